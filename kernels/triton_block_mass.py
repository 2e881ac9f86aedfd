"""The sampled estimator's block mass in one Triton launch: scores and per-key-block softmax mass
of the scored queries, pooled over each query block and a KV head's query heads, without ever
writing the score matrix.

One program per (query block i, batch x KV head, row split): its rows are the G query heads x the
scored queries of block i (a CSR row pointer built on the host from pos, which lives on the CPU,
so nothing waits on the device), query-major so an early split ends its keys early. Pass 1 walks
the visible keys once for each row's running max and normaliser (online softmax in exp2, as in
FlashAttention); pass 2 recomputes the scores and sums the probabilities per key block, pooled
over the rows (max, or a sum scaled by 1 / the block's real query count for "mean"). Row blocks
with more rows than one program holds (every query scored) split over programs that combine by
atomic max / add into a zeroed output (the masses are non-negative). The longest (last) row
blocks launch first. The torch reference: kernels/block_mass_reference.py.

CPU tensors run under the interpreter (TRITON_INTERPRET=1 before triton is imported); it misreads
bfloat16, so there bfloat16 scores run as float32 from bfloat16-rounded inputs (same products).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .block_mass_reference import check_block_mass_inputs, normalise_rows

LOG2E = 1.4426950408889634
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# many parameters: a Triton helper takes each pointer, stride and mask as a scalar
@triton.jit
def _masked_scores(q, k_base, kpos, skl, skr, dims, dmask, start, hi, rhi, row_ok, qk_scale,
                   IEEE_DOT: tl.constexpr):  # fmt: skip
    """Scores (log2 units) of the tile's rows against the keys kpos, -inf where a row does not
    see the key (before the span's start, past the row's own position or the span's end)."""
    k_ok = (kpos >= start) & (kpos < hi)
    kt = tl.load(
        k_base + kpos[None, :] * skl + dims[:, None] * skr,
        mask=dmask[:, None] & k_ok[None, :],
        other=0.0,
    )  # [BLOCK_R, BLOCK_N]
    qk = tl.dot(q, kt, input_precision="ieee") if IEEE_DOT else tl.dot(q, kt)
    ok = row_ok[:, None] & (kpos[None, :] >= start) & (kpos[None, :] < rhi[:, None])
    return tl.where(ok, qk * qk_scale, float("-inf"))


@triton.jit
def pooled_block_mass_kernel(  # long, many parameters: one Triton kernel (its loop in registers); strides, constexprs as scalars
    q_ptr, k_ptr, out_ptr, pos_ptr, rowptr_ptr, qv_ptr, start_ptr, end_ptr,
    sqb, sqh, sqs, sqr, skb, skh, skl, skr, sob, soh, sor, son, svb, svs,
    HKV, G, R, N, RDIM, qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, SPLITS: tl.constexpr,
    POOL_MAX: tl.constexpr, ATOMIC: tl.constexpr, IEEE_DOT: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    i = R - 1 - pid // SPLITS  # the longest rows first
    split = pid % SPLITS
    bi = (bh // HKV).to(tl.int64)
    kh = (bh % HKV).to(tl.int64)
    q0 = tl.load(rowptr_ptr + i)
    nq = tl.load(rowptr_ptr + i + 1) - q0
    start = tl.load(start_ptr + bi)
    end = tl.load(end_ptr + bi)

    t = split * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_in = t < nq * G
    qi = (q0 + t // G).to(tl.int64)
    head = kh * G + t % G
    qpos = tl.load(pos_ptr + qi, mask=row_in, other=0)
    qval = tl.load(qv_ptr + bi * svb + qi * svs, mask=row_in, other=0)
    row_ok = row_in & (qval != 0)
    rhi = tl.where(row_ok, tl.minimum(qpos + 1, end), 0)  # a row sees start .. rhi - 1
    hi = tl.max(rhi, 0)

    dims = tl.arange(0, BLOCK_R)
    dmask = dims < RDIM
    q = tl.load(
        q_ptr + bi * sqb + head[:, None] * sqh + qi[:, None] * sqs + dims[None, :] * sqr,
        mask=row_in[:, None] & dmask[None, :],
        other=0.0,
    )
    k_base = k_ptr + bi * skb + kh * skh

    # pass 1: each row's max and normaliser over its visible keys
    m_i = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], tl.float32)
    for kt in tl.range(start // BLOCK_N * BLOCK_N, hi, BLOCK_N, num_stages=NUM_STAGES):
        kpos = kt + tl.arange(0, BLOCK_N)
        qk = _masked_scores(q, k_base, kpos, skl, skr, dims, dmask, start, hi, rhi, row_ok,
                            qk_scale, IEEE_DOT)  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
        l_i = l_i * tl.math.exp2(m_i - m_safe) + tl.sum(tl.math.exp2(qk - m_safe[:, None]), 1)
        m_i = m_new
    m_i = tl.where(m_i == float("-inf"), 0.0, m_i)
    inv_l = tl.where(l_i > 0, 1.0 / tl.maximum(l_i, 1.0), 0.0)  # l >= 1 once a key is seen

    # "mean": the rows' sum over the block's real scored queries (all of them, not the split's)
    if POOL_MAX:
        weight = 1.0
    else:
        qs_all = tl.arange(0, BLOCK_Q)
        qv_all = tl.load(qv_ptr + bi * svb + (q0 + qs_all) * svs, mask=qs_all < nq, other=0)
        weight = 1.0 / tl.maximum(tl.sum((qv_all != 0).to(tl.float32), 0), 1.0)

    # pass 2: the probabilities again, summed per key block and pooled over the rows
    out_base = out_ptr + bi * sob + kh * soh + i.to(tl.int64) * sor
    if BLOCK_SIZE >= BLOCK_N:  # a key block spans BLOCK_SIZE // BLOCK_N tiles
        for kb in tl.range(start // BLOCK_SIZE, tl.cdiv(hi, BLOCK_SIZE), num_stages=NUM_STAGES):
            acc = tl.zeros([BLOCK_ROWS], tl.float32)
            for sub in tl.static_range(BLOCK_SIZE // BLOCK_N):
                kpos = kb * BLOCK_SIZE + sub * BLOCK_N + tl.arange(0, BLOCK_N)
                qk = _masked_scores(q, k_base, kpos, skl, skr, dims, dmask, start, hi, rhi, row_ok,
                                    qk_scale, IEEE_DOT)  # fmt: skip
                acc += tl.sum(tl.math.exp2(qk - m_i[:, None]), 1) * inv_l
            val = tl.max(acc, 0) if POOL_MAX else tl.sum(acc, 0) * weight
            if ATOMIC:
                if POOL_MAX:
                    tl.atomic_max(out_base + kb * son, val)
                else:
                    tl.atomic_add(out_base + kb * son, val)
            else:
                tl.store(out_base + kb * son, val)
    else:  # a tile spans BLOCK_N // BLOCK_SIZE key blocks
        for kt in tl.range(start // BLOCK_N * BLOCK_N, hi, BLOCK_N, num_stages=NUM_STAGES):
            kpos = kt + tl.arange(0, BLOCK_N)
            qk = _masked_scores(q, k_base, kpos, skl, skr, dims, dmask, start, hi, rhi, row_ok,
                                qk_scale, IEEE_DOT)  # fmt: skip
            p = tl.math.exp2(qk - m_i[:, None]) * inv_l[:, None]
            mass = tl.sum(
                tl.reshape(p, (BLOCK_ROWS, BLOCK_N // BLOCK_SIZE, BLOCK_SIZE)), 2
            )  # [BLOCK_ROWS, BLOCK_N // BLOCK_SIZE]
            val = tl.max(mass, 0) if POOL_MAX else tl.sum(mass, 0) * weight
            cols = kt // BLOCK_SIZE + tl.arange(0, BLOCK_N // BLOCK_SIZE)
            at = out_base + cols * son
            if ATOMIC:
                if POOL_MAX:
                    tl.atomic_max(at, val, mask=cols < N)
                else:
                    tl.atomic_add(at, val, mask=cols < N)
            else:
                tl.store(at, val, mask=cols < N)


def _kernel(kernel, device: torch.device):
    """The kernel, after checking it can run on `device` (CPU tensors need the interpreter),
    as kernels/triton_dispatch.py does."""
    if device.type != "cuda":
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(kernel, InterpretedFunction):
            raise RuntimeError(
                "Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before triton is "
                "imported; use kernels.cpu_block_mass otherwise"
            )
    return kernel


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def _tile(value: int | None, default: int, name: str) -> int:
    if value is None:
        return default
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    return value


def tiles(
    rows: int, r: int, block_rows: int | None = None, block_n: int | None = None
) -> tuple[int, int, int, int]:
    """(BLOCK_ROWS, BLOCK_N, BLOCK_R, splits) of a launch whose largest row block holds `rows`
    rows (query heads x scored queries) of sketch width r: wide sketches get fewer rows a
    program, a row block with more rows than a program holds splits over programs."""
    br = max(16, _pow2(r))
    cap = 128 if br <= 32 else 64 if br <= 64 else 32
    bm = _tile(block_rows, max(16, min(_pow2(rows), cap)), "block_rows")
    bn = _tile(block_n, 64, "block_n")
    return bm, bn, br, -(-rows // bm)


def block_mass_work(
    pos: torch.Tensor,
    lk: int,
    block_size: int,
    heads: int,
    kv_heads: int,
    r: int,
    batch: int = 1,
    block_rows: int | None = None,
    block_n: int | None = None,
) -> dict[str, int]:
    """What one launch of pooled_block_mass_kernel computes, counted from its grid and loop
    bounds (no padding keys, one span of real keys from 0): score multiply-adds (tl.dot, padded
    tiles included) and exponentials (exp2 elements), for queries at positions pos [S] (CPU)
    against lk keys. Pass 1 runs every key tile up to the row block's last query (a tile's
    scores, then one exp2 a score and one a row); pass 2 the same tiles again (one exp2 a
    score)."""
    gh, b = heads // kv_heads, block_size
    blk = pos.to(torch.int64) // b
    rows_per_block = torch.bincount(blk - blk[0])
    bm, bn, br, splits = tiles(gh * int(rows_per_block.max()), r, block_rows, block_n)
    macs = exps = 0
    for i in range(int(blk[0]), int(blk[-1]) + 1):
        last = pos[blk == i]
        if last.numel() == 0:
            continue
        hi = min(int(last.max()) + 1, lk)
        t1 = -(-hi // bn)
        t2 = -(-hi // b) * (b // bn) if b >= bn else t1
        macs += (t1 + t2) * bm * bn * br
        exps += t1 * (bm * bn + bm) + t2 * bm * bn
    programs = splits * batch * kv_heads
    return {"macs": macs * programs, "exps": exps * programs}


def dense_attention_work(length: int, heads: int, head_dim: int, batch: int = 1) -> dict[str, int]:
    """A causal dense attention layer's work without padding: each of the T(T+1)/2 visible
    query-key pairs of every head costs head_dim multiply-adds for its score and head_dim for
    its value, and one exponential."""
    pairs = batch * heads * length * (length + 1) // 2
    return {"macs": 2 * head_dim * pairs, "exps": pairs}


def pooled_block_mass_triton(  # many parameters: the block_mass op's, plus tile overrides
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    pool: str = "max",
    dtype: torch.dtype = torch.bfloat16,
    *,
    block_rows: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """kernels/cpu_block_mass.py sampled_block_mass pooled over each KV head's G query heads (amax for
    pool "max", sum for "mean"), before row normalisation: float32 [B, Hkv, R, n] for the query
    blocks pos[0] // b .. pos[-1] // b and key blocks 0 .. ceil(Lk / b) - 1; contract and maths
    as kernels/block_mass_reference.py pooled_block_mass_reference (k_valid: one span of real
    keys per sequence). One launch, plus a few small torch ops, whatever the length.

    qs [B, H, S, r] sketched queries at strictly ascending positions pos [S] (a CPU integer
    tensor; q_valid [B, S]); ks [B, Hkv, Lk, r] sketched keys (k_valid [B, Lk]); dtype: of the
    score product (float32, float16, bfloat16), the softmax and masses are float32.
    block_rows / block_n: tile overrides (rows per program, keys per tile; powers of two >= 16)
    for tests; a row block with more than block_rows rows splits over programs."""
    check_block_mass_inputs(qs, q_valid, pos, ks, k_valid, block_size, pool)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype}")
    dev = qs.device
    if ks.device != dev or q_valid.device != dev or k_valid.device != dev:
        raise ValueError(f"qs, q_valid, ks and k_valid must share a device (qs on {dev})")
    kernel = _kernel(pooled_block_mass_kernel, dev)
    bsz, h, s, r = qs.shape
    hkv, lk = ks.shape[1], ks.shape[2]
    gh, b = h // hkv, block_size
    n = -(-lk // b)

    # the rows on the host: row block i holds the scored queries rowptr[i] .. rowptr[i + 1] - 1
    pos64 = pos.to(torch.int64)
    blk = pos64 // b
    j0 = int(blk[0])
    nrows = int(blk[-1]) - j0 + 1
    rowptr = torch.searchsorted(blk, torch.arange(j0, j0 + nrows + 1))
    maxq = int((rowptr[1:] - rowptr[:-1]).max())
    host = torch.cat([pos64, rowptr])
    if dev.type == "cuda":
        host = host.pin_memory().to(dev, non_blocking=True)  # no wait on the device
    pos_d, rowptr_d = host[:s], host[s:]

    # q scaled by c, then rounded to the score dtype, as sampled_block_mass does
    c = dim**-0.5 / tau
    q = (qs.float() * c).to(dtype)
    k = ks.to(dtype)
    if dev.type != "cuda" and dtype == torch.bfloat16:  # the interpreter misreads bf16
        q, k = q.float(), k.float()
    kv = k_valid.bool()
    at = torch.arange(lk, device=dev)
    start = torch.where(kv, at, lk).amin(1)  # each sequence's real keys: start .. end - 1
    end = torch.where(kv, at + 1, 0).amax(1)
    qv = q_valid.to(torch.int8)

    cuda = dev.type == "cuda"
    bm, bn, br, splits = tiles(gh * maxq, r, block_rows, block_n)
    out = torch.zeros(bsz, hkv, nrows, n, device=dev, dtype=torch.float32)
    grid = (nrows * splits, bsz * hkv)
    kernel[grid](
        q, k, out, pos_d, rowptr_d, qv, start, end,
        *q.stride(), *k.stride(), *out.stride(), *qv.stride(),
        hkv, gh, nrows, n, r, LOG2E,
        BLOCK_SIZE=b, BLOCK_ROWS=bm, BLOCK_N=bn, BLOCK_R=br, BLOCK_Q=max(16, _pow2(maxq)),
        SPLITS=splits, POOL_MAX=pool == "max", ATOMIC=splits > 1,
        IEEE_DOT=q.dtype == torch.float32, NUM_STAGES=2 if cuda else 1,
        num_warps=4 if bm * bn <= 4096 else 8,
    )  # fmt: skip
    return out


__all__ = [
    "block_mass_work",
    "dense_attention_work",
    "normalise_rows",
    "pooled_block_mass_kernel",
    "pooled_block_mass_triton",
    "tiles",
]
