"""Exact block-sparse attention in plain torch: the oracle every fast kernel is tested against.

Conventions shared by every kernel (the entry point: kernels/backends.py; the lists: kernels/lists.py):
- q [B, H, Lq, D]; k, v [B, Hkv, Lk, D] with H % Hkv == 0 (grouped-query attention, K/V not repeated).
- Queries are the last Lq positions of the Lk keys (Lq == Lk in prefill, Lq == 1 in decode).
- Query block i is rows [i*b, (i+1)*b) of q; key block j is key positions [j*b, (j+1)*b).
  With query_block = m (a multiple of b), lists are per query tile instead: rows [i*m, (i+1)*m).
- block_index [B, G, NQ, K] int: sorted key-block ids per (batch, head group, query block), entries
  past block_count [B, G, NQ] are ignored (they may hold any value). G divides H; query head h uses
  group h // (H // G). NQ = ceil(Lq / b) (ceil(Lq / m) with query tiles).
- causal: key position p is visible to query row r only if p <= (Lk - Lq) + r.
- seq_start [B] (optional): keys before seq_start[b] are padding and never visible.
- A query row that sees no key returns zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .lists import BlockLists


def selected_block_mask(
    block_index: torch.Tensor, block_count: torch.Tensor, n_kblocks: int
) -> torch.Tensor:
    """Index lists -> boolean [B, G, NQ, NK] mask of selected key blocks."""
    kmax = block_index.shape[-1]
    live = torch.arange(kmax, device=block_index.device) < block_count.unsqueeze(-1)
    idx = torch.where(live, block_index.long(), torch.full_like(block_index.long(), n_kblocks))
    mask = torch.zeros(
        *block_index.shape[:-1], n_kblocks + 1, dtype=torch.bool, device=block_index.device
    )
    mask.scatter_(-1, idx, True)
    return mask[..., :n_kblocks]


def token_mask(
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    lq: int,
    lk: int,
    causal: bool = True,
    seq_start: torch.Tensor | None = None,
    query_block: int | None = None,
) -> torch.Tensor:
    """The [B, G, Lq, Lk] boolean visibility mask the index lists describe."""
    nk = -(-lk // block_size)
    blocks = selected_block_mask(block_index, block_count, nk)  # [B,G,NQ,NK]
    rows = torch.arange(lq, device=blocks.device)
    cols = torch.arange(lk, device=blocks.device)
    tile = query_block or block_size
    mask = blocks[:, :, rows // tile][..., cols // block_size]  # [B,G,Lq,Lk]
    if causal:
        mask = mask & (cols[None, :] <= rows[:, None] + (lk - lq))
    if seq_start is not None:
        mask = mask & (cols >= seq_start.to(cols.device).view(-1, 1, 1, 1))
    return mask


def block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Materialises scores and the token mask in fp32: exact, slow, O(Lq * Lk) memory."""
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    lists.check_keys(lk)
    g = lists.groups
    scale = d**-0.5 if scale is None else scale
    mask = token_mask(
        lists.index, lists.count, lists.block_size, lq, lk, causal, lists.seq_start,
        lists.query_block,
    )  # fmt: skip
    mask = mask.repeat_interleave(h // g, dim=1)  # [B,H,Lq,Lk]
    kf = k.float().repeat_interleave(h // hkv, dim=1)
    vf = v.float().repeat_interleave(h // hkv, dim=1)
    scores = (q.float() @ kf.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ vf).to(q.dtype)


def rows_of_tiles(
    block_index: torch.Tensor, block_count: torch.Tensor, tile_rows: int, n_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists per query tile of tile_rows blocks -> the same lists per query block (exact: causality
    trims each row), for kernels that take one list per block."""
    index = block_index.repeat_interleave(tile_rows, dim=2)[:, :, :n_rows]
    count = block_count.repeat_interleave(tile_rows, dim=2)[:, :, :n_rows]
    return index.contiguous(), count.contiguous()


def tiles_of_rows(
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    tile_rows: int,
    n_kblocks: int,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists per query block -> one list per tile of tile_rows consecutive blocks (their union).
    width: the lists' width where the caller knows a bound on the host (no device read of the
    longest union; entries past a tile's count hold the last key block, never read)."""
    bsz, g, nq, _ = block_index.shape
    mask = selected_block_mask(block_index, block_count, n_kblocks)
    n_tiles = -(-nq // tile_rows)
    pad = n_tiles * tile_rows - nq
    if pad:
        mask = torch.nn.functional.pad(mask, (0, 0, 0, pad))
    mask = mask.view(bsz, g, n_tiles, tile_rows, n_kblocks).any(3)
    count = mask.sum(-1)
    if width is None:
        width = int(count.max()) if count.numel() else 1
    kmax = max(min(width, n_kblocks), 1)
    j = torch.arange(n_kblocks, device=mask.device, dtype=torch.int32)
    index = torch.where(mask, j, torch.full_like(j, n_kblocks)).sort(dim=-1).values[..., :kmax]
    index = index.clamp(max=max(n_kblocks - 1, 0))
    return index.contiguous(), count.to(torch.int32).contiguous()


def dense_block_index(
    batch: int, groups: int, lq: int, lk: int, block_size: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index lists that select every causal key block: the kernels then equal dense attention."""
    nq = -(-lq // block_size)
    nk = -(-lk // block_size)
    offset = lk - lq
    last_row = torch.clamp(
        torch.arange(nq, device=device) * block_size + block_size - 1, max=lq - 1
    )
    count = (last_row + offset) // block_size + 1  # key blocks up to the row block's last position
    index = torch.arange(nk, device=device).expand(nq, nk)
    index = index.expand(batch, groups, nq, nk).to(torch.int32).contiguous()
    count = count.to(torch.int32).expand(batch, groups, nq).contiguous()
    return index, count
