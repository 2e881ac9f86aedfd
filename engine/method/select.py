"""Select: the key blocks each query block keeps, to a density budget, as sorted index lists.

A selection is the kernels' BlockLists (kernels/lists.py): the lists with their block size, the
key blocks they range over and the (row, block) pairs kept and counted, whose ratio is the
achieved density.

Per row i the candidates are causal key blocks holding real tokens. Sink blocks, the local window
and dense-tail rows are always kept ("forced"). The rest of the budget, density x all candidate
pairs, is spread one of two ways:
- budget "layer": to the highest scores anywhere in the layer (per selection group), so rows keep
  different counts and the budget goes where the estimated attention is. Needs scores that
  compare across rows (row-normalised block masses do).
- budget "row": one rate for every row, each row keeping max(forced, ceil(rate * candidates)),
  with the rate calibrated so the total lands on the target.
With query tiles (config query_block), consecutive rows share one list: the layer budget then
goes to (tile, key block) pairs, each costing the rows that see it (group_budget_keep).
Either way the achieved density is reported, never assumed.

A method may bring its own rule instead of the budget (Method.rule): ThresholdRule keeps, per
row, the fewest blocks whose estimated mass reaches a threshold (XAttention's selection), at
whatever density that comes to, counted the same way.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from sketchwalk.kernels import BlockLists, kernel, selected_block_mask


@dataclass(frozen=True)
class Tiles:
    """Query rows in tiles of consecutive blocks that share one list (config query_block): each
    row's tile `gid` [nq] on the rows' device, and the layout as host integers, read once per
    forward step (budget_masks) so a layer's selection never asks the device for a shape.
    regular: only the first and last tiles may be partial (consecutive rows), so sums over a
    tile's rows are a padded view; otherwise a one-hot product."""

    gid: torch.Tensor
    count: int  # tiles
    size: int  # rows of a whole tile
    front: int  # rows the first tile lacks
    regular: bool

    @classmethod
    def of(cls, q_blocks: torch.Tensor, row_group: int) -> Tiles:
        host = q_blocks.cpu()  # one host read: the rows' layout, not data
        gid = host // row_group
        gid = gid - gid[0]
        count, nq = int(gid[-1]) + 1, gid.numel()
        sizes = torch.bincount(gid, minlength=count)
        size = int(sizes.max())
        front = size - int(sizes[0])
        regular = bool((sizes[1:-1] == size).all()) and front + nq <= count * size
        return cls(gid.to(q_blocks.device), count, size, front, regular)

    @classmethod
    def rows(cls, nq: int, device: torch.device | str) -> Tiles:
        """One tile per row."""
        return cls(torch.arange(nq, device=device), nq, 1, 0, True)


@dataclass(frozen=True)
class ForcedRule:
    """Which blocks are kept whatever the scores: sink, local window, dense tail rows.

    sink/window are fractions of the sequence's real length; sink_blocks/window_blocks are
    floors in blocks (the window floor counts blocks before the diagonal, which is always kept).
    """

    block_size: int
    sink: float = 0.0
    sink_blocks: int = 0
    window: float = 0.0
    window_blocks: int = 0

    @classmethod
    def of(cls, cfg) -> ForcedRule:
        return cls(cfg.block_size, cfg.sink, cfg.sink_blocks, cfg.window, cfg.window_blocks)


def candidate_mask(
    q_blocks: torch.Tensor, n_kblocks: int, start_block: torch.Tensor
) -> torch.Tensor:
    """[B, nq, nk]: key block j is a candidate for row i when start_block[b] <= j <= q_blocks[i]."""
    j = torch.arange(n_kblocks, device=q_blocks.device)
    causal = j[None, :] <= q_blocks[:, None]
    return causal[None] & (j[None, None, :] >= start_block[:, None, None])


