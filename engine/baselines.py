"""Block scores of the peer methods Sketch&Walk is compared against: Quest and XAttention.

Each function returns scores [B, G, rows, nk] (higher = keep) that go through the SAME
`select_blocks` as Sketch&Walk (sink, window and dense tail forced, calibrated to the same
density budget) and the same block-sparse kernels. Only the ranking differs, so a comparison at
equal density compares the scoring ideas, not selection rules or kernels.

Scores are per-head block probabilities averaged over the heads of a selection group (one group
per layer, or one per KV head with per_group), like the sketch's A_l: the raw quantities below
(bounds, antidiagonal sums) are not comparable across heads, their softmax mass is.

Ideas, restated and implemented here from the papers (no code taken from their repositories):
- Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
  Inference", mit-han-lab/Quest): per key page, the elementwise min and max of its keys bound
  q . k from above: sum_d max(q_d * kmin_d, q_d * kmax_d). Pages with the largest bound are kept.
- XAttention (Xu et al. 2025, "XAttention: Block Sparse Attention with Antidiagonal Scoring",
  mit-han-lab/x-attention): inside every S x S tile of the attention matrix, the sum along the
  antidiagonal touches every row and every column once, so it sees both vertical and slash
  patterns at 1/S of the cost; softmax over the strided grid and summing per block estimates the
  block's attention mass. The paper selects by cumulative threshold; we select to the density
  budget so every method runs at equal density.
"""

from __future__ import annotations

import torch

from .sketch import block_means, block_pool, causal_block_softmax

BASELINES = ("quest", "xattention")
XATTN_STRIDE = 8
"""XAttention's default stride S (the paper uses 8 or 16); capped at the block size."""

_CHUNK_ELEMS = 1 << 24  # score elements per chunk of the strided grid (64 MB of fp32)


def _valid_or_all(valid: torch.Tensor | None, bsz: int, length: int, device) -> torch.Tensor:
    if valid is None:
        return torch.ones(bsz, length, dtype=torch.bool, device=device)
    return valid.bool()


