"""A decode token into the sketch's block sums in C (kernels/token_sketch.py) against its torch twin."""

import pytest
import torch

from sketchwalk.kernels.token_sketch import absorb_token, absorb_token_torch


def _state(gen, bsz, h, hkv, n, r, squares):
    """Block sums [B, H(kv), n, r] and counts [B, n] as decode keeps them (grown buffers: views
    whose rows are further apart than r), with random contents."""
    q_sum = torch.randn(bsz, h, n + 3, r + 5, generator=gen)[..., :n, :r]
    k_sum = torch.randn(bsz, hkv, n, r, generator=gen)
    k_sq = torch.rand(bsz, hkv, n, r, generator=gen) if squares else None
    counts = torch.randint(0, 9, (2, bsz, n + 2), generator=gen).float()[..., :n]
    return q_sum, k_sum, k_sq, counts[0], counts[1]


@pytest.mark.parametrize("seed", range(12))
def test_c_equals_torch_on_random_shapes(seed):
    gen = torch.Generator().manual_seed(seed)
    bsz, hkv = [(1, 1), (2, 3), (3, 2)][seed % 3]
    h = hkv * [1, 3, 4][seed % 2]
    d, r = [(64, 64), (16, 8), (48, 64), (128, 32)][seed % 4]
    n, cur = 7, int(torch.randint(0, 7, (1,), generator=gen))
    # q and k as the model hands them: one position of a [B, H, L, d] view, heads strided
    q = torch.randn(bsz, 5, h, d, generator=gen).transpose(1, 2)[:, :, 2]
    k = torch.randn(bsz, hkv, 4, d, generator=gen)[:, :, 3]
    matrix = torch.randn(d, r, generator=gen)
    fast = _state(gen, bsz, h, hkv, n, r, squares=seed % 2 == 0)
    slow = tuple(None if x is None else x.clone() for x in fast)

    def at_cur(s):
        q_sum, k_sum, k_sq, qc, kc = s
        sq = None if k_sq is None else k_sq[:, :, cur]
        return q_sum[:, :, cur], k_sum[:, :, cur], sq, qc[:, cur], kc[:, cur]

    got = absorb_token(q, k, matrix, *at_cur(fast))
    want = absorb_token_torch(q, k, matrix, *at_cur(slow))
    assert got is not None and got.shape == want.shape == (bsz, h, r)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    for a, b in zip(fast, slow, strict=True):
        if a is not None:
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-5)  # only block cur moved, alike
    assert fast[3][:, cur].tolist() == (slow[3][:, cur]).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_sketch_goes_into_a_strided_slot_and_nowhere_else(seed):
    """out: a slot of the decode window's buffer [B, H, 2w, r] (rows 2w * r apart); C writes
    the token's sketch there, in place, as the torch twin does, and leaves the other slots."""
    gen = torch.Generator().manual_seed(seed)
    bsz, h, hkv, d, r, n = 1 + seed % 2, 6, 2, [64, 16, 48][seed % 3], [64, 8, 32][seed % 3], 5
    q, k = torch.randn(bsz, h, d, generator=gen), torch.randn(bsz, hkv, d, generator=gen)
    matrix = torch.randn(d, r, generator=gen)
    fast = _state(gen, bsz, h, hkv, n, r, squares=seed % 2 == 1)
    slow = tuple(None if x is None else x.clone() for x in fast)
    window = torch.randn(bsz, h, 8, r, generator=gen)
    ref = window.clone()
    col = int(torch.randint(0, 8, (1,), generator=gen))

    def at(s):
        sq = None if s[2] is None else s[2][:, :, 2]
        return s[0][:, :, 2], s[1][:, :, 2], sq, s[3][:, 2], s[4][:, 2]

    got = absorb_token(q, k, matrix, *at(fast), out=window[:, :, col])
    want = absorb_token_torch(q, k, matrix, *at(slow), out=ref[:, :, col])
    assert got is not None and got.data_ptr() == window[:, :, col].data_ptr()
    assert want.data_ptr() == ref[:, :, col].data_ptr()
    for a, b in zip(fast, slow, strict=True):
        if a is not None:
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-5)
    assert torch.allclose(window, ref, atol=1e-4, rtol=1e-5)
    others = [c for c in range(8) if c != col]
    assert torch.equal(window[:, :, others], ref[:, :, others])
    assert torch.allclose(window[:, :, col], q @ matrix, atol=1e-4, rtol=1e-5)


def test_where_c_does_not_apply_nothing_changes(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    q, k, matrix = torch.randn(1, 2, 8), torch.randn(1, 1, 8), torch.randn(8, 8)
    q_sum, k_sum, k_sq, qc, kc = _state(gen, 1, 2, 1, 3, 8, squares=True)
    before = [x.clone() for x in (q_sum, k_sum, k_sq, qc, kc)]
    views = (q_sum[:, :, 1], k_sum[:, :, 1], k_sq[:, :, 1], qc[:, 1], kc[:, 1])
    assert absorb_token(q.bfloat16(), k, matrix, *views) is None
    assert absorb_token(q, k, matrix.T, *views) is None  # the sketch matrix must be row-major
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert absorb_token(q, k, matrix, *views) is None
    for a, b in zip((q_sum, k_sum, k_sq, qc, kc), before, strict=True):
        assert torch.equal(a, b)
