"""What one sparse decode step costs per layer: aten ops (deterministic) and time (interleaved).

A decode step on CPU is bound by the number of small torch ops and the bytes it copies, and on a
shared machine wall-clock times move 2-5x, so this counts the aten calls of one layer's decode
step (session.attend: sketch, walk, select and the kernel) with torch.profiler, and times it
against dense SDPA on the same K/V, interleaved, medians. Random inputs of SmolLM2's shape
(9 query heads, 3 KV heads, head dim 64) and the default config; the layer is a sparse one.

Run: python -m sketchwalk.benchmarks.decode_ops [--seq-len 7376] [--steps 32] [--reselect 1 4 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

from sketchwalk.openmp import short_spin_waits

os.environ.update(short_spin_waits(os.environ))

import torch  # noqa: E402

from sketchwalk.allocator import keep_freed_memory  # noqa: E402
from sketchwalk.engine.hf.dense import dense_attention  # noqa: E402
from sketchwalk.engine.hf.session import Session  # noqa: E402
from sketchwalk.engine.method.config import SketchWalkConfig  # noqa: E402

LAYER = 2  # a sparse layer under the default dense_layers (0, 1)


def _ops(fn) -> tuple[int, Counter]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    # top-level ops only: an op called from inside another op is not a dispatch we pay for twice
    top = sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)
    return top, names


def run(seq_len: int, steps: int, reselect: int, heads=9, kv=3, d=64, seed=0) -> dict:
    torch.manual_seed(seed)
    cfg = SketchWalkConfig(decode_reselect=reselect)
    scale = d**-0.5
    total = seq_len + steps
    q_all = torch.randn(1, heads, total, d)
    k_all, v_all = torch.randn(1, kv, total, d), torch.randn(1, kv, total, d)
    s = Session(cfg)
    s.attend(
        LAYER, q_all[:, :, :seq_len], k_all[:, :, :seq_len], v_all[:, :, :seq_len], None, scale
    )
    counts, per_op, t_sparse, t_dense = [], Counter(), [], []
    for i in range(steps):
        lk = seq_len + i + 1
        q = q_all[:, :, lk - 1 : lk].contiguous()
        k = k_all[:, :, :lk].contiguous()  # the model's cache is contiguous (torch.cat)
        v = v_all[:, :, :lk].contiguous()
        if 0 < i < steps // 2:  # counted (not the first step: it fills the window's rows) ...
            n, names = _ops(lambda q=q, k=k, v=v: s.attend(LAYER, q, k, v, None, scale))
            counts.append(n)
            per_op.update(names)
            continue
        if i == 0:
            s.attend(LAYER, q, k, v, None, scale)
            continue
        t0 = time.perf_counter()  # ... then timed, against dense on the same K/V
        s.attend(LAYER, q, k, v, None, scale)
        t1 = time.perf_counter()
        dense_attention(q, k, v, None, scale)
        t2 = time.perf_counter()
        t_sparse.append((t1 - t0) * 1e3)
        t_dense.append((t2 - t1) * 1e3)
    return dict(
        seq_len=seq_len,
        reselect=reselect,
        ops_per_step=statistics.mean(counts),
        ops_max=max(counts),
        sparse_ms=statistics.median(t_sparse),
        dense_ms=statistics.median(t_dense),
        top_ops=per_op.most_common(12),
        profiled_steps=len(counts),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, nargs="+", default=[7376])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--reselect", type=int, nargs="+", default=[1, 4, 0])
    p.add_argument("--top", action="store_true", help="also print the most called aten ops")
    args = p.parse_args(argv)
    keep_freed_memory()  # as the sketchwalk command (sketchwalk/allocator.py)
    print("tokens reselect  aten ops/step (max)  sparse ms  dense ms  dense/sparse")
    for n in args.seq_len:
        for r in args.reselect:
            x = run(n, args.steps, r)
            print(
                f"{n:>6} {r:>8}  {x['ops_per_step']:>12.1f} ({x['ops_max']:>4})  "
                f"{x['sparse_ms']:>9.2f} {x['dense_ms']:>9.2f}  "
                f"{x['dense_ms'] / x['sparse_ms']:>8.2f}x"
            )
            if args.top:
                print(
                    "   ", ", ".join(f"{k[6:]}={v // x['profiled_steps']}" for k, v in x["top_ops"])
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
