"""The CPU decode (one query per sequence): in C where it can be, else torch paths by cache length.

Decode is memory-bound: what matters is touching the kept K/V rows once. The C kernel
(kernels/decode_attention.py) reads the listed rows in place; the torch paths take one masked SDPA
over all keys for short caches, gather every kept row at once where they fit in cache, and else
gather a chunk at a time and merge the chunks by log-sum-exp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_common import NEG_INF, attend, full_blocks, token_rows
from .decode_attention import decode_block_attention

_DECODE_CHUNK_TOKENS = 2048  # K/V rows gathered per decode call: the copy stays in cache


_DECODE_MASKED_MAX_TOKENS = 4096  # shorter caches: one masked SDPA call beats gathering


_DECODE_ONE_GATHER = 8192  # kept tokens per head up to which decode gathers them all at once


def decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    b: int,
    scale: float,
    seq_start: torch.Tensor | None,
) -> torch.Tensor:
    """One query per sequence: in C where it can be (float32 on a CPU with a compiler), else the
    listed blocks per (sequence, group) in cache-sized chunks.

    Decode is memory-bound, so what matters is touching the kept K/V rows once: full blocks are
    gathered by index_select on a [heads, blocks, b * D] view a chunk at a time (the copy stays in
    cache while the kernel reads it: 1.4-1.6x faster than one big gather), the partial last block
    is a slice, only left padding needs a (small) mask, and the chunks merge by log-sum-exp.
    """
    out = decode_block_attention(q, k, v, block_index, block_count, b, scale, seq_start)
    if out is not None:  # in C, the listed rows read in place (kernels/decode_attention.py)
        return out
    bsz, h, _, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    if lk <= _DECODE_MASKED_MAX_TOKENS:
        return _decode_masked(q, k, v, block_index, block_count, b, scale, seq_start)
    out = _decode_one_gather(q, k, v, block_index, block_count, b, scale, seq_start)
    if out is not None:
        return out
    g = block_index.shape[1]
    hq = h // g
    kv_per_group = max(hkv // g, 1)
    n_full = lk // b
    chunk = max(1, _DECODE_CHUNK_TOKENS // b)
    idx_all = block_index[:, :, 0].long().cpu()
    cnt_all = block_count[:, :, 0].long().cpu()
    starts = None if seq_start is None else seq_start.long().cpu()
    out = torch.empty_like(q)
    for bi in range(bsz):
        kb, vb = full_blocks(k[bi], n_full, b), full_blocks(v[bi], n_full, b)
        start = 0 if starts is None else int(starts[bi])
        for gi in range(g):
            ids = idx_all[bi, gi, : cnt_all[bi, gi]].unique()
            ids = ids[(ids * b < lk) & ((ids + 1) * b > start)]
            kv0 = (gi * hq) // (h // hkv)
            heads = slice(kv0, kv0 + kv_per_group)
            full = ids[ids < n_full]
            parts: list[torch.Tensor | None] = [p for p in torch.split(full, chunk) if p.numel()]
            if bool((ids == n_full).any()):
                parts.append(None)  # the partial last block: a slice
            qg = q[bi, gi * hq : (gi + 1) * hq].unsqueeze(0)
            kh, vh = kb[heads], vb[heads]
            outs, lses = [], []
            for part in parts:  # gathered one chunk at a time: the copy is still in cache
                if part is None:
                    kg, vg = k[bi, heads, n_full * b :], v[bi, heads, n_full * b :]
                    pos = torch.arange(n_full * b, lk)
                else:
                    kg = kh.index_select(1, part).view(kv_per_group, -1, d)
                    vg = vh.index_select(1, part).view(kv_per_group, -1, d)
                    pos = (part[:, None] * b + torch.arange(b)).reshape(-1)
                mask = None
                if start > int(pos[0]):  # the chunk reaches into the left padding
                    mask = torch.zeros(1, 1, 1, pos.numel(), dtype=q.dtype)
                    mask.masked_fill_(pos < start, NEG_INF)
                o, lse = attend(qg, kg.unsqueeze(0), vg.unsqueeze(0), scale, mask=mask)
                outs.append(o[0].float())
                lses.append(lse[0].float())
            if not outs:
                out[bi, gi * hq : (gi + 1) * hq] = 0
                continue
            lse_all = torch.stack(lses)  # [pieces, hq, 1]
            w = torch.softmax(lse_all, dim=0).unsqueeze(-1)
            out[bi, gi * hq : (gi + 1) * hq] = (torch.stack(outs) * w).sum(0).to(q.dtype)
    return out


def _decode_one_gather(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    b: int,
    scale: float,
    seq_start: torch.Tensor | None,
) -> torch.Tensor | None:
    """One sequence, no padding, one list per layer or per KV head, at most _DECODE_ONE_GATHER
    kept tokens per head: the kept token rows of all heads in one index_select each for K and V
    (the cache viewed as [Hkv * lk, d]) and one SDPA, the query heads of a KV head as rows of one
    query; shorter lists are padded with masked rows. None where this does not apply.

    Why: the chunked path costs ~10 ops per chunk and group (1.7x dense time at 16k tokens, block
    16); this is ~15 ops in all, and the copy (<= 4 MB) stays in cache."""
    bsz, h, _, d = q.shape
    _, hkv, lk, _ = k.shape
    g = block_index.shape[1]
    if bsz != 1 or seq_start is not None or g not in (1, hkv) or h % hkv:
        return None
    rows_kv = token_rows(k, v)
    if rows_kv is None:
        return None
    k_rows, v_rows, _, step = rows_kv
    nk = -(-lk // b)
    tok = torch.arange(b)
    rows = []
    for gi in range(g):
        ids = block_index[0, gi, 0, : int(block_count[0, gi, 0])].long().cpu().unique()
        ids = ids[(ids >= 0) & (ids < nk)]
        r = ((ids * b).unsqueeze(1) + tok).view(-1)
        rows.append(r[r < lk])
    m = max(int(r.numel()) for r in rows)
    if min(int(r.numel()) for r in rows) == 0 or m > _DECODE_ONE_GATHER:
        return None  # an empty list comes out zero in the chunked path
    mask = None
    if len({int(r.numel()) for r in rows}) > 1:
        lens = torch.tensor([int(r.numel()) for r in rows])
        mask = torch.zeros(g, m, dtype=q.dtype).masked_fill_(
            torch.arange(m) >= lens[:, None], NEG_INF
        )
        mask = mask.view(1, g, 1, m)
        rows = [F.pad(r, (0, m - r.numel())) for r in rows]
    heads = (torch.arange(hkv) * step).unsqueeze(1)  # each KV head's first row
    idx = torch.stack(rows) + heads  # [Hkv, m]: one list (g = 1) broadcasts over the heads
    idx = idx.view(-1).to(k.device)
    kg = k_rows.index_select(0, idx).view(1, hkv, m, d)
    vg = v_rows.index_select(0, idx).view(1, hkv, m, d)
    if mask is not None:
        mask = mask.to(q.device)
    qg = q.reshape(1, hkv, h // hkv, d)
    out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)
    return out.view(1, h, 1, d)


def _decode_masked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    b: int,
    scale: float,
    seq_start: torch.Tensor | None,
) -> torch.Tensor:
    """Short caches: one SDPA call over all keys with the unlisted ones masked out.

    Below a few thousand tokens a decode step is dominated by fixed costs, and reading the whole
    (cache-resident) K/V beats gathering: `sketchwalk bench attention --phase decode` puts the
    crossover near 6k tokens on the project's CPU. The result is the block-sparse one exactly.
    """
    bsz, h, _, d = q.shape
    lk = k.shape[2]
    g = block_index.shape[1]
    nk = -(-lk // b)
    idx = block_index[:, :, 0].long()
    live = torch.arange(idx.shape[-1], device=idx.device) < block_count[:, :, 0].long()[..., None]
    live &= (idx >= 0) & (idx < nk)
    blocks = torch.full((bsz, g, nk + 1), NEG_INF, dtype=q.dtype, device=idx.device)
    blocks.scatter_(2, torch.where(live, idx, nk), 0.0)
    mask = blocks[..., :nk, None].expand(bsz, g, nk, b).reshape(bsz, g, 1, nk * b)[..., :lk]
    if seq_start is not None:
        pad = torch.arange(lk, device=q.device) < seq_start.to(q.device).view(bsz, 1, 1, 1)
        mask = mask.masked_fill(pad, NEG_INF)
    empty = ~torch.isfinite(mask).any(-1)  # [B, G, 1]: rows that see nothing come out zero
    if g == k.shape[1]:  # one list per KV head: its query heads become rows of one query
        out = F.scaled_dot_product_attention(q.view(bsz, g, h // g, d), k, v, mask, scale=scale)
        out = out.view(bsz, h, 1, d)
    else:
        mask = mask.repeat_interleave(h // g, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=True)
    if bool(empty.any()):
        out = out.masked_fill(empty.repeat_interleave(h // g, dim=1)[..., None], 0.0)
    return out
