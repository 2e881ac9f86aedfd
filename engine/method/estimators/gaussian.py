"""A key block summarised as a Gaussian (mean and per-coordinate variance of its sketched keys),
and the log-sum-exp estimate of a query's scores over it: the query estimator's arithmetic
(estimators/query.py), shared with the decode window (estimators/window.py)."""

from __future__ import annotations

import torch

from sketchwalk.engine.method.sketch import group_queries


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
