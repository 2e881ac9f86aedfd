"""The CPU prefill's torch path (kernels/cpu.py says when it runs instead of the C kernel).

Why it is shaped like this (measured on the project's 2-core AVX-512 CPU, see docs/notes/speed-log.md):
- Each (batch, head group, query block) row splits its selected key blocks into *interior* blocks,
  fully visible to every query of the block (no mask at all), and a few *edge* blocks (the causal
  diagonal, a block cut by the left-padding start, the partial last block) that need a mask.
- Interior work: rows are grouped by their interior block count, so one call of the CPU flash kernel
  per group covers many rows without padding. K/V blocks are gathered with `index_select` on a
  strided [rows, block_size * D] view (fast memcpy rows, unlike advanced indexing).
- Edge work: one call for all rows; in the common aligned case it is plain `is_causal`, otherwise a
  tiny explicit mask over at most a handful of blocks per row (never a T x T mask).
- Sink runs shared by neighbouring rows fold those rows into one long query; local windows of
  consecutive rows are one strided view (row stride = one block), never a copy. Rows whose runs
  differ by a few blocks share the shorter one (the rest joins the scattered middle): a real
  model's windows are ragged, and one call per distinct length was most of its calls.
- Short query tiles fold the query heads of a KV head into one longer query (cpu_common.attend).
- The partial results are merged with their log-sum-exp in fp32.
- A prefill's query tiles are cut into equal-work parts, one per core, each run on one thread of a
  pool (kernels/parts.py): the many short calls alone left the second core idle (see _in_parts).
Index-list layout follows MInference's block-sparse kernel (sorted key-block ids plus a count per query
block); the interior/edge split and the count grouping are ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu_common import NEG_INF, attend, block_view, token_rows
from .lists import BlockLists
from .parts import run_in_parts, workers

_RUN_SLACK = 4  # blocks a row may give up to share its sink run with its neighbours


_WINDOW_SLACK = 8  # and its window: measured on real layers, 8 beat 4 (see docs/notes/speed-log.md)


_MIN_TILES_PER_PART = 4  # query tiles per thread below which one call does it all


_WHOLE_ROWS_MAX_KEYS = (
    4096  # up to here a row's blocks are one gathered call (see _TilePass.whole_rows)
)


@dataclass
class _RowBlocks:
    """Each row's visible key blocks (cleaned of invisible, out-of-range and duplicate ids), split
    into interior blocks (no mask needed) and edge blocks (masked)."""

    interior: torch.Tensor  # [R, K] long, sorted, valid up to interior_count
    interior_count: torch.Tensor  # [R]
    edge: torch.Tensor  # [R, E] long, sorted, valid up to edge_count
    edge_count: torch.Tensor  # [R]
    plain: torch.Tensor  # [R] bool: the row's only edge block is its aligned causal diagonal


def _compact(idx: torch.Tensor, keep: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Move kept ids to the front (sorted), fill the rest; returns (ids, count)."""
    ids = torch.where(keep, idx, torch.full_like(idx, fill)).sort(dim=-1).values
    return ids, keep.sum(-1)


