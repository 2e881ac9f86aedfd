"""The fast CPU path against the torch oracle on fresh random inputs of many shapes."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

from sketchwalk.kernels.cpu import block_sparse_attention_cpu
from sketchwalk.kernels.cpu_common import full_blocks
from sketchwalk.kernels.lists import BlockLists
from sketchwalk.kernels.reference import (
    block_sparse_attention_reference,
    dense_block_index,
    rows_of_tiles,
    tiles_of_rows,
)
from sketchwalk.kernels.testing import (
    patterned_block_index,
    random_block_index,
    random_qkv,
    rel_err,
    staircase_block_index,
    uneven_block_index,
    with_spare_rows,
)


@pytest.fixture(autouse=True, params=["0", "1"], ids=["torch", "C"])
def native(request, monkeypatch):
    """Every test twice: the torch path, and with the C kernels (kernels/native.py) where they
    apply (float32 decode; causal prefill with 16-multiple blocks, tiles and head dims)."""
    monkeypatch.setenv("SKETCHWALK_NATIVE", request.param)
    return request.param


# (batch, heads, kv_heads, lq, lk, head_dim, block, groups)
SHAPES = [
    (1, 9, 3, 300, 300, 64, 16, 1),  # SmolLM2 heads, partial last block
    (2, 8, 2, 200, 250, 32, 16, 2),  # chunked prefill, Lq < Lk, offset not block aligned
    (1, 4, 4, 130, 130, 32, 32, 4),  # GQA ratio 1, G = Hkv
    (2, 12, 3, 97, 160, 16, 16, 3),  # ratio 4, odd lengths
    (2, 8, 2, 64, 64, 16, 16, 8),  # one list per query head (G > Hkv)
    (1, 6, 2, 70, 70, 16, 16, 6),  # G = H
    (1, 12, 4, 50, 80, 16, 16, 6),  # G straddles KV heads (6 groups, 4 KV heads)
    (2, 9, 3, 1, 301, 64, 16, 1),  # decode: one query, partial last block
    (1, 6, 3, 5, 90, 32, 16, 3),  # a few queries at the end (Lq < block)
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pattern", ["random", "sink_window", "staircase"])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_reference_fp32(shape, pattern, causal):
    bsz, h, hkv, lq, lk, d, b, g = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, pattern, causal)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, torch.float32, gen)
    if pattern == "random":
        idx, cnt = random_block_index(bsz, g, lq, lk, b, 0.4, gen)
    elif pattern == "staircase":
        idx, cnt = staircase_block_index(bsz, g, lq, lk, b, gen)
    else:
        idx, cnt = patterned_block_index(bsz, g, lq, lk, b, gen)
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, b), causal)
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b), causal)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("shape", SHAPES[:4] + SHAPES[7:8], ids=lambda s: "x".join(map(str, s)))
def test_left_padding_hides_keys(shape):
    bsz, h, hkv, lq, lk, d, b, g = shape
    gen = torch.Generator().manual_seed(7)
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, torch.float32, gen)
    idx, cnt = patterned_block_index(bsz, g, lq, lk, b, gen)
    starts = torch.tensor([5, 37][:bsz]) if bsz > 1 else torch.tensor([21])
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, b, seq_start=starts))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b, seq_start=starts))
    assert rel_err(out, ref) < 1e-5
    # changing the padded keys must not change anything
    k2 = k.clone()
    k2[0, :, : int(starts[0])] = 1e4
    out2 = block_sparse_attention_cpu(q, k2, v, BlockLists(idx, cnt, b, seq_start=starts))
    assert torch.equal(out, out2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    gen = torch.Generator().manual_seed(3)
    q, k, v = random_qkv(2, 9, 3, 260, 260, 64, dtype, gen)
    idx, cnt = patterned_block_index(2, 1, 260, 260, 32, gen)
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 32))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 32))
    assert out.dtype == dtype
    err = rel_err(out, ref)
    assert err < 1e-2
    assert err > 0  # really computed in low precision, not silently the reference


@pytest.mark.parametrize("lq,lk", [(256, 256), (200, 200), (77, 300), (1, 129)])
def test_density_one_is_dense_sdpa(lq, lk):
    gen = torch.Generator().manual_seed(lq + lk)
    q, k, v = random_qkv(2, 9, 3, lq, lk, 64, torch.float32, gen)
    idx, cnt = dense_block_index(2, 1, lq, lk, 64)
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 64))
    # SDPA's is_causal is top-left aligned; queries are the last lq positions, so build the mask
    mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert rel_err(out, dense) < 1e-5


def test_diagonal_only_and_empty_rows():
    gen = torch.Generator().manual_seed(11)
    b, lq = 16, 80
    q, k, v = random_qkv(1, 4, 2, lq, lq, 16, torch.float32, gen)
    nq = lq // b
    idx = torch.arange(nq, dtype=torch.int32).view(1, 1, nq, 1).repeat(1, 2, 1, 1)
    cnt = torch.ones(1, 2, nq, dtype=torch.int32)
    cnt[0, 1, 2] = 0  # group 1, block 2 keeps nothing: its rows must be zeros
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, b))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b))
    assert rel_err(out, ref) < 1e-5
    assert torch.count_nonzero(out[0, 2:4, 2 * b : 3 * b]) == 0
    assert torch.count_nonzero(out[0, :2, 2 * b : 3 * b]) > 0


def test_junk_duplicates_and_future_blocks_ignored():
    gen = torch.Generator().manual_seed(5)
    b, lq = 16, 96
    q, k, v = random_qkv(1, 2, 1, lq, lq, 16, torch.float32, gen)
    idx = torch.tensor([[[[0, 0, 2, 5, 99, -3]] * 6]], dtype=torch.int32)  # dup, future, junk
    cnt = torch.full((1, 1, 6), 4, dtype=torch.int32)
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, b))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, b))
    assert rel_err(out, ref) < 1e-5


def test_strided_inputs():
    """transformers hands over q/k/v as transposed views."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = random_qkv(1, 9, 3, 150, 150, 32, torch.float32, gen)
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    idx, cnt = patterned_block_index(1, 1, 150, 150, 16, gen)
    out = block_sparse_attention_cpu(qt, kt, vt, BlockLists(idx, cnt, 16))
    assert rel_err(out, block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16))) < 1e-5


