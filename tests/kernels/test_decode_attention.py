"""Decode over listed blocks in C (kernels/decode_attention.c) against the torch reference, on
random shapes, lists, paddings and cache layouts; and where it hands over to the torch path."""

import pytest
import torch

from sketchwalk.kernels.cpu import block_sparse_attention_cpu
from sketchwalk.kernels.decode_attention import applies, decode_block_attention
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.native import library
from sketchwalk.kernels.reference import block_sparse_attention_reference

HEADS = [(9, 3), (8, 2), (4, 4), (6, 1), (2, 1)]  # (query heads, KV heads)


def _case(seed: int):
    gen = torch.Generator().manual_seed(seed)

    def pick(xs):
        return xs[int(torch.randint(len(xs), (1,), generator=gen))]

    bsz = pick([1, 1, 2, 3])
    h, hkv = pick(HEADS)
    g = pick(sorted({1, hkv, h}))
    d = pick([8, 16, 64, 80, 128])
    b = pick([1, 4, 16, 32, 64])
    lk = int(torch.randint(1, 900, (1,), generator=gen))
    nk = -(-lk // b)
    width = int(torch.randint(1, nk + 4, (1,), generator=gen))
    # unsorted lists with repeats; counts below the width leave stale ids behind them
    ids = torch.randint(0, nk, (bsz, g, 1, width), generator=gen)
    counts = torch.randint(0, width + 1, (bsz, g, 1), generator=gen)
    return bsz, h, hkv, g, d, b, lk, ids, counts, gen


@pytest.mark.parametrize("seed", range(40))
def test_c_decode_equals_the_reference_on_random_cases(seed):
    assert library() is not None, "these tests need a C compiler (cc)"
    bsz, h, hkv, g, d, b, lk, ids, counts, gen = _case(seed)
    q = torch.randn(bsz, h, 1, d, generator=gen) * 3
    if seed % 3 == 0:  # the model's cache layout may be any strides: [B, Lk, Hkv, D] transposed
        k = torch.randn(bsz, lk, hkv, d, generator=gen).transpose(1, 2)
        v = torch.randn(bsz, lk, hkv, d, generator=gen).transpose(1, 2)
    else:  # a prefix of a larger buffer
        k = torch.randn(bsz, hkv, lk + 7, d, generator=gen)[:, :, :lk]
        v = torch.randn(bsz, hkv, lk + 7, d, generator=gen)[:, :, :lk]
    starts = torch.randint(0, lk, (bsz,), generator=gen) if seed % 2 else None
    scale = float(torch.empty(1).uniform_(0.05, 1.0, generator=gen))
    got = decode_block_attention(q, k, v, ids, counts, b, scale, starts)
    want = block_sparse_attention_reference(
        q, k, v, BlockLists(ids, counts, b, seq_start=starts), True, scale
    )
    assert got is not None and got.shape == want.shape == (bsz, h, 1, d)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4)
    # a head whose list sees nothing is zero, as in the reference
    live = torch.zeros(bsz, g, dtype=torch.bool)
    for bi in range(bsz):
        for gi in range(g):
            blocks = ids[bi, gi, 0, : counts[bi, gi, 0]]
            start = 0 if starts is None else int(starts[bi])
            live[bi, gi] = bool(((blocks + 1) * b > start).any())
    dead = ~live.repeat_interleave(h // g, dim=1)
    assert torch.equal(got[dead], torch.zeros_like(got[dead]))


def test_the_cpu_kernel_takes_it_for_decode_and_keeps_its_torch_path(monkeypatch):
    """block_sparse_attention_cpu's decode runs the C kernel; with it off, the torch path gives
    the same output."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 5000, 64), torch.randn(1, 3, 5000, 64)
    nk = -(-5000 // 32)
    ids = torch.stack([torch.randperm(nk)[:40].sort().values for _ in range(3)]).view(1, 3, 1, 40)
    counts = torch.tensor([[[40], [25], [33]]])
    c = block_sparse_attention_cpu(q, k, v, BlockLists(ids, counts, 32), True, 0.125)
    assert torch.equal(c, decode_block_attention(q, k, v, ids, counts, 32, 0.125))
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert not applies(q, k, v)
    t = block_sparse_attention_cpu(q, k, v, BlockLists(ids, counts, 32), True, 0.125)
    assert torch.allclose(c, t, atol=2e-6)


def test_it_hands_over_where_it_does_not_apply():
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 40, 16)
    ids, counts = torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.ones(1, 1, 1, dtype=torch.long)
    assert (
        decode_block_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), ids, counts, 8, 1.0)
        is None
    )
    assert decode_block_attention(torch.randn(1, 4, 2, 16), k, k, ids, counts, 8, 1.0) is None
    with pytest.raises(ValueError, match="multiple of index groups"):
        decode_block_attention(q, k, k, ids.expand(1, 3, 1, 1), counts.expand(1, 3, 1), 8, 1.0)
