"""Triton split-K decode kernel (interpreter) against the torch oracle."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.reference import block_sparse_attention_reference, dense_block_index
from sketchwalk.kernels.testing import (
    poisoned,
    random_block_index,
    random_qkv,
    rel_err,
    with_spare_rows,
)
from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton, block_sparse_decode

TOL = {torch.float32: 1e-5, torch.float16: 5e-3}

# (batch, heads, kv_heads, lk, head_dim, block, groups, splits)
SHAPES = [
    (2, 9, 3, 77, 16, 16, 1, 3),  # SmolLM2 ratio, lists of different lengths per sequence
    (2, 8, 2, 64, 32, 16, 2, 2),  # ratio 4, G = Hkv, full last block
    (1, 4, 4, 50, 24, 16, 4, 1),  # ratio 1, head dim 24, no split
    (2, 8, 2, 40, 16, 16, 8, 4),  # G = H (each head its own list), more splits than some lists
    (1, 12, 4, 70, 16, 32, 6, 2),  # G straddles KV heads (expanded to per-head lists)
    (1, 9, 3, 301, 64, 64, 1, 2),  # real tile sizes: head dim 64, block 64
    (1, 8, 2, 300, 128, 128, 2, 2),  # head dim 128, block 128
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_matches_reference(shape, dtype):
    bsz, h, hkv, lk, d, b, g, splits = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, dtype)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, 1, lk, d, dtype, gen)
    idx, cnt = random_block_index(bsz, g, 1, lk, b, 0.5, gen)
    cnt[-1, 0, 0] = 1  # a sequence whose only block is the current one
    idx[-1, 0, 0, 0] = (lk - 1) // b
    out = poisoned(q)
    res = block_sparse_decode(q, k, v, idx, cnt, b, out=out, num_splits=splits)
    assert res is out and not out.isnan().any()
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b))
    assert rel_err(out, ref) < TOL[dtype]


def test_decode_padding_and_empty_lists():
    gen = torch.Generator().manual_seed(1)
    q, k, v = random_qkv(3, 6, 2, 1, 60, 16, torch.float32, gen)
    idx, cnt = random_block_index(3, 2, 1, 60, 16, 0.6, gen)
    cnt[1, 1] = 0  # nothing selected: zeros
    starts = torch.tensor([0, 20, 33])
    out = poisoned(q)
    block_sparse_decode(q, k, v, idx, cnt, 16, None, starts, out=out, num_splits=2)
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16, seq_start=starts))
    assert rel_err(out, ref) < 1e-5
    assert torch.count_nonzero(out[1, 3:]) == 0


def test_dispatch_uses_decode_for_one_query_and_matches_sdpa():
    gen = torch.Generator().manual_seed(2)
    q, k, v = random_qkv(1, 4, 2, 1, 45, 16, torch.float32, gen)
    idx, cnt = dense_block_index(1, 1, 1, 45, 16)
    out = block_sparse_attention_triton(q, k, v, BlockLists(idx, cnt, 16), out=poisoned(q))
    dense = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert rel_err(out, dense) < 1e-5


@pytest.mark.parametrize("b", [16, 32], ids=["b16", "b32"])
def test_decode_gathers_small_blocks_and_never_reads_padding(b):
    """Blocks of 16/32 tokens gathered into 64-key steps, slices cut in whole steps (splits that
    do not divide the list), a partial last block, and padding that crosses a block: the keys
    before seq_start and the cache's room past Lk are NaN, so reading one shows."""
    gen = torch.Generator().manual_seed(b)
    lk = 7 * b + 5
    q, k, v = random_qkv(2, 8, 2, 1, lk, 32, torch.float32, gen)
    idx, cnt = random_block_index(2, 2, 1, lk, b, 0.7, gen)
    starts = torch.tensor([b + 3, 0])
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b, seq_start=starts))
    k, v = with_spare_rows(k, 9), with_spare_rows(v, 9)
    k[0, :, : b + 3] = float("nan")
    v[0, :, : b + 3] = float("nan")
    for splits in (1, 2, 5):
        out = poisoned(q)
        block_sparse_decode(q, k, v, idx, cnt, b, None, starts, out=out, num_splits=splits)
        assert rel_err(out, ref) < 1e-5