def _mean_heads(probs: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, gh, rows, nk] per-head distributions -> [B, groups, rows, nk] (groups 1 or Hkv)."""
    if groups == 1:
        return probs.mean(dim=(1, 2)).unsqueeze(1)
    return probs.mean(dim=2)


def key_block_bounds(
    k: torch.Tensor, valid: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elementwise min and max of the real keys of each block: [B, Hkv, nk, d] each, and [B, nk]
    bool saying which blocks hold any real key (empty blocks get min = max = 0)."""
    bsz, hkv, lk, d = k.shape
    nk = -(-lk // block_size)
    pad = nk * block_size - lk
    kf = torch.nn.functional.pad(k.float(), (0, 0, 0, pad))
    v = torch.nn.functional.pad(valid, (0, pad)).view(bsz, 1, nk, block_size, 1)
    kb = kf.view(bsz, hkv, nk, block_size, d)
    kmin = kb.masked_fill(~v, float("inf")).amin(dim=3)
    kmax = kb.masked_fill(~v, float("-inf")).amax(dim=3)
    has = v.view(bsz, nk, block_size).any(-1)
    empty = ~has[:, None, :, None]
    return kmin.masked_fill(empty, 0.0), kmax.masked_fill(empty, 0.0), has


def quest_bound(qg: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k over the keys of each block: [B, Hkv, gh, rows, nk].

    qg [B, Hkv, gh, rows, d] queries grouped by KV head; kmin/kmax [B, Hkv, nk, d].
    sum_d max(q_d kmin_d, q_d kmax_d) = q+ . kmax + q- . kmin (two matmuls, no [.., nk, d] temp).
    """
    pos, neg = qg.clamp(min=0.0), qg.clamp(max=0.0)
    return pos @ kmax.unsqueeze(2).transpose(-1, -2) + neg @ kmin.unsqueeze(2).transpose(-1, -2)


def quest_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    block_size: int,
    scale: float,
    groups: int,
) -> torch.Tensor:
    """Quest scores [B, G, rows, nk].

    Decode (one query, the method's home): the query's upper bound on q . k per key block.
    Prefill (our extension; Quest itself is decode-only): each query block is represented by the
    MEAN of its real queries, bounded against the key blocks' min/max box. A bound over all
    queries of the block (a box-box bound) is valid but so loose it barely ranks anything; the
    pooled query is what MInference-style and Sketch&Walk pooling use too, so the comparison
    isolates "min/max key box" against "mean key" (nowalk).
    """
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    valid = _valid_or_all(valid, bsz, lk, q.device)
    kmin, kmax, has = key_block_bounds(k, valid, block_size)
    if lq == 1:
        qrep = q.float()  # [B, H, 1, d]
        rows = torch.tensor([(lk - 1) // block_size], device=q.device)
    else:
        sums, counts = block_pool(q, block_size, valid[:, lk - lq :], offset=lk - lq)
        rows = torch.arange(sums.shape[2], device=q.device)
        qrep = block_means(sums, counts)  # [B, H, nq, d]
    bound = quest_bound(qrep.view(bsz, hkv, h // hkv, qrep.shape[2], d), kmin, kmax)
    probs = causal_block_softmax(bound * scale, has, rows)  # [B, Hkv, gh, rows, nk]
    return _mean_heads(probs, groups)


def _strided(x: torch.Tensor, stride: int, reverse: bool) -> torch.Tensor:
    """[B, H, T, d] (T a multiple of stride) -> [B, H, T/S, S*d]: each cell's S tokens side by
    side, in reverse order for queries, so a dot product of cells sums one antidiagonal."""
    bsz, h, t, d = x.shape
    cells = x.view(bsz, h, t // stride, stride, d)
    if reverse:
        cells = cells.flip(3)
    return cells.reshape(bsz, h, t // stride, stride * d)


def xattention_prefill_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    block_size: int,
    scale: float,
    groups: int,
    stride: int = XATTN_STRIDE,
) -> torch.Tensor:
    """XAttention antidiagonal block scores [B, G, n, n] for a prefill (queries == keys).

    Cell (a, c) of the strided grid scores sum_s q[aS+S-1-s] . k[cS+s] (one antidiagonal of the
    S x S tile), divided by S, times the attention scale. Softmax over causal cells c <= a, summed
    over the cells of each block pair and averaged over the block's cells rows, gives a block
    attention-mass estimate. The diagonal tile's antidiagonal includes S/2 future keys (as in the
    paper's scoring); that only touches the diagonal block, which selection always keeps.
    Invalid (padding) tokens are zeroed so they add nothing; cells with no real token are masked.
    """
    bsz, h, t, d = q.shape
    hkv = k.shape[1]
    stride = max(1, min(stride, block_size))
    if block_size % stride:
        stride = 1
    n = -(-t // block_size)
    tp = n * block_size
    valid = _valid_or_all(valid, bsz, t, q.device)
    w = valid.to(torch.float32)[:, None, :, None]
    qz = torch.nn.functional.pad(q.float() * w, (0, 0, 0, tp - t))
    kz = torch.nn.functional.pad(k.float() * w, (0, 0, 0, tp - t))
    qr = _strided(qz, stride, reverse=True).view(bsz, hkv, h // hkv, tp // stride, -1)
    kr = _strided(kz, stride, reverse=False).unsqueeze(2)  # [B, Hkv, 1, C, S*d]
    cells = tp // stride
    per_block = block_size // stride
    cell_valid = torch.nn.functional.pad(valid, (0, tp - t)).view(bsz, cells, stride).any(-1)
    col = torch.arange(cells, device=q.device)
    out = torch.zeros(bsz, hkv, h // hkv, n, n, device=q.device)
    rows_per_chunk = max(1, _CHUNK_ELEMS // max(1, h * cells * bsz) // per_block) * per_block
    for s in range(0, cells, rows_per_chunk):
        e = min(cells, s + rows_per_chunk)
        logits = (qr[:, :, :, s:e] @ kr.transpose(-1, -2)) * (scale / stride)  # [B,Hkv,gh,c,C]
        row = torch.arange(s, e, device=q.device)
        mask = (col[None, :] <= row[:, None])[None] & cell_valid[:, None, :]  # [B, c, C]
        probs = torch.softmax(logits.masked_fill(~mask[:, None, None], float("-inf")), dim=-1)
        probs = probs.nan_to_num(0.0) * cell_valid[:, None, None, s:e, None]
        nb = (e - s) // per_block
        blocks = probs.view(bsz, hkv, h // hkv, nb, per_block, n, per_block).sum(dim=(4, 6))
        out[:, :, :, s // per_block : s // per_block + nb] = blocks
    real_cells = cell_valid.view(bsz, n, per_block).sum(-1).clamp(min=1).float()
    out = out / real_cells[:, None, None, :, None]
    return _mean_heads(out, groups)


def xattention_decode_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    block_size: int,
    scale: float,
    groups: int,
    stride: int = XATTN_STRIDE,
) -> torch.Tensor:
    """XAttention's idea carried to one decode query, [B, G, 1, nk].

    XAttention is a prefill method. A single query is one row of an S x S tile, and that row
    meets the tile's antidiagonal at exactly one column (S-1-r for row r = position mod S), so the
    antidiagonal scoring of one row is strided key sampling: one key in every S, softmax over the
    samples, summed per key block. Cost: Lk/S dot products per head instead of Lk.
    """
    bsz, h, _, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    stride = max(1, min(stride, block_size))
    if block_size % stride:
        stride = 1
    valid = _valid_or_all(valid, bsz, lk, q.device)
    nk = -(-lk // block_size)
    offset = stride - 1 - (lk - 1) % stride
    pos = torch.arange(offset, nk * block_size, stride, device=q.device)
    live = pos < lk
    pos_c = pos.clamp(max=lk - 1)
    ks = k.float().index_select(2, pos_c)  # [B, Hkv, nk*b/S, d]
    ok = live[None, :] & valid.index_select(1, pos_c)  # [B, samples]
    qg = q.float().view(bsz, hkv, h // hkv, 1, d)
    logits = (qg @ ks.unsqueeze(2).transpose(-1, -2)) * scale  # [B, Hkv, gh, 1, samples]
    probs = torch.softmax(logits.masked_fill(~ok[:, None, None, None], float("-inf")), dim=-1)
    probs = probs.nan_to_num(0.0)
    blocks = torch.zeros(bsz, hkv, h // hkv, 1, nk, device=q.device)
    blocks.index_add_(-1, pos // block_size, probs)
    return _mean_heads(blocks, groups)


def baseline_scores(
    method: str,
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    valid: torch.Tensor | None,
    scale: float | None,
    block_size: int,
    shape: tuple[int, ...],
) -> torch.Tensor:
    """Scores of a baseline `method` with the shape select_blocks expects ([B, G, rows, nk]).

    q [B, H, Lq, d] with Lq == Lk (prefill) or Lq == 1 (decode); k [B, Hkv, Lk, d] the full keys;
    valid [B, Lk] real keys. Prefill Quest and decode XAttention are our adaptations (see the
    functions' docstrings).
    """
    if q is None or k is None:
        raise ValueError(f"method {method!r} scores blocks from q and k; the caller passed none")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = shape[1]
    if method == "quest":
        out = quest_scores(q, k, valid, block_size, scale, groups)
    elif method == "xattention":
        fn = xattention_decode_scores if q.shape[2] == 1 else xattention_prefill_scores
        out = fn(q, k, valid, block_size, scale, groups)
    else:
        raise ValueError(f"{method!r} is not a baseline ({', '.join(BASELINES)})")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{method} scores have shape {tuple(out.shape)}, expected {tuple(shape)}")
    return out