@pytest.mark.parametrize("groups", [1, 3])
def test_decode_in_chunks_with_left_padding(monkeypatch, groups):
    """Decode gathers the kept blocks a few at a time; chunks merge by LSE, padding cuts some."""
    from sketchwalk.kernels import cpu_decode

    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")  # the torch path (C: test_decode_attention.py)
    monkeypatch.setattr(cpu_decode, "_DECODE_CHUNK_TOKENS", 48)  # 3 blocks of 16 per chunk
    monkeypatch.setattr(cpu_decode, "_DECODE_MASKED_MAX_TOKENS", 0)  # the gather path, not the mask
    gen = torch.Generator().manual_seed(groups)
    q, k, v = random_qkv(2, 9, 3, 1, 333, 32, torch.float32, gen)
    idx, cnt = random_block_index(2, groups, 1, 333, 16, 0.6, gen)
    starts = torch.tensor([0, 41])  # 41: inside block 2, which a chunk may include
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 16, seq_start=starts))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16, seq_start=starts))
    assert int(cnt.max()) > 6  # several chunks per row
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("groups", [1, 3, 9])
def test_decode_short_cache_masked_path(groups, monkeypatch):
    """Without C, short caches take one masked SDPA call: same result, padding hidden, empty
    lists zero."""
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    gen = torch.Generator().manual_seed(100 + groups)
    q, k, v = random_qkv(2, 9, 3, 1, 250, 32, torch.float32, gen)
    idx, cnt = random_block_index(2, groups, 1, 250, 16, 0.4, gen)
    cnt[1, -1] = 0  # the last group of sequence 1 keeps nothing
    starts = torch.tensor([0, 23])
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 16, seq_start=starts))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16, seq_start=starts))
    assert rel_err(out, ref) < 1e-5
    assert torch.count_nonzero(out[1, 9 - 9 // groups :]) == 0


# (batch, heads, kv_heads, lq, lk, head_dim, block, groups, blocks per query tile)
TILE_SHAPES = [
    (1, 9, 3, 300, 300, 64, 16, 1, 4),  # SmolLM2 heads, partial last tile
    (2, 8, 2, 200, 250, 32, 16, 2, 2),  # queries after a cache, offset not block aligned
    (1, 4, 4, 130, 130, 32, 16, 4, 8),  # one tile longer than half the sequence
    (2, 12, 3, 97, 160, 16, 16, 3, 4),
    (1, 6, 3, 5, 90, 32, 16, 3, 2),  # fewer queries than one block
    (1, 9, 3, 512, 512, 64, 16, 3, 4),  # whole tiles
]


@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pattern", ["random", "no_diagonal", "sink_window", "staircase"])
@pytest.mark.parametrize("causal", [True, False])
def test_query_tiles_match_reference(shape, pattern, causal):
    """One list per tile of r query blocks over fine key blocks, against the oracle, which in
    turn equals the per-block lists with each tile's list repeated."""
    bsz, h, hkv, lq, lk, d, b, g, r = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, pattern, causal)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, torch.float32, gen)
    if pattern in ("random", "no_diagonal"):
        idx, cnt = random_block_index(bsz, g, lq, lk, b, 0.4, gen, pattern == "random")
    elif pattern == "staircase":
        idx, cnt = staircase_block_index(bsz, g, lq, lk, b, gen)
    else:
        idx, cnt = patterned_block_index(bsz, g, lq, lk, b, gen)
    t_idx, t_cnt = tiles_of_rows(idx, cnt, r, -(-lk // b))
    out = block_sparse_attention_cpu(
        q, k, v, BlockLists(t_idx, t_cnt, b, query_block=r * b), causal
    )
    ref = block_sparse_attention_reference(
        q, k, v, BlockLists(t_idx, t_cnt, b, query_block=r * b), causal
    )
    assert rel_err(out, ref) < 1e-5
    r_idx, r_cnt = rows_of_tiles(t_idx, t_cnt, r, -(-lq // b))
    per_row = block_sparse_attention_reference(q, k, v, BlockLists(r_idx, r_cnt, b), causal)
    assert rel_err(ref, per_row) < 1e-6


def test_query_tiles_hide_left_padding():
    gen = torch.Generator().manual_seed(5)
    q, k, v = random_qkv(2, 9, 3, 200, 200, 32, torch.float32, gen)
    idx, cnt = patterned_block_index(2, 3, 200, 200, 16, gen)
    t_idx, t_cnt = tiles_of_rows(idx, cnt, 4, 13)
    lists = BlockLists(t_idx, t_cnt, 16, query_block=64, seq_start=torch.tensor([5, 70]))
    out = block_sparse_attention_cpu(q, k, v, lists)
    ref = block_sparse_attention_reference(q, k, v, lists)
    assert rel_err(out, ref) < 1e-5
    with pytest.raises(ValueError, match="multiple of the block size"):
        block_sparse_attention_cpu(q, k, v, BlockLists(t_idx, t_cnt, 16, query_block=24))


# (batch, heads, kv_heads, lq, lk, head_dim, block, groups, blocks per query tile)
UNEVEN_SHAPES = [
    (1, 9, 3, 640, 640, 32, 16, 3, 4),  # the default model's heads, tiles of 64 over blocks of 16
    (2, 8, 2, 500, 530, 16, 16, 2, 1),  # one list per block, queries after a cache
    (1, 4, 4, 300, 300, 16, 32, 4, 2),  # GQA ratio 1, partial last tile
    (2, 6, 2, 257, 257, 16, 16, 1, 4),  # one list for all heads, a 1-query last tile
    (1, 12, 3, 700, 700, 16, 64, 3, 1),  # the fast preset's 64-token blocks
]


@pytest.mark.parametrize("shape", UNEVEN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("padded", [False, True])
def test_uneven_counts_match_reference(shape, padded):
    """Rows with 1 block next to rows with nearly all, ragged windows, empty rows: the lists a
    real layer budget makes (windows shared by rows whose runs differ by a few blocks)."""
    bsz, h, hkv, lq, lk, d, b, g, r = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, padded)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, torch.float32, gen)
    idx, cnt = uneven_block_index(bsz, g, lq, lk, b, gen, r)
    starts = None
    if padded:
        starts = torch.randint(1, 3 * b, (bsz,), generator=gen)
    lists = BlockLists(idx, cnt, b, query_block=r * b, seq_start=starts)
    out = block_sparse_attention_cpu(q, k, v, lists)
    ref = block_sparse_attention_reference(q, k, v, lists)
    assert rel_err(out, ref) < 1e-5
    # as a model hands them over: transposed queries, K/V in a cache with room (NaN past the
    # filled rows); read in place, the very same result
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    kr, vr = with_spare_rows(k, 24), with_spare_rows(v, 24)
    moved = block_sparse_attention_cpu(qt, kr, vr, lists)
    assert torch.equal(moved, out)


SPLIT_SHAPES = [  # enough query tiles for up to 5 parts of at least 4 tiles, but the third
    (1, 9, 3, 1300, 1300, 16, 16, 3, 4),  # the default model's heads, a partial last tile
    (2, 8, 2, 500, 530, 16, 16, 2, 1),  # one list per block, queries after a cache
    (1, 4, 4, 700, 700, 16, 32, 4, 2),  # GQA ratio 1: 11 tiles, too few for 3 or 5 parts
]


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_split_over_threads_matches_reference(monkeypatch, shape, causal, workers):
    """A prefill cut into consecutive parts of query tiles, one thread each (queries after a
    cache, left padding, partial last tiles): the same result as one part and the reference."""
    from sketchwalk.kernels import cpu_prefill

    bsz, h, hkv, lq, lk, d, b, g, r = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, causal, workers)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, d, torch.float32, gen)
    idx, cnt = uneven_block_index(bsz, g, lq, lk, b, gen, r)
    starts = torch.randint(0, 2 * b, (bsz,), generator=gen)
    lists = BlockLists(idx, cnt, b, query_block=r * b, seq_start=starts)
    monkeypatch.setattr(cpu_prefill, "workers", lambda: workers)
    parts = cpu_prefill._split_points(cnt, workers)
    nq = cnt.shape[2]
    assert parts == sorted(set(parts)) and parts[0] == 0 and parts[-1] == nq
    assert (len(parts) > 2) == (workers > 1 and nq >= cpu_prefill._MIN_TILES_PER_PART * workers)
    out = block_sparse_attention_cpu(q, k, v, lists, causal)
    ref = block_sparse_attention_reference(q, k, v, lists, causal)
    assert rel_err(out, ref) < 1e-5
    # as a model hands them over: transposed queries, K/V in a cache with room (NaN past the
    # filled rows); read in place, the very same result
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    kr, vr = with_spare_rows(k, 24), with_spare_rows(v, 24)
    moved = block_sparse_attention_cpu(qt, kr, vr, lists, causal)
    assert torch.equal(moved, out)


def test_parts_leave_the_thread_count_as_they_found_it(monkeypatch):
    """Parts run with one intra-op thread each; afterwards the caller and any new thread (a new
    app session's) still get the caller's count."""
    import threading

    from sketchwalk.kernels import cpu_prefill

    monkeypatch.setattr(cpu_prefill, "workers", lambda: 2)
    gen = torch.Generator().manual_seed(3)
    q, k, v = random_qkv(1, 4, 2, 512, 512, 16, torch.float32, gen)
    idx, cnt = uneven_block_index(1, 2, 512, 512, 16, gen, 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert len(cpu_prefill._split_points(cnt, 2)) > 2
        block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 16))
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert torch.get_num_threads() == 2 and seen == [2]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("lk", [4500, 4607])
def test_decode_one_gather_matches_reference(groups, lk):
    """Caches past the masked path with few kept tokens: one gather for all heads and one SDPA.
    Junk, duplicate and out-of-range ids, uneven lists, a partial last block."""
    from sketchwalk.kernels import cpu_decode

    gen = torch.Generator().manual_seed(groups + lk)
    q, k, v = random_qkv(1, 9, 3, 1, lk, 32, torch.float32, gen)
    idx, cnt = random_block_index(1, groups, 1, lk, 16, 0.2, gen)
    idx[..., 1] = idx[..., 0]  # a duplicate
    idx[..., -1] = 10_000  # out of range, past the count or not
    nk = -(-lk // 16)
    idx[0, 0, 0, 0] = nk - 1  # the partial last block (lk 4607) in the first list
    assert cpu_decode._decode_one_gather(q, k, v, idx, cnt, 16, 32**-0.5, None) is not None
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 16), True)
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16), True)
    assert rel_err(out, ref) < 1e-5
    cnt_empty = cnt.clone()
    cnt_empty[0, -1] = 0  # an empty list: the chunked path, a zero output for its heads
    assert cpu_decode._decode_one_gather(q, k, v, idx, cnt_empty, 16, 32**-0.5, None) is None
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt_empty, 16), True)
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt_empty, 16), True)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize(
    "lq,lk,groups", [(300, 300, 3), (120, 333, 1), (1, 250, 3), (1, 4500, 1), (1, 4607, 3)]
)
def test_cache_with_room_matches_reference(lq, lk, groups):
    """K/V as a growing cache hands them over (the filled part of buffers with room, NaN beyond):
    prefill, queries after a cache, and each decode path read only the filled rows of each head."""
    from sketchwalk.kernels import cpu_decode

    gen = torch.Generator().manual_seed(lq + lk + groups)
    q, k, v = random_qkv(1, 9, 3, lq, lk, 32, torch.float32, gen)
    idx, cnt = random_block_index(1, groups, lq, lk, 16, 0.3, gen)
    kr, vr = with_spare_rows(k, 40), with_spare_rows(v, 40)
    assert not kr.is_contiguous()
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16))
    assert rel_err(block_sparse_attention_cpu(q, kr, vr, BlockLists(idx, cnt, 16)), ref) < 1e-5
    if lq == 1 and lk > cpu_decode._DECODE_MASKED_MAX_TOKENS:  # the one-gather path takes the views
        one = cpu_decode._decode_one_gather(q, kr, vr, idx, cnt, 16, 32**-0.5, None)
        assert one is not None and rel_err(one, ref) < 1e-5