def forced_mask(
    q_blocks: torch.Tensor,
    n_kblocks: int,
    rule: ForcedRule,
    seq_start: torch.Tensor,
    seq_end: torch.Tensor,
) -> torch.Tensor:
    """[B, nq, nk]: sink blocks and window blocks (callers intersect with the candidates).

    Sink: the first max(sink_blocks, ceil(sink*T/b)) real blocks. Window: the blocks covering the
    last ceil(window*T) tokens up to each row block's last token, and at least window_blocks
    blocks before the diagonal (the diagonal block itself is always kept). T is each sequence's
    real length, seq_start/seq_end [B] its span.
    """
    device = q_blocks.device
    b = rule.block_size
    length = (seq_end - seq_start).clamp(min=1).float()  # [B]
    start_block = seq_start // b
    n_sink = torch.ceil(rule.sink * length / b).long().clamp(min=rule.sink_blocks)
    w_tok = torch.ceil(rule.window * length).long().clamp(min=1)
    j = torch.arange(n_kblocks, device=device)
    sink_m = j[None, None, :] < (start_block + n_sink)[:, None, None]
    row_end = torch.minimum((q_blocks[None, :] + 1) * b, seq_end[:, None]) - 1  # [B, nq]
    first = (row_end - w_tok[:, None] + 1).clamp(min=0) // b
    first = torch.minimum(first, q_blocks[None, :] - rule.window_blocks)
    win_m = j[None, None, :] >= first[:, :, None]
    return sink_m | win_m


@dataclass
class Offers:
    """What a layer's budget can buy (per batch element and selection group): each (tile, key
    block) item is worth `value` per pair (the mean score of the tile's rows that see it, -inf
    where it costs nothing) and costs `cost` pairs, on top of the layer's forced pairs."""

    value: torch.Tensor  # [B, G, ng * nk] float
    cost: torch.Tensor  # [B, ng * nk] float
    forced: torch.Tensor  # [B] forced pairs
    candidates: torch.Tensor  # [B] causal pairs of real rows


