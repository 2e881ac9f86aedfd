"""Triton block-sparse prefill: flash attention over each query block's key-block list.

One program per (query tile, batch * query head). It loads its query tile once, then walks only the
key blocks listed for its (batch, head group, query block): online softmax in fp32 with exp2, causal
and padding masks from token positions (so chunked prefill, Lq < Lk, and partial blocks need no
special cases), GQA by indexing the shared KV head (never repeating K/V). The inner loop is
kernels/triton_common.py's, shared with decode. The shape of the loop
follows MInference's block_sparse_flash_attention idea (index list + count per query block); the
code is ours. Conventions: kernels/reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import attend_listed_blocks


@triton.jit
def block_sparse_prefill_kernel(
    Q,
    K,
    V,
    Out,
    IDX,
    CNT,
    SS,
    sqb,
    sqh,
    sql,
    sqd,
    skb,
    skh,
    skl,
    skd,
    svb,
    svh,
    svl,
    svd,
    sob,
    soh,
    sol,
    sod,
    sib,
    sig,
    sii,
    sik,
    scb,
    scg,
    sci,
    H,
    G,
    HKV,
    LQ,
    LK,
    qk_scale,  # softmax scale * log2(e): scores go straight into exp2
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # the selection's block size (tokens per index entry)
    BLOCK_M: tl.constexpr,  # query rows per program; divides BLOCK_SIZE
    BLOCK_N: tl.constexpr,  # keys per inner step; divides BLOCK_SIZE
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    CAUSAL: tl.constexpr,
    HAS_SS: tl.constexpr,
    IEEE_DOT: tl.constexpr,  # fp32 inputs: exact fp32 dots instead of tf32
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    g = h // (H // G)
    kvh = h // (H // HKV)
    qb = pid_m // (BLOCK_SIZE // BLOCK_M)  # query block = index-list row
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    row_ok = rows < LQ
    qpos = LK - LQ + rows  # queries are the last LQ positions

    q = tl.load(
        Q + b * sqb + h * sqh + rows[:, None] * sql + dims[None, :] * sqd,
        mask=row_ok[:, None] & dmask[None, :],
        other=0.0,
    )
    start = 0
    if HAS_SS:
        start = tl.load(SS + b)
    cnt = tl.load(CNT + b * scb + g * scg + qb * sci)
    idx_row = IDX + b * sib + g * sig + qb * sii
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i, l_i, acc = attend_listed_blocks(
        q, m_i, l_i, acc, idx_row, sik, 0, cnt, k_base, v_base, skl, skd, svl, svd, LK, start,
        qpos, row_ok, qk_scale, dims, dmask, BLOCK_SIZE, BLOCK_N, CAUSAL, IEEE_DOT,
    )  # fmt: skip
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that saw no key returns zeros
    tl.store(
        Out + b * sob + h * soh + rows[:, None] * sol + dims[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & dmask[None, :],
    )
