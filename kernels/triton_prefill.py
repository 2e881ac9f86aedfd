"""Triton block-sparse prefill: flash attention over each query tile's key-block list.

One program per (BLOCK_M query rows, batch * query head); a list serves QUERY_TILE rows (one block,
or a query tile of several), so QUERY_TILE // BLOCK_M programs share it. The program loads its
query rows once and walks only the listed key blocks (kernels/triton_common.py's attend_list,
shared with decode): full blocks without masks in a pipelined loop, masks only on the edge
(diagonal, partial last block, seq_start crossing), small blocks gathered into wide key steps.
Online softmax in fp32 with exp2; causal and padding masks from token positions, so chunked
prefill (Lq < Lk) and partial blocks need no special case; GQA by indexing the shared KV head
(never repeating K/V). Programs run the longest lists (last query tiles) first. The loop's shape
follows MInference's block_sparse_flash_attention (index list + count per query block); the code
is ours. Conventions: kernels/reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import attend_list


@triton.jit
def block_sparse_prefill_kernel(  # long, many parameters: one Triton kernel (its loop in registers); strides, constexprs as scalars
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
    QUERY_TILE: tl.constexpr,  # query rows per list (a multiple of BLOCK_SIZE)
    BLOCK_M: tl.constexpr,  # query rows per program; divides QUERY_TILE
    BLOCK_N: tl.constexpr,  # keys per inner step (any power of two >= 16)
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    CAUSAL: tl.constexpr,
    HAS_SS: tl.constexpr,
    IEEE_DOT: tl.constexpr,  # fp32 inputs: exact fp32 dots instead of tf32
    WIDE: tl.constexpr,  # 64-bit key offsets
    NUM_STAGES: tl.constexpr,  # software-pipeline depth of the full-block loop
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest lists first
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)  # 64-bit offsets: long caches overflow int32 strides
    g = h // (H // G)
    kvh = h // (H // HKV)
    tile = pid_m // (QUERY_TILE // BLOCK_M)  # index-list row
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q0 = LK - LQ + pid_m * BLOCK_M  # queries are the last LQ positions
    qpos = q0 + tl.arange(0, BLOCK_M)
    q = tl.load(
        Q + b * sqb + h * sqh + rows[:, None].to(tl.int64) * sql + dims[None, :] * sqd,
        mask=(rows < LQ)[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
    )
    start = 0
    if HAS_SS:
        start = tl.load(SS + b)
    cnt = tl.load(CNT + b * scb + g * scg + tile * sci)
    # unmasked: blocks ending at or before the first query (causal), else all but a partial last
    full_below = (q0 + 1) // BLOCK_SIZE if CAUSAL else LK // BLOCK_SIZE

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i, l_i, acc = attend_list(
        q, m_i, l_i, acc, IDX + b * sib + g * sig + tile * sii, sik, 0, cnt, full_below,
        K + b * skb + kvh * skh, V + b * svb + kvh * svh, skl, skd, svl, svd, LK, start, qpos,
        qk_scale, dims, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, CAUSAL, HAS_SS, IEEE_DOT,
        WIDE, NUM_STAGES,
    )  # fmt: skip
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that saw no key returns zeros
    tl.store(
        Out + b * sob + h * soh + rows[:, None].to(tl.int64) * sol + dims[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=(rows < LQ)[:, None] & (dims < HEAD_DIM)[None, :],
    )
