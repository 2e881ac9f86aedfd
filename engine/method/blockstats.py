"""Exact block attention mass: the ground truth that estimates and selections are compared
against, and that the explorer shows beside the sketch. It needs the full softmax, so it
costs as much as dense attention and is only computed when recording (see Recorder limits).
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.sketch import all_on_host
from sketchwalk.kernels.block_softmax import pack_keys, scored_block_mass
from sketchwalk.kernels.native import library
from sketchwalk.kernels.pooling import pool_into

FUSED_ELEMS = 1 << 22
"""Per-row block masses [B, H, rows, n] per query chunk of the fused path (16 MiB)."""


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
    padded = not all_on_host(key_valid)  # on a GPU: mask anyway (no sync per layer)
    if not padded and lq >= b and q.device.type == "cpu" and library() is not None:
        return _exact_fused(q, k, scale, b, groups, pool)  # a decode row: the product below
    chunk = max(b, (budget_elems // max(h * lk * bsz, 1)) // b * b)
    qv = key_valid[:, offset:].float()  # [B, Lq] real queries
    out = torch.zeros(bsz, groups, nq, nk, device=q.device)
    kt = k.float().transpose(-1, -2)  # [B, Hkv, d, Lk]: a view, never copied per chunk
    for s in range(0, lq, chunk):
        e = min(lq, s + chunk)
        kend = min(lk, e + offset)  # no row of this chunk sees past its last position
        nkc = -(-kend // b)
        # the group's query rows in one product per KV head ([B, Hkv, Gh * c, d]): a product
        # broadcast over the heads of a group copied the keys Gh times per chunk
        qc = q[:, :, s:e].float().reshape(bsz, hkv, (h // hkv) * (e - s), d)
        scores = (qc @ kt[..., :kend]).view(bsz, hkv, h // hkv, e - s, kend) * scale
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


def _exact_fused(
    q: torch.Tensor, k: torch.Tensor, scale: float, b: int, groups: int, pool: str
) -> torch.Tensor:
    """exact_block_mass with every key real, on CPU: each query row's softmax summed per key
    block in one C call (kernels/block_softmax.py scored_block_mass), so the [rows, keys] scores
    and probabilities are never written; about 3x faster than the torch product, softmax and
    block sum (a 2k-token SmolLM2 layer). Agrees with the torch path to float rounding (its
    exp: relative error ~1e-7)."""
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    gh = h // hkv
    nk, nq = -(-lk // b), -(-lq // b)
    offset = lk - lq
    panels = pack_keys(k)  # [B, Hkv, n, d, PANEL]
    out = torch.zeros(bsz, groups, nq, nk)
    chunk = max(b, (FUSED_ELEMS // max(h * nk * bsz, 1)) // b * b)
    for s in range(0, lq, chunk):
        e = min(lq, s + chunk)
        kend = e + offset  # no row of this chunk sees past its last position
        nkc = -(-kend // b)
        qc = (q[:, :, s:e].float() * scale).reshape(bsz, hkv, gh * (e - s), d)
        hi = (torch.arange(s, e) + offset + 1).repeat(gh)  # row (head, t) sees keys 0 .. t
        mass = scored_block_mass(qc, panels, 0, hi, b, kend)  # [B, Hkv, Gh * c, nkc]
        mass = mass.view(bsz, groups, -1, e - s, nkc)
        mass = mass.amax(2) if pool == "max" else mass.mean(2)  # [B, G, c, nkc]
        pool_into(out[..., :nkc], 2, torch.arange(s, e) // b, mass, pool)
    if pool == "max":
        return out / out.sum(-1, keepdim=True).clamp(min=1e-30)
    counts = torch.full((nq,), float(b))
    counts[-1] = lq - (nq - 1) * b
    return out / counts[None, None, :, None]
