"""Triton prefill kernel (interpreter) against the torch oracle; outputs poisoned with NaN first."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

from sketchwalk.kernels.reference import block_sparse_attention_reference, dense_block_index
from sketchwalk.kernels.testing import (
    patterned_block_index,
    poisoned,
    random_block_index,
    random_qkv,
    rel_err,
)
from sketchwalk.kernels.triton_dispatch import block_sparse_prefill

TOL = {torch.float32: 1e-5, torch.float16: 5e-3}

# (batch, heads, kv_heads, lq, lk, head_dim, block, groups) -- small: the interpreter is slow
SHAPES = [
    (1, 3, 1, 45, 45, 16, 16, 1),  # GQA 3, partial last block
    (2, 4, 1, 37, 50, 16, 16, 2),  # ratio 4, batch 2 with different lists, Lq < Lk unaligned
    (1, 2, 2, 32, 64, 32, 16, 2),  # ratio 1, G = Hkv, chunk aligned to blocks
    (1, 4, 2, 40, 40, 24, 32, 4),  # head dim not a power of two, block 32, G = H
]


def _seed(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_prefill_matches_reference(shape, dtype):
    bsz, h, hkv, lq, lk, d, b, g = shape
    gen = _seed(shape, dtype)
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, dtype, gen)
    idx, cnt = random_block_index(bsz, g, lq, lk, b, 0.5, gen)
    out = poisoned(q)
    res = block_sparse_prefill(q, k, v, idx, cnt, b, out=out)
    assert res is out and not out.isnan().any()  # every element written
    ref = block_sparse_attention_reference(q, k, v, idx, cnt, b)
    assert rel_err(out, ref) < TOL[dtype]


def test_prefill_padding_noncausal_and_patterns():
    gen = _seed("pad")
    q, k, v = random_qkv(2, 4, 2, 40, 48, 16, torch.float32, gen)
    idx, cnt = patterned_block_index(2, 1, 40, 48, 16, gen, sink=1, window=1, extra=1)
    starts = torch.tensor([0, 19])
    for causal in (True, False):
        out = poisoned(q)
        block_sparse_prefill(q, k, v, idx, cnt, 16, causal, None, starts, out=out)
        ref = block_sparse_attention_reference(q, k, v, idx, cnt, 16, causal, None, starts)
        assert rel_err(out, ref) < 1e-5


def test_prefill_diagonal_only_empty_rows_and_scale():
    gen = _seed("diag")
    q, k, v = random_qkv(1, 2, 1, 48, 48, 16, torch.float32, gen)
    idx = torch.arange(3, dtype=torch.int32).view(1, 1, 3, 1)
    cnt = torch.tensor([[[1, 0, 1]]], dtype=torch.int32)
    out = poisoned(q)
    block_sparse_prefill(q, k, v, idx, cnt, 16, True, 0.3, out=out)
    ref = block_sparse_attention_reference(q, k, v, idx, cnt, 16, True, 0.3)
    assert rel_err(out, ref) < 1e-5
    assert torch.count_nonzero(out[:, :, 16:32]) == 0 and torch.count_nonzero(out[:, :, :16]) > 0


def test_prefill_density_one_is_sdpa():
    gen = _seed("dense")
    q, k, v = random_qkv(1, 3, 1, 48, 48, 32, torch.float32, gen)
    idx, cnt = dense_block_index(1, 1, 48, 48, 16)
    out = block_sparse_prefill(q, k, v, idx, cnt, 16, out=poisoned(q))
    dense = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert rel_err(out, dense) < 1e-5


def test_prefill_strided_output_and_bf16_dispatch():
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    gen = _seed("bf16")
    q, k, v = random_qkv(1, 3, 1, 32, 32, 16, torch.bfloat16, gen)
    idx, cnt = dense_block_index(1, 1, 32, 32, 16)
    out = poisoned(q.transpose(1, 2)).transpose(1, 2)  # [B, L, H, D] storage, as transformers wants
    res = block_sparse_attention_triton(q, k, v, idx, cnt, 16, out=out)
    assert res is out and res.dtype == torch.bfloat16 and not out.isnan().any()
    assert rel_err(out, block_sparse_attention_reference(q, k, v, idx, cnt, 16)) < 1e-2


@pytest.mark.parametrize("d,b", [(64, 64), (128, 128)], ids=["d64-b64", "d128-b128"])
def test_prefill_real_tile_sizes(d, b):
    """The sizes real models run (head dim 64/128, blocks 64/128), GQA 2, partial last block."""
    gen = _seed("real", d, b)
    lq = lk = 2 * b + 37
    q, k, v = random_qkv(1, 4, 2, lq, lk, d, torch.float16, gen)
    idx, cnt = random_block_index(1, 2, lq, lk, b, 0.6, gen)
    out = poisoned(q)
    block_sparse_prefill(q, k, v, idx, cnt, b, out=out)
    assert not out.isnan().any()
    assert rel_err(out, block_sparse_attention_reference(q, k, v, idx, cnt, b)) < TOL[torch.float16]


def test_query_tiles_match_reference():
    """One list per tile of 2 query blocks (the Triton path repeats each tile's list per block)."""
    from sketchwalk.kernels.reference import tiles_of_rows
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    gen = _seed("tiles")
    q, k, v = random_qkv(1, 4, 2, 70, 70, 16, torch.float32, gen)
    idx, cnt = random_block_index(1, 2, 70, 70, 16, 0.5, gen)
    t_idx, t_cnt = tiles_of_rows(idx, cnt, 2, 5)
    out = block_sparse_attention_triton(q, k, v, t_idx, t_cnt, 16, query_block=32)
    ref = block_sparse_attention_reference(q, k, v, t_idx, t_cnt, 16, query_block=32)
    assert rel_err(out, ref) < 1e-5
