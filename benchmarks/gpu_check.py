"""One prepared GPU session: (a) Triton kernels vs the torch oracle on the GPU in bf16/fp16/fp32,
(b) prefill at 32k/64k/128k and decode at 32k/128k against SDPA (flash) and flash-attn 2 when
installed, density 0.1/0.2/0.3, Llama-3.1-8B shapes. Prints tables; writes JSON to $OUT if set.

Run through benchmarks/gpu_check.sh (about ten minutes at most). Exit code 1 when a kernel is wrong.
`--smoke --device cpu` under TRITON_INTERPRET=1 runs the same code on tiny inputs: CI runs it, so a
lent GPU's few minutes are never lost to a broken script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

from sketchwalk.benchmarks.attention import format_table, run_attention_bench
from sketchwalk.kernels.reference import block_sparse_attention_reference, dense_block_index
from sketchwalk.kernels.testing import random_block_index

TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}

# (batch, heads, kv_heads, lq, lk, head_dim, block, groups, with seq_start)
CASES = [
    (1, 32, 8, 2048, 2048, 128, 64, 1, False),  # Llama-3.1-8B heads, shared lists
    (2, 9, 3, 1500, 1500, 64, 64, 3, True),  # SmolLM2 heads, per-group lists, left padding
    (1, 32, 8, 700, 3000, 128, 128, 8, False),  # chunked prefill, block 128, unaligned chunk
    (2, 16, 4, 1, 4099, 128, 64, 4, True),  # decode, batch 2 with different counts
    (4, 32, 8, 1, 2048, 128, 128, 1, False),  # decode, block 128
    (1, 8, 8, 1000, 1000, 64, 64, 8, False),  # GQA ratio 1
]
SMOKE_CASES = [  # the same situations at interpreter sizes
    (1, 4, 2, 70, 70, 32, 16, 1, False),
    (2, 6, 3, 50, 50, 16, 16, 3, True),
    (1, 4, 2, 20, 60, 32, 32, 2, False),
    (2, 4, 2, 1, 75, 32, 16, 2, True),
]


def _versions(dev: torch.device) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import flash_attn

        info["flash_attn"] = flash_attn.__version__
    except Exception:
        info["flash_attn"] = None
    return info


def check_kernels(dev: torch.device, smoke: bool = False) -> list[dict]:
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    gen = torch.Generator().manual_seed(0)
    rows = []
    dtypes = (
        (torch.float16, torch.float32) if smoke else (torch.bfloat16, torch.float16, torch.float32)
    )
    for case in SMOKE_CASES if smoke else CASES:
        bsz, h, hkv, lq, lk, d, b, g, pad = case
        idx, cnt = (x.to(dev) for x in random_block_index(bsz, g, lq, lk, b, 0.3, gen))
        starts = torch.tensor([0, 333, 17, 64][:bsz], device=dev) if pad else None
        for dt in dtypes:
            q = torch.randn(bsz, h, lq, d, generator=gen).to(dev, dt)
            k = torch.randn(bsz, hkv, lk, d, generator=gen).to(dev, dt)
            v = torch.randn(bsz, hkv, lk, d, generator=gen).to(dev, dt)
            out = torch.full_like(q, float("nan"))
            block_sparse_attention_triton(q, k, v, idx, cnt, b, True, None, starts, out=out)
            ref = block_sparse_attention_reference(q, k, v, idx, cnt, b, True, None, starts).float()
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(out).all()) and err < TOL[dt]
            rows.append({"case": str(case), "dtype": str(dt)[6:], "rel_err": err, "ok": ok})
            print(f"check {case} {str(dt)[6:]:9s} rel_err {err:.2e} {'ok' if ok else 'FAIL'}")
    length, b, dt = (64, 16, torch.float16) if smoke else (1024, 64, torch.bfloat16)
    di, dc = dense_block_index(1, 1, length, length, b, dev)
    q = torch.randn(1, 32, length, 128, generator=gen).to(dev, dt)
    k = torch.randn(1, 8, length, 128, generator=gen).to(dev, dt)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), k.float(), is_causal=True, enable_gqa=True
    )
    full = block_sparse_attention_triton(q, k, k, di, dc, b)
    err = float((full.float() - dense).abs().max() / dense.abs().max())
    name = str(dt)[6:]
    rows.append({"case": "density 1.0 vs SDPA", "dtype": name, "rel_err": err, "ok": err < TOL[dt]})
    print(f"check density-1.0 vs SDPA {name} rel_err {err:.2e}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefill", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--decode", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--density", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--no-flex", action="store_true", help="leave out the FlexAttention column")
    ap.add_argument("--device", default="cuda", help="cpu only with TRITON_INTERPRET=1 (smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny cases, fp16: tests the script")
    args = ap.parse_args(argv)
    try:
        dev = torch.device(args.device)
    except RuntimeError:
        print(f"gpu_check: unknown device {args.device!r}", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check: a CPU device needs TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    t0 = time.time()
    report: dict = {"versions": _versions(dev)}
    print(json.dumps(report["versions"]))
    checks = [] if args.skip_check else check_kernels(dev, args.smoke)
    report["checks"] = checks
    dtype = "fp16" if args.smoke else "bf16"  # the interpreter has no bf16
    from sketchwalk.benchmarks.flex import flex_available

    flex = flex_available() and not args.smoke and not args.no_flex  # compiling is slow on CPU
    rows = run_attention_bench(
        dev, args.prefill, args.density, [args.shape], args.repeats, "triton", dtype, ("prefill",),
        flex=flex,
    )  # fmt: skip
    rows += run_attention_bench(
        dev, args.decode, args.density, [args.shape], max(args.repeats, 10), "triton", dtype,
        ("decode",),
    )  # fmt: skip
    report["timings"] = rows
    report["seconds"] = round(time.time() - t0, 1)
    print(format_table(rows))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_check.json"), "w") as f:
            json.dump(report, f, indent=1)
    bad = [c for c in checks if not c["ok"]]
    if bad:
        print(f"gpu_check: {len(bad)} kernel checks FAILED", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
