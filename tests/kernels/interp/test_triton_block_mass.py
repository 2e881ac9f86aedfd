"""The fused Triton estimator (interpreter) against its torch reference and the engine's CPU path.

The triton backend's block_mass op (kernels/backends.py), so it must give the same pooled block
mass as the cpu backend's (kernels/cpu_block_mass.py pooled_block_mass_cpu).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from sketchwalk.engine.method.sketch import sample_positions
from sketchwalk.kernels.block_mass_reference import pooled_block_mass_reference
from sketchwalk.kernels.cpu_block_mass import pooled_block_mass_cpu
from sketchwalk.kernels.triton_block_mass import pooled_block_mass_triton

# (batch, heads, kv_heads, length, r, block, samples, padding)
SHAPES = [
    (1, 4, 2, 70, 16, 16, 4, None),  # GQA 2, partial last block
    (2, 3, 1, 64, 24, 32, 2, "left"),  # GQA 3, r not a power of two, left padding
    (2, 4, 4, 50, 32, 16, 1, "right"),  # ratio 1, right padding
    (1, 8, 2, 48, 16, 16, 0, None),  # every query scored: rows split over programs
]


def _inputs(shape):
    bsz, h, hkv, t, r, b, samples, pad = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr(shape).encode()))
    pos = sample_positions(t, b, samples)
    qs = torch.randn(bsz, h, pos.numel(), r, generator=gen)
    ks = torch.randn(bsz, hkv, t, r, generator=gen)
    valid = torch.ones(bsz, t, dtype=torch.bool)
    if pad == "left":
        valid[1, :19] = False
    elif pad == "right":
        valid[1, t - 13 :] = False
    return qs, valid[:, pos], pos, ks, valid, b


@pytest.mark.parametrize("pool", ["max", "mean"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_reference_and_engine(shape, pool):
    qs, q_valid, pos, ks, k_valid, b = _inputs(shape)
    args = (qs, q_valid, pos, ks, k_valid, b, 64, 1.0, pool)
    got = pooled_block_mass_triton(*args, torch.float32, block_rows=16, block_n=32)
    ref = pooled_block_mass_reference(*args, torch.float32)
    engine = pooled_block_mass_cpu(*args, torch.float32)
    assert got.shape == ref.shape == engine.shape
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() < 1e-5
    assert (got - engine).abs().max() < 1e-5
    assert ref.abs().sum() > 0  # something was computed


def test_kernel_fp16_scores_close():
    qs, q_valid, pos, ks, k_valid, b = _inputs(SHAPES[0])
    args = (qs, q_valid, pos, ks, k_valid, b, 64, 1.0, "max")
    got = pooled_block_mass_triton(*args, torch.float16)
    ref = pooled_block_mass_reference(*args, torch.float32)
    assert (got - ref).abs().max() < 5e-3


def test_engine_transition_takes_the_kernel_and_agrees_with_the_cpu_path(monkeypatch):
    """Under the interpreter transition() takes the Triton path (as on CUDA); the same inputs
    through the CPU path (kernel backend forced to cpu) give the same block transition."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import sketch_blocks, transition
    from sketchwalk.engine.method.sketch import make_srht

    cfg = SketchWalkConfig(estimator="sampled", score_rank=0, score_dtype="float32")
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 96, 32, generator=gen), torch.randn(1, 2, 96, 32, generator=gen)
    srht = make_srht(32, cfg.sketch_dim, 0, 3)
    valid = torch.ones(1, 96, dtype=torch.bool)
    sk, qt = sketch_blocks(q, k, srht, cfg.block_size, valid, cfg)
    rows = torch.arange(96 // cfg.block_size)
    fused = transition(sk, rows, 32, cfg, qt)
    monkeypatch.setenv("SKETCHWALK_KERNEL", "cpu")
    plain = transition(sk, rows, 32, cfg, qt)
    assert fused.shape == plain.shape
    assert (fused - plain).abs().max() < 1e-5
    assert torch.allclose(fused.sum(-1), torch.ones_like(fused.sum(-1)))


@pytest.mark.parametrize(
    "shape, block_n",
    [((1, 4, 2, 200, 24, 16, 4, None), None), ((2, 8, 2, 300, 64, 64, 8, None), None),
     ((1, 6, 3, 130, 32, 32, 2, None), 32), ((1, 8, 2, 48, 16, 16, 0, None), None)],
)  # fmt: skip
def test_counted_work_is_what_the_interpreter_executes(shape, block_n, monkeypatch):
    """block_mass_work (the GPU cost the benchmarks report) counts, from the launch grid and the
    loop bounds, exactly the score multiply-adds (tl.dot) and exponentials (exp2) the kernel
    executes: traced here on the interpreter's builder."""
    from triton.runtime.interpreter import InterpreterBuilder

    from sketchwalk.kernels.triton_block_mass import block_mass_work

    seen = {"macs": 0, "exps": 0}
    dot, exp2 = InterpreterBuilder.create_dot, InterpreterBuilder.create_exp2

    def traced_dot(self, a, b, *args):
        seen["macs"] += a.data.shape[0] * a.data.shape[1] * b.data.shape[1]
        return dot(self, a, b, *args)

    def traced_exp2(self, arg):
        seen["exps"] += arg.data.size
        return exp2(self, arg)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", traced_dot)
    monkeypatch.setattr(InterpreterBuilder, "create_exp2", traced_exp2)
    qs, q_valid, pos, ks, k_valid, b = _inputs(shape)
    bsz, h, hkv, t, r = shape[:5]
    pooled_block_mass_triton(qs, q_valid, pos, ks, k_valid, b, r, 1.0, "max", torch.float32,
                             block_n=block_n)  # fmt: skip
    want = block_mass_work(pos, t, b, h, hkv, r, bsz, block_n=block_n)
    assert seen == want and want["exps"] > 0
