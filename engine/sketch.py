"""The sketch: block-level attention estimates from pooled, Hadamard-sketched queries and keys.

Pool queries and keys per block (over real tokens only), project both with one subsampled
randomized Hadamard transform (SRHT) normalised so sketched inner products are unbiased, and turn
block logits into a causal, row-stochastic block transition matrix A.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..kernels.block_softmax import block_softmax_sums, pack_keys, scored_block_mass
from ..kernels.hadamard import srht_rows
from ..kernels.native import library
from ..kernels.parts import run_in_parts, workers

# index_reduce_ is marked beta (a one-time UserWarning); its "amax" is what max pooling needs and
# runs as fast as index_add_ on these shapes (scatter_reduce_ was ~20x slower)
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")


# rows [B, H, L] from which a sketch runs the fast transform in C (kernels/hadamard.py) rather than
# the [d, r] product: the keys at 7k tokens (22k rows) 2.3 -> ~0.9 ms (its pooling included)
_FAST_ROWS = 1024


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh-Hadamard transform over the last dim (a power of two)."""
    m = x.shape[-1]
    if m & (m - 1):
        raise ValueError(f"FWHT needs a power-of-two length, got {m}")
    lead = x.shape[:-1]
    y = x.reshape(-1, m)
    h = 1
    while h < m:
        y = y.view(-1, m // (2 * h), 2, h)
        a, b = y[:, :, 0], y[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(*lead, m) / math.sqrt(m)


@dataclass(frozen=True)
class SRHT:
    """Fixed random signs and kept coordinates of one layer's sketch (reproducible from its seed).

    Applied as one [d, r] matrix, built once with the fast transform: for head dims of 64-256 a
    single matmul beats log2(m) small transform passes, which matters most in decode.
    """

    signs: torch.Tensor  # [m] of +-1
    keep: torch.Tensor  # [r] sorted coordinate ids (r <= m)
    dim: int  # head dim d before padding
    matrix: torch.Tensor  # [d, r]: x @ matrix == scale * FWHT(pad(x) * signs)[keep]

    @property
    def padded_dim(self) -> int:
        return self.signs.shape[0]

    @property
    def scale(self) -> float:
        """sqrt(m / r): makes E[<Sx, Sy>] = <x, y> when r of m coordinates are kept."""
        return math.sqrt(self.padded_dim / self.keep.shape[0])

    def to(self, device: torch.device | str) -> SRHT:
        return SRHT(self.signs.to(device), self.keep.to(device), self.dim, self.matrix.to(device))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The sketch through the fast Walsh-Hadamard transform (defines `matrix`)."""
        m = self.padded_dim
        x = x.float()
        if x.shape[-1] < m:
            x = torch.nn.functional.pad(x, (0, m - x.shape[-1]))
        y = fwht(x * self.signs)
        if self.keep.shape[0] < m:
            y = y.index_select(-1, self.keep)
        return y * self.scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sketch the last dim: [..., d] -> [..., r] in fp32 (many rows [B, H, L, d] through the
        fast transform in C where it applies)."""
        if x.dim() == 4 and x.shape[:3].numel() >= _FAST_ROWS:
            fast = self._fast(x)
            if fast is not None:
                return fast[0]
        return x.float() @ self.matrix

    def pooled(
        self, x: torch.Tensor, block_size: int, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sketch of x [B, H, L, d] and, per block of block_size rows over the valid ones
        (valid [B, L]; None: all), the sums of the sketched rows and of their squares [B, H, n, r]."""
        fast = self._fast(x, block_size, valid)
        if fast is not None:
            return fast  # type: ignore[return-value]
        xs = self(x)
        return xs, block_pool(xs, block_size, valid)[0], block_pool(xs * xs, block_size, valid)[0]

    def _fast(
        self, x: torch.Tensor, block_size: int = 0, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
        """kernels/hadamard.py srht_rows for this sketch (None where it does not apply)."""
        m, r = self.padded_dim, self.keep.shape[0]
        weights = None if valid is None or bool(valid.all()) else valid
        keep = None if r == m else self.keep
        return srht_rows(x, self.signs, keep, self.scale / math.sqrt(m), block_size, weights)


def make_srht(dim: int, sketch_dim: int, seed: int, layer: int) -> SRHT:
    """Draw the sketch of one (layer, seed): signs over the padded dim and r kept coordinates."""
    m = 1 << max(0, (dim - 1).bit_length())
    r = min(sketch_dim, m)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + layer)
    signs = torch.randint(0, 2, (m,), generator=gen).float() * 2 - 1
    keep = torch.randperm(m, generator=gen)[:r].sort().values
    partial = SRHT(signs, keep, dim, torch.empty(0))
    return SRHT(signs, keep, dim, partial.transform(torch.eye(dim)))


def all_on_host(x: torch.Tensor) -> bool:
    """x.all(), asked only where the answer is free (a CPU tensor). On a GPU the question is a
    host round trip per layer, and the masked work it would skip one cheap pass: False there."""
    return x.device.type == "cpu" and bool(x.all())


def block_pool(
    x: torch.Tensor, block_size: int, valid: torch.Tensor | None = None, offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and count of x [B, H, L, d] per absolute block, over valid tokens only.

    offset is the absolute position of row 0 (queries in chunked prefill); valid [B, L] marks real
    tokens. Returns sums [B, H, n, d] (fp32) and counts [B, n] (fp32) with n = ceil((offset+L)/b).
    Sums (not means) are returned so decode can keep running averages by adding tokens.
    """
    bsz, length = x.shape[0], x.shape[2]
    xf = x.float()
    w = torch.ones(bsz, length, 1, device=x.device) if valid is None else valid.float()[..., None]
    if valid is not None and not all_on_host(valid):  # skip a full copy in the common case
        xf = xf * w[:, None]
    return _pool_rows(xf, block_size, offset), _pool_rows(w, block_size, offset)[..., 0]


def _pool_rows(x: torch.Tensor, b: int, offset: int) -> torch.Tensor:
    """x [..., L, d] summed per block of b rows, row 0 at absolute position offset: [..., n, d].
    The full blocks are one view and one sum, the partial first and last blocks sums of their
    own: padding the whole tensor to whole blocks copied it (~10 ms a layer's queries at 7k)."""
    length = x.shape[-2]
    j0 = offset // b
    n = -(-(offset + length) // b) - j0
    out = x.new_zeros(*x.shape[:-2], j0 + n, x.shape[-1])
    first = min((b - offset % b) % b, length)  # rows in the partial first block
    full = (length - first) // b
    if first:
        out[..., j0, :] = x[..., :first, :].sum(-2)
    jf = j0 + (1 if first else 0)
    if full:
        out[..., jf : jf + full, :] = (
            x[..., first : first + full * b, :].unflatten(-2, (full, b)).sum(-2)
        )
    if first + full * b < length:
        out[..., jf + full, :] = x[..., first + full * b :, :].sum(-2)
    return out


def block_means(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return sums / counts.clamp(min=1.0)[:, None, :, None]


def group_queries(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, H, ..., r] -> [B, Hkv, H/Hkv, ..., r]: GQA scoring without repeating keys."""
    bsz, h = q.shape[:2]
    return q.view(bsz, n_kv_heads, h // n_kv_heads, *q.shape[2:])


def kv_rows(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, H, L, r] -> [B, Hkv, (H/Hkv) L, r]: the query heads of a KV head as rows of one matrix,
    so one matmul per KV head scores them all; a broadcast matmul over group_queries would copy
    the keys once per query head (at 7k tokens in decode that copy cost more than the product)."""
    return q.reshape(q.shape[0], n_kv_heads, -1, q.shape[-1])


def block_logits(qs: torch.Tensor, ks: torch.Tensor, dim: int, tau: float) -> torch.Tensor:
    """Sketched block logits [B, Hkv, G, nq, nk] from qs [B, H, nq, r] and ks [B, Hkv, nk, r]."""
    bsz, hkv, nk = ks.shape[0], ks.shape[1], ks.shape[2]
    gh, nq = qs.shape[1] // hkv, qs.shape[2]
    logits = kv_rows(qs, hkv) @ ks.transpose(-1, -2)
    return logits.view(bsz, hkv, gh, nq, nk) * (dim**-0.5 / tau)


def causal_block_softmax(
    logits: torch.Tensor, key_valid: torch.Tensor, q_blocks: torch.Tensor
) -> torch.Tensor:
    """Softmax over key blocks j <= q_block that hold real keys (masked BEFORE the softmax).

    logits [B, ..., nq, nk]; key_valid [B, nk] bool; q_blocks [nq] absolute ids of the rows.
    Rows with no visible block come out all zero.
    """
    nk = logits.shape[-1]
    causal = torch.arange(nk, device=logits.device)[None, :] <= q_blocks[:, None]  # [nq, nk]
    extra = logits.dim() - 2
    kv = key_valid.view(key_valid.shape[0], *([1] * (extra - 1)), 1, nk)
    mask = causal & kv
    # one pass to mask and one to normalise (without the masked_fill copy and the nan_to_num
    # pass a block-mean selection at 8k tokens took 24.5 ms, not 26.3); NaN rows need padding
    probs = torch.softmax(torch.where(mask, logits, float("-inf")), dim=-1)
    if not all_on_host(mask.any(-1)):
        probs.nan_to_num_(0.0)
    return probs


def pool_into(
    out: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, pool: str
) -> torch.Tensor:
    """Pool the slices of src into out along dim at index, in place: summed (pool "mean"; the
    caller divides by the counts) or their running max (pool "max"; out starts at 0 for
    masses, or at -inf). index: rows of a host tensor (its runs are read on the host; a device
    tensor costs a copy)."""
    index = index.cpu()
    run = _run_length(index)
    if run:  # runs of `run` slices per index, in order: a reshape, not a scatter (~2x faster)
        length, first = index.numel(), int(index[0])
        whole = length // run * run
        for s in range(0, length, whole):  # the whole runs, then a shorter last one if any
            e = min(length, s + whole)
            x = src.narrow(dim, s, e - s).unflatten(dim, (-1, min(run, e - s)))
            o = out.narrow(dim, first + s // run, x.shape[dim])
            if pool == "max":
                torch.maximum(o, x.amax(dim + 1), out=o)
            else:
                o.add_(x.sum(dim + 1))
        return out
    index = index.to(out.device)
    if pool == "max":
        return out.index_reduce_(dim, index, src, "amax")
    return out.index_add_(dim, index, src)


def _run_length(index: torch.Tensor) -> int:
    """k where index [L] is index[0] + (0, .., 0, 1, .., 1, ...) in runs of k (the last may be
    shorter), as evenly sampled queries give their rows; 0 otherwise."""
    length = index.numel()
    if length < 2:
        return 0
    k = int(torch.searchsorted(index, index[0] + 1))  # the first run's length
    expect = index[0] + torch.arange(length) // max(k, 1)
    return k if 0 < k < length and torch.equal(index, expect) else 0


def aggregate_heads(probs: torch.Tensor, per_group: bool, pool: str = "mean") -> torch.Tensor:
    """Pool per-head block distributions [B, Hkv, G, nq, nk] into [B, groups, nq, nk], rows
    summing to 1: the heads' mean mass, or (pool "max") each block's largest over the heads.

    groups = 1 (one selection shared by the layer) or Hkv (one per KV-head group).
    """
    dims = 2 if per_group else (1, 2)
    agg = probs.amax(dim=dims) if pool == "max" else probs.sum(dim=dims)
    if not per_group:
        agg = agg.unsqueeze(1)
    total = agg.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, agg / total.clamp(min=1e-30), agg)


# ---- the token-query estimator -------------------------------------------------------------
# A block's attention mass is a log-sum-exp over its token pairs, dominated by its largest
# scores; pooling the queries of a block washes out the queries that each look somewhere else
# (copying and induction heads). This estimator keeps every sketched query and summarises each
# key block by its mean and per-coordinate variance: for scores s = c q.k with k ~ N(mean, var),
# log sum_k exp(s) ~ log count + c q.mean + c^2/2 sum_d q_d^2 var_d. Each query's softmax over
# key blocks is averaged over the queries of its block. Cost: L x n x r per head, 1/b of QK^T.


def key_summary(
    k_sum: torch.Tensor, k_sq: torch.Tensor | None, k_count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per key block: mean [B, Hkv, n, r] and per-coordinate variance (None without squares)."""
    km = block_means(k_sum, k_count)
    if k_sq is None:
        return km, None
    return km, (block_means(k_sq, k_count) - km * km).clamp(min=0.0)


def token_block_logits(
    qs: torch.Tensor,
    km: torch.Tensor,
    kvar: torch.Tensor | None,
    k_count: torch.Tensor,
    dim: int,
    tau: float,
) -> torch.Tensor:
    """Log-sum-exp estimates [B, Hkv, G, L, n] of each sketched query qs [B, H, L, r] over the
    keys of each block (mean + half the variance + log of the block's real key count), as one
    matmul of [q, q^2, 1] against [c mean, c^2/2 var, log count] per KV head (the query heads
    of a KV head are rows of one matrix, so the keys are never repeated)."""
    return token_logits(qs, token_keys(km, kvar, k_count, dim, tau), kvar is not None)


def token_keys(
    km: torch.Tensor, kvar: torch.Tensor | None, k_count: torch.Tensor, dim: int, tau: float
) -> torch.Tensor:
    """The key side of token_block_logits, [B, Hkv, n, r (+ r) + 1]: [c mean, c^2/2 var, log
    count] per key block. Row j depends on block j's sums only (decode keeps it per block)."""
    c = dim**-0.5 / tau
    bsz, hkv, n = km.shape[0], km.shape[1], km.shape[2]
    log_count = k_count.clamp(min=1.0).log().view(bsz, 1, n, 1).expand(bsz, hkv, n, 1)
    return torch.cat([km * c, *([kvar * (0.5 * c * c)] if kvar is not None else []), log_count], -1)


def token_logits(qs: torch.Tensor, keys: torch.Tensor, squares: bool) -> torch.Tensor:
    """token_block_logits from the key side `keys` [B, Hkv, n, f] (token_keys): [B, Hkv, G, L, n]."""
    bsz, hkv, n = keys.shape[0], keys.shape[1], keys.shape[2]
    qg = group_queries(qs, hkv)  # [B, Hkv, G, L, r]
    ones = torch.ones(*qg.shape[:-1], 1, device=qs.device, dtype=qg.dtype)
    queries = torch.cat([qg, *([qg * qg] if squares else []), ones], -1)
    gh, length = qg.shape[2], qg.shape[3]
    out = queries.view(bsz, hkv, gh * length, -1) @ keys.transpose(-1, -2)
    return out.view(bsz, hkv, gh, length, n)


def _mean_per_row(sums: torch.Tensor, row: torch.Tensor, q_valid: torch.Tensor) -> torch.Tensor:
    """Sums [B, Hkv, G, R, n] over scored queries -> their mean per row; row [L] is each query's
    row, q_valid [B, L] its realness (rows without a real scored query stay zero)."""
    count = torch.zeros(sums.shape[0], sums.shape[3], device=sums.device)
    count.index_add_(1, row, q_valid.float())
    return sums / count.clamp(min=1.0)[:, None, None, :, None]


def sample_positions(length: int, block_size: int, samples: int, offset: int = 0) -> torch.Tensor:
    """Positions offset .. offset + length - 1 to score: all of them (samples 0 or >= block), or
    `samples` evenly spaced ones per block, the last token of each block always among them."""
    pos = torch.arange(offset, offset + length)
    if samples <= 0 or samples >= block_size:
        return pos
    stride = block_size // samples
    keep = (pos % block_size) % stride == stride - 1
    keep[-1] = True  # the last position (a partial last block) is always scored
    return pos[keep]


def token_block_mass(
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    km: torch.Tensor,
    kvar: torch.Tensor | None,
    k_count: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    chunk_elems: int = 1 << 20,
    pool: str = "mean",
) -> torch.Tensor:
    """Estimated block mass [B, Hkv, G, R, n] for the query blocks from pos[0] // b to
    pos[-1] // b, from sketched queries qs [B, H, L, r] at ascending positions pos [L]
    (q_valid [B, L] real queries); a block's estimate is the mean over its scored queries, or
    with pool "max" each key block's largest mass among them.

    Each query sees the key blocks before its own and, in its own block, only the keys up to
    itself (the log-count of the diagonal block is that of the visible keys). Query chunks keep
    the logits bounded and only score the key blocks their last query can see."""
    bsz, h, length, r = qs.shape
    b = block_size
    n = km.shape[2]
    blk_host = pos.cpu() // b  # positions are host values: their blocks sized without a sync
    pos = pos.to(qs.device)
    blk_all = pos // b
    j0 = int(blk_host[0])
    rows = int(blk_host[-1]) - j0 + 1
    out = torch.zeros(bsz, km.shape[1], h // km.shape[1], rows, n, device=qs.device)
    has = k_count > 0
    cols = torch.arange(n, device=qs.device)
    step = max(1, chunk_elems // max(h * n * bsz, 1))
    for s in range(0, length, step):  # sums per block, so chunks need not align to blocks
        e = min(length, s + step)
        blk = blk_all[s:e]
        nk = int(blk_host[e - 1]) + 1  # no query of this chunk sees past its last block
        logits = token_block_logits(
            qs[:, :, s:e], km[:, :, :nk], None if kvar is None else kvar[:, :, :nk],
            k_count[:, :nk], dim, tau,
        )  # fmt: skip
        # own block: only the keys up to the query are visible
        seen = (pos[s:e] % b + 1).float()[None, :].minimum(k_count[:, blk])  # [B, c]
        fix = seen.clamp(min=1.0).log() - k_count[:, blk].clamp(min=1.0).log()
        idx = blk.view(1, 1, 1, -1, 1).expand(*logits.shape[:4], 1)
        logits.scatter_add_(-1, idx, fix.view(bsz, 1, 1, -1, 1).expand_as(idx))
        hidden = (cols[None, :nk] > blk[:, None])[None] | ~has[:, None, :nk]  # [B, c, nk]
        logits.masked_fill_(hidden[:, None, None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        # rows that see no block (padding queries) are NaN: they, and every padding query, add 0
        probs.masked_fill_(~q_valid[:, None, None, s:e, None], 0.0)
        pool_into(out[..., :nk], 3, blk_host[s:e] - j0, probs, pool)
    return out if pool == "max" else _mean_per_row(out, blk_all - j0, q_valid)


# ---- the sampled estimator ------------------------------------------------------------------
# The block-mean and Gaussian summaries miss single keys that stand out inside a block (the
# attention of a copying head lands on one token). Scoring a few queries per block against every
# sketched key sees them: the block mass of those queries is exact in the sketched space, and
# neighbouring queries attend alike, so a block's sampled queries stand for all of its queries.
# Cost: (samples / b) of the dense score matrix, without the value product.


# A chunk scores its queries against the keys up to its last query: the keys past each earlier
# query are computed and masked, on average half the chunk's span per query. At short contexts
# the element budget alone made chunks span a fifth of the keys (2048 tokens: ~20% wasted); with
# spans capped at lk / 16 the estimator ran 1.2-1.8x faster at 1-2k tokens, the same from 4k on.
_CHUNK_SPAN = 16


_SCORE_ELEMS = 1 << 21  # scores per chunk of the torch product: measured best here
# The fused kernel writes block masses, not scores, and scores each tile of rows only up to its
# own causal end, so its chunks need no span cap: at most this many masses (16 MB) a chunk, at
# 7376 tokens one call per core instead of ~30 calls of ~30 queries.
_FUSED_ELEMS = 1 << 22
_PART_QUERIES = 32  # scored queries a thread must get to be worth starting


def score_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The dtype of the sampled estimator's score product for knob value `name`: "auto" is
    bfloat16 on CUDA and on CPUs with oneDNN bfloat16 (AVX-512 and newer), where the product
    alone ran ~6x faster than float32 (docs/speed.md); elsewhere emulated bfloat16 can be
    slower than float32, so "auto" keeps float32 there."""
    if name != "auto":
        return getattr(torch, name)
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)  # private: may go
    return torch.bfloat16 if native is not None and native() else torch.float32


def _chunk_queries(pos: torch.Tensor, lk: int, row_elems: int, chunk_elems: int) -> int:
    """Queries per chunk: at most chunk_elems score elements (row_elems per query), and
    spanning at most lk / _CHUNK_SPAN positions, but never fewer than 16 queries (each chunk
    costs a dozen small ops)."""
    step = max(1, chunk_elems // max(row_elems, 1))
    if pos.numel() > 1:
        per_token = pos.numel() / (int(pos[-1]) - int(pos[0]) + 1)
        step = min(step, max(16, int(lk / _CHUNK_SPAN * per_token)))
    return step


def sampled_block_mass(
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    chunk_elems: int | None = None,
    pool: str = "mean",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Block mass [B, Hkv, G, R, n] for the query blocks pos[0] // b .. pos[-1] // b from the
    sketched queries qs [B, H, S, r] at ascending positions pos [S] (q_valid [B, S]) against the
    sketched keys ks [B, Hkv, Lk, r] at positions 0 .. Lk - 1 (k_valid [B, Lk], one span of
    real keys per sequence, as padding makes it); each query sees
    the real keys up to itself, a row's estimate is the mean over its scored queries, or with
    pool "max" each key block's largest mass among them (padding queries count as 0). dtype:
    of the score product (score_dtype); the softmax and the masses are float32. chunk_elems:
    what one pass over a chunk of queries may hold (scores, or the fused kernel's block masses;
    None: the measured defaults below)."""
    bsz, h, length, r = qs.shape
    hkv, lk = ks.shape[1], ks.shape[2]
    gh, b = h // hkv, block_size
    n = -(-lk // b)
    c = dim**-0.5 / tau
    blk_host = pos.cpu() // b  # positions are host values: their blocks sized without a sync
    pos = pos.to(qs.device)
    blk_all = pos // b
    j0 = int(blk_host[0])
    rows = int(blk_host[-1]) - j0 + 1
    out = torch.zeros(bsz, hkv, gh, rows, n, device=qs.device)
    # float32 on CPU: scores and block mass in one C call over keys packed in panels
    # (kernels/block_softmax.py scored_block_mass: a layer's estimate 1.5x faster at 7k tokens
    # than the product and the C softmax apart). Otherwise [B, Hkv, r, Lk], contiguous: a
    # bfloat16 product over a key prefix of the transposed view copied the keys in every chunk
    # (~1.7x slower)
    fused = dtype == torch.float32 and qs.device.type == "cpu" and library() is not None
    if fused:
        keys = pack_keys(ks)
    else:
        keys = ks.transpose(-1, -2).to(dtype, memory_format=torch.contiguous_format)
    # each sequence's real keys are one span (left or right padding): a query at p sees
    # start .. min(p + 1, end) - 1
    at = torch.arange(lk, device=qs.device)
    start = torch.where(k_valid, at, lk).amin(1).view(bsz, 1, 1)
    end = torch.where(k_valid, at + 1, 0).amax(1).view(bsz, 1, 1)
    if fused:  # bounded by its output alone: every row tile's keys end at its own queries
        step = max(1, (chunk_elems or _FUSED_ELEMS) // max(h * n * bsz, 1))
    else:
        step = _chunk_queries(pos, lk, h * lk * bsz, chunk_elems or _SCORE_ELEMS)

    def score(s0: int, s1: int) -> None:
        """Queries s0 .. s1 - 1, chunk by chunk, into their rows of out. The torch product
        writes into one buffer per part, sized for the longest chunk: chunks score ever more
        keys, and a fresh, larger block per chunk is rarely reused by the heap."""
        buf = None
        if not fused:
            buf = torch.empty(bsz * hkv * gh * step * lk, dtype=dtype, device=qs.device)
        for s in range(s0, s1, step):
            chunk(s, min(s1, s + step), buf)

    # the torch product's key widths rounded up to a few sizes: every distinct width was a new
    # oneDNN bfloat16 primitive (kept in its cache, with its own scratch), and at 64k tokens a
    # layer's ~1000 chunks held 3.2 GB that way; the extra keys are masked like any future key
    span = max(b, -(-lk // (_CHUNK_SPAN * b)) * b)

    def chunk(s: int, e: int, buf: torch.Tensor | None = None) -> None:
        p = pos[s:e]
        kend = int(p[-1]) + 1  # no query of this chunk sees past itself
        if not fused:
            kend = min(lk, -(-kend // span) * span)
        nkc = -(-kend // b)
        qg = kv_rows(qs[:, :, s:e] * c, hkv).to(dtype)
        # the softmax over each row's visible keys, summed per key block (kernels/block_softmax:
        # in C on CPU, without writing the probabilities: ~half the estimator's time in torch)
        hi = torch.minimum((p + 1).repeat(gh)[None, None], end)
        if fused:
            mass = scored_block_mass(qg, keys, start, hi, b, min(kend, lk))
        else:
            kk = keys[..., : min(kend, lk)]
            shape = (*qg.shape[:-1], kk.shape[-1])  # [B, Hkv, G * c, kend]
            scores = torch.matmul(qg, kk, out=buf[: math.prod(shape)].view(shape))
            mass = block_softmax_sums(scores, start, hi, b)
        mass = mass.view(bsz, hkv, gh, e - s, nkc)
        if not bool(q_valid[:, s:e].all()):
            mass.masked_fill_(~q_valid[:, None, None, s:e, None], 0.0)  # padding queries
        pool_into(out[..., :nkc], 3, p // b - j0, mass, pool)

    # on CPU, one part per core (kernels/parts.py: at 7k tokens 1.6x faster than every op on
    # both cores); parts end at query blocks, so they add into disjoint rows of out
    on_cpu = qs.device.type == "cpu"
    cuts = _cuts_by_work(pos, b, workers(), _PART_QUERIES) if on_cpu else [0, length]
    if len(cuts) > 2:
        run_in_parts(score, cuts)
    else:
        score(0, length)
    return out if pool == "max" else _mean_per_row(out, blk_all - j0, q_valid)


def _cuts_by_work(pos: torch.Tensor, b: int, parts: int, min_len: int) -> list[int]:
    """Bounds [0, ..., L] cutting L ascending query positions into `parts` runs of about equal
    causal work (a query at p scores p + 1 keys), each ending at a query block; [0, L] when a
    part would be shorter than min_len queries."""
    length = pos.numel()
    if parts < 2 or length < parts * min_len:
        return [0, length]
    work = (pos.cpu().double() + 1).cumsum(0)
    blk = pos.cpu() // b
    starts = torch.nonzero(blk[1:] != blk[:-1]).squeeze(1) + 1  # first query of each block
    want = torch.searchsorted(work, work[-1] * torch.arange(1, parts) / parts)
    at = torch.searchsorted(starts, want)
    cuts = [int(starts[i]) for i in at.tolist() if i < starts.numel()]
    return sorted({0, length, *cuts})


def current_row_mass(
    qs: torch.Tensor, ks: torch.Tensor, block_size: int, dim: int, tau: float, pool: str = "mean"
) -> torch.Tensor:
    """sampled_block_mass for decode's one row when every key is real: the queries qs [B, H, s, r]
    all stand for the newest position, so each sees every key in ks [B, Hkv, Lk, r]; their block
    masses [B, Hkv, G, 1, n] are averaged (pool "max": their largest per block). No causal
    mask and no per-row scatter: at 7k tokens the generic path spent a quarter of its time
    filling a padded copy of the scores."""
    bsz, h, s = ks.shape[0], qs.shape[1], qs.shape[2]
    hkv, lk = ks.shape[1], ks.shape[2]
    gh, b = h // hkv, block_size
    qg = kv_rows(qs * (dim**-0.5 / tau), hkv)
    mass = block_softmax_sums(qg @ ks.transpose(-1, -2), 0, lk, b)  # [B, Hkv, G*s, n]
    mass = mass.view(bsz, hkv, gh, s, -1)
    return mass.amax(3, keepdim=True) if pool == "max" else mass.mean(3, keepdim=True)
