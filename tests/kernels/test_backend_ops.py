"""The one kernel seam (kernels/backends.py): every op of every backend against the reference
backend on fresh random inputs, and a session bound to a backend running that backend's kernels
and no other's."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.kernels import REGISTRY, kernel, native, use_backend
from sketchwalk.kernels.backends import OPS, choose_backend
from sketchwalk.kernels.block_softmax import PackedKeys


def test_every_automatic_backend_names_every_op():
    """An op missing from cpu or triton would silently fall back to nothing: each names all."""
    for name in ("reference", "cpu", "triton"):
        for op in OPS:
            assert REGISTRY[name].op_at(op) is not None, (name, op)


def test_unknown_ops_and_backends_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown kernel op 'fft'"):
        kernel("fft", "cpu")
    with pytest.raises(ValueError, match="unknown kernel backend 'gpu'"), use_backend("gpu"):
        pass


def test_a_bound_backend_is_what_kernel_returns_and_ends_with_its_block():
    assert choose_backend("cpu") == "cpu"
    with use_backend("reference"):
        assert choose_backend("cpu") == "reference"
        assert kernel("block_lists", "cpu").__name__ == "block_lists_reference"
        assert choose_backend("cpu", "cpu") == "cpu"  # an explicit argument wins
    assert kernel("block_lists", "cpu").__name__ == "block_lists"
    # flex names attention only: its other ops are the device's automatic backend's
    assert kernel("block_mass", "cpu", "flex").__name__ == "pooled_block_mass_cpu"


@pytest.mark.parametrize("seed", range(4))
def test_cpu_ops_match_the_reference_backend(seed):
    """block_mass, row_mass, sketch_rows, block_lists and absorb_token of the cpu backend
    equal the reference backend's on random shapes (partial blocks, padding, GQA)."""
    from sketchwalk.engine.method.sketch import make_srht, sample_positions

    g = torch.Generator().manual_seed(seed)
    b = (16, 32)[seed % 2]
    t = int(torch.randint(40, 300, (1,), generator=g))
    hkv, gh, d = 2, 1 + seed % 3, 64
    h = hkv * gh
    valid = torch.ones(2, t, dtype=torch.bool)
    valid[1, : seed * 3] = False  # left padding
    qs = torch.randn(2, h, t, d, generator=g) * 2
    ks = torch.randn(2, hkv, t, d, generator=g) * 2
    pos = sample_positions(t, b, 4)
    for pool in ("max", "mean"):
        args = (qs[:, :, pos], valid[:, pos], pos, ks, valid, b, d, 1.0, pool, torch.float32)
        want = kernel("block_mass", "cpu", "reference")(*args)
        got = kernel("block_mass", "cpu", "cpu")(*args)
        assert got.shape == (2, hkv, -(-int(pos[-1] + 1) // b), -(-t // b))
        assert (got - want).abs().max() < 1e-5 and want.abs().sum() > 0
    lo, hi = (
        torch.randint(0, 5, (2, 1, 1), generator=g),
        torch.randint(5, t + 1, (2, 1, 1), generator=g),
    )
    packed = PackedKeys()
    for dtype in (torch.float32, torch.bfloat16):  # bfloat16: the fused call on kept keys (AMX)
        for length in (t - 7, t):  # the cache grows between two re-selections
            row = (qs[:, :hkv, -5:], ks[:, :, :length], lo, hi.clamp(max=length), b, dtype, packed)
            torch.testing.assert_close(
                kernel("row_mass", "cpu", "cpu")(*row),
                kernel("row_mass", "cpu", "reference")(*row),
                atol=2e-5,
                rtol=1e-3,
            )
    srht = make_srht(d, 64 if seed % 2 else 32, seed, 3)
    keep = None if srht.keep.numel() == srht.padded_dim else srht.keep
    sk = (ks, srht.matrix, srht.signs, keep, srht.scale / srht.padded_dim**0.5, b, valid)
    for got, want in zip(kernel("sketch_rows", "cpu", "cpu")(*sk),
                         kernel("sketch_rows", "cpu", "reference")(*sk), strict=True):  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    keep_mask = torch.rand(2, 3, 7, 40, generator=g) < 0.3
    kmax = max(int(keep_mask.sum(-1).max()), 1)
    assert torch.equal(
        kernel("block_lists", "cpu", "cpu")(keep_mask, kmax),
        kernel("block_lists", "cpu", "reference")(keep_mask, kmax),
    )
    r = srht.matrix.shape[1]
    sums = [torch.randn(2, h, r), torch.randn(2, hkv, r), torch.randn(2, hkv, r)]
    sums += [torch.zeros(2), torch.zeros(2)]
    twins = [[x.clone() for x in sums] for _ in range(2)]
    q1, k1 = torch.randn(2, h, d, generator=g), torch.randn(2, hkv, d, generator=g)
    outs = [kernel("absorb_token", "cpu", n)(q1, k1, srht.matrix, *s) for n, s in
            zip(("cpu", "reference"), twins, strict=True)]  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for a, c in zip(*twins, strict=True):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


class _Spy:
    """The compiled library, recording which of its C functions are looked up."""

    def __init__(self, lib):
        self.lib, self.calls = lib, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.lib, name)


def _generate(backend: str) -> torch.Tensor:
    model = tiny_llama(layers=3, heads=4, kv_heads=2, head_dim=16)
    model.set_attn_implementation("sketch_walk")
    cfg = SketchWalkConfig(block_size=16, dense_layers=(), density=0.5, query_samples=4)
    ids = torch.randint(1, 128, (1, 230), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), sketch_walk_session(cfg, kernel_backend=backend):
        out = model.generate(ids, max_new_tokens=20, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
    return torch.stack(out.logits)


def test_a_session_runs_its_own_backends_kernels_and_no_others(monkeypatch):
    """Bound to the reference backend, a prefill and decode look up no C function (and, with
    no TRITON_INTERPRET, run no Triton); bound to cpu, the same run calls the C kernels of
    attention, the block mass, the sketch, the lists and the decode token, with the same
    logits."""
    lib = native.library()
    assert lib is not None, "the C kernels need a compiler (CI installs gcc)"
    spy = _Spy(lib)
    monkeypatch.setitem(native._loaded, native._build_key(), spy)
    ref = _generate("reference")
    assert spy.calls == []
    cpu = _generate("cpu")
    called = set(spy.calls)
    for fn in ("srht_rows_f32", "block_lists_i32", "absorb_token_f32"):
        assert fn in called, (fn, sorted(called))
    assert called & {"scored_block_mass_f32", "block_softmax_sums_f32", "block_softmax_sums_bf16"}
    assert any("attention" in fn for fn in called), sorted(called)
    torch.testing.assert_close(cpu, ref, atol=2e-3, rtol=2e-3)
