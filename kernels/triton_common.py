"""The online-softmax walk over one index list, shared by the Triton prefill and decode kernels.

Both kernels walk a slice [lo, hi) of one sorted list for a tile of query rows (prefill:
consecutive queries; decode: the query heads that share a KV head) and fold each step of BLOCK_N
keys into the running max m_i, normaliser l_i and accumulator acc (fp32, exp2 with the scale
pre-multiplied by log2(e)). A row that saw no key keeps m_i = -inf and l_i = 0; callers turn that
into a zero output.

Steps, in key units along the list: entry t covers list positions [t*b, (t+1)*b) for block size b,
a step covers BLOCK_N of them. Blocks smaller than BLOCK_N are gathered (one step loads
BLOCK_N // b listed blocks: kpos = idx[t + lane // b] * b + lane % b); larger ones take
b // BLOCK_N sub-steps.

Masks only at the edges: since a list is sorted, its entries fall into at most four runs (from
`list_runs`): blocks wholly in the left padding (skipped), the one crossing seq_start (masked),
full blocks (no mask at all: inside [seq_start, Lk) and, causally, wholly at or before the tile's
first query), and the edge (diagonal, partial last block, and what does not fill a whole gathered
step; masked). The full run is a software-pipelined `tl.range` loop.
Rows past the tile's real rows are computed on zeros and never stored, so nothing masks them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def list_runs(
    idx_row,
    sik,
    lo,
    hi,
    skip_below,  # ids below it lie wholly before seq_start
    lead_below,  # ids below it start before seq_start
    full_below,  # ids below it (and not lead) need no mask
    HAS_SS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Ends of the skip / lead / full runs of the sorted slice [lo, hi): counts of ids below each
    bound, one vector pass over the slice (reduced once at the end)."""
    n_skip = tl.zeros([CHUNK], dtype=tl.int32)
    n_lead = tl.zeros([CHUNK], dtype=tl.int32)
    n_full = tl.zeros([CHUNK], dtype=tl.int32)
    for c in range(lo, hi, CHUNK):
        t = c + tl.arange(0, CHUNK)
        ids = tl.load(idx_row + t * sik, mask=t < hi, other=0x7FFFFFFF)
        n_full += (ids < full_below).to(tl.int32)
        if HAS_SS:
            n_skip += (ids < skip_below).to(tl.int32)
            n_lead += (ids < lead_below).to(tl.int32)
    return lo + tl.sum(n_skip, 0), lo + tl.sum(n_lead, 0), lo + tl.sum(n_full, 0)


@triton.jit
def _dot(a, b, IEEE_DOT: tl.constexpr):
    """fp32 inputs: exact fp32 products (the tests' tolerance), not tf32."""
    return tl.dot(a, b, input_precision="ieee") if IEEE_DOT else tl.dot(a, b)


