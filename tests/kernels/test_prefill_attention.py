"""Block-sparse prefill in C (kernels/prefill_attention.c) against the torch reference, on random
shapes, lists, tiles, paddings and layouts; and where it hands over to the torch path."""

import pytest
import torch

from sketchwalk.kernels.cpu import block_sparse_attention_cpu
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.native import library
from sketchwalk.kernels.prefill_attention import applies, prefill_block_attention
from sketchwalk.kernels.reference import block_sparse_attention_reference

HEADS = [(9, 3), (8, 2), (4, 4), (6, 1), (2, 1)]  # (query heads, KV heads)


def _lists(gen, bsz, g, lq, lk, b, tile, density):
    """Random lists per query tile: causal blocks, unsorted, with repeats, ids past the tile's
    reach and past the cache, junk after the count, and now and then an empty list."""
    nt, nk = -(-lq // tile), -(-lk // b)
    width = nk + 3
    ids = torch.randint(0, nk + 2, (bsz, g, nt, width), generator=gen)  # junk everywhere
    counts = torch.zeros(bsz, g, nt, dtype=torch.long)
    for bi in range(bsz):
        for gi in range(g):
            for t in range(nt):
                last = (lk - lq + min(t * tile + tile, lq) - 1) // b
                want = max(1, round(density * (last + 1)))
                keep = torch.randint(0, last + 1, (want,), generator=gen)
                extra = torch.tensor([last, last, min(last + 1, nk + 1)])  # repeat, future
                keep = torch.cat([keep, extra])[torch.randperm(want + 3, generator=gen)]
                if float(torch.rand(1, generator=gen)) < 0.05:
                    keep = keep[:0]
                ids[bi, gi, t, : keep.numel()] = keep
                counts[bi, gi, t] = keep.numel()
    return ids, counts


@pytest.mark.parametrize("seed", range(30))
def test_c_prefill_equals_the_reference_on_random_cases(seed):
    assert library() is not None, "these tests need a C compiler (cc)"
    gen = torch.Generator().manual_seed(seed)

    def pick(xs):
        return xs[int(torch.randint(len(xs), (1,), generator=gen))]

    bsz = pick([1, 1, 2])
    h, hkv = pick(HEADS)
    g = pick(sorted({1, hkv, h}))
    d = pick([16, 32, 64, 128])
    b = pick([16, 32, 64])
    tile = b * pick([1, 2, 4])
    lk = int(torch.randint(1, 700, (1,), generator=gen))
    lq = lk if seed % 3 else int(torch.randint(1, lk + 1, (1,), generator=gen))  # after a cache
    if seed % 4 == 0:  # the model's layout: [B, L, H, D] transposed, for q and v
        q = torch.randn(bsz, lq, h, d, generator=gen).transpose(1, 2)
        v = torch.randn(bsz, lk, hkv, d, generator=gen).transpose(1, 2)
    else:
        q = torch.randn(bsz, h, lq, d, generator=gen)
        v = torch.randn(bsz, hkv, lk, d, generator=gen)
    k = torch.randn(bsz, hkv, lk, d, generator=gen) * 2
    starts = torch.randint(0, lk, (bsz,), generator=gen) if seed % 2 else None
    ids, counts = _lists(gen, bsz, g, lq, lk, b, tile, 0.3)
    scale = float(torch.empty(1).uniform_(0.05, 0.5, generator=gen))
    got = prefill_block_attention(q, k, v, ids, counts, b, scale, starts, tile)
    want = block_sparse_attention_reference(
        q, k, v, BlockLists(ids, counts, b, query_block=tile, seq_start=starts), True, scale
    )
    assert got is not None and got.shape == want.shape == (bsz, h, lq, d)
    assert torch.allclose(got, want, atol=3e-5, rtol=1e-4), (got - want).abs().max()


def test_the_cpu_kernel_takes_it_for_prefill_and_keeps_its_torch_path(monkeypatch):
    """block_sparse_attention_cpu's prefill runs the C kernel; with it off, the torch path gives
    the same output."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, n, 600, 64, generator=gen) for n in (9, 3, 3))
    ids, counts = _lists(gen, 1, 3, 600, 600, 32, 64, 0.25)
    c = block_sparse_attention_cpu(
        q, k, v, BlockLists(ids, counts, 32, query_block=64), True, 0.125
    )
    assert torch.equal(c, prefill_block_attention(q, k, v, ids, counts, 32, 0.125, None, 64))
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert not applies(q, k, v, 32, 64)
    t = block_sparse_attention_cpu(
        q, k, v, BlockLists(ids, counts, 32, query_block=64), True, 0.125
    )
    assert torch.allclose(c, t, atol=3e-6)


def test_it_hands_over_where_it_does_not_apply():
    q, k = torch.randn(1, 4, 64, 64), torch.randn(1, 2, 64, 64)
    ids, counts = torch.zeros(1, 1, 4, 1, dtype=torch.long), torch.ones(1, 1, 4, dtype=torch.long)
    assert prefill_block_attention(q, k, k, ids, counts, 8, 1.0) is None  # block 8: torch
    assert (
        prefill_block_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), ids, counts, 16, 1.0)
        is None
    )
    assert (
        prefill_block_attention(q[..., :24], k[..., :24], k[..., :24], ids, counts, 16, 1.0) is None
    )
    with pytest.raises(ValueError, match="lists for 64 queries"):
        prefill_block_attention(q, k, k, ids, counts, 16, 1.0, None, 32)  # 4 lists, 2 tiles
