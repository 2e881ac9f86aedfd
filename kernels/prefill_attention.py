"""Block-sparse prefill attention in C on CPU: kernel in prefill_attention.c, built by
kernels/native.py.

Why: the torch path (kernels/cpu.py) runs torch's flash kernel over gathered blocks at dense
attention's efficiency, plus thousands of small ops around the calls (~25% of a layer at 8k
tokens). The C kernel scores and sums in register tiles over the listed blocks in place, one call
per layer and core (docs/notes/speed-log.md has the measurements). Same contract as kernels/reference.py
for causal attention; returns None where it does not apply (not CPU, not float32, block size,
query tile or head dim not a multiple of 16, no compiled library), and the caller takes its torch
path.
"""

from __future__ import annotations

import torch

from .block_softmax import PANEL, pack_keys
from .native import library, runs_on
from .parts import run_in_parts, workers


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, tile: int) -> bool:
    """Whether prefill_block_attention runs for these tensors and lists (else it returns None)."""
    sizes = block_size % PANEL == 0 and tile % block_size == 0 and q.shape[-1] % PANEL == 0
    return sizes and runs_on(q, k, v)


def prefill_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    scale: float,
    seq_start: torch.Tensor | None = None,
    query_block: int | None = None,
) -> torch.Tensor | None:
    """Causal q [B, H, Lq, D] (the last Lq of the Lk positions) over the key blocks that
    block_index [B, G, NT, K] lists per query tile of query_block rows (default: one block),
    counts block_count [B, G, NT]; keys before seq_start [B] are padding. Returns [B, H, Lq, D],
    or None where the C kernel does not apply."""
    tile = query_block or block_size
    if not applies(q, k, v, block_size, tile):
        return None
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g, nt = block_index.shape[1], block_index.shape[2]
    if h % g or h % hkv:
        raise ValueError(f"heads {h} must be a multiple of index groups {g} and KV heads {hkv}")
    if nt != -(-lq // tile):
        raise ValueError(f"{nt} lists for {lq} queries in tiles of {tile}")
    panels = pack_keys(k, block_size)  # whole blocks: a partial last block reads zero keys
    ids = block_index.to(torch.int64).contiguous()
    counts = block_count.to(torch.int64).contiguous()
    starts = None if seq_start is None else seq_start.to(torch.int64).contiguous()
    out = torch.empty(bsz, h, lq, d)
    units = bsz * hkv * nt
    parts = max(1, min(workers(), units))
    lib = library()

    def run(i: int, _end: int) -> None:
        status = lib.prefill_block_attention_f32(
            q.data_ptr(), *q.stride()[:3], panels.data_ptr(), v.data_ptr(), *v.stride()[:3],
            bsz, h, hkv, lq, lk, d, panels.shape[2], block_size, tile, ids.data_ptr(),
            counts.data_ptr(), g, ids.shape[-1], None if starts is None else starts.data_ptr(),
            float(scale), i, parts, out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise MemoryError("prefill_block_attention: no memory for its scratch")

    # units are interleaved over the parts (unit i, i + parts, ...): the causal work grows with
    # the query tile, so every part gets early and late tiles alike
    if parts > 1:
        run_in_parts(run, list(range(parts + 1)))
    else:
        run(0, 1)
    return out
