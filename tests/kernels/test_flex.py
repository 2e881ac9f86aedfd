"""FlexAttention as a backend (kernels/flex.py) computes what our lists describe: against the
torch reference on random lists of many shapes (query tiles, left padding, partial blocks,
queries after a cache, non-causal, decode), and its BlockMask's full and partial blocks are
exactly the wholly and partly visible ones."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import block_sparse_attention, block_sparse_attention_reference
from sketchwalk.kernels.flex import block_mask
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.reference import tiles_of_rows, token_mask
from sketchwalk.kernels.testing import random_block_index, random_qkv

# (batch, heads, kv heads, groups, lq, lk, block, blocks per query tile, padded, causal)
SHAPES = [
    (1, 4, 2, 1, 96, 96, 16, 1, False, True),
    (1, 6, 2, 2, 128, 128, 32, 1, False, True),
    (1, 4, 4, 4, 200, 200, 16, 1, False, True),  # a partial last block
    (1, 2, 1, 1, 64, 64, 64, 1, False, True),
    (2, 4, 2, 2, 150, 150, 16, 1, True, True),  # left padding, different per sequence
    (1, 9, 3, 3, 160, 160, 16, 4, False, True),  # tiles of 64 rows over 16-token blocks
    (2, 4, 2, 1, 130, 130, 16, 2, True, True),  # tiles and padding
    (1, 4, 2, 2, 48, 120, 16, 1, False, True),  # queries after a cache
    (1, 4, 2, 2, 80, 80, 16, 1, False, False),  # not causal
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_flex_backend_matches_the_reference(shape):
    bsz, h, hkv, g, lq, lk, b, r, padded, causal = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, 16, torch.float32, gen)
    idx, cnt = random_block_index(bsz, g, lq, lk, b, 0.4, gen)
    starts = torch.randint(1, 2 * b, (bsz,), generator=gen) if padded else None
    lists = BlockLists(idx, cnt, b, seq_start=starts)
    if r > 1:
        lists = lists.tiled(r, -(-lk // b))
    got = block_sparse_attention(q, k, v, lists, causal, backend="flex")
    want = block_sparse_attention_reference(q, k, v, lists, causal)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_decode_takes_the_devices_kernel(monkeypatch):
    """One query: Flex would compile per cache length, so the device's own kernel runs."""
    import sketchwalk.kernels.cpu as cpu

    calls = []
    real = cpu.block_sparse_attention_cpu
    monkeypatch.setattr(cpu, "block_sparse_attention_cpu", lambda *a: calls.append(1) or real(*a))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(0)
    q, k, v = random_qkv(1, 4, 2, 1, 100, 16, torch.float32, gen)
    idx, cnt = random_block_index(1, 2, 1, 100, 16, 0.5, gen)
    lists = BlockLists(idx, cnt, 16)
    got = block_sparse_attention(q, k, v, lists, backend="flex")
    assert calls == [1]
    torch.testing.assert_close(got, block_sparse_attention_reference(q, k, v, lists))


@pytest.mark.parametrize(
    "heads,groups,lq,lk,block,padded",
    [(4, 1, 96, 96, 16, False), (6, 2, 128, 128, 32, False), (4, 4, 200, 200, 16, True),
     (2, 2, 64, 100, 16, False)],
)  # fmt: skip
def test_block_mask_lists_are_the_visible_blocks(heads, groups, lq, lk, block, padded):
    """What the compiled kernel runs: full blocks are wholly visible (it skips their mask_mod),
    partial blocks partly, and together they are every block with a visible pair."""
    gen = torch.Generator().manual_seed(lq + lk + block)
    idx, cnt = random_block_index(1, groups, lq, lk, block, 0.4, gen)
    starts = torch.tensor([21]) if padded else None
    mask = block_mask(BlockLists(idx, cnt, block, seq_start=starts), heads, lq, lk)
    vis = token_mask(idx, cnt, block, lq, lk, seq_start=starts)
    vis = vis.repeat_interleave(heads // groups, 1)
    nq, nk = -(-lq // block), -(-lk // block)
    vis = torch.nn.functional.pad(vis, (0, nk * block - lk, 0, nq * block - lq))
    tiles = vis.view(1, heads, nq, block, nk, block)
    real = torch.nn.functional.pad(  # pairs inside the lengths
        torch.ones(lq, lk, dtype=torch.bool), (0, nk * block - lk, 0, nq * block - lq)
    ).view(nq, block, nk, block)
    whole = (tiles | ~real[None, None]).all(5).all(3)  # every real pair of the tile visible
    if padded:  # a block holding padding is never whole: its mask_mod hides the padding
        whole &= torch.arange(nk) * block >= 21
    some = tiles.any(5).any(3)

    def dense(counts, ids):
        out = torch.zeros(1, heads, nq, nk, dtype=torch.bool)
        live = torch.arange(ids.shape[-1]) < counts[..., None]
        return out.scatter_(-1, ids.long(), live) if ids.numel() else out

    full = dense(mask.full_kv_num_blocks, mask.full_kv_indices)
    partial = dense(mask.kv_num_blocks, mask.kv_indices)
    assert not (full & partial).any()
    assert torch.equal(full | partial, some)
    assert torch.equal(full, some & whole & (torch.arange(nk) * block + block <= lk))


def test_tiles_of_rows_give_the_tile_lists_flex_reads():
    """A tiled BlockMask is the union of its rows' lists (kernels/reference.py tiles_of_rows)."""
    gen = torch.Generator().manual_seed(3)
    idx, cnt = random_block_index(1, 1, 128, 128, 16, 0.3, gen)
    t_idx, t_cnt = tiles_of_rows(idx, cnt, 4, 8)
    mask = block_mask(BlockLists(t_idx, t_cnt, 16, query_block=64), 2, 128, 128)
    assert tuple(mask.kv_num_blocks.shape) == (1, 2, 2) and mask.BLOCK_SIZE == (64, 16)
