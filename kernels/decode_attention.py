"""Decode over the listed key blocks in C, read in place from the cache: kernel in
decode_attention.c, built by kernels/native.py.

Why: a sparse decode step is memory-bound and short. The torch paths gather the listed blocks (or
keep a gathered buffer across steps) and call SDPA; with the cache cold, as in a model where every
other layer's weights pass between two calls of a layer, that ran at 2.5-4 GB/s. The C loop reads
each listed K and V row once for all the query heads that share it (docs/notes/speed-log.md has the
measurements). Same contract as kernels/reference.py for one query row; returns None where it
does not apply (not CPU, not float32, no compiled library), and the caller takes its torch path.
"""

from __future__ import annotations

import torch

from .native import library, runs_on


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether decode_block_attention runs for these tensors (else it returns None)."""
    return q.shape[2] == 1 and runs_on(q, k, v)


def decode_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    scale: float,
    seq_start: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """q [B, H, 1, D] at position Lk - 1 over the blocks block_index [B, G, 1, K] lists (counts
    block_count [B, G, 1]) of k, v [B, Hkv, Lk, D]; keys before seq_start [B] are padding.
    Lists may be unsorted and hold duplicates or ids past the cache. Returns [B, H, 1, D], or
    None where the C kernel does not apply."""
    if not applies(q, k, v):
        return None
    bsz, h, _, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = block_index.shape[1]
    if h % g or h % hkv:
        raise ValueError(f"heads {h} must be a multiple of index groups {g} and KV heads {hkv}")
    ids = block_index[:, :, 0].to(torch.int32).contiguous()  # the lists' own dtype: no copy
    counts = block_count[:, :, 0].to(torch.int32).contiguous()
    starts = None if seq_start is None else seq_start.to(torch.int64).contiguous()
    qc = q.contiguous()
    out = torch.empty(bsz, h, 1, d)
    status = library().decode_block_attention_f32(
        qc.data_ptr(), k.data_ptr(), *k.stride()[:3], v.data_ptr(), *v.stride()[:3],
        bsz, h, hkv, d, lk, block_size, ids.data_ptr(), counts.data_ptr(), g, ids.shape[-1],
        None if starts is None else starts.data_ptr(), float(scale), out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise MemoryError(f"decode_block_attention: no memory for the scores of {lk} keys")
    return out
