"""XAttention (Xu et al. 2025, "XAttention: Block Sparse Attention with Antidiagonal Scoring",
mit-han-lab/x-attention), restated from the paper: inside every S x S tile of the attention
matrix the sum along the antidiagonal touches every row and column once, so it sees vertical and
slash patterns at 1/S of the cost; a softmax over the strided grid, summed per block, estimates
the block's attention mass. The paper selects by cumulative threshold; we select to the density
budget so every method runs at equal density.
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.methods.base import Method, ScoreInputs, mean_heads, valid_or_all

XATTN_STRIDE = 8
"""XAttention's default stride S (the paper uses 8 or 16); capped at the block size."""

_CHUNK_ELEMS = 1 << 24  # score elements per chunk of the strided grid (64 MB of fp32)


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
    valid = valid_or_all(valid, bsz, t, q.device)
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
    return mean_heads(out, groups)


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
    valid = valid_or_all(valid, bsz, lk, q.device)
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
    return mean_heads(blocks, groups)


def score(x: ScoreInputs) -> torch.Tensor:
    scale = x.q.shape[-1] ** -0.5 if x.scale is None else x.scale
    fn = xattention_decode_scores if x.q.shape[2] == 1 else xattention_prefill_scores
    return fn(x.q, x.k, x.valid, x.block_size, scale, x.shape[1])


METHOD = Method(
    name="xattention",
    help="XAttention: antidiagonal scoring on a strided grid",
    score=score,
    needs_qk=True,
    reads_sketch=False,
)