def _row_blocks(
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    b: int,
    lq: int,
    lk: int,
    causal: bool,
    seq_start: torch.Tensor | None,
    tile: int,
) -> _RowBlocks:
    """Drop invisible, out-of-range and duplicate blocks; split the rest into interior and edge.

    Row i is the query tile [i * tile, (i + 1) * tile) (tile: a multiple of the key block b)."""
    bsz, g, nq, kmax = block_index.shape
    nk = -(-lk // b)
    off = lk - lq
    idx = block_index.long().reshape(bsz, g, nq, kmax)
    live = torch.arange(kmax) < block_count.long().unsqueeze(-1)
    live &= (idx >= 0) & (idx < nk)
    idx, _ = _compact(idx, live, nk)
    live = idx < nk
    live[..., 1:] &= idx[..., 1:] != idx[..., :-1]  # duplicates count once, as in the reference

    rows = torch.arange(nq)
    first_pos = (off + rows * tile).view(1, 1, nq, 1)  # position of each tile's first query
    last_pos = (off + torch.clamp(rows * tile + tile, max=lq) - 1).view(1, 1, nq, 1)
    start = idx * b
    end = torch.clamp(start + b, max=lk)  # one past the block's last real key
    ss = (
        torch.zeros(bsz, 1, 1, 1, dtype=torch.long)
        if seq_start is None
        else seq_start.long().cpu().view(bsz, 1, 1, 1)
    )
    visible = live & (end > ss)
    full = (start >= ss) & (end - start == b)
    if causal:
        visible &= start <= last_pos
        full &= end - 1 <= first_pos
    interior = visible & full
    edge = visible & ~full
    int_ids, int_count = _compact(idx, interior, nk)
    edge_ids, edge_count = _compact(idx, edge, nk)
    int_ids, edge_ids = int_ids.clamp(max=nk - 1), edge_ids.clamp(max=nk - 1)
    emax = max(int(edge_count.max()) if edge_count.numel() else 0, 1)
    edge_ids = edge_ids[..., :emax]
    kcap = max(int(int_count.max()) if int_count.numel() else 0, 1)
    int_ids = int_ids[..., :kcap]
    plain = torch.zeros(bsz, g, nq, dtype=torch.bool)
    if causal and off % b == 0 and lq >= b:  # square diagonal tiles: is_causal is exact there
        diag = (first_pos // b).view(1, 1, nq)  # the tile's diagonal key blocks, all listed
        n_diag = (last_pos // b).view(1, 1, nq) - diag + 1
        first = edge_ids[..., 0]
        last = edge_ids.gather(-1, (n_diag - 1).clamp(max=emax - 1).expand_as(first)[..., None])
        plain = (edge_count == n_diag) & (first == diag) & (last[..., 0] == diag + n_diag - 1)
        plain &= first * b >= ss[..., 0]
    r = bsz * g * nq
    return _RowBlocks(
        int_ids.reshape(r, -1),
        int_count.reshape(r),
        edge_ids.reshape(r, -1),
        edge_count.reshape(r),
        plain.reshape(r),
    )


@dataclass
class _Runs:
    """Interior lists split into a leading run from block 0 (sinks), a trailing contiguous run
    (the local window) and the scattered middle. Runs are read through strided views (no copy)."""

    prefix: torch.Tensor  # [R] length of the run 0..prefix-1
    suffix: torch.Tensor  # [R] length of the trailing run used as a view
    suffix_end: torch.Tensor  # [R] one past the trailing run's last block
    middle: torch.Tensor  # [R, K] sorted ids, valid up to middle_count
    middle_count: torch.Tensor  # [R]


def _share_runs(
    length: torch.Tensor, key: torch.Tensor | None = None, slack: int = _RUN_SLACK
) -> torch.Tensor:
    """[BG, nq] run lengths -> lengths shared by segments of consecutive rows.

    Rows of a segment read one common run through one view (one long query for sinks, one strided
    view for windows) instead of one short call each; each row's excess over the segment's minimum
    (at most `slack` blocks) moves to the scattered middle. Dense rows (a staircase of prefixes)
    and real windows (a tile often lacks one of the window's blocks) thus fold into one call.
    A segment also ends where `key` changes (windows: rows whose runs end elsewhere).
    """
    out = length.clone()
    keys = None if key is None else key.tolist()
    for bg, row in enumerate(length.tolist()):
        kr = keys[bg] if keys is not None else [0] * len(row)
        start, lo, hi = 0, row[0], row[0]
        for i in range(1, len(row) + 1):
            p = row[i] if i < len(row) else 0
            same = i < len(row) and kr[i] == kr[start]
            if same and p > 0 and lo > 0 and max(hi, p) - min(lo, p) <= slack:
                lo, hi = min(lo, p), max(hi, p)
                continue
            out[bg, start:i] = lo
            start, lo, hi = i, p, p
    return out


def _runs(ids: torch.Tensor, cnt: torch.Tensor, g: int, nq: int, r_tile: int) -> _Runs:
    r, kcap = ids.shape
    m = torch.arange(kcap)
    valid = m < cnt.unsqueeze(1)
    prefix = ((ids == m) & valid).long().cumprod(dim=1).sum(dim=1)
    last = ids.gather(1, (cnt - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    pos = cnt.unsqueeze(1) - 1 - m  # walk back from the last entry
    ok = pos >= prefix.unsqueeze(1)
    back = ids.gather(1, pos.clamp(min=0))
    tail = ((back == last.unsqueeze(1) - m) & ok).long().cumprod(dim=1).sum(dim=1)
    # One common window length per (batch, group) keeps consecutive rows in one strided view;
    # longer runs give their excess to the middle.
    tail_bg = tail.view(-1, nq)
    cap = torch.zeros(tail_bg.shape[0], dtype=torch.long)
    for i in range(tail_bg.shape[0]):
        nz = tail_bg[i][tail_bg[i] > 0]
        if nz.numel():
            cap[i] = torch.mode(nz).values
    suffix = torch.minimum(tail, cap.repeat_interleave(nq)).view(-1, nq)
    shift = (last + 1).view(-1, nq) - torch.arange(nq) * r_tile  # equal: one strided view
    suffix = _share_runs(suffix, shift, _WINDOW_SLACK).view(-1)
    prefix = _share_runs(prefix.view(-1, nq)).view(-1)
    mid = valid & (m >= prefix.unsqueeze(1)) & (m < (cnt - suffix).unsqueeze(1))
    mid_ids, mid_cnt = _compact(ids, mid, int(ids.max()) + 1 if ids.numel() else 0)
    kmid = max(int(mid_cnt.max()) if mid_cnt.numel() else 0, 1)
    return _Runs(prefix, suffix, last + 1, mid_ids[:, :kmid], mid_cnt)


class _Accumulator:
    """fp32 output and log-sum-exp per (head row, query); partial results merge by LSE.

    Pieces that cover consecutive query blocks of one (batch, group) merge in place through strided
    views; only scattered rows pay for index_select/index_copy. The output starts unfilled (a
    zero fill was ~2% of a 7k-token layer): a row's first piece writes it, a piece that also
    covers written rows first zeroes the others, and `result` zeroes rows no piece covered.
    """

    def __init__(self, bsz: int, g: int, hq: int, nq: int, tq: int, d: int) -> None:
        self.shape = (bsz, g, hq, nq, tq, d)
        self.out = torch.empty(self.shape, dtype=torch.float32)
        self.lse = torch.full(self.shape[:-1], NEG_INF, dtype=torch.float32)
        self.seen = torch.zeros(bsz * g * nq, dtype=torch.bool)

    @staticmethod
    def _merge(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, l_: torch.Tensor) -> None:
        new = torch.logaddexp(lse, l_)
        # The two weights sum to one, so out * w_old + o * w_new is one lerp pass over out.
        w_new = torch.exp(l_ - new).nan_to_num_(0.0).unsqueeze(-1)  # nan: neither saw a key
        out.lerp_(o.to(out.dtype), w_new)
        lse.copy_(new)

    def add(self, rows: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> None:
        """Merge o [n, hq, tq, d] and lse [n, hq, tq] of the rows (flat (batch, group, block) ids)."""
        bsz, g, hq, nq, tq, d = self.shape
        n = rows.numel()
        seen = self.seen[rows]
        first = not bool(seen.any())
        if not first and not bool(seen.all()):
            self._zero(rows[~seen])
        self.seen[rows] = True
        lse = lse.float()
        r0, r1 = int(rows[0]), int(rows[-1])
        if n == bsz * g * nq and r1 - r0 == n - 1:  # every row, in order
            o_v = o.view(bsz, g, nq, hq, tq, d).permute(0, 1, 3, 2, 4, 5)
            l_v = lse.view(bsz, g, nq, hq, tq).permute(0, 1, 3, 2, 4)
            out, cur = self.out, self.lse
        elif r1 - r0 == n - 1 and r0 // nq == r1 // nq:  # consecutive blocks of one (b, group)
            bg, i0 = divmod(r0, nq)
            out = self.out.view(bsz * g, hq, nq, tq, d)[bg, :, i0 : i0 + n]
            cur = self.lse.view(bsz * g, hq, nq, tq)[bg, :, i0 : i0 + n]
            o_v, l_v = o.transpose(0, 1), lse.transpose(0, 1)
        else:  # scattered rows: gather, merge, scatter back
            hr = self._head_rows(rows)
            flat_out = self.out.view(-1, tq, d)
            flat_lse = self.lse.view(-1, tq)
            o_f, l_f = o.reshape(-1, tq, d), lse.reshape(-1, tq)
            if first:
                flat_out.index_copy_(0, hr, o_f.float())
                flat_lse.index_copy_(0, hr, l_f)
                return
            out, cur = flat_out.index_select(0, hr), flat_lse.index_select(0, hr)
            self._merge(out, cur, o_f, l_f)
            flat_out.index_copy_(0, hr, out)
            flat_lse.index_copy_(0, hr, cur)
            return
        if first:
            out.copy_(o_v)
            cur.copy_(l_v)
        else:
            self._merge(out, cur, o_v, l_v)

    def _head_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat (batch, group, head, block) ids of the rows' query heads."""
        _, _, hq, nq, _, _ = self.shape
        bg, i = rows // nq, rows % nq
        return (((bg * hq).unsqueeze(1) + torch.arange(hq)) * nq + i.unsqueeze(1)).reshape(-1)

    def _zero(self, rows: torch.Tensor) -> None:
        self.out.view(-1, *self.shape[-2:]).index_fill_(0, self._head_rows(rows), 0.0)

    def result(self) -> torch.Tensor:
        """[B, G, hq, nq, tq, d]: rows that saw no key (no piece covered them) are zero."""
        missing = torch.nonzero(~self.seen).squeeze(1)
        if missing.numel():
            self._zero(missing)
        return self.out


def _consecutive(rows: torch.Tensor) -> list[torch.Tensor]:
    """Split sorted row ids into runs of consecutive ids."""
    if rows.numel() == 0:
        return []
    breaks = torch.nonzero(rows[1:] != rows[:-1] + 1).squeeze(1) + 1
    sizes = torch.diff(torch.cat([torch.tensor([0]), breaks, torch.tensor([rows.numel()])]))
    return list(torch.split(rows, sizes.tolist()))


def _split_points(block_count: torch.Tensor, n_parts: int) -> list[int]:
    """Tile boundaries [0, ..., nq] cutting the query tiles into `n_parts` parts of about equal
    work (listed blocks summed over batch and groups), or [0, nq] when a split would not pay."""
    nq = block_count.shape[2]
    if n_parts < 2 or nq < _MIN_TILES_PER_PART * n_parts:
        return [0, nq]
    cum = block_count.long().cpu().sum((0, 1)).double().cumsum(0) + torch.arange(1, nq + 1)
    cuts = torch.searchsorted(cum, cum[-1] * torch.arange(1, n_parts) / n_parts).tolist()
    return sorted({0, nq, *(min(max(c + 1, 1), nq - 1) for c in cuts)})


def _in_parts(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool,
    scale: float,
    parts: list[int],
) -> torch.Tensor:
    """The query tiles in consecutive parts (kernels/parts.py: one thread each), each writing
    its rows into the shared output.

    Why: the CPU flash kernel parallelises one call over its heads and query splits, and the
    sparse path's many short calls leave the second core idle much of the time (CPU time 1.4x
    wall against dense SDPA's 1.9x). Parts are independent (a tile's output depends only on its
    list), so the result is the unsplit one. A causal part reads the keys up to its last query.
    """
    lq, lk = q.shape[2], k.shape[2]
    off = lk - lq
    qt = lists.rows_per_list
    out = q.new_empty(q.shape)  # contiguous, as torch.cat gave

    def part(i0: int, i1: int) -> None:
        q0, q1 = i0 * qt, min(i1 * qt, lq)
        kend = min(off + q1, lk) if causal else lk
        sub = lists.rows(i0, i1)
        out[:, :, q0:q1] = _prefill(
            q[:, :, q0:q1], k[:, :, :kend], v[:, :, :kend], sub, causal, scale
        )

    run_in_parts(part, parts)
    return out


class _TilePass:
    """One pass over a set of query tiles: the layout its pieces share (queries as rows of whole
    tiles, K/V as token rows, where each row's query and KV heads lie) and the pieces, one method
    each, merged into one accumulator. A row is one (batch, group, query tile)."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lists: BlockLists,
        causal: bool,
        scale: float,
    ) -> None:
        bsz, h, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        b, qt = lists.block_size, lists.rows_per_list
        block_index, block_count = lists.index, lists.count
        g = block_index.shape[1]
        if hkv % g and g % hkv:  # groups straddle KV heads: give every query head its own list
            block_index = block_index.repeat_interleave(h // g, dim=1)
            block_count = block_count.repeat_interleave(h // g, dim=1)
            g = h
        hq, hk = h // g, max(hkv // g, 1)
        nq = -(-lq // qt)
        tq = qt if nq > 1 else lq  # query tile rows: no padding waste in decode (Lq = 1)
        self.b, self.qt, self.causal, self.scale, self.seq_start = (
            b,
            qt,
            causal,
            scale,
            lists.seq_start,
        )
        self.bsz, self.h, self.lq, self.d, self.lk, self.off = bsz, h, lq, d, lk, lk - lq
        self.g, self.hq, self.hk, self.nq, self.tq = g, hq, hk, nq, tq
        self.r_tile = qt // b  # key blocks per query tile
        self.blocks = _row_blocks(
            block_index.cpu(), block_count.cpu(), b, lq, lk, causal, lists.seq_start, qt
        )
        self.runs = _runs(self.blocks.interior, self.blocks.interior_count, g, nq, self.r_tile)
        self.dt = dt = q.dtype
        if nq * tq != lq or not q.is_contiguous():  # one copy: padded to whole tiles, contiguous
            qp = q.new_empty(bsz, h, nq * tq, d)
            qp[:, :, :lq] = q
            qp[:, :, lq:] = 0
            q = qp
        self.q = q
        k, v = k.to(dt), v.to(dt)
        rows_kv = token_rows(k, v) or token_rows(
            k.clone(memory_format=torch.contiguous_format),
            v.clone(memory_format=torch.contiguous_format),
        )
        self.k_tok, self.v_tok, seq_rows, self.head_rows_kv = rows_kv
        # [rows, tq * d]: a 2-d index_select copies whole rows with memcpy, ~4x faster than on a
        # [rows, tq, d] view (a small part of a layer: within noise on whole layers)
        self.q_rows = q.view(bsz * h * nq, tq * d)
        self.r_all = r_all = bsz * g * nq
        r = torch.arange(r_all)
        self.r_b, self.r_g, self.r_i = r_b, r_g, r_i = r // (g * nq), (r // nq) % g, r % nq
        self.head_rows = (
            (r_b * h + r_g * hq).unsqueeze(1) + torch.arange(hq)
        ) * nq + r_i.unsqueeze(1)
        self.kv_tok = (
            r_b * seq_rows + (r_g * hkv // g) * self.head_rows_kv
        )  # [R] first KV head's token 0
        self.kv_head = self.kv_tok.unsqueeze(1) + torch.arange(hk) * self.head_rows_kv  # [R, hk]
        self.acc = _Accumulator(bsz, g, hq, nq, tq, d)
        self.k_rows, self.v_rows = block_view(self.k_tok, b), block_view(self.v_tok, b)

    def attend_rows(self, rows: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, **kw) -> None:
        """The rows' query tiles over kg, vg [n, hk, keys, d], merged into the output."""
        hr = self.head_rows[rows].reshape(-1)
        qg = self.q_rows.index_select(0, hr).view(rows.numel(), self.hq, self.tq, self.d)
        o, lse = attend(qg, kg, vg, self.scale, **kw)
        self.acc.add(rows, o, lse)

    def view(self, x: torch.Tensor, n: int, row_stride: int, tok: int, length: int) -> torch.Tensor:
        """[n, hk, length, d] strided view of token rows x [R, d] from row `tok` (no copy)."""
        d = self.d
        start = x.storage_offset() + tok * d
        return x.as_strided(
            (n, self.hk, length, d), (row_stride * d, self.head_rows_kv * d, d, 1), start
        )

    def gathered(self, ids: torch.Tensor, counts: torch.Tensor, diagonal: bool = False) -> None:
        """Rows attend to their blocks ids[row, :count] gathered (memcpy rows), one call per
        count; diagonal: the last block is the row's aligned diagonal, under one shared mask."""
        b, hk, d = self.b, self.hk, self.d
        order = torch.argsort(counts, stable=True)
        sizes = torch.bincount(counts, minlength=1).tolist()
        for c, rows in zip(range(len(sizes)), torch.split(order, sizes), strict=True):
            if c == 0 or rows.numel() == 0:
                continue
            n = rows.numel()
            pos = self.kv_head[rows].unsqueeze(-1) + ids[rows, :c].unsqueeze(1) * b  # [n, hk, c]
            kg = self.k_rows.index_select(0, pos.reshape(-1)).view(n, hk, c * b, d)
            vg = self.v_rows.index_select(0, pos.reshape(-1)).view(n, hk, c * b, d)
            self.attend_rows(rows, kg, vg, tail=diagonal)

    def whole_rows(self) -> torch.Tensor:
        """Short contexts: a row's listed blocks and its tile's diagonal blocks in one gathered
        call, no merges. Faster up to ~4k keys; beyond, the gathers grow faster than the merges
        they save (docs/notes/speed-log.md). Rows whose diagonal blocks are not all listed, whole
        and aligned (a partial last tile, padding) take the other pieces. Returns [R] bool: the
        rows done here."""
        blocks, r_tile = self.blocks, self.r_tile
        whole = torch.zeros(self.r_all, dtype=torch.bool)
        if self.causal and self.lk <= _WHOLE_ROWS_MAX_KEYS and blocks.edge.shape[1] >= r_tile:
            # a whole tile: r_tile whole blocks
            whole = blocks.plain & (self.off + (self.r_i + 1) * self.qt <= self.lk)
            diag = blocks.edge[:, :r_tile]
            at = blocks.interior_count[:, None] + torch.arange(r_tile)
            ids = torch.cat([blocks.interior, diag], 1).scatter_(1, at, diag)
            self.gathered(ids, (blocks.interior_count + r_tile) * whole, diagonal=True)
        return whole

    def middle(self, whole: torch.Tensor) -> None:
        """Scattered middle blocks: gathered, one call per block count. First of the pieces, so
        that their scattered rows are written once (index_copy_) rather than read, merged and
        written back; the later pieces are consecutive rows that merge in place through strided
        views."""
        self.gathered(self.runs.middle, self.runs.middle_count.masked_fill(whole, 0))

    def windows(self, whole: torch.Tensor) -> torch.Tensor:
        """Windows: consecutive rows with the same run length and the same offset to their row
        slide along the keys one tile per row: one strided view (row stride = one tile). When the
        run ends at an aligned diagonal, the diagonal joins the view under one broadcast triangle
        mask. Returns [R] bool: the rows whose diagonal was fused so."""
        runs, b, qt, r_tile, r_i = self.runs, self.b, self.qt, self.r_tile, self.r_i
        has = (runs.suffix > 0) & ~whole
        start_blk = runs.suffix_end - runs.suffix
        fused = has & self.blocks.plain & (runs.suffix_end * b == self.off + r_i * qt)
        fused &= (runs.suffix_end + r_tile) * b <= self.lk  # the view may not run past the keys
        wkey = torch.stack(
            [self.r_b * self.g + self.r_g, runs.suffix, start_blk - r_i * r_tile, fused.long()], 1
        )
        wkey = wkey[has]
        rows_has = torch.nonzero(has).squeeze(1)
        if rows_has.numel():
            _, inv = torch.unique(wkey, dim=0, return_inverse=True)
            for u in torch.unique(inv).tolist():
                for rows in _consecutive(rows_has[inv == u]):
                    n, n_blocks = rows.numel(), int(runs.suffix[rows[0]])
                    tok = int(self.kv_tok[rows[0]]) + int(start_blk[rows[0]]) * b
                    tail = bool(fused[rows[0]])
                    if tail:
                        n_blocks += r_tile
                    kg = self.view(self.k_tok, n, qt, tok, n_blocks * b)
                    vg = self.view(self.v_tok, n, qt, tok, n_blocks * b)
                    self.attend_rows(rows, kg, vg, tail=tail)
        return fused

    def edges(self, fused: torch.Tensor, whole: torch.Tensor) -> None:
        """Edge: blocks that need a mask and were not fused into a window, all rows in one call."""
        blocks, b, lk, hk, d = self.blocks, self.b, self.lk, self.hk, self.d
        rows = torch.nonzero((blocks.edge_count > 0) & ~fused & ~whole).squeeze(1)
        if not rows.numel():
            return
        n, e = rows.numel(), blocks.edge.shape[1]
        ids = blocks.edge[rows]  # [n, e]
        kpos = (ids.unsqueeze(-1) * b + torch.arange(b)).reshape(n, e * b)
        dead = torch.arange(e).unsqueeze(0) >= blocks.edge_count[rows].unsqueeze(1)
        kpos = kpos.masked_fill(dead.repeat_interleave(b, dim=1), lk)  # never visible
        src = self.kv_head[rows].unsqueeze(-1) + kpos.clamp(max=lk - 1).unsqueeze(1)  # [n,hk,e*b]
        kg = self.k_tok.index_select(0, src.reshape(-1)).view(n, hk, e * b, d)
        vg = self.v_tok.index_select(0, src.reshape(-1)).view(n, hk, e * b, d)
        if bool(blocks.plain[rows].all()):
            self.attend_rows(rows, kg, vg, causal=True)
            return
        tq = self.tq
        qpos = self.off + self.r_i[rows].unsqueeze(1) * self.qt + torch.arange(tq)  # [n, tq]
        see = kpos.unsqueeze(1) < lk
        if self.causal:
            see = see & (kpos.unsqueeze(1) <= qpos.unsqueeze(2))
        if self.seq_start is not None:
            ss = self.seq_start.long().cpu()[self.r_b[rows]].view(n, 1, 1)
            see = see & (kpos.unsqueeze(1) >= ss)
        mask = torch.zeros(n, 1, tq, e * b, dtype=self.dt).masked_fill_(~see.unsqueeze(1), NEG_INF)
        hr = self.head_rows[rows].reshape(-1)
        qg = self.q_rows.index_select(0, hr).view(n, self.hq, tq, d)
        o, lse = attend(qg, kg, vg, self.scale, mask=mask)
        lse = lse.masked_fill(~see.any(-1).unsqueeze(1), NEG_INF)  # the kernel says 0 there
        self.acc.add(rows, o, lse)

    def sinks(self, whole: torch.Tensor) -> None:
        """Sinks: consecutive rows of one (batch, group) with the same leading run 0..P-1 see
        the very same keys, so their queries fold into one long query (bigger, faster tiles in
        the kernel)."""
        runs, nq, tq, hq, d = self.runs, self.nq, self.tq, self.hq, self.d
        key = (self.r_b * self.g + self.r_g) * (runs.prefix.max() + 1) + runs.prefix
        key = key.masked_fill(whole, -1)
        q_seq = self.q.view(self.bsz * self.g, hq, nq * tq, d)
        for kv in torch.unique(key[(runs.prefix > 0) & ~whole]).tolist():
            for rows in _consecutive(torch.nonzero(key == kv).squeeze(1)):
                n, length = rows.numel(), int(runs.prefix[rows[0]]) * self.b
                tok = int(self.kv_tok[rows[0]])
                bg, i0 = divmod(int(rows[0]), nq)
                qg = q_seq[bg, :, i0 * tq : (i0 + n) * tq].unsqueeze(0)
                kg = self.view(self.k_tok, 1, 0, tok, length)
                vg = self.view(self.v_tok, 1, 0, tok, length)
                o, lse = attend(qg, kg, vg, self.scale)
                o = o.view(hq, n, tq, d).transpose(0, 1)
                self.acc.add(rows, o, lse.view(hq, n, tq).transpose(0, 1))

    def result(self) -> torch.Tensor:
        """[B, H, Lq, d] in the queries' dtype."""
        res = self.acc.result().view(self.bsz, self.h, self.nq * self.tq, self.d)[:, :, : self.lq]
        return res.to(self.dt)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """block_sparse_attention_cpu for one set of query tiles (any length: prefill or a chunk):
    its pieces in this order (the merge order of their partial results)."""
    tiles = _TilePass(q, k, v, lists, causal, scale)
    whole = tiles.whole_rows()
    tiles.middle(whole)
    fused = tiles.windows(whole)
    tiles.edges(fused, whole)
    tiles.sinks(whole)
    return tiles.result()


def prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """The query tiles of a prefill (or a chunk): in equal-work parts, a thread each, where a
    split pays; in one pass otherwise."""
    parts = _split_points(lists.count, workers())
    if len(parts) > 2:
        return _in_parts(q, k, v, lists, causal, scale, parts)
    return _prefill(q, k, v, lists, causal, scale)
