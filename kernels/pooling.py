"""Tensor helpers the block-mass launchers and the engine share: GQA rows and per-row pooling.

Pure torch, no kernel: they live in kernels/ because the launchers (kernels/cpu_block_mass.py)
pool scored queries into their rows, and kernels never import the engine.
"""

from __future__ import annotations

import warnings

import torch

# index_reduce_ is marked beta (a one-time UserWarning); its "amax" is what max pooling needs and
# runs as fast as index_add_ on these shapes (scatter_reduce_ was ~20x slower)
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")


def kv_rows(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, H, L, r] -> [B, Hkv, (H/Hkv) L, r]: the query heads of a KV head as rows of one matrix,
    so one matmul per KV head scores them all; a broadcast matmul over grouped queries would copy
    the keys once per query head (at 7k tokens in decode that copy cost more than the product)."""
    return q.reshape(q.shape[0], n_kv_heads, -1, q.shape[-1])


def pool_into(
    out: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, pool: str
) -> torch.Tensor:
    """Pool the slices of src into out along dim at index, in place: summed (pool "mean"; the
    caller divides by the counts) or their running max (pool "max"; out starts at 0 for
    masses, or at -inf). index: rows of a host tensor (its runs are read on the host; a device
    tensor costs a copy)."""
    index = index.cpu()
    run = _run_length(index)
    if run:  # runs of `run` slices per index, in order: a reshape, not a scatter (~2x faster)
        length, first = index.numel(), int(index[0])
        whole = length // run * run
        for s in range(0, length, whole):  # the whole runs, then a shorter last one if any
            e = min(length, s + whole)
            x = src.narrow(dim, s, e - s).unflatten(dim, (-1, min(run, e - s)))
            o = out.narrow(dim, first + s // run, x.shape[dim])
            if pool == "max":
                torch.maximum(o, x.amax(dim + 1), out=o)
            else:
                o.add_(x.sum(dim + 1))
        return out
    index = index.to(out.device)
    if pool == "max":
        return out.index_reduce_(dim, index, src, "amax")
    return out.index_add_(dim, index, src)


def _run_length(index: torch.Tensor) -> int:
    """k where index [L] is index[0] + (0, .., 0, 1, .., 1, ...) in runs of k (the last may be
    shorter), as evenly sampled queries give their rows; 0 otherwise."""
    length = index.numel()
    if length < 2:
        return 0
    k = int(torch.searchsorted(index, index[0] + 1))  # the first run's length
    expect = index[0] + torch.arange(length) // max(k, 1)
    return k if 0 < k < length and torch.equal(index, expect) else 0


def mean_per_row(sums: torch.Tensor, row: torch.Tensor, q_valid: torch.Tensor) -> torch.Tensor:
    """Sums [B, Hkv, G, R, n] over scored queries -> their mean per row; row [L] is each query's
    row, q_valid [B, L] its realness (rows without a real scored query stay zero)."""
    count = torch.zeros(sums.shape[0], sums.shape[3], device=sums.device)
    count.index_add_(1, row, q_valid.float())
    return sums / count.clamp(min=1.0)[:, None, None, :, None]


def pool_heads(mass: torch.Tensor, pool: str) -> torch.Tensor:
    """Per-head block mass [B, Hkv, G, R, n] -> [B, Hkv, R, n]: each block's largest over a KV
    head's query heads (pool "max") or their sum ("mean"), before rows are normalised."""
    return mass.amax(2) if pool == "max" else mass.sum(2)
