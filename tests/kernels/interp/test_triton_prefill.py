"""Triton prefill kernel (interpreter) against the torch oracle; outputs poisoned with NaN first.

Tile shapes are forced to the GPU's (kernels/triton_configs.py) so the interpreter walks the same
paths: unmasked full runs and masked edges, 16/32-token blocks gathered into 64/128-key steps,
64/128-token blocks in sub-steps, several programs per query tile."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.reference import (
    block_sparse_attention_reference,
    dense_block_index,
    rows_of_tiles,
    tiles_of_rows,
)
from sketchwalk.kernels.testing import (
    patterned_block_index,
    poisoned,
    random_block_index,
    random_qkv,
    rel_err,
    uneven_block_index,
    with_spare_rows,
)
from sketchwalk.kernels.triton_common import list_runs
from sketchwalk.kernels.triton_configs import PrefillConfig
from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton, block_sparse_prefill

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
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b))
    assert rel_err(out, ref) < TOL[dtype]


def test_prefill_padding_noncausal_and_patterns():
    gen = _seed("pad")
    q, k, v = random_qkv(2, 4, 2, 40, 48, 16, torch.float32, gen)
    idx, cnt = patterned_block_index(2, 1, 40, 48, 16, gen, sink=1, window=1, extra=1)
    starts = torch.tensor([0, 19])
    for causal in (True, False):
        out = poisoned(q)
        block_sparse_prefill(q, k, v, idx, cnt, 16, causal, None, starts, out=out)
        ref = block_sparse_attention_reference(
            q, k, v, BlockLists(idx, cnt, 16, seq_start=starts), causal, None
        )
        assert rel_err(out, ref) < 1e-5


def test_prefill_diagonal_only_empty_rows_and_scale():
    gen = _seed("diag")
    q, k, v = random_qkv(1, 2, 1, 48, 48, 16, torch.float32, gen)
    idx = torch.arange(3, dtype=torch.int32).view(1, 1, 3, 1)
    cnt = torch.tensor([[[1, 0, 1]]], dtype=torch.int32)
    out = poisoned(q)
    block_sparse_prefill(q, k, v, idx, cnt, 16, True, 0.3, out=out)
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16), True, 0.3)
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
    gen = _seed("bf16")
    q, k, v = random_qkv(1, 3, 1, 32, 32, 16, torch.bfloat16, gen)
    idx, cnt = dense_block_index(1, 1, 32, 32, 16)
    out = poisoned(q.transpose(1, 2)).transpose(1, 2)  # [B, L, H, D] storage, as transformers wants
    res = block_sparse_attention_triton(q, k, v, BlockLists(idx, cnt, 16), out=out)
    assert res is out and res.dtype == torch.bfloat16 and not out.isnan().any()
    assert rel_err(out, block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16))) < 1e-2


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
    assert (
        rel_err(out, block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b)))
        < TOL[torch.float16]
    )


def test_query_tiles_match_reference():
    """One list per tile of 2 query blocks, passed to the kernel as they are."""
    gen = _seed("tiles")
    q, k, v = random_qkv(1, 4, 2, 70, 70, 16, torch.float32, gen)
    idx, cnt = random_block_index(1, 2, 70, 70, 16, 0.5, gen)
    t_idx, t_cnt = tiles_of_rows(idx, cnt, 2, 5)
    out = block_sparse_attention_triton(
        q, k, v, BlockLists(t_idx, t_cnt, 16, query_block=32), out=poisoned(q)
    )
    ref = block_sparse_attention_reference(q, k, v, BlockLists(t_idx, t_cnt, 16, query_block=32))
    assert rel_err(out, ref) < 1e-5


@triton.jit
def _runs_kernel(IDX, CNT, OUT, BOUNDS, HAS_SS: tl.constexpr, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    lo = tl.load(BOUNDS + r * 5)
    hi = tl.load(BOUNDS + r * 5 + 1)
    n_skip, n_lead, n_full = list_runs(
        IDX + r * 300, 1, lo, hi, tl.load(BOUNDS + r * 5 + 2), tl.load(BOUNDS + r * 5 + 3),
        tl.load(BOUNDS + r * 5 + 4), HAS_SS, CHUNK,
    )  # fmt: skip
    tl.store(OUT + r * 3, n_skip)
    tl.store(OUT + r * 3 + 1, n_lead)
    tl.store(OUT + r * 3 + 2, n_full)


@pytest.mark.parametrize("has_ss", [True, False], ids=["padding", "no-padding"])
def test_list_runs_split_sorted_slices_where_masks_start(has_ss):
    """The ends of the skipped / masked-lead / unmasked runs are the counts of ids below each
    bound, within any slice, over several chunks, with junk past the slice's end."""
    gen = _seed("runs", has_ss)
    rows, bounds, want = [], [], []
    for _ in range(6):
        n = int(torch.randint(0, 150, (1,), generator=gen))
        ids = torch.randperm(290, generator=gen)[:n].sort().values
        row = torch.randint(0, 290, (300,), generator=gen)  # junk past the slice
        row[:n] = ids
        lo = int(torch.randint(0, n + 1, (1,), generator=gen))
        hi = int(torch.randint(lo, n + 1, (1,), generator=gen))
        skip, full = sorted(torch.randint(0, 300, (2,), generator=gen).tolist())
        lead = skip + 1
        sl = ids[lo:hi]
        counts = [int((sl < x).sum()) if has_ss else 0 for x in (skip, lead)]
        want.append([lo + counts[0], lo + counts[1], lo + int((sl < full).sum())])
        rows.append(row)
        bounds.append([lo, hi, skip, lead, full])
    idx = torch.stack(rows).to(torch.int32)
    out = torch.full((6, 3), -1, dtype=torch.int32)
    _runs_kernel[(6,)](idx, None, out, torch.tensor(bounds, dtype=torch.int32), has_ss, 32)
    assert out.tolist() == want


