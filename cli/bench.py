"""`sketchwalk bench attention`: dense SDPA vs our sparse path (selection included), as ratios."""

from __future__ import annotations

import argparse
import json
import math
import sys

from sketchwalk.cli import flags
from sketchwalk.errors import SketchWalkError
from sketchwalk.kernels.backends import REGISTRY

from .knobs import add_config_args, config_from_args

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
SEQ_LEN = flags.count("--seq-len", 1, flags.MAX_TOKENS)
REPEATS = flags.count("--repeats", 1, 10_000)
BLOCK = flags.count("--block-size", 1, 4096)
DENSITY = flags.number("--density")


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
    p.add_argument("--seq-len", type=SEQ_LEN, nargs="+", default=[4096, 16384], metavar="N")
    p.add_argument("--density", type=DENSITY, nargs="+", default=[0.1, 0.2, 0.3], metavar="RHO")
    p.add_argument("--shape", nargs="+", default=["smollm2"], choices=sorted(SHAPES))
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=REPEATS, default=3, metavar="N")
    p.add_argument("--phase", default="prefill", choices=["prefill", "decode", "both"])
    p.add_argument("--backend", default=None, choices=list(REGISTRY), help="kernel backend")
    p.add_argument(
        "--flex",
        action="store_true",
        help="prefill: also time PyTorch FlexAttention on the same lists (compiles, 10-20 s)",
    )
    p.add_argument("--block-size", type=BLOCK, default=None, metavar="B", help="default: config's")
    p.add_argument(
        "--query-block",
        type=flags.count("--query-block", 1, 4096),
        default=None,
        metavar="M",
        help="query tile (default: config's)",
    )
    p.add_argument(
        "--layer-depth",
        type=flags.number("--layer-depth"),
        default=0.0,
        metavar="D",
        help="the timed layer's depth in a model, 0-1: below --sampled-depth it estimates with "
        "the sampled estimator (default 0: a first layer, the costlier estimate)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_config_args(p, exclude=("density", "block_size", "query_block", "phases"))
    p.set_defaults(func=run_attention)

    m = what.add_parser(
        "model",
        help="whole-model prefill and decode: dense SDPA vs Sketch&Walk (no recording)",
        description=(
            "Runs the real model on a real prompt (the first N tokens of a text file), dense and "
            "sparse interleaved in one process, and prints medians of prefill and per-token "
            "decode times with their ratios. Prefill keeps the last position's logits only, as "
            "model.generate does (--all-logits: every position's, as `sketchwalk run` does). "
            "--random-weights SHAPE times a seeded random-weight model of a real model's shape "
            "on random token ids instead (a GPU host without the weights)."
        ),
    )
    flags.add_model(m, None, "HF id or local folder (default: SmolLM2-135M)")
    m.add_argument(
        "--random-weights",
        default=None,
        metavar="SHAPE",
        help="instead of --model: a seeded random-weight model of that shape (llama3-8b, "
        "smollm2, tiny) on random token ids; honest for timing, meaningless for quality",
    )
    m.add_argument(
        "--layers",
        type=flags.count("--layers", 1, flags.MAX_LAYERS),
        default=None,
        metavar="N",
        help="--random-weights: decoder layers",
    )
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    flags.add_device(m)
    m.add_argument("--seq-len", type=SEQ_LEN, nargs="+", default=[2048, 4096, 7376], metavar="N")
    m.add_argument("--density", type=DENSITY, default=0.2, metavar="RHO")
    m.add_argument("--block-size", type=BLOCK, default=None, metavar="B", help="default: config's")
    m.add_argument(
        "--new-tokens", type=flags.count("--new-tokens", 0, 1 << 16), default=8, metavar="N",
        help="decode steps timed",
    )  # fmt: skip
    m.add_argument("--repeats", type=REPEATS, default=3, metavar="N")
    m.add_argument("--prompt-file", default=str(DEFAULT_TEXT), metavar="FILE")
    m.add_argument("--all-logits", action="store_true", help="prefill computes every logit")
    m.add_argument("--backend", default=None, choices=list(REGISTRY), help="kernel backend")
    m.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_config_args(m, exclude=("density", "block_size"))  # --decode-reselect among them
    m.set_defaults(func=run_model)


def _validate(args: argparse.Namespace) -> None:
    for d in args.density:
        if not (0.0 < d <= 1.0) or math.isnan(d):
            raise SketchWalkError(f"density must be in (0, 1], got {d}")
    for n in args.seq_len:
        if n < 1:
            raise SketchWalkError(f"sequence length must be at least 1, got {n}")
    if args.repeats < 1:
        raise SketchWalkError(f"repeats must be at least 1, got {args.repeats}")
    if not 0.0 <= getattr(args, "layer_depth", 0.0) <= 1.0:
        raise SketchWalkError(f"layer depth must be in [0, 1], got {args.layer_depth}")
    b = args.block_size
    if b is not None and (b < 1 or b & (b - 1)):
        raise SketchWalkError(f"block size must be a positive power of two, got {b}")
    if args.flex:
        from sketchwalk.kernels.flex import available as flex_available

        if not flex_available():
            raise SketchWalkError("--flex needs torch.nn.attention.flex_attention (torch >= 2.5)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SketchWalkError("--device cuda asked, but torch sees no CUDA device here")


def run_attention(args: argparse.Namespace) -> int:
    _validate(args)
    from tqdm import tqdm

    from sketchwalk.benchmarks.attention import format_table, run_attention_bench

    knobs = config_from_args(args, density=args.density[0])  # each row sets its own density
    machine = _announce_machine(args.device, knobs.score_dtype)
    # One layer is timed: its estimator is the one a layer at --layer-depth of a model runs.
    knobs = knobs.at_depth(args.layer_depth, 1.0).with_(sampled_depth=0.0)
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
            flex=args.flex,
            block_size=args.block_size,
            query_block=args.query_block,
            knobs=knobs,
        )
    for r in rows:
        r["machine"] = machine
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


def _announce_machine(device: str, score: str) -> dict:
    """Print which machine the numbers come from (stderr) and return its fields for the rows."""
    from sketchwalk.machine import describe, machine_info

    info = machine_info(device, score)
    print(describe(info), file=sys.stderr)
    return info


def _validate_model(args: argparse.Namespace) -> str | None:
    """Checks what can be checked before loading the model; returns the prompt text (None with
    random weights, which read no prompt)."""
    if not (0.0 < args.density <= 1.0) or math.isnan(args.density):
        raise SketchWalkError(f"density must be in (0, 1], got {args.density}")
    if args.repeats < 1:
        raise SketchWalkError(f"repeats must be at least 1, got {args.repeats}")
    if args.new_tokens < 0:
        raise SketchWalkError(f"new tokens must be >= 0, got {args.new_tokens}")
    for n in args.seq_len:
        if n < 1:
            raise SketchWalkError(f"sequence length must be at least 1, got {n}")
    if args.random_weights is not None:
        from sketchwalk.benchmarks.random_model import model_shape

        if args.model is not None:
            raise SketchWalkError("give --model or --random-weights, not both")
        model_shape(args.random_weights)  # an unknown shape is a one-line error
        if args.layers is not None and args.layers < 1:
            raise SketchWalkError(f"layers must be at least 1, got {args.layers}")
        return None
    if args.layers is not None:
        raise SketchWalkError("--layers applies to --random-weights only")
    try:
        with open(args.prompt_file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SketchWalkError(f"cannot read prompt file {args.prompt_file}: {exc}") from exc
    if not text.strip():
        raise SketchWalkError(f"prompt file {args.prompt_file} is empty")
    return text


def run_model(args: argparse.Namespace) -> int:
    rows = model_rows(args)
    from sketchwalk.benchmarks.model import format_table

    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


def model_rows(args: argparse.Namespace) -> list[dict]:
    """The rows `bench model` prints (benchmarks/gpu_check.py calls it with the same flags: the
    `sketchwalk` command itself needs the store's packages, which a bare GPU host lacks)."""
    text = _validate_model(args)
    from tqdm import tqdm

    from sketchwalk.benchmarks.model import run_model_bench

    changes = {"density": args.density}
    if args.block_size is not None:
        changes["block_size"] = args.block_size
    cfg = config_from_args(args, **changes)  # ConfigError is one line
    model, tokenizer, model_id, max_context, token_ids, extra = _bench_model(args)
    for n in args.seq_len:
        if n + args.new_tokens > max_context:
            raise SketchWalkError(
                f"{n} tokens + {args.new_tokens} new exceed {model_id}'s context "
                f"of {max_context} tokens"
            )
        if n < cfg.block_size:
            raise SketchWalkError(f"{n} tokens is shorter than one block ({cfg.block_size})")
    device = str(next(model.parameters()).device)
    machine = _announce_machine(device, cfg.score_dtype)  # input checked first
    total = len(args.seq_len) * args.repeats * 2
    with tqdm(total=total, desc="bench model", unit="pass", file=sys.stderr) as bar:
        rows = run_model_bench(
            model,
            tokenizer,
            text,
            args.seq_len,
            cfg,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            all_logits=args.all_logits,
            backend=args.backend,
            progress=lambda: bar.update(1),
            token_ids=token_ids,
        )
    for r in rows:
        r["model"] = model_id
        r["dtype"] = args.dtype
        r.update(extra)
        r["machine"] = machine
    return rows


def _bench_model(args: argparse.Namespace) -> tuple:
    """(model, tokenizer, id, max context, token_ids or None, extra row fields): the real model
    loaded, or a random-weight one built on the device (benchmarks/random_model.py)."""
    if args.random_weights is None:
        from sketchwalk.engine.run.models import load_model

        lm = load_model(args.model, args.dtype, args.device)
        return lm.model, lm.tokenizer, lm.model_id, lm.max_context, None, {"random_weights": False}
    import torch

    from sketchwalk.benchmarks.random_model import (
        MAX_POSITIONS,
        build_random_model,
        random_token_ids,
    )
    from sketchwalk.engine.run.models import DTYPES

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SketchWalkError(f"device {args.device} asked for but CUDA is not available here")
    rm = build_random_model(args.random_weights, args.layers, DTYPES[args.dtype], args.device)
    dev = next(rm.model.parameters()).device
    extra = {"random_weights": True, "shape": rm.shape.name, "layers": rm.layers}

    def token_ids(n: int) -> torch.Tensor:
        return random_token_ids(rm.shape.vocab, n, dev)

    return rm.model, None, rm.model_id, MAX_POSITIONS, token_ids, extra
