"""The engine-to-kernel contract: which key blocks each query block (or tile) attends to.

A selection (engine/method/select.py) builds one BlockLists per layer step; every backend
(kernels/backends.py) takes it as it is. Conventions (kernels/reference.py has the exact ones):
- index [B, G, NQ, K] int32: sorted key-block ids per (batch, head group, query row of lists);
  entries past count [B, G, NQ] are ignored. G divides the query heads; head h uses group
  h // (H // G).
- block_size: key (and query) block size in tokens.
- query_block: rows per list when tiles of several query blocks share one list (a multiple of
  block_size); None means one list per query block.
- seq_start [B] (optional): keys before it are left padding, never visible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .reference import dense_block_index, tiles_of_rows


@dataclass(frozen=True)
class BlockLists:
    index: torch.Tensor
    count: torch.Tensor
    block_size: int
    query_block: int | None = None
    seq_start: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.index.device

    @property
    def groups(self) -> int:
        return self.index.shape[1]

    @property
    def rows_per_list(self) -> int:
        """Query rows that share one list (query_block, or one block)."""
        return self.block_size if self.query_block is None else int(self.query_block)

    def starting_at(self, seq_start: torch.Tensor | None) -> BlockLists:
        """The same lists over keys whose first real position per sequence is seq_start."""
        return replace(self, seq_start=seq_start)

    def rows(self, i0: int, i1: int) -> BlockLists:
        """The lists of query rows [i0, i1) (rows of lists, not tokens)."""
        return replace(self, index=self.index[:, :, i0:i1], count=self.count[:, :, i0:i1])

    def tiled(self, tile_rows: int, n_kblocks: int, width: int | None = None) -> BlockLists:
        """One list per tile of tile_rows consecutive query blocks: the union of theirs.
        width: a bound on the unions' length known on the host (no device read); see
        kernels/reference.py tiles_of_rows."""
        if self.query_block is not None:
            raise ValueError("these lists are already per query tile")
        index, count = tiles_of_rows(self.index, self.count, tile_rows, n_kblocks, width)
        return replace(self, index=index, count=count, query_block=tile_rows * self.block_size)


def dense_lists(
    batch: int, groups: int, lq: int, lk: int, block_size: int, device: torch.device | str = "cpu"
) -> BlockLists:
    """Lists that select every causal key block: the kernels then equal dense attention."""
    index, count = dense_block_index(batch, groups, lq, lk, block_size, device)
    return BlockLists(index, count, block_size)
