"""`sketchwalk bench attention`: dense SDPA vs our sparse path (selection included), as ratios."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from sketchwalk.errors import SketchWalkError


def register(subparsers: argparse._SubParsersAction) -> None:
    from sketchwalk.benchmarks.attention import DTYPES, SHAPES

    bench = subparsers.add_parser(
        "bench", help="benchmarks", description="Benchmarks that print tables (or --json)."
    )
    what = bench.add_subparsers(dest="bench_what", required=True, metavar="WHAT")
    p = what.add_parser(
        "attention",
        help="dense attention vs block-sparse attention including sketch + walk + select",
        description=(
            "Times dense torch SDPA (causal, GQA) against Sketch&Walk selection plus the "
            "block-sparse kernel on random inputs of real model shapes; dense and sparse runs are "
            "interleaved in one process and the medians reported, with their ratio."
        ),
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seq-len", type=int, nargs="+", default=[4096, 16384], metavar="N")
    p.add_argument("--density", type=float, nargs="+", default=[0.1, 0.2, 0.3], metavar="RHO")
    p.add_argument("--shape", nargs="+", default=["smollm2"], choices=sorted(SHAPES))
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=int, default=3, metavar="N")
    p.add_argument("--phase", default="prefill", choices=["prefill", "decode", "both"])
    p.add_argument(
        "--backend", default=None, choices=["cpu", "triton", "reference"], help="kernel backend"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=run_attention)


def _validate(args: argparse.Namespace) -> None:
    for d in args.density:
        if not (0.0 < d <= 1.0) or math.isnan(d):
            raise SketchWalkError(f"density must be in (0, 1], got {d}")
    for n in args.seq_len:
        if n < 1:
            raise SketchWalkError(f"sequence length must be at least 1, got {n}")
    if args.repeats < 1:
        raise SketchWalkError(f"repeats must be at least 1, got {args.repeats}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SketchWalkError("--device cuda asked, but torch sees no CUDA device here")


def run_attention(args: argparse.Namespace) -> int:
    _validate(args)
    from tqdm import tqdm

    from sketchwalk.benchmarks.attention import format_table, run_attention_bench

    if args.device == "cpu" and "OMP_WAIT_POLICY" not in os.environ:
        print(
            "note: on a shared CPU run with OMP_WAIT_POLICY=passive; with spinning OpenMP workers "
            "each small parallel op of the sparse path can wait a scheduler tick (~8 ms here)",
            file=sys.stderr,
        )
    phases = ("prefill", "decode") if args.phase == "both" else (args.phase,)
    total = len(args.shape) * len(args.seq_len) * len(args.density) * len(phases)
    with tqdm(total=total, desc="bench attention", unit="config", file=sys.stderr) as bar:
        rows = run_attention_bench(
            args.device,
            args.seq_len,
            args.density,
            args.shape,
            repeats=args.repeats,
            backend=args.backend,
            dtype=args.dtype,
            phases=phases,
            progress=lambda: bar.update(1),
        )
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0
