"""The sketch: block-level attention estimates from pooled, Hadamard-sketched queries and keys.

Pool queries and keys per block (over real tokens only), project both with one subsampled
randomized Hadamard transform (SRHT) normalised so sketched inner products are unbiased, and turn
block logits into a causal, row-stochastic block transition matrix A.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sketchwalk.kernels import kernel
from sketchwalk.kernels.pooling import kv_rows

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig

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
    def rotation(self) -> bool:
        """Whether every coordinate is kept (r == m == d): the sketch is then an orthonormal
        rotation, (S q).(S k) == q.k, and scoring needs no sketched copy of q or k."""
        return self.keep.shape[0] == self.padded_dim == self.dim

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
        backend's sketch_rows op: the fast transform in C on a CPU)."""
        if x.dim() == 4 and x.shape[:3].numel() >= _FAST_ROWS:
            return self._rows(x)[0]
        return x.float() @ self.matrix

    def pooled(
        self, x: torch.Tensor, block_size: int, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sketch of x [B, H, L, d] and, per block of block_size rows over the valid ones
        (valid [B, L]; None: all), the sums of the sketched rows and of their squares [B, H, n, r]."""
        return self._rows(x, block_size, valid)  # type: ignore[return-value]

    def _rows(
        self, x: torch.Tensor, block_size: int = 0, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The backend's sketch_rows op (kernels/backends.py) for this sketch."""
        m, r = self.padded_dim, self.keep.shape[0]
        weights = None if valid is None or bool(valid.all()) else valid
        keep = None if r == m else self.keep
        sketch_rows = kernel("sketch_rows", x.device)
        return sketch_rows(
            x, self.matrix, self.signs, keep, self.scale / math.sqrt(m), block_size, weights
        )


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


def key_span(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First and one-past-last real position per sequence from a [B, L] validity mask."""
    length = valid.shape[1]
    pos = torch.arange(length, device=valid.device)
    start = torch.where(valid, pos, length).min(dim=1).values
    end = torch.where(valid, pos + 1, 0).max(dim=1).values
    return start, end


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
    return agg / total.clamp(min=1e-30)  # masses are >= 0: a zero total has zero rows, kept


def key_summary(
    k_sum: torch.Tensor, k_sq: torch.Tensor | None, k_count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per key block: mean [B, Hkv, n, r] and per-coordinate variance (None without squares)."""
    km = block_means(k_sum, k_count)
    if k_sq is None:
        return km, None
    return km, (block_means(k_sq, k_count) - km * km).clamp(min=0.0)


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


@dataclass
class SketchedBlocks:
    """Sketched block sums of queries and keys: what decode keeps to grow A_l token by token."""

    q_sum: torch.Tensor  # [B, H, n, r]
    q_count: torch.Tensor  # [B, n]
    k_sum: torch.Tensor  # [B, Hkv, n, r]
    k_count: torch.Tensor  # [B, n]
    k_sq: torch.Tensor | None = None  # [B, Hkv, n, r] sums of squared sketched keys ("query")


@dataclass
class QueryTokens:
    """Sketched queries [B, H, L, r] at ascending absolute positions pos [L], for the
    token-level estimators; valid [B, L] marks real ones. keys/key_valid: every sketched key
    [B, Hkv, Lk, r] and its validity [B, Lk] (the "sampled" estimator in a prefill). Where the
    sketch is a rotation (SRHT.rotation) and only inner products of queries with keys are read
    (keys set), both are raw: the same scores without sketching them."""

    qs: torch.Tensor
    valid: torch.Tensor
    pos: torch.Tensor
    keys: torch.Tensor | None = None
    key_valid: torch.Tensor | None = None

    @classmethod
    def sampled(
        cls,
        qs: torch.Tensor,
        valid: torch.Tensor,
        offset: int,
        cfg: SketchWalkConfig,
        sketch: SRHT | None = None,
    ) -> QueryTokens:
        """Keep cfg.query_samples evenly spaced queries per block (all with 0); sketch: qs are
        raw queries, sketched once kept (an eighth of them with 4 samples per 32-token block)."""
        pos = sample_positions(qs.shape[2], cfg.block_size, cfg.query_samples, offset)
        idx = (pos - offset).to(qs.device)
        kept = qs.index_select(2, idx)
        return cls(kept if sketch is None else sketch(kept), valid.index_select(1, idx), pos)
