"""The FlexAttention peer of `bench attention --flex` computes what our lists describe."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.benchmarks.flex import block_mask
from sketchwalk.kernels import block_sparse_attention_reference
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.reference import token_mask
from sketchwalk.kernels.testing import random_block_index, random_qkv


@pytest.mark.parametrize(
    "heads,kv,groups,t,block",
    [(4, 2, 1, 96, 16), (6, 2, 2, 128, 32), (4, 4, 4, 200, 16), (2, 1, 1, 64, 64)],
)
def test_block_mask_from_lists_matches_reference(heads, kv, groups, t, block):
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(t + block)
    q, k, v = random_qkv(1, heads, kv, t, t, 16, torch.float32, gen)
    idx, cnt = random_block_index(1, groups, t, t, block, 0.4, gen)
    mask = block_mask(idx, cnt, block, heads, t, t)
    got = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)  # eager: no compile in tests
    want = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, block))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "heads,groups,lq,lk,block",
    [(4, 1, 96, 96, 16), (6, 2, 128, 128, 32), (4, 4, 200, 200, 16), (2, 2, 64, 100, 16)],
)
def test_block_mask_lists_are_the_visible_blocks(heads, groups, lq, lk, block):
    """What the compiled kernel runs: full blocks are wholly visible (it skips their mask_mod),
    partial blocks partly, and together they are every block with a visible pair."""
    gen = torch.Generator().manual_seed(lq + lk + block)
    idx, cnt = random_block_index(1, groups, lq, lk, block, 0.4, gen)
    mask = block_mask(idx, cnt, block, heads, lq, lk)
    vis = token_mask(idx, cnt, block, lq, lk).repeat_interleave(heads // groups, 1)
    nq, nk = -(-lq // block), -(-lk // block)
    vis = torch.nn.functional.pad(vis, (0, nk * block - lk, 0, nq * block - lq))
    tiles = vis.view(1, heads, nq, block, nk, block)
    padded = torch.nn.functional.pad(
        torch.ones(lq, lk, dtype=torch.bool), (0, nk * block - lk, 0, nq * block - lq)
    ).view(nq, block, nk, block)
    whole = (tiles | ~padded[None, None]).all(5).all(3)  # every real pair of the tile visible
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