def budget_masks(
    shape: tuple[int, ...] | torch.Size,
    q_blocks: torch.Tensor,
    rule: ForcedRule,
    seq_start: torch.Tensor,
    seq_end: torch.Tensor,
    dense_rows: torch.Tensor | None = None,
    real_rows: torch.Tensor | None = None,
    row_group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(candidates, forced, tiles or None, real rows) of a layer's selection over scores of
    `shape` [B, G, nq, nk]; arguments as select_blocks. Candidates are real rows' causal blocks;
    forced blocks are candidates, spread over a tile's rows. Every layer of a forward step asks
    for the same masks: the session builds them once per step (engine/method/step.py), never here."""
    bsz, _, nq, nk = shape
    start_block = seq_start // rule.block_size
    cand = candidate_mask(q_blocks, nk, start_block)  # [B, nq, nk]
    forced = cand & forced_mask(q_blocks, nk, rule, seq_start, seq_end)
    if dense_rows is not None:
        forced = forced | (cand & dense_rows[None, :, None])
    tiles = None
    if row_group > 1 and nq > 1:
        tiles = Tiles.of(q_blocks, row_group)
        forced = cand & _spread(forced, tiles)  # a tile keeps what any of its rows must keep
    rows = torch.ones(bsz, nq, dtype=torch.bool, device=q_blocks.device)
    if real_rows is not None:
        rows = real_rows
    cand = cand & rows[:, :, None]  # rows without real queries keep only what is forced
    return cand, forced, tiles, rows


def select_blocks(  # many parameters: the selection rule's inputs, the optional ones defaulted
    scores: torch.Tensor,
    q_blocks: torch.Tensor,
    rule: ForcedRule,
    density: float | Sequence[float],
    seq_start: torch.Tensor,
    seq_end: torch.Tensor,
    dense_rows: torch.Tensor | None = None,
    real_rows: torch.Tensor | None = None,
    budget: str = "row",
    row_group: int = 1,
    pool: str = "mean",
    masks: tuple | None = None,
) -> BlockLists:
    """Top blocks of scores [B, G, nq, nk] (higher = keep) to the density budget: one list per
    query block, over nk key blocks of rule.block_size.

    dense_rows [nq] bool: rows that keep every candidate (the dense tail). real_rows [B, nq] bool:
    rows that hold real queries, the only ones counted in the density. budget: "layer" or "row"
    (module docstring); with a single row both are the same. row_group: consecutive query blocks
    (aligned to multiples of it) that share one list (query tiles of row_group blocks, see
    group_budget_keep); needs the layer budget. density: one for every group, or one per group
    (a layer profile's, engine/method/layer_profile.py). pool: how a tile's rows combine their scores
    (tile_offers). masks: budget_masks' result for these arguments, where the caller keeps it
    (engine/method/step.py: once per forward step).
    """
    if masks is None:
        masks = budget_masks(
            scores.shape, q_blocks, rule, seq_start, seq_end, dense_rows, real_rows, row_group
        )
    cand, forced, tiles, rows = masks
    if tiles is not None:
        if budget != "layer":
            raise ValueError("query tiles of several blocks need the layer budget")
        keep = group_budget_keep(scores, cand, forced, tiles, density, pool)
    elif budget == "layer" and scores.shape[2] > 1:
        keep = layer_budget_keep(scores, cand, forced, density)
    else:
        rates = group_rates(density, scores.shape[1]).tolist()
        if len(set(rates)) == 1:
            keep = row_budget_keep(scores, cand, forced, rows, rates[0])
        else:  # the row rate is calibrated per group: one group at a time
            one = [scores[:, g : g + 1] for g in range(len(rates))]
            keep = torch.cat(
                [
                    row_budget_keep(x, cand, forced, rows, d)
                    for x, d in zip(one, rates, strict=True)
                ],
                dim=1,
            )
    keep = keep | forced[:, None]  # padding rows still get their forced blocks
    return selection_from_mask(keep, cand, rows, rule.block_size)


def selection_from_mask(
    keep: torch.Tensor, cand: torch.Tensor, rows: torch.Tensor, block_size: int
) -> BlockLists:
    """Index lists from a kept mask [B, G, nq, nk] of key blocks of block_size; density counted
    over real rows' candidates (as tensors: the lists' width is the one number read on the
    host)."""
    groups = keep.shape[1]
    count = keep.sum(-1, dtype=torch.int32)  # [B, G, nq]
    kmax = max(int(count.max().item()) if count.numel() else 1, 1)
    index = kernel("block_lists", keep.device)(keep, kmax)
    kept = (keep & cand[:, None]).sum()
    total = (cand.sum(-1) * rows).sum() * groups
    return BlockLists(
        index, count, block_size, key_blocks=keep.shape[-1], kept=kept, candidates=total
    )


@dataclass(frozen=True)
class ThresholdRule:
    """A cumulative-mass threshold in place of the density budget: per row and selection group,
    the forced blocks, then the fewest further candidates, largest estimated mass first, whose
    mass together reaches `threshold` of the row's estimated mass over its candidates
    (threshold_keep). The idea is XAttention's (Xu et al. 2025, "XAttention: Block Sparse
    Attention with Antidiagonal Scoring", mit-han-lab/x-attention), whose selection always keeps
    a row's first key block and its diagonal block: `forced` gives that set (the first real block
    and the diagonal; a config's dense tail rows still stay dense). The density it achieves is
    its own, counted over the real rows' causal pairs as every selection's is."""

    threshold: float

    def forced(self, block_size: int) -> ForcedRule:
        """The blocks kept whatever the scores: the first real block and the diagonal."""
        return ForcedRule(block_size, sink_blocks=1, window_blocks=0)

    def select(self, scores: torch.Tensor, masks: tuple, block_size: int) -> BlockLists:
        """Lists from scores [B, G, nq, nk] and budget_masks' result for the forced rule above;
        rows of a query tile share the union of their rows' blocks (within each row's
        candidates)."""
        cand, forced, tiles, rows = masks
        keep = threshold_keep(scores, cand, forced, self.threshold)
        if tiles is not None:
            keep = (_tile_sums(keep, tiles) > 0)[:, :, tiles.gid] & cand[:, None]
        keep = keep | forced[:, None]  # padding rows still get their forced blocks
        return selection_from_mask(keep, cand, rows, block_size)


def threshold_keep(
    scores: torch.Tensor, cand: torch.Tensor, forced: torch.Tensor, threshold: float
) -> torch.Tensor:
    """[B, G, nq, nk] kept: per row, its forced candidates, then free candidates in decreasing
    score while the mass kept before each is below threshold x the row's mass (the block that
    crosses it is kept), so every row reaches the threshold with the fewest blocks, or keeps all
    its candidates. Scores are read as non-negative masses (negatives count as 0); cand, forced
    [B, nq, nk] as budget_masks gives them."""
    mass = torch.where(cand[:, None], scores.float().clamp(min=0.0), 0.0)
    need = threshold * mass.sum(-1, keepdim=True)
    fixed = (cand & forced)[:, None]
    got = torch.where(fixed, mass, 0.0).sum(-1, keepdim=True)
    free = (cand & ~forced)[:, None].expand_as(mass)
    ranked = torch.where(free, mass, -1.0)  # every free block before every other (mass >= 0)
    vals, order = ranked.sort(dim=-1, descending=True, stable=True)
    vals = vals.clamp(min=0.0)
    before = got + torch.nn.functional.pad(vals.cumsum(-1)[..., :-1], (1, 0))
    take = (before < need) & free.gather(-1, order)
    keep = torch.zeros_like(free).scatter_(-1, order, take)
    return keep | fixed


def group_rates(
    density: float | Sequence[float], groups: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[G] float64 densities on `device`: one for every group, or one per group (a layer
    profile's). The budgets multiply them with the scores' counts, so they must share a device
    (on a GPU a CPU tensor here crashed the first sparse layer)."""
    d = torch.as_tensor(density, dtype=torch.float64, device=device).reshape(-1)
    if d.numel() not in (1, groups):
        raise ValueError(f"{d.numel()} group densities for {groups} selection groups")
    return d.expand(groups)


