"""The CPU block-sparse kernel on the selections a real model makes, against dense SDPA.

Why: random inputs give every row about the same block count, while the layer budget of a real
model gives rows very different counts (and different sink/window shapes), so the kernel's call
count and Python overhead there are what a user pays. This captures, during one real prefill of
the default model on the GPL-3 text, the exact kernel inputs (q, k, v, the lists) of a few sparse
layers, saves them under /tmp, then times dense SDPA against the kernel on them, interleaved in one
process (medians), and counts the CPU flash-kernel calls. `--baseline FILE` times a second copy of
kernels/cpu.py (its torch paths are kernels/cpu_prefill.py and cpu_decode.py since the split; a
copy from before it carries them; e.g. `git show main:kernels/cpu.py > /tmp/cpu_main.py`) in the same loop.

    .venv/bin/python -m sketchwalk.benchmarks.kernel_real --tokens 4096 7376 --preset default fast
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# as the sketchwalk command does: see docs/notes/speed-log.md
from sketchwalk.openmp import short_spin_waits

os.environ.update(short_spin_waits(os.environ))
import torch  # noqa: E402
import torch.nn.functional as F

from sketchwalk.allocator import keep_freed_memory
from sketchwalk.benchmarks.model import DEFAULT_TEXT, prompt_ids
from sketchwalk.engine.method.config import PRESETS, SketchWalkConfig, preset
from sketchwalk.kernels.cpu import block_sparse_attention_cpu
from sketchwalk.kernels.lists import BlockLists

CAPTURE_DIR = Path("/tmp/sketchwalk-kernel-real")
FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _config(name: str, density: float) -> SketchWalkConfig:
    return SketchWalkConfig(density=density) if name == "default" else preset(name, density=density)


def capture(tokens: int, preset_name: str, layers: list[int], density: float) -> list[dict]:
    """The kernel's arguments at the given layers during one sparse prefill of the real model."""
    import sketchwalk.engine.method.pipeline as pipeline
    from sketchwalk.engine.hf.hook import NAME
    from sketchwalk.engine.hf.session import Session, sketch_walk_session
    from sketchwalk.engine.run.models import load_model

    lm = load_model()
    ids = prompt_ids(lm.tokenizer, DEFAULT_TEXT.read_text(), tokens)
    saved: list[dict] = []
    layer_now = [-1]
    kernel, sparse = pipeline.block_sparse_attention, Session._sparse

    def spy(q, k, v, lists, causal=True, scale=None, backend=None):
        if layer_now[0] in layers and q.shape[2] == k.shape[2]:
            tensors = dict(q=q, k=k, v=v, index=lists.index, count=lists.count)
            meta = dict(
                block=lists.block_size, scale=scale, seq_start=lists.seq_start,
                query_block=lists.query_block,
            )  # fmt: skip
            saved.append(
                {n: x.clone() for n, x in tensors.items()} | meta | {"layer": layer_now[0]}
            )
        return kernel(q, k, v, lists, causal, scale, backend)

    def sparse_at(self, call, plan):
        layer_now[0] = call.layer
        return sparse(self, call, plan)

    pipeline.block_sparse_attention = spy
    Session._sparse = sparse_at
    lm.model.set_attn_implementation(NAME)
    try:
        with torch.inference_mode(), sketch_walk_session(_config(preset_name, density)):
            lm.model(ids, use_cache=True, logits_to_keep=1)
    finally:
        pipeline.block_sparse_attention = kernel
        Session._sparse = sparse
        lm.model.set_attn_implementation("sdpa")
    return saved


def _load_kernel(path: Path) -> Callable:
    """Another copy of kernels/cpu.py, loaded as a module of sketchwalk.kernels so that its
    relative imports (.parts) resolve to this checkout's."""
    name = "sketchwalk.kernels._baseline_cpu"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod.block_sparse_attention_cpu


