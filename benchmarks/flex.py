"""PyTorch FlexAttention on our index lists: the peer a user would pick instead of our kernels.

A BlockMask is built from the same block lists the sparse kernel runs (one list per layer or per
KV-head group), with the causal rule inside the diagonal blocks, so both compute the same
attention; `torch.compile(flex_attention)` is compiled once per process (8-20 s on this CPU).
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
    """BlockMask of the lists [B, G, nq, K] (queries are the last lq of lk positions).

    Built straight from the lists (`BlockMask.from_kv_blocks`): the blocks every query of a row
    sees whole are Flex's "full" blocks (no mask_mod), the other visible listed blocks its partial
    ones. No mask is evaluated to build it, so nothing is compiled or materialised
    (create_block_mask evaluates the mask_mod per element: [B, H, lq, lk] when not compiled,
    64 GiB for Llama-3.1-8B's 32 heads at 16k tokens). The mask_mod still reads the lists' block
    table, as Flex's eager path (the tests) applies the mask_mod alone."""
    from torch.nn.attention.flex_attention import BlockMask

    g, b = block_index.shape[1], block_size
    nq, nk = -(-lq // b), -(-lk // b)
    off = lk - lq
    table = selected_block_mask(block_index, block_count, nk).to(block_index.device)
    rep = heads // g
    start = torch.arange(nk, device=table.device) * b
    end = torch.clamp(start + b, max=lk)  # one past a key block's last key
    first_q = off + torch.arange(nq, device=table.device) * b
    last_q = off + torch.clamp(torch.arange(1, nq + 1, device=table.device) * b, max=lq) - 1
    whole = (end[None, :] - 1 <= first_q[:, None]) & (end - start == b)[None, :]
    seen = start[None, :] <= last_q[:, None]
    full, partial = table & whole, table & seen & ~whole
    full, partial = full.repeat_interleave(rep, 1), partial.repeat_interleave(rep, 1)

    def lists(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.sort(m.to(torch.int8), dim=-1, descending=True, stable=True).indices
        return m.sum(-1).to(torch.int32), order.to(torch.int32)

    def mask_mod(bi, h, q_idx, kv_idx):  # kernels/reference.py token_mask, one element
        return table[bi, h // rep, q_idx // b, kv_idx // b] & (q_idx + off >= kv_idx)

    return BlockMask.from_kv_blocks(
        *lists(partial), *lists(full), BLOCK_SIZE=b, mask_mod=mask_mod, seq_lengths=(lq, lk)
    )


def flex_attend(q, k, v, mask, scale: float | None = None) -> torch.Tensor:
    return _compiled()(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