def layer_budget_keep(
    scores: torch.Tensor,
    cand: torch.Tensor,
    forced: torch.Tensor,
    density: float | Sequence[float],
) -> torch.Tensor:
    """[B, G, nq, nk] kept: forced blocks, then the highest scores anywhere in the layer until
    density x candidate pairs are kept (per batch element and group; density one for all groups
    or one per group). Where forced blocks alone exceed the target, only they are kept."""
    bsz, groups, nq, nk = scores.shape
    free = cand & ~forced  # [B, nq, nk]
    dens = group_rates(density, groups, scores.device)
    target = torch.floor(dens * cand.sum((1, 2)).double()[:, None] + 1e-9).long()  # never over
    to_pick = (target - forced.sum((1, 2))[:, None]).clamp(min=0)  # [B, G] blocks to add
    to_pick = torch.minimum(to_pick, free.sum((1, 2))[:, None])
    kmax = int(to_pick.max().item()) if to_pick.numel() else 0
    keep = torch.zeros(bsz, groups, nq * nk, dtype=torch.bool, device=scores.device)
    if kmax > 0:
        inf = torch.tensor(float("-inf"), device=scores.device)
        ranked = torch.where(free[:, None], scores.float(), inf).view(bsz, groups, nq * nk)
        top = ranked.topk(kmax, dim=-1, sorted=True).indices  # best first
        live = torch.arange(kmax, device=scores.device)[None, None, :] < to_pick[:, :, None]
        keep.scatter_(-1, top, live)
    return keep.view(bsz, groups, nq, nk) & free[:, None]