def test_full_blocks_of_a_cache_with_room_is_a_view():
    gen = torch.Generator().manual_seed(5)
    _, k, _ = random_qkv(1, 1, 3, 1, 70, 8, torch.float32, gen)
    kr = with_spare_rows(k, 13)[0]
    blocks = full_blocks(kr, 4, 16)
    assert blocks.data_ptr() == kr.data_ptr()  # no copy of the cache
    assert torch.equal(blocks, k[0, :, :64].reshape(3, 4, 16 * 8))


@pytest.mark.parametrize(
    "bsz, h, hkv, lq, lk, b, g, pad, r",
    [(1, 9, 3, 512, 512, 32, 3, 0, 1), (2, 8, 2, 300, 300, 16, 2, 5, 1),
     (1, 4, 4, 200, 264, 16, 1, 0, 1), (1, 6, 2, 250, 250, 16, 6, 0, 1),
     (1, 9, 3, 700, 700, 16, 3, 0, 4), (2, 4, 2, 300, 364, 16, 2, 7, 2),
     (1, 4, 2, 19, 51, 16, 2, 0, 4), (1, 4, 2, 35, 99, 16, 2, 0, 2), (1, 4, 2, 48, 80, 16, 2, 0, 1),
     (1, 4, 2, 50, 50, 16, 2, 0, 4)],
)  # fmt: skip
def test_whole_rows_and_pieces_agree(monkeypatch, bsz, h, hkv, lq, lk, b, g, pad, r):
    """Short contexts: each row's blocks and diagonal blocks in one call (whole rows) or split
    into sinks, windows, middle and edges (pieces): the reference either way (a partial last
    tile, left padding, queries after a cache, groups across KV heads, tiles of r blocks)."""
    from sketchwalk.kernels import cpu_prefill

    gen = torch.Generator().manual_seed(zlib.crc32(repr((bsz, h, lq, lk, b, g, r)).encode()))
    q, k, v = random_qkv(bsz, h, hkv, lq, lk, 16, torch.float32, gen)
    idx, cnt = uneven_block_index(bsz, g, lq, lk, b, gen, r)
    starts = torch.tensor([pad] * bsz) if pad else None
    lists = BlockLists(idx, cnt, b, query_block=r * b, seq_start=starts)
    ref = block_sparse_attention_reference(q, k, v, lists)
    whole = block_sparse_attention_cpu(q, k, v, lists)
    monkeypatch.setattr(cpu_prefill, "_WHOLE_ROWS_MAX_KEYS", 0)
    pieces = block_sparse_attention_cpu(q, k, v, lists)
    assert rel_err(whole, ref) < 1e-5 and rel_err(pieces, ref) < 1e-5


@pytest.mark.parametrize("lq, lk", [(50, 50), (35, 99)])
def test_a_partial_tile_with_every_diagonal_block_listed_matches_reference(lq, lk):
    """One query tile (64 rows) shorter than a tile, listing every block it sees: its last
    diagonal block is partial, so it may not be gathered as a whole block."""
    gen = torch.Generator().manual_seed(lq + lk)
    q, k, v = random_qkv(1, 4, 2, lq, lk, 16, torch.float32, gen)
    nk = -(-lk // 16)
    idx = torch.arange(nk, dtype=torch.int32).expand(1, 2, 1, nk).contiguous()
    cnt = torch.full((1, 2, 1), nk, dtype=torch.int32)
    out = block_sparse_attention_cpu(q, k, v, BlockLists(idx, cnt, 16, query_block=64))
    ref = block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16, query_block=64))
    assert rel_err(out, ref) < 1e-5
