"""Registers Sketch&Walk with transformers as attn_implementation="sketch_walk"."""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from sketchwalk.engine.hf.session import current_session, in_dense_context

NAME = "sketch_walk"


def sketch_walk_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: q [B,H,Lq,D], k/v [B,Hkv,Lk,D] -> out [B,Lq,H,D]."""
    if in_dense_context():  # a run's dense side beside a sparse one (session.dense_context)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    session = current_session()
    session.bind_model(getattr(module, "config", None))  # once per session: reads the profile
    out = session.attend(module.layer_idx, query, key, value, attention_mask, scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Idempotent; returns the implementation name to pass as attn_implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sketch_walk_attention)
    # sdpa_mask: a bool mask only when there is padding (None otherwise), never a dense float T x T.
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