def _tile_sums(x: torch.Tensor, tiles: Tiles, op: str = "sum") -> torch.Tensor:
    """[..., nq, nk] -> [..., ng, nk] float: the sum (op "sum") or max (op "max", -inf where a
    tile is empty) over each tile's rows. Regular tiles reduce through a padded view (a one-hot
    product would cost ng x nq x nk, ~5 ms a layer at 7k tokens)."""
    ng, nq = tiles.count, tiles.gid.shape[0]
    x = x.float()
    if tiles.regular:
        pad = (0, 0, tiles.front, ng * tiles.size - tiles.front - nq)
        x = torch.nn.functional.pad(x, pad, value=0.0 if op == "sum" else -math.inf)
        x = x.view(*x.shape[:-2], ng, tiles.size, x.shape[-1])
        return x.sum(-2) if op == "sum" else x.amax(-2)
    if op == "max":
        out = x.new_full((*x.shape[:-2], ng, x.shape[-1]), -math.inf)
        return out.index_reduce_(-2, tiles.gid.to(x.device), x, "amax")
    member = torch.nn.functional.one_hot(tiles.gid.long(), ng).T.float().to(x.device)
    return torch.einsum("gq,...qk->...gk", member, x)


def _spread(mask: torch.Tensor, tiles: Tiles) -> torch.Tensor:
    """[B, nq, nk] -> the same shape, each row holding the union over its tile's rows."""
    return (_tile_sums(mask, tiles) > 0)[:, tiles.gid]


def group_budget_keep(
    scores: torch.Tensor,
    cand: torch.Tensor,
    forced: torch.Tensor,
    tiles: Tiles,
    density: float | Sequence[float],
    pool: str = "mean",
) -> torch.Tensor:
    """[B, G, nq, nk] kept when the rows of a tile share one list.

    A tile's block costs one pair per row that can see it and does not already keep it; its value
    per pair is the rows' mean score, or with pool "max" their largest (tile_offers). Blocks are
    taken best value first, anywhere in the layer, while the running cost stays within density x
    candidate pairs (never over), then every row of the tile keeps them where causal. With one
    row per tile this is layer_budget_keep.
    """
    bsz, groups, nq, nk = scores.shape
    ng = tiles.count
    free = cand & ~forced  # [B, nq, nk]
    o = tile_offers(scores, cand, forced, tiles, pool)
    dens = group_rates(density, groups, scores.device)
    target = torch.floor(dens * o.candidates.double()[:, None] + 1e-9).long()  # [B, G]
    budget_left = (target - o.forced[:, None]).clamp(min=0)  # [B, G] pairs left to buy
    keep = kernel("take_best", scores.device)(o.value, o.cost, budget_left)  # [B, G, ng * nk]
    return keep.view(bsz, groups, ng, nk)[:, :, tiles.gid] & free[:, None]


def tile_offers(
    scores: torch.Tensor,
    cand: torch.Tensor,
    forced: torch.Tensor,
    tiles: Tiles,
    pool: str = "mean",
) -> Offers:
    """The items group_budget_keep ranks, from scores [B, G, nq, nk] and the masks of
    budget_masks (tiles: Tiles.rows where rows do not share lists).
    A block's value is the mean score of the tile's rows that can see it, or with pool "max" the
    largest: a shared list serves every row, and the row that needs a block most is the one
    hurt most without it (docs/quality.md measures both). The calibration (eval/calibrate.py)
    ranks the offers of the exact mass, pooled the same way, across layers."""
    bsz, groups, nq, nk = scores.shape
    ng = tiles.count
    free = cand & ~forced  # [B, nq, nk]
    cost = _tile_sums(free, tiles)  # [B, ng, nk]
    if pool == "max":
        sc = torch.where(cand[:, None], scores.float(), -math.inf)
        value = _tile_sums(sc, tiles, "max")  # [B, G, ng, nk]
    else:
        seen = _tile_sums(cand, tiles).clamp(min=1)
        sc = torch.where(cand[:, None], scores.float(), 0.0)
        value = _tile_sums(sc, tiles) / seen[:, None]  # [B, G, ng, nk]
    value = value.masked_fill(cost[:, None] <= 0, -math.inf).reshape(bsz, groups, ng * nk)
    return Offers(value, cost.reshape(bsz, ng * nk), forced.sum((1, 2)), cand.sum((1, 2)))


