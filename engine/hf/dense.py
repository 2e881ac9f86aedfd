"""Dense attention the way the model would compute it (SDPA), for dense layers and baselines."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Causal attention of the last Lq positions over Lk keys; mask is the model's (bool or additive)."""
    lq, lk = q.shape[2], k.shape[2]
    if mask is not None:
        mask = mask[:, :, -lq:, :lk]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if lq == lk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    if lq == 1:  # decode: the one query sees every key; an all-true mask costs SDPA ~2x here
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    # SDPA's is_causal aligns top-left; queries here are the last Lq positions (bottom-right).
    rows = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
    causal = torch.arange(lk, device=q.device)[None, :] <= rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=scale, enable_gqa=True)


def key_validity(
    mask: torch.Tensor | None, bsz: int, lk: int, device: torch.device
) -> torch.Tensor:
    """[B, Lk] real-key mask from the model's attention mask (bool or additive float).

    The last query row sees every real key (causality) and no padding, so it names the real keys.
    """
    if mask is None:
        return torch.ones(bsz, lk, dtype=torch.bool, device=device)
    last = mask[:, 0, -1, :lk]
    if last.dtype == torch.bool:
        return last.expand(bsz, lk)
    return (last > torch.finfo(last.dtype).min / 2).expand(bsz, lk)