@triton.jit
def _step_keys(
    idx_row,
    sik,
    p0,
    hi,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    WIDE: tl.constexpr,
):
    """Key positions [BLOCK_N] of the step at list position p0, and the lanes inside the slice.
    int32 unless WIDE: 64-bit offsets cost ~15% more registers in the loop (sm90, d 128)."""
    lanes = tl.arange(0, BLOCK_N)
    if BLOCK_SIZE >= BLOCK_N:  # one block, sub-step p0 % b: contiguous keys
        kb = tl.load(idx_row + (p0 // BLOCK_SIZE) * sik)
        if WIDE:
            kb = kb.to(tl.int64)
        kpos = kb * BLOCK_SIZE + p0 % BLOCK_SIZE + lanes
        live = lanes < BLOCK_N
    else:  # BLOCK_N // b blocks gathered, lanes past the slice's end masked
        t = p0 // BLOCK_SIZE + lanes // BLOCK_SIZE
        live = t < hi
        if MASKED:
            kb = tl.load(idx_row + t * sik, mask=live, other=0)
        else:
            kb = tl.load(idx_row + t * sik)
        if WIDE:
            kb = kb.to(tl.int64)
        kpos = kb * BLOCK_SIZE + lanes % BLOCK_SIZE
    return kpos, live


@triton.jit
def _attend_run(  # many parameters: a Triton helper takes each stride and constexpr as a scalar
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
    qpos,
    qk_scale,
    dims,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SS: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    WIDE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Entries [lo, hi) in steps of BLOCK_N keys; MASKED checks bounds, padding, causality."""
    dmask = dims < HEAD_DIM
    for p0 in tl.range(lo * BLOCK_SIZE, hi * BLOCK_SIZE, BLOCK_N, num_stages=NUM_STAGES):
        kpos, live = _step_keys(idx_row, sik, p0, hi, BLOCK_SIZE, BLOCK_N, MASKED, WIDE)
        k_ptr = k_base + kpos[:, None] * skl + dims[None, :] * skd
        v_ptr = v_base + kpos[:, None] * svl + dims[None, :] * svd
        if MASKED:
            k_ok = live & (kpos < LK)
            if HAS_SS:
                k_ok = k_ok & (kpos >= start)
            kv_mask = k_ok[:, None] & dmask[None, :]
            k = tl.load(k_ptr, mask=kv_mask, other=0.0)
            v = tl.load(v_ptr, mask=kv_mask, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            k = tl.load(k_ptr, mask=dmask[None, :], other=0.0)
            v = tl.load(v_ptr, mask=dmask[None, :], other=0.0)
        else:
            k = tl.load(k_ptr)
            v = tl.load(v_ptr)
        qk = _dot(q, tl.trans(k), IEEE_DOT) * qk_scale
        if MASKED:
            ok = k_ok[None, :]
            if CAUSAL:
                ok = ok & (kpos[None, :] <= qpos[:, None])
            qk = tl.where(ok, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
        else:  # every score is finite: m_new is, and exp2(-inf - m_new) = 0 starts a row
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = m_new
        p = tl.math.exp2(qk - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE_DOT)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def attend_list(  # many parameters: a Triton helper takes each stride and constexpr as a scalar
    q,
    m_i,
    l_i,
    acc,
    idx_row,
    sik,
    lo,
    hi,
    full_below,
    k_base,
    v_base,
    skl,
    skd,
    svl,
    svd,
    LK,
    start,
    qpos,  # [ROWS] query positions (read when CAUSAL)
    qk_scale,
    dims,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SS: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    WIDE: tl.constexpr,  # 64-bit key offsets (Lk * row stride may pass 2**31)
    NUM_STAGES: tl.constexpr,
):
    """Entries [lo, hi) of a sorted list: the seq_start crossing and the edge masked, the full run
    (ids below full_below, whole gathered steps) unmasked and pipelined."""
    per = (BLOCK_N + BLOCK_SIZE - 1) // BLOCK_SIZE  # entries a step (powers of two)
    n_skip, n_lead, n_full = list_runs(
        idx_row, sik, lo, hi, start // BLOCK_SIZE, tl.cdiv(start, BLOCK_SIZE), full_below,
        HAS_SS, 64,
    )  # fmt: skip
    f1 = tl.maximum(n_lead, n_full)
    f1 = n_lead + (f1 - n_lead) // per * per  # what fills no whole step joins the edge
    if HAS_SS:
        m_i, l_i, acc = _attend_run(
            q, m_i, l_i, acc, idx_row, sik, n_skip, n_lead, k_base, v_base, skl, skd, svl, svd,
            LK, start, qpos, qk_scale, dims, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, True, CAUSAL,
            HAS_SS, IEEE_DOT, WIDE, 1,
        )  # fmt: skip
    m_i, l_i, acc = _attend_run(
        q, m_i, l_i, acc, idx_row, sik, n_lead, f1, k_base, v_base, skl, skd, svl, svd,
        LK, start, qpos, qk_scale, dims, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, False, CAUSAL,
        HAS_SS, IEEE_DOT, WIDE, NUM_STAGES,
    )  # fmt: skip
    m_i, l_i, acc = _attend_run(
        q, m_i, l_i, acc, idx_row, sik, f1, hi, k_base, v_base, skl, skd, svl, svd,
        LK, start, qpos, qk_scale, dims, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, True, CAUSAL,
        HAS_SS, IEEE_DOT, WIDE, 1,
    )  # fmt: skip
    return m_i, l_i, acc