def row_budget_keep(
    scores: torch.Tensor,
    cand: torch.Tensor,
    forced: torch.Tensor,
    rows: torch.Tensor,
    density: float,
) -> torch.Tensor:
    """[B, G, nq, nk] kept with one calibrated per-row rate (see row_budget)."""
    bsz, groups, nq, nk = scores.shape
    n_cand, n_forced = cand.sum(-1), forced.sum(-1)
    budget = row_budget(n_cand, n_forced, rows, density)  # [B, nq]
    inf = torch.tensor(float("inf"), device=scores.device, dtype=torch.float32)
    ranked = torch.where(cand[:, None], scores.float(), -inf)
    ranked = torch.where(forced[:, None], inf, ranked)
    kmax = max(int(budget.max().item()), 1)
    top = ranked.topk(min(kmax, nk), dim=-1, sorted=True).indices
    live = torch.arange(top.shape[-1], device=scores.device) < budget[:, None, :, None]
    keep = torch.zeros(bsz, groups, nq, nk, dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, top, live.expand_as(top))
    return keep & (cand | forced)[:, None]


def extend_selection(sel: BlockLists, block: int) -> BlockLists:
    """A one-row decode selection [B, G, 1, K] with key block `block` appended to every list,
    now ranging over the keys up to that block.

    Used when a kept decode selection crosses into a new key block: the new block is the local
    window (always kept), and the lists stay sorted because it is newer than every listed block.
    Each group's row gains one kept block and one candidate.
    """
    bsz, groups, nq, k = sel.index.shape
    if nq != 1:
        raise ValueError(f"only one-row (decode) selections are extended, got {nq} rows")
    if sel.key_blocks is not None and block < sel.key_blocks:
        raise ValueError(f"block {block} is not newer than the lists' {sel.key_blocks} blocks")
    index = torch.nn.functional.pad(sel.index, (0, 1))
    at = sel.count.long().unsqueeze(-1)  # [B, G, 1, 1]: the first free slot
    index.scatter_(-1, at, torch.full_like(at, block, dtype=index.dtype))
    extra = bsz * groups
    return replace(
        sel,
        index=index,
        count=sel.count + 1,
        key_blocks=block + 1,
        kept=None if sel.kept is None else sel.kept + extra,
        candidates=None if sel.candidates is None else sel.candidates + extra,
    )


def selection_mask(sel: BlockLists, n_kblocks: int) -> torch.Tensor:
    """Boolean [B, G, nq, nk] view of the index lists (for recording and metrics)."""
    return selected_block_mask(sel.index, sel.count, n_kblocks)


def _budget_at(rate: torch.Tensor, n_cand: torch.Tensor, n_forced: torch.Tensor) -> torch.Tensor:
    """Blocks per row at a per-sequence rate [B]: max(forced, ceil(rate * candidates))."""
    want = torch.ceil(rate[:, None] * n_cand - 1e-9).long()
    return torch.maximum(n_forced, want).clamp(max=n_cand)


def row_budget(
    n_cand: torch.Tensor,
    n_forced: torch.Tensor,
    rows: torch.Tensor,
    density: float,
    iters: int = 24,
) -> torch.Tensor:
    """Blocks each row keeps, [B, nq].

    The plain rule max(forced, ceil(density * cand)) overshoots: sink, window and dense-tail blocks
    come on top wherever they exceed the row's share. A bisection finds the largest rate <= density
    whose total stays within density * all candidate pairs, so forced blocks are paid for by the
    other rows. Where forced blocks alone exceed the target, only they are kept.
    """
    full = torch.full((n_cand.shape[0],), float(density), device=n_cand.device)
    if density >= 1.0 or n_cand.shape[1] == 1:  # one row: the rules coincide
        return _budget_at(full, n_cand, n_forced)
    target = density * (n_cand * rows).sum(-1).double()
    lo, hi = torch.zeros_like(full), full.clone()
    for _ in range(iters):
        mid = (lo + hi) / 2
        over = (_budget_at(mid, n_cand, n_forced) * rows).sum(-1).double() > target
        hi = torch.where(over, mid, hi)
        lo = torch.where(over, lo, mid)
    return _budget_at(lo, n_cand, n_forced)


