"""Block-sparse attention that is actually fast on CPU: the entry point of the CPU backend.

Where each case runs (measured on the project's CPUs, see docs/notes/speed-log.md):
- causal prefill, float32, blocks and tiles in multiples of 16: C (kernels/prefill_attention.py:
  both products in register tiles over the listed blocks, no gathers);
- other prefills and chunks: the torch path (kernels/cpu_prefill.py: interior blocks without
  masks, grouped by count, K/V gathered as memcpy rows, partial results merged by log-sum-exp);
- decode: C where it can be, else torch paths by cache length (kernels/cpu_decode.py); a
  selection reused across steps keeps its K/V gathered (kernels/decode_cache.py KEEPER).
"""

from __future__ import annotations

import torch

from .cpu_decode import decode
from .cpu_prefill import prefill
from .lists import BlockLists
from .prefill_attention import prefill_block_attention


def block_sparse_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as kernels.reference.block_sparse_attention_reference; returns q's dtype.

    Long query tiles over fine key blocks (lists.query_block) keep every flash-kernel call long
    (see docs/notes/speed-log.md)."""
    bsz, h, lq, d = q.shape
    hkv = k.shape[1]
    b, qt = lists.block_size, lists.rows_per_list
    index, count, seq_start = lists.index, lists.count, lists.seq_start
    if qt % b:
        raise ValueError(f"query block {qt} must be a multiple of the block size {b}")
    scale = d**-0.5 if scale is None else float(scale)
    g = lists.groups
    if h % g or h % hkv:
        raise ValueError(f"heads {h} must be a multiple of index groups {g} and KV heads {hkv}")
    if lq == 1 and causal and (hkv % g == 0 or g % hkv == 0):
        return decode(q, k, v, index, count, b, scale, seq_start)
    if causal:
        out = prefill_block_attention(q, k, v, index, count, b, scale, seq_start, qt)
        if out is not None:
            return out.to(q.dtype)
    return prefill(q, k, v, lists, causal, scale)


__all__ = ["block_sparse_attention_cpu"]
