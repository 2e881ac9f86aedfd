"""Decode over a selection that is kept across steps: gather its K/V once, then one SDPA per step.

The torch path: where the C kernels run (float32 on a CPU with a compiler), decode reads the
listed blocks in place instead (kernels/decode_attention.py) and nothing is kept here.

Why: a decode step is a handful of microseconds of arithmetic per layer, so on CPU its cost is the
number of torch ops (each can wait for an OpenMP wake-up on a loaded machine) and the bytes it
copies. The stateless kernel (kernels/cpu.py `_decode`) gathers the listed blocks every step, a
chunk at a time, and merges chunks by log-sum-exp: ~25 ops. When the session reuses a selection
(engine/method/decode.py `reusable`), the listed blocks before the current one are immutable past
tokens, so they are gathered once into a buffer with space for one more block; each step copies the
current block's tokens (at most one block) behind them and runs one SDPA call: 3 ops. A selection
kept across key blocks (`engine/method/select.py` `extend_selection`) takes the finished block into the
buffer and moves on (`advance`), given space for more blocks (`spare_blocks`).

Applies to one sequence without left padding whose lists have one group or one per KV head
(`supports`; per-group lists of different lengths get a small mask); everything else takes the
stateless kernel. Reference: kernels/reference.py (the
tests compare against it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import decode_attention
from .cpu_common import full_blocks
from .lists import BlockLists


@dataclass
class GatheredKV:
    """Listed full blocks before block `cur`, gathered per KV head, plus space for block `cur`
    (and for later blocks: `advance`)."""

    k: torch.Tensor  # [1, Hkv, m + b * spare_blocks, d], spare_blocks >= 1
    v: torch.Tensor
    m: int  # gathered tokens
    cur: int  # the current (partial) key block: its tokens are copied in each step
    block_size: int
    source: object  # the index tensor of the lists it was built for (identity, not equality)
    mask: torch.Tensor | None = None  # [1, H, 1, cap] -inf on padded slots of shorter lists


def supports(q: torch.Tensor, k: torch.Tensor, groups: int, seq_start) -> bool:
    """One sequence, no left padding, one list per layer or one per KV head."""
    return q.shape[0] == 1 and q.shape[2] == 1 and seq_start is None and groups in (1, k.shape[1])


def gather(
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    lk: int,
    source: object = None,
    heads: int | None = None,
    spare_blocks: int = 1,
) -> GatheredKV:
    """Gather the listed blocks before the current block (lk - 1) // b, once per selection.

    block_index [1, G, 1, K], block_count [1, G, 1]: G is 1 or Hkv (see `supports`). Per-group
    lists may keep different numbers of blocks (a per-layer budget does that): the shorter ones
    are padded with masked slots, so then `heads` (query heads) is needed to build the mask.
    spare_blocks: blocks of space behind the gathered ones (the current block, `advance`'s next).
    """
    b = block_size
    hkv, d = k.shape[1], k.shape[3]
    cur = (lk - 1) // b
    g = block_index.shape[1]
    lists = []
    for gi in range(g):
        ids = block_index[0, gi, 0, : int(block_count[0, gi, 0])].long().unique()
        if not bool((ids == cur).any()):
            raise ValueError("the list leaves out the current block: use the stateless kernel")
        lists.append(ids[ids < cur])  # full blocks before the current one
    n_full = max(x.numel() for x in lists)
    m = n_full * b
    kb, vb = full_blocks(k[0], cur, b), full_blocks(v[0], cur, b)
    cap = m + b * max(spare_blocks, 1)
    # empty, not zeros: every slot is written before it is read, except the padded slots of
    # shorter lists, zeroed below (masked, but 0 x NaN garbage would still be NaN)
    kbuf = torch.empty(1, hkv, cap, d, dtype=k.dtype, device=k.device)
    vbuf = torch.empty_like(kbuf)
    mask = None
    for h in range(hkv):  # straight into the buffers: no intermediate copy
        ids = lists[0 if g == 1 else h]
        rows = ids.numel()
        torch.index_select(kb[h], 0, ids, out=kbuf[0, h, : rows * b].view(rows, b * d))
        torch.index_select(vb[h], 0, ids, out=vbuf[0, h, : rows * b].view(rows, b * d))
        if rows * b < m:
            kbuf[0, h, rows * b : m] = 0.0
            vbuf[0, h, rows * b : m] = 0.0
    if g > 1 and len({x.numel() for x in lists}) > 1:
        if heads is None:
            raise ValueError("per-group lists of different lengths need the query heads")
        lens = torch.tensor([x.numel() * b for x in lists], device=k.device)
        pad = torch.arange(cap, device=k.device)[None, :] >= lens[:, None]
        pad &= torch.arange(cap, device=k.device)[None, :] < m  # current block on: live
        mask = torch.zeros(hkv, cap, dtype=k.dtype, device=k.device)
        mask = mask.masked_fill(pad, float("-inf"))
        mask = mask.repeat_interleave(heads // hkv, dim=0).view(1, heads, 1, cap)
    return GatheredKV(kbuf, vbuf, m, cur, b, source, mask)


def advance(
    gkv: GatheredKV, k: torch.Tensor, v: torch.Tensor, source: object = None
) -> GatheredKV | None:
    """The gathered K/V of a selection that kept gkv's lists and added the block after gkv.cur
    (engine/method/select.py `extend_selection`): block gkv.cur, now full, joins the gathered tokens and
    the next block becomes the current one. In place, no regathering; None when the buffer has no
    space for another block (then gather afresh)."""
    b = gkv.block_size
    if gkv.m + 2 * b > gkv.k.shape[2]:
        return None
    start = gkv.cur * b
    if k.shape[2] < start + b:
        raise ValueError(f"block {gkv.cur} is not complete in a cache of {k.shape[2]} tokens")
    gkv.k[:, :, gkv.m : gkv.m + b] = k[:, :, start : start + b]
    gkv.v[:, :, gkv.m : gkv.m + b] = v[:, :, start : start + b]
    gkv.m += b
    gkv.cur += 1
    gkv.source = source
    return gkv


def attend(
    gkv: GatheredKV, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """The last query over the gathered blocks plus the current block's tokens so far.

    q [1, H, 1, d]; k, v [1, Hkv, lk, d] the cache, whose last block must be gkv.cur.
    """
    lk = k.shape[2]
    b = gkv.block_size
    if (lk - 1) // b != gkv.cur:
        raise ValueError(f"gathered for block {gkv.cur}, but the cache ends in {(lk - 1) // b}")
    t = lk - gkv.cur * b  # tokens of the current block so far (1..b)
    end = gkv.m + t
    gkv.k[:, :, gkv.m : end] = k[:, :, gkv.cur * b : lk]
    gkv.v[:, :, gkv.m : end] = v[:, :, gkv.cur * b : lk]
    mask = None if gkv.mask is None else gkv.mask[..., :end]
    return F.scaled_dot_product_attention(
        q, gkv.k[:, :, :end], gkv.v[:, :, :end], attn_mask=mask, scale=scale, enable_gqa=True
    )


class Keeper:
    """The CPU backend's DecodeKeeper (kernels/backends.py): a selection's K/V gathered once and
    kept while the session reuses it. Lists are told apart by their index tensor's identity: a
    reused selection hands the same one each step, an extended one (engine/method/select.py
    extend_selection) a new one whose predecessor is `extended_from`."""

    def plan(
        self,
        previous: GatheredKV | None,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lists: BlockLists,
        extended_from: BlockLists | None,
        spare_blocks: int,
    ) -> GatheredKV | None:
        """The gathered K/V for these lists (advanced or gathered anew as needed); None where
        the stateless kernel should run (C reads the rows in place, or `supports` says no)."""
        lists.check_keys(k.shape[2])
        if decode_attention.applies(q, k, v):  # C reads the listed rows in place: keep nothing
            return None
        if not supports(q, k, lists.groups, lists.seq_start):
            return None
        b = lists.block_size
        cur = (k.shape[2] - 1) // b
        g = previous
        crossed = extended_from is not None and g is not None and g.source is extended_from.index
        if crossed and g.cur == cur - 1:
            g = advance(g, k, v, source=lists.index)  # the kept lists crossed a block
        if g is None or g.source is not lists.index or g.cur != cur:
            try:
                heads = q.shape[1]
                g = gather(
                    k, v, lists.index, lists.count, b, k.shape[2], lists.index, heads, spare_blocks
                )
            except ValueError:
                return None
        return g

    def run(
        self, kept: GatheredKV, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return attend(kept, q, k, v, scale)


KEEPER = Keeper()