def _f32(x: float) -> float:
    """x rounded to float32, as torch computes a float32 tensor op."""
    return struct.unpack("f", struct.pack("f", x))[0]


@functools.lru_cache(maxsize=1024)
def _row_budgets(
    density: float | tuple[float, ...], groups: int, n_cand: int, n_forced: int
) -> tuple[int, ...]:
    """row_budget for one row and each group: max(forced, ceil(rate * candidates - 1e-9)) in
    float32, at most the candidates. Cached: a decode step asks it once a layer, with the same
    few arguments for a key block's tokens (the list and the float64 tensor were ~8 us)."""
    rates = [float(density)] * groups if isinstance(density, (int, float)) else None
    return tuple(
        min(max(n_forced, math.ceil(_f32(_f32(_f32(d) * n_cand) - _f32(1e-9)))), n_cand)
        for d in (rates or group_rates(density, groups).tolist())
    )


def decode_row_selection(
    scores: torch.Tensor,
    cur: int,
    rule: ForcedRule,
    density: float | Sequence[float],
    start_block: int = 0,
) -> BlockLists | None:
    """select_blocks for one decode row of sequences without padding, in a handful of ops.

    scores [B, G, 1, n] with n = cur + 1 (the current key block is the last); every sequence's real
    keys start in block start_block. The forced blocks and the row budget are plain integers here
    (one row: max(forced, ceil(density x candidates))), so one topk over the row and one sort are
    the whole selection; the lists and counts equal select_blocks' bit for bit (tested). None where
    the rule needs the sequence length (sink or window as fractions): take select_blocks.
    """
    if rule.sink > 0.0 or rule.window > 0.0:
        return None
    bsz, groups, nq, nk = scores.shape
    if nq != 1 or nk != cur + 1 or not 0 <= start_block <= cur:
        return None
    n_cand = cur - start_block + 1
    sink_end = min(start_block + rule.sink_blocks, cur + 1)  # blocks start_block .. sink_end - 1
    win_start = max(cur - rule.window_blocks, start_block)  # blocks win_start .. cur
    n_forced = (sink_end - start_block) + (cur - win_start + 1) - max(sink_end - win_start, 0)
    rates = density if isinstance(density, (int, float)) else tuple(density)
    budgets = _row_budgets(rates, groups, n_cand, n_forced)
    budget = max(budgets)
    ranked = scores.float().clone()
    # forced first (+inf), then non-candidates last (-inf), as row_budget_keep ranks them
    ranked[..., win_start:] = float("inf")
    if sink_end > start_block:
        ranked[..., start_block:sink_end] = float("inf")
    if start_block > 0:
        ranked[..., :start_block] = float("-inf")
    top = ranked.topk(budget, dim=-1, sorted=True).indices
    if min(budgets) == budget:  # one budget for every group: no tails to fill (half the ops)
        index = top.sort(dim=-1).values.to(torch.int32)
        count = torch.full((bsz, groups, 1), budget, dtype=torch.int32, device=scores.device)
    else:
        count = torch.tensor(budgets, dtype=torch.int32, device=scores.device).view(1, groups, 1)
        live = torch.arange(budget, device=scores.device) < count[..., None]  # groups' budgets
        index = torch.where(live, top, nk).sort(dim=-1).values
        index = torch.where(index < nk, index, index[..., :1]).to(torch.int32)  # tails: the first
        count = count.expand(bsz, groups, 1).contiguous()
    kept, candidates = bsz * sum(budgets), bsz * groups * n_cand
    return BlockLists(
        index, count, rule.block_size, key_blocks=nk, kept=kept, candidates=candidates
    )
