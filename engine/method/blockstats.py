"""Exact block attention mass and the metrics that compare estimates and selections against it.

This is the ground truth the explorer shows beside the sketch: it needs the full softmax, so it
costs as much as dense attention and is only computed when recording (see Recorder limits).
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.sketch import all_on_host
from sketchwalk.kernels.pooling import pool_into


def exact_block_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    block_size: int,
    key_valid: torch.Tensor,
    groups: int = 1,
    budget_elems: int = 1 << 20,  # ~one query block per chunk: scores stay in cache (2-3x faster)
    pool: str = "mean",
) -> torch.Tensor:
    """True softmax mass per key block, [B, groups, nq, nk], averaged over heads and real queries
    (pool "max": each key block's largest mass over them, rows scaled to sum to 1: the exact
    counterpart of a max-pooled estimate).

    q [B, H, Lq, d] are the last Lq positions of k [B, Hkv, Lk, d]; key_valid [B, Lk] marks real
    keys. Row i is query block i (rows [i*b, (i+1)*b) of q). Query chunks keep memory bounded, and
    each chunk only scores the keys its last row can see (half the work under causality).
    """
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    b = block_size
    nk, nq = -(-lk // b), -(-lq // b)
    offset = lk - lq
    chunk = max(b, (budget_elems // max(h * lk * bsz, 1)) // b * b)
    padded = not all_on_host(key_valid)  # on a GPU: mask anyway (no sync per layer)
    qv = key_valid[:, offset:].float()  # [B, Lq] real queries
    out = torch.zeros(bsz, groups, nq, nk, device=q.device)
    kf = k.float().unsqueeze(2)  # [B, Hkv, 1, Lk, d]
    for s in range(0, lq, chunk):
        e = min(lq, s + chunk)
        kend = min(lk, e + offset)  # no row of this chunk sees past its last position
        nkc = -(-kend // b)
        qc = q[:, :, s:e].float().view(bsz, hkv, h // hkv, e - s, d)
        scores = (qc @ kf[..., :kend, :].transpose(-1, -2)) * scale  # [B,Hkv,Gh,c,kend]
        first = s + offset + 1  # keys from here on are in the future of some row
        if first < kend:
            rows = torch.arange(s, e, device=q.device)[:, None] + offset
            future = torch.arange(first, kend, device=q.device)[None, :] > rows
            scores[..., first:].masked_fill_(future, float("-inf"))
        if padded:
            scores.masked_fill_(~key_valid[:, None, None, None, :kend], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if padded:  # padded query rows see nothing: NaN rows -> 0
            probs = probs.nan_to_num_(0.0)
        if nkc * b != kend:
            probs = torch.nn.functional.pad(probs, (0, nkc * b - kend))
        mass = probs.view(bsz, hkv, h // hkv, e - s, nkc, b).sum(-1)
        mass = mass.reshape(bsz, groups, -1, e - s, nkc)
        mass = mass.amax(2) if pool == "max" else mass.mean(2)  # [B,G,c,nkc]
        if padded:
            mass = mass * qv[:, None, s:e, None]
        pool_into(out[..., :nkc], 2, torch.arange(s, e) // b, mass, pool)
    if pool == "max":  # rows scaled to sum to 1, as the estimates are (sketch.aggregate_heads)
        return out / out.sum(-1, keepdim=True).clamp(min=1e-30)
    counts = torch.nn.functional.pad(qv, (0, nq * b - lq)).view(bsz, nq, b).sum(-1)
    return out / counts.clamp(min=1.0)[:, None, :, None]


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total-variation distance between distributions along the last dim."""
    return 0.5 * (p - q).abs().sum(-1)


def mass_recall(exact: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Share of true attention mass that falls in the selected blocks, per row."""
    return (exact * selected.to(exact.dtype)).sum(-1)


def row_mean(values: torch.Tensor, rows: torch.Tensor) -> float:
    """Mean of per-row values over the rows that hold real queries."""
    w = rows.to(values.dtype)
    return float((values * w).sum() / w.sum().clamp(min=1.0))
