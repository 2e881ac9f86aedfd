"""The selection's GPU work counted, not timed: the sampled estimator's Triton launch against
dense attention, per layer, from the kernel's launch grid (kernels/triton_block_mass.py
block_mass_work, which a test checks against the interpreter's trace of the kernel).

    python -m sketchwalk.benchmarks.gpu_work --shape llama3-8b --seq-len 32768 131072

Counts are exact for the kernel as it is; they say nothing of how fast a GPU runs them. On an
H100 exponentials are the scarcer resource (about 4 T/s against ~1000 TFLOP/s of bf16 matrix
math), so the exponential share is the one to watch.
"""

from __future__ import annotations

import argparse
import json

from sketchwalk.benchmarks.attention import SHAPES
from sketchwalk.engine.method.config import PRESETS, preset
from sketchwalk.engine.method.sketch import sample_positions
from sketchwalk.kernels.triton_block_mass import block_mass_work, dense_attention_work


def work_row(shape_name: str, length: int, preset_name: str) -> dict:
    """One sampled-estimator layer's work as a share of dense attention's, for a preset's
    knobs; `sampled_layers` is the share of layers that run it (block means elsewhere, whose
    n^2 x r products are not counted)."""
    shape = SHAPES[shape_name]
    cfg = preset(preset_name)
    share = 1.0 if cfg.estimator == "sampled" else cfg.sampled_depth
    r = min(cfg.score_rank or cfg.sketch_dim, cfg.sketch_dim, shape.head_dim)
    pos = sample_positions(length, cfg.block_size, cfg.query_samples)
    est = block_mass_work(pos, length, cfg.block_size, shape.heads, shape.kv_heads, r)
    dense = dense_attention_work(length, shape.heads, shape.head_dim)
    return {
        "shape": shape_name,
        "seq_len": length,
        "preset": preset_name,
        "block": cfg.block_size,
        "queries_per_block": cfg.query_samples or cfg.block_size,
        "rank": r,
        "sampled_layers": share,
        "mac_share": est["macs"] / dense["macs"],
        "exp_share": est["exps"] / dense["exps"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--seq-len", type=int, nargs="+", default=[32768, 131072])
    p.add_argument("--preset", nargs="+", choices=sorted(PRESETS), default=["gpu", "default"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if any(n < 1 or n > 1 << 22 for n in args.seq_len):
        p.error("--seq-len must lie in 1 .. 4194304")
    rows = [work_row(args.shape, n, name) for n in args.seq_len for name in args.preset]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("shape      tokens  preset    block q/blk rank layers  multiply-adds  exponentials")
    for x in rows:
        if not x["sampled_layers"]:
            print(f"{x['shape']:10s} {x['seq_len']:6d}  {x['preset']:8s} block means only")
            continue
        print(
            f"{x['shape']:10s} {x['seq_len']:6d}  {x['preset']:8s} {x['block']:5d} "
            f"{x['queries_per_block']:5d} {x['rank']:4d} {x['sampled_layers']:6.0%}  "
            f"{x['mac_share']:12.1%}  {x['exp_share']:11.1%}"
        )


if __name__ == "__main__":
    main()
