"""The engine-to-kernel contract: which key blocks each query block (or tile) attends to.

A selection (engine/method/select.py) is one BlockLists per layer step, and every backend
(kernels/backends.py) takes it as it is; like FlexAttention's BlockMask it carries its block
size and the length of the keys it ranges over (in blocks). Conventions (kernels/reference.py
has the exact ones):
- index [B, G, NQ, K] int32: sorted key-block ids per (batch, head group, query row of lists);
  entries past count [B, G, NQ] are ignored. G divides the query heads; head h uses group
  h // (H // G).
- block_size: key (and query) block size in tokens.
- key_blocks: key blocks the lists range over, ceil(Lk / block_size) of the keys they are run
  on (checked on the host by `check_keys`); None for lists built without keys in mind (tests).
- query_block: rows per list when tiles of several query blocks share one list (a multiple of
  block_size); None means one list per query block.
- seq_start [B] (optional): keys before it are left padding, never visible.
- kept, candidates: a selection's (query row, key block) pairs kept and causal, over real rows,
  every batch element and group; `density` is their ratio. Ints where counted on the host,
  0-dim tensors where counted on the device (read only when a density is asked for: no host
  round trip per layer); None where no selection counted them.
A backend that keeps state for a selection across decode steps (a DecodeKeeper) tells
selections apart by the identity of their index tensor: the selection's lists hand it over
themselves, and starting_at keeps it.
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
    key_blocks: int | None = None
    kept: int | torch.Tensor | None = None
    candidates: int | torch.Tensor | None = None

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

    @property
    def density(self) -> float:
        """Kept over candidate pairs: the density the selection achieved (a host read of the
        counts where they are device tensors, so only when asked)."""
        if self.kept is None or self.candidates is None:
            raise ValueError("these lists carry no pair counts: no selection made them")
        return float(self.kept) / max(float(self.candidates), 1.0)

    def check_keys(self, key_length: int) -> None:
        """Raise where these lists range over other key blocks than key_length keys fill (a host
        comparison of integers: no device read)."""
        if self.key_blocks is None:
            return
        n = -(-key_length // self.block_size)
        if n != self.key_blocks:
            raise ValueError(
                f"lists over {self.key_blocks} key blocks of {self.block_size} tokens run on "
                f"{key_length} keys ({n} blocks)"
            )

    def starting_at(self, seq_start: torch.Tensor | None) -> BlockLists:
        """The same lists over keys whose first real position per sequence is seq_start (these
        lists themselves where that is theirs already: a decode layer asks twice a step)."""
        return self if seq_start is self.seq_start else replace(self, seq_start=seq_start)

    def rows(self, i0: int, i1: int) -> BlockLists:
        """The lists of query rows [i0, i1) (rows of lists, not tokens): a part of one kernel
        call. The pair counts are the whole selection's, not the part's, so they are dropped."""
        return replace(
            self,
            index=self.index[:, :, i0:i1],
            count=self.count[:, :, i0:i1],
            kept=None,
            candidates=None,
        )

    def tiled(self, tile_rows: int, n_kblocks: int, width: int | None = None) -> BlockLists:
        """One list per tile of tile_rows consecutive query blocks: the union of theirs.
        width: a bound on the unions' length known on the host (no device read); see
        kernels/reference.py tiles_of_rows. The pair counts stay the selection's (what it
        kept, not the blocks a union reads past a row's causal end)."""
        if self.query_block is not None:
            raise ValueError("these lists are already per query tile")
        index, count = tiles_of_rows(self.index, self.count, tile_rows, n_kblocks, width)
        return replace(self, index=index, count=count, query_block=tile_rows * self.block_size)


def dense_lists(
    batch: int, groups: int, lq: int, lk: int, block_size: int, device: torch.device | str = "cpu"
) -> BlockLists:
    """Lists that select every causal key block: the kernels then equal dense attention (every
    listed pair is a kept candidate: density 1 wherever there is a pair)."""
    index, count = dense_block_index(batch, groups, lq, lk, block_size, device)
    pairs = count.sum()
    return BlockLists(
        index, count, block_size, key_blocks=-(-lk // block_size), kept=pairs, candidates=pairs
    )