# (block, query tile, forced tiles, lq, lk, head_dim, heads, kv_heads, groups, padded)
GPU_TILES = [
    (16, 64, PrefillConfig(64, 64), 150, 150, 64, 2, 2, 2, False),  # 4 blocks gathered a step
    (16, 64, PrefillConfig(32, 128), 101, 170, 24, 4, 1, 1, True),  # 8 gathered, 2 programs/tile
    (32, 64, PrefillConfig(64, 128), 190, 190, 128, 4, 1, 4, False),  # default preset's shape
    (32, 128, PrefillConfig(64, 64), 170, 233, 80, 4, 4, 1, True),  # 4x tile, head dim 80
    (64, 64, PrefillConfig(64, 32), 150, 150, 64, 4, 1, 1, True),  # blocks cut into sub-steps
    (128, 128, PrefillConfig(128, 64), 300, 300, 128, 2, 2, 2, False),  # GPU tile at 128 rows
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", GPU_TILES, ids=lambda c: f"b{c[0]}-t{c[1]}-m{c[2].block_m}"
                         f"n{c[2].block_n}-d{c[5]}")  # fmt: skip
def test_gpu_tiles_full_runs_and_edges_match_reference(case, dtype):
    """Per-tile lists (empty, single-block and nearly dense rows among them) on GPU tile shapes:
    chunked prefill with Lq < Lk unaligned, partial last blocks, GQA 1/4; with padding, the keys
    before seq_start and the cache's room past Lk are NaN, so reading one shows."""
    b, tile, cfg, lq, lk, d, h, hkv, g, padded = case
    gen = _seed("gpu-tiles", case, dtype)
    q, k, v = random_qkv(2, h, hkv, lq, lk, d, dtype, gen)
    idx, cnt = uneven_block_index(2, g, lq, lk, b, gen, tile=tile // b)
    cnt[0, 0, 1] = 0  # an empty list (group 0, second tile): zeros
    starts = torch.tensor([0, 2 * b + 5]) if padded else None
    ref = block_sparse_attention_reference(
        q, k, v, BlockLists(idx, cnt, b, query_block=tile, seq_start=starts)
    )
    if padded:
        k, v = with_spare_rows(k, 7), with_spare_rows(v, 7)
        k[1, :, : 2 * b + 5] = float("nan")
        v[1, :, : 2 * b + 5] = float("nan")
    out = poisoned(q)
    block_sparse_prefill(
        q, k, v, idx, cnt, b, True, None, starts, out, query_block=tile, config=cfg
    )  # fmt: skip
    assert rel_err(out, ref) < TOL[dtype]
    assert torch.count_nonzero(out[0, : h // g, tile : 2 * tile]) == 0  # group 0's empty tile


@pytest.mark.parametrize("query_rows", [2, 4], ids=["2x", "4x"])
def test_tile_lists_equal_their_rows_lists(query_rows):
    """A tile's list run once per tile equals the same list repeated per query block: exact
    because causality trims each row. Non-causal too, with padding crossing a block."""
    gen = _seed("tile-rows", query_rows)
    b, lq = 16, 16 * query_rows * 2 + 9
    q, k, v = random_qkv(1, 4, 2, lq, lq, 32, torch.float32, gen)
    idx, cnt = uneven_block_index(1, 2, lq, lq, b, gen, tile=query_rows)
    r_idx, r_cnt = rows_of_tiles(idx, cnt, query_rows, -(-lq // b))
    starts = torch.tensor([21])
    for causal in (True, False):
        tiled = block_sparse_attention_triton(
            q,
            k,
            v,
            BlockLists(idx, cnt, b, query_block=b * query_rows, seq_start=starts),
            causal,
            None,
        )
        rows = block_sparse_attention_triton(
            q, k, v, BlockLists(r_idx, r_cnt, b, seq_start=starts), causal, None
        )
        ref = block_sparse_attention_reference(
            q,
            k,
            v,
            BlockLists(idx, cnt, b, query_block=b * query_rows, seq_start=starts),
            causal,
            None,
        )
        assert rel_err(tiled, ref) < 1e-5 and rel_err(rows, ref) < 1e-5


def test_bad_tiles_and_lists_are_one_line_value_errors():
    q, k, v = random_qkv(1, 2, 1, 40, 40, 16, torch.float32, _seed("bad"))
    idx, cnt = dense_block_index(1, 1, 40, 40, 16)
    with pytest.raises(ValueError, match="multiple of the block size"):
        block_sparse_prefill(q, k, v, idx, cnt, 16, query_block=24)
    with pytest.raises(ValueError, match="must divide the query tile"):
        block_sparse_prefill(q, k, v, idx, cnt, 16, config=PrefillConfig(32, 64))
    with pytest.raises(ValueError, match="power of two"):
        block_sparse_prefill(q, k, v, idx, cnt, 16, config=PrefillConfig(16, 48))
    with pytest.raises(ValueError, match="need 3 lists"):
        block_sparse_prefill(q, k, v, idx[:, :, :2], cnt[:, :, :2], 16)
