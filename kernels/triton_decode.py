"""Triton block-sparse decode: split-K flash decoding over the selected key blocks.

One query token per sequence. A program owns every query head that shares one KV head and one index
list (stacked as the rows of one tile, so each K/V block is read once for all of them: the arithmetic
intensity GQA allows) and one slice of that list. Slices are cut per sequence from its own count, in
whole gathered steps, so a batch may mix long and short lists. Each slice writes a normalised
partial output plus its log-sum-exp; a second small kernel merges the slices (the flash-decoding
combine). Idea from Flash-Decoding (Dao et al. 2023) and flash-linear-attention's split kernels; the
code is ours. The walk is kernels/triton_common.py's attend_list, shared with prefill: the query is
the last position, so only a partial last block and the seq_start crossing take masks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import attend_list


@triton.jit
def block_sparse_decode_split_kernel(  # long, many parameters: one Triton kernel (its loop in registers); strides, constexprs as scalars
    Q,
    K,
    V,
    OP,  # [B, H, S, BLOCK_D] fp32 partial outputs
    LP,  # [B, H, S] fp32 partial log2-sum-exp
    IDX,
    CNT,
    SS,
    sqb,
    sqh,
    sqd,
    skb,
    skh,
    skl,
    skd,
    svb,
    svh,
    svl,
    svd,
    sib,
    sig,
    sik,
    scb,
    scg,
    H,
    G,
    HKV,
    LK,
    qk_scale,
    NUM_SPLITS: tl.constexpr,
    HEADS: tl.constexpr,  # query heads per program (share KV head and index list)
    BLOCK_H: tl.constexpr,  # HEADS rounded up to a tile size tl.dot accepts
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SS: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    WIDE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    split = tl.program_id(0)
    bu = tl.program_id(1)
    units = H // HEADS
    b = (bu // units).to(tl.int64)
    u = bu % units
    h0 = u * HEADS
    g = h0 // (H // G)
    kvh = h0 // (H // HKV)
    hs = h0 + tl.arange(0, BLOCK_H)
    h_ok = tl.arange(0, BLOCK_H) < HEADS
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM

    q = tl.load(
        Q + b * sqb + hs[:, None].to(tl.int64) * sqh + dims[None, :] * sqd,
        mask=h_ok[:, None] & dmask[None, :],
        other=0.0,
    )
    start = 0
    if HAS_SS:
        start = tl.load(SS + b)
    cnt = tl.load(CNT + b * scb + g * scg)
    step = (BLOCK_N + BLOCK_SIZE - 1) // BLOCK_SIZE  # entries a gathered step
    per = tl.cdiv(tl.cdiv(cnt, NUM_SPLITS), step) * step  # slices of whole steps
    lo = split * per
    hi = tl.minimum(lo + per, cnt)
    idx_row = IDX + b * sib + g * sig
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    # one query at LK - 1: keys in range are causal (CAUSAL off; qpos unused)
    m_i, l_i, acc = attend_list(
        q, m_i, l_i, acc, idx_row, sik, lo, hi, LK // BLOCK_SIZE, k_base, v_base, skl, skd, svl,
        svd, LK, start, hs, qk_scale, dims, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, False, HAS_SS,
        IEEE_DOT, WIDE, NUM_STAGES,
    )  # fmt: skip
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    lse = tl.where(
        l_i == 0.0, float("-inf"), m_i + tl.math.log2(tl.where(l_i == 0.0, 1.0, l_i))
    )  # empty slice: weight 0
    row = (b * H + hs) * NUM_SPLITS + split
    tl.store(OP + row[:, None] * BLOCK_D + dims[None, :], out, mask=h_ok[:, None])
    tl.store(LP + row, lse, mask=h_ok)


@triton.jit
def block_sparse_decode_combine_kernel(  # many parameters: Triton kernels take each stride and constexpr as a scalar
    OP,
    LP,
    Out,
    sob,
    soh,
    sod,
    H,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge the split partials of one (batch, head) by their log2-sum-exp."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < NUM_SPLITS
    dims = tl.arange(0, BLOCK_D)
    lse = tl.load(LP + bh * NUM_SPLITS + splits, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m_safe)
    part = tl.load(
        OP + (bh * NUM_SPLITS + splits)[:, None] * BLOCK_D + dims[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    den = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(den == 0.0, 1.0, den)
    tl.store(
        Out + b * sob + h * soh + dims * sod, out.to(Out.dtype.element_ty), mask=dims < HEAD_DIM
    )