def _flash_calls(fn: Callable[[], object]) -> int:
    """Flash-kernel calls of one run, counted on one thread: the profiler does not see the
    kernel's worker threads, and with one thread the kernel does not split the tiles."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        torch.set_num_threads(threads)
    return sum(e.count for e in prof.key_averages() if e.key == FLASH_OP)


def time_layer(cap: dict, kernels: dict[str, Callable], repeats: int) -> dict:
    """Median ms of dense SDPA and of each kernel on one capture, interleaved; flash-call counts
    and the largest difference between the kernels' outputs. Also the median CPU time (both
    threads; with OpenMP workers that sleep when idle it leaves out time lost to other jobs on a
    shared machine, so it is the steadier number under load)."""
    q, k, v = cap["q"], cap["k"], cap["v"]

    def dense() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=cap["scale"], enable_gqa=True
        )

    lists = BlockLists(
        cap["index"], cap["count"], cap["block"], cap["query_block"], cap["seq_start"]
    )

    def run(fn: Callable) -> Callable[[], torch.Tensor]:
        if "lists" not in inspect.signature(fn).parameters:  # a copy from before BlockLists
            old = (lists.index, lists.count, lists.block_size, True, cap["scale"], lists.seq_start)
            return lambda: fn(q, k, v, *old, query_block=lists.query_block)
        return lambda: fn(q, k, v, lists, True, cap["scale"])

    variants = {"dense": dense} | {name: run(fn) for name, fn in kernels.items()}
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(repeats):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            variants[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((time.process_time() - c0) * 1e3)
    row = {name: statistics.median(ts) for name, ts in times.items()}
    row["cpu"] = {name: statistics.median(ts) for name, ts in cpu.items()}
    row["calls"] = {name: _flash_calls(variants[name]) for name in kernels}
    outs = [variants[name]() for name in kernels]
    row["max_diff"] = max((o - outs[0]).abs().max().item() for o in outs)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096])
    ap.add_argument("--preset", nargs="+", default=["default"], choices=list(PRESETS))
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 10, 20, 29])
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another copy of kernels/cpu.py to time too")
    ap.add_argument("--recapture", action="store_true", help="ignore saved captures")
    args = ap.parse_args(argv)
    if min(args.tokens) < 2 or min(args.layers) < 0 or args.repeats < 1:
        ap.error("--tokens must be >= 2, --layers >= 0 and --repeats >= 1")
    keep_freed_memory()  # as the sketchwalk command (sketchwalk/allocator.py)
    torch.manual_seed(0)
    kernels = {"kernel": block_sparse_attention_cpu}
    if args.baseline:
        kernels = {"baseline": _load_kernel(args.baseline)} | kernels
    CAPTURE_DIR.mkdir(exist_ok=True)
    names = list(kernels)
    cols = ["dense", *names]
    head = f"{'preset':>7} {'tokens':>6} {'layer':>5}" + "".join(f" {n + ' ms':>12}" for n in cols)
    head += "".join(f" {n + ' x':>10} {'calls':>5}" for n in names)
    head += "  CPU ms (" + " / ".join(cols) + ")"
    print(head, flush=True)

    def line(name: str, tokens: int, layer: str, ms: dict, cpu: dict, calls: dict) -> str:
        out = f"{name:>7} {tokens:>6} {layer:>5}" + "".join(f" {ms[n]:>12.1f}" for n in cols)
        out += "".join(f" {ms['dense'] / ms[n]:>10.2f} {calls.get(n, ''):>5}" for n in names)
        return out + "  " + " / ".join(f"{cpu[n]:.0f}" for n in cols)

    for tokens in args.tokens:
        for name in args.preset:
            path = CAPTURE_DIR / f"{name}-{tokens}-{args.density}.pt"
            if path.exists() and not args.recapture:
                caps = torch.load(path)
            else:
                caps = capture(tokens, name, args.layers, args.density)
                torch.save(caps, path)
            total = dict.fromkeys(cols, 0.0)
            total_cpu = dict.fromkeys(cols, 0.0)
            for cap in caps:
                if cap["layer"] not in args.layers:
                    continue
                row = time_layer(cap, kernels, args.repeats)
                text = line(name, tokens, str(cap["layer"]), row, row["cpu"], row["calls"])
                print(text + f"  (max diff {row['max_diff']:.1e})", flush=True)
                for n in cols:
                    total[n] += row[n]
                    total_cpu[n] += row["cpu"][n]
            print(line(name, tokens, "sum", total, total_cpu, {}), flush=True)


if __name__ == "__main__":
    main()
