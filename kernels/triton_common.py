"""The one online-softmax inner loop shared by the Triton prefill and decode kernels.

Both kernels walk a slice [lo, hi) of one index list and, per listed key block, load BLOCK_N keys
at a time, score them against a tile of query rows (prefill: consecutive queries; decode: the
query heads that share a KV head), mask what is out of range, before the left-padding start,
after the query (causal), or on padding rows, and fold the block into the running max m_i,
normaliser l_i and accumulator acc (fp32, exp2 with the scale pre-multiplied by log2(e)). A row
that saw no key keeps m_i = -inf and l_i = 0; callers turn that into a zero output.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_listed_blocks(
    q,
    m_i,
    l_i,
    acc,
    idx_row,
    sik,
    lo,
    hi,
    k_base,
    v_base,
    skl,
    skd,
    svl,
    svd,
    LK,
    start,
    qpos,  # [ROWS] query positions (read when CAUSAL)
    row_ok,  # [ROWS] real rows of the tile
    qk_scale,
    dims,
    dmask,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    for t in range(lo, hi):
        kb = tl.load(idx_row + t * sik).to(tl.int64)
        for s in range(0, BLOCK_SIZE // BLOCK_N):
            kpos = kb * BLOCK_SIZE + s * BLOCK_N + tl.arange(0, BLOCK_N)
            k_ok = (kpos < LK) & (kpos >= start)
            k = tl.load(
                k_base + kpos[:, None] * skl + dims[None, :] * skd,
                mask=k_ok[:, None] & dmask[None, :],
                other=0.0,
            )
            if IEEE_DOT:
                qk = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                qk = tl.dot(q, tl.trans(k))
            qk = qk * qk_scale
            ok = k_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                ok = ok & (kpos[None, :] <= qpos[:, None])
            qk = tl.where(ok, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
            p = tl.math.exp2(qk - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_base + kpos[:, None] * svl + dims[None, :] * svd,
                mask=k_ok[:, None] & dmask[None, :],
                other=0.0,
            )
            if IEEE_DOT:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    return m_i, l_i, acc
