"""PyTorch FlexAttention on our index lists: the peer a user would pick instead of our kernels.

A BlockMask is built from the same block lists the sparse kernel runs (one list per layer or per
KV-head group), with the causal rule inside the diagonal blocks, so both compute the same
attention; `torch.compile(flex_attention)` is compiled once per process (8-20 s on this CPU).
The mask_mod reads a dense [B, G, nq, nk] bool block table, which reproduces the lists exactly.
"""

from __future__ import annotations

import functools

import torch

from sketchwalk.kernels import selected_block_mask


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def block_mask(
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    heads: int,
    lq: int,
    lk: int,
):
    """BlockMask of the lists [B, G, nq, K] (queries are the last lq of lk positions)."""
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, g = block_index.shape[:2]
    nk = -(-lk // block_size)
    table = selected_block_mask(block_index, block_count, nk).to(block_index.device)  # [B,G,nq,nk]
    rep = heads // g
    off = lk - lq
    b = block_size

    def mask_mod(bi, h, q_idx, kv_idx):  # kernels/reference.py token_mask, one element
        return table[bi, h // rep, q_idx // b, kv_idx // b] & (q_idx + off >= kv_idx)

    return create_block_mask(
        mask_mod,
        bsz,
        None if g == 1 else heads,
        lq,
        lk,
        device=str(block_index.device),
        BLOCK_SIZE=block_size,
        # compiled, the mask is reduced block by block: evaluated eagerly it is materialised as
        # [B, H, lq, lk] (64 GiB for Llama-3.1-8B's 32 heads at 16k tokens)
        _compile=True,
    )


def flex_attend(q, k, v, mask, scale: float | None = None) -> torch.Tensor:
    return _compiled()(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
