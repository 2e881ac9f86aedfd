"""PyTorch FlexAttention as a backend: the peer a user would pick, run on our own lists.

A BlockMask is built straight from the lists (`BlockMask.from_kv_blocks`, nothing evaluated per
element): the blocks every query of a list's rows sees whole are Flex's "full" blocks (no
mask_mod), the other visible listed blocks its partial ones, whose mask_mod applies the lists,
causality and left padding element by element (kernels/reference.py token_mask). Query tiles
(lists.query_block) are Flex's query block size. On CUDA the attention is
`torch.compile(flex_attention)` (compiled once per shape); on CPU tensors it runs eagerly,
which is exact but materialises the scores (the tests' path; the CPU kernels are the fast one).
A decode step (one query) goes to the device's own kernel instead: a compiled Flex call per
cache length would recompile at every token.

Select it with backend="flex" or SKETCHWALK_KERNEL=flex; benchmarks/gpu_check.sh times it beside
the Triton kernel on the same lists.
"""

from __future__ import annotations

import functools

import torch

from .lists import BlockLists
from .reference import selected_block_mask


def available() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def block_mask(lists: BlockLists, heads: int, lq: int, lk: int, causal: bool = True):
    """The BlockMask of `lists` for `heads` query heads (queries are the last lq of lk keys)."""
    from torch.nn.attention.flex_attention import BlockMask

    b, qt = lists.block_size, lists.rows_per_list
    dev = lists.device
    nq, nk = -(-lq // qt), -(-lk // b)
    off = lk - lq
    table = selected_block_mask(lists.index, lists.count, nk)  # [B, G, nq, nk]
    rep = heads // lists.groups
    start = torch.arange(nk, device=dev) * b
    end = torch.clamp(start + b, max=lk)  # one past a key block's last key
    first_q = off + torch.arange(nq, device=dev) * qt
    last_q = off + torch.clamp(torch.arange(1, nq + 1, device=dev) * qt, max=lq) - 1
    bsz = table.shape[0]
    pad = torch.zeros(bsz, dtype=torch.long, device=dev)
    if lists.seq_start is not None:
        pad = lists.seq_start.to(dev).long()
    real = end[None, :] > pad[:, None]  # [B, nk] blocks holding a real key
    intact = (start[None, :] >= pad[:, None]) & (end - start == b)[None, :]  # no pad, no cut
    if causal:
        whole = (end[None, :] - 1 <= first_q[:, None])[None] & intact[:, None]
        seen = (start[None, :] <= last_q[:, None])[None] & real[:, None]
    else:
        whole = intact[:, None].expand(bsz, nq, nk)
        seen = real[:, None].expand(bsz, nq, nk)
    full = table & whole[:, None]
    partial = table & seen[:, None] & ~whole[:, None]
    full, partial = full.repeat_interleave(rep, 1), partial.repeat_interleave(rep, 1)

    def as_lists(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.sort(m.to(torch.int8), dim=-1, descending=True, stable=True).indices
        return m.sum(-1).to(torch.int32), order.to(torch.int32)

    def mask_mod(bi, h, q_idx, kv_idx):  # token_mask, one element
        keep = table[bi, h // rep, q_idx // qt, kv_idx // b] & (kv_idx >= pad[bi])
        return keep & (q_idx + off >= kv_idx) if causal else keep

    return BlockMask.from_kv_blocks(
        *as_lists(partial), *as_lists(full), BLOCK_SIZE=(qt, b), mask_mod=mask_mod,
        seq_lengths=(lq, lk),
    )  # fmt: skip


def flex_attend(q, k, v, mask, scale: float | None = None) -> torch.Tensor:
    """FlexAttention under a BlockMask: compiled on CUDA, eager elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)


def block_sparse_attention_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as kernels.reference.block_sparse_attention_reference."""
    if q.shape[2] == 1 and causal:  # decode: the device's own kernel (see the module's note)
        from .backends import backend_for

        return backend_for(q.device, "auto").attend(q, k, v, lists, causal, scale)
    mask = block_mask(lists, q.shape[1], q.shape[2], k.shape[2], causal)
    return flex_attend(q, k, v, mask, scale)
