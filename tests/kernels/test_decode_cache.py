"""Decode over a kept selection (kernels/decode_cache.py) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import block_sparse_attention_reference, decode_cache
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.testing import random_qkv


def _lists(groups: int, cur: int, density: float, gen: torch.Generator, equal: bool = True):
    """Decode lists of equal length per group, each holding the current block."""
    keep = max(1, round(density * cur))
    index = torch.full((1, groups, 1, cur + 1), cur, dtype=torch.int32)
    count = torch.zeros(1, groups, 1, dtype=torch.int32)
    for gi in range(groups):
        n = keep if equal or gi == 0 else max(0, keep - 1)
        ids = torch.randperm(cur, generator=gen)[:n] if cur else torch.empty(0, dtype=torch.long)
        ids = torch.cat([ids.sort().values, torch.tensor([cur])])
        index[0, gi, 0, : ids.numel()] = ids.to(torch.int32)
        count[0, gi, 0] = ids.numel()
    return index, count


@pytest.mark.parametrize("equal", [True, False])
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize(
    "heads,kv,per_group", [(9, 3, False), (9, 3, True), (4, 4, True), (8, 2, False)]
)
@pytest.mark.parametrize("lk0", [1, 200, 333])
def test_gathered_decode_matches_reference_as_the_block_fills(
    block, heads, kv, per_group, lk0, equal
):
    gen = torch.Generator().manual_seed(block * 1000 + lk0 + heads)
    d = 32
    cur = (lk0 - 1) // block
    end = (cur + 1) * block  # steps until the block is full
    q, k, v = random_qkv(1, heads, kv, 1, end, d, torch.float32, gen)
    index, count = _lists(kv if per_group else 1, cur, 0.3, gen, equal)
    g = decode_cache.gather(k[:, :, :lk0], v[:, :, :lk0], index, count, block, lk0, heads=heads)
    assert g.m == (int(count.max()) - 1) * block
    assert (g.mask is None) == (equal or not per_group or kv == 1 or cur < 2)
    for lk in range(lk0, end + 1, max(1, (end - lk0) // 4)):  # later steps reuse the same gather
        qs = torch.randn(1, heads, 1, d, generator=gen)
        want = block_sparse_attention_reference(
            qs, k[:, :, :lk], v[:, :, :lk], BlockLists(index, count, block)
        )
        got = decode_cache.attend(g, qs, k[:, :, :lk], v[:, :, :lk], d**-0.5)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_refuses_what_it_cannot_do():
    gen = torch.Generator().manual_seed(0)
    q, k, v = random_qkv(1, 4, 2, 1, 100, 16, torch.float32, gen)
    index, count = _lists(2, 6, 0.5, gen, equal=False)
    with pytest.raises(ValueError, match="different lengths"):
        decode_cache.gather(k, v, index, count, 16, 100)  # the mask needs the query heads
    no_cur = torch.tensor([[[[0, 1]]]], dtype=torch.int32)
    with pytest.raises(ValueError, match="current block"):
        decode_cache.gather(k, v, no_cur, torch.tensor([[[2]]], dtype=torch.int32), 16, 100)
    index, count = _lists(1, 6, 0.5, gen)
    g = decode_cache.gather(k, v, index, count, 16, 100)
    with pytest.raises(ValueError, match="gathered for block 6"):
        decode_cache.attend(g, q, torch.cat([k, k], 2)[:, :, :113], v, 0.25)
    assert (
        decode_cache.advance(g, k, v) is None
    )  # space for the current block only (spare_blocks=1)
    g = decode_cache.gather(k, v, index, count, 16, 100, spare_blocks=2)
    with pytest.raises(ValueError, match="not complete"):
        decode_cache.advance(g, k, v)  # block 6 of a 100-token cache holds 4 tokens
    assert decode_cache.supports(q, k, 1, None) and decode_cache.supports(q, k, 2, None)
    assert not decode_cache.supports(q, k, 1, torch.tensor([3]))
    assert not decode_cache.supports(torch.cat([q, q]), k, 1, None)


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("heads,kv,per_group", [(9, 3, False), (9, 3, True), (4, 4, True)])
@pytest.mark.parametrize("lk", [1, 16, 17, 200, 333])
def test_one_gather_decode_matches_reference(block, heads, kv, per_group, lk):
    """A re-selecting step's lists (sorted, the current block last) through the stateless
    kernel's one-gather path (kernels/cpu_decode.py) equal the reference."""
    from sketchwalk.kernels.cpu_decode import _decode_one_gather

    gen = torch.Generator().manual_seed(block + lk + heads)
    d = 32
    cur = (lk - 1) // block
    q, k, v = random_qkv(1, heads, kv, 1, lk, d, torch.float32, gen)
    index, count = _lists(kv if per_group else 1, cur, 0.3, gen)
    want = block_sparse_attention_reference(q, k, v, BlockLists(index, count, block))
    got = _decode_one_gather(q, k, v, index, count, block, d**-0.5, None)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_one_gather_decode_declines_what_it_cannot_do():
    from sketchwalk.kernels import cpu_decode as cpu

    gen = torch.Generator().manual_seed(1)
    q, k, v = random_qkv(2, 4, 2, 1, 100, 16, torch.float32, gen)
    index, count = _lists(2, 6, 0.5, gen)
    batch = (index.expand(2, -1, -1, -1), count.expand(2, -1, -1), 16, 0.25, None)
    assert cpu._decode_one_gather(q, k, v, *batch) is None  # a batch
    assert (
        cpu._decode_one_gather(q[:1], k[:1], v[:1], index, count, 16, 0.25, torch.tensor([3]))
        is None
    )
    big = torch.arange(cpu._DECODE_ONE_GATHER // 16 + 1).view(1, 1, 1, -1)
    kk = torch.randn(1, 2, 16 * big.numel(), 16)
    n = torch.tensor([[[big.numel()]]])
    assert cpu._decode_one_gather(q[:1], kk, kk, big, n, 16, 0.25, None) is None  # too many


@pytest.mark.parametrize("equal", [True, False])
@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("heads,kv,per_group", [(9, 3, False), (9, 3, True), (4, 4, True)])
def test_advance_across_blocks_matches_reference_on_the_extended_lists(
    block, heads, kv, per_group, equal
):
    """A kept selection crossing into new key blocks: each block joins the lists as it starts;
    the advanced buffer attends like the reference on those lists, until its room runs out."""
    from sketchwalk.engine.method.select import extend_selection

    gen = torch.Generator().manual_seed(block + heads + 7 * equal)
    d, lk0, spare = 32, 5 * block + 3, 3
    cur0 = (lk0 - 1) // block
    end = (cur0 + spare) * block
    q, k, v = random_qkv(1, heads, kv, 1, end + block, d, torch.float32, gen)
    index, count = _lists(kv if per_group else 1, cur0, 0.4, gen, equal)
    sel = BlockLists(index, count, block, key_blocks=cur0 + 1, kept=0, candidates=0)
    g = decode_cache.gather(
        k[:, :, :lk0], v[:, :, :lk0], index, count, block, lk0, sel, heads, spare
    )
    for lk in range(lk0, end + 2):
        cur = (lk - 1) // block
        if cur != g.cur:
            sel = extend_selection(sel, cur)
            g = decode_cache.advance(g, k[:, :, :lk], v[:, :, :lk], sel)
            if cur == cur0 + spare:  # space for spare - 1 more blocks: then gather afresh
                assert g is None
                break
        qs = torch.randn(1, heads, 1, d, generator=gen)
        want = block_sparse_attention_reference(qs, k[:, :, :lk], v[:, :, :lk], sel)
        got = decode_cache.attend(g, qs, k[:, :, :lk], v[:, :, :lk], d**-0.5)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    else:
        raise AssertionError("the buffer never ran out of room")
