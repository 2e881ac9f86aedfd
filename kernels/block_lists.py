"""A kept-block mask as sorted index lists (block_lists.c), beside its torch reference.

Why: the select's last step turns a [B, G, nq, nk] kept mask into the kernels' index lists; the
torch reference below (a cumulative sum, a scatter, a select, each converting dtypes) took ~1-2 ms
a layer at 8k tokens, one C scan per row a tenth of that. `block_lists` runs the C kernel on CPU
where the library is built, the reference elsewhere.
"""

from __future__ import annotations

import torch

from .native import library


def block_lists_reference(keep: torch.Tensor, kmax: int) -> torch.Tensor:
    """keep [..., nk] bool -> int32 [..., kmax]: each row's kept blocks ascending, then its first
    kept block repeated (nk - 1 where it keeps none); kmax >= every row's count."""
    nk = keep.shape[-1]
    at = keep.cumsum(-1, dtype=torch.int32)  # a kept block's place in its list, plus one
    count = (
        at[..., -1:]
        if nk
        else torch.zeros(*keep.shape[:-1], 1, dtype=torch.int32, device=keep.device)
    )
    j = torch.arange(nk, device=keep.device, dtype=torch.int32)
    # each kept block written at its place (unkept ones into a spare last slot): the sorted lists
    # in one pass, where a sort of every row cost ~3.5 ms a layer at 7k tokens
    index = torch.full((*keep.shape[:-1], kmax + 1), nk, dtype=torch.int32, device=keep.device)
    index.scatter_(-1, torch.where(keep, at - 1, kmax).long(), j.expand_as(at))
    index = index[..., :kmax]
    live = torch.arange(kmax, device=keep.device) < count
    return torch.where(live, index, index[..., :1].clamp(max=max(nk - 1, 0)))


def block_lists(keep: torch.Tensor, kmax: int) -> torch.Tensor:
    """block_lists_reference, in C on CPU where it can be."""
    lib = library() if keep.device.type == "cpu" and keep.dtype == torch.bool else None
    if lib is None:
        return block_lists_reference(keep, kmax)
    flags = keep.contiguous()
    index = torch.empty(*keep.shape[:-1], kmax, dtype=torch.int32)
    rows = keep[..., 0].numel() if keep.shape[-1] else 0
    if lib.block_lists_i32(flags.data_ptr(), rows, keep.shape[-1], kmax, index.data_ptr()) != 0:
        raise MemoryError(f"block_lists: no memory for a row of {keep.shape[-1]} blocks")
    return index
