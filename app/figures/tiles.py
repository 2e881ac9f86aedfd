"""Long contexts: a layer's block matrices shown as tiles when zoomed out, full detail zoomed in.

At 32k tokens a layer has 512 x 512 blocks and at 128k 2048 x 2048 (4M cells, 16 MB per matrix
as float32): shipping that to the browser for every slider move is what made long runs slow.
A view is a region (query blocks x key blocks) drawn at no more than `max_side` cells a side:
cells are aggregated into square tiles, keeping the max (the colour) and the mean (the hover),
and the axes carry one short label per tile, never one hover string per cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sketchwalk.app.figures.common import block_labels

MAX_SIDE = 256  # cells per side drawn at once; 512 blocks or more are tiled when zoomed out
# Regions wider than 4 x MAX_SIDE blocks (past 64k tokens at 64-token blocks) are drawn at half
# that: a heatmap's plot is ~330 px tall, so 256 cells a side are below a pixel each anyway, and
# at 2048 blocks three 256 x 256 heatmaps kept the browser ~0.8 s per layer step; at 128 a side a
# step measured 0.5-0.75 s (docs/explorer.md). Narrower layers keep the finer hover.
WIDE_FACTOR = 4


@dataclass(frozen=True)
class View:
    """Query rows [q0, q1) x key blocks [k0, k1) drawn with `tile` x `tile` blocks per cell."""

    q0: int
    q1: int
    k0: int
    k1: int
    tile: int

    @property
    def tiled(self) -> bool:
        return self.tile > 1


def plan_view(
    n: int, region: tuple[int, int, int, int] | None = None, max_side: int = MAX_SIDE
) -> View:
    """The region (inclusive block bounds q_lo, q_hi, k_lo, k_hi; None = all) and its tile size."""
    q0, q1, k0, k1 = (0, n - 1, 0, n - 1) if region is None else region
    q0, k0 = max(0, int(q0)), max(0, int(k0))
    q1, k1 = min(n - 1, int(q1)), min(n - 1, int(k1))
    side = max(q1 - q0 + 1, k1 - k0 + 1, 1)
    if side > WIDE_FACTOR * max_side:
        max_side //= 2
    return View(q0, q1 + 1, k0, k1 + 1, max(1, math.ceil(side / max_side)))


def aggregate(z: np.ndarray, view: View, how: str = "max") -> np.ndarray:
    """z[q0:q1, k0:k1] pooled over tile x tile cells (NaN cells ignored; all-NaN tiles stay NaN).

    Reshape-based (see _pool): a 2048 x 2048 layer costs a few whole-array passes, no Python
    per cell.
    """
    sub = np.asarray(z, dtype=np.float32)[view.q0 : view.q1, view.k0 : view.k1]
    t = view.tile
    if t == 1:
        return sub
    r, c = sub.shape
    rows, cols = -(-r // t), -(-c // t)
    if (rows * t, cols * t) != (r, c):  # ragged edge tiles: pad with NaN, which is ignored
        sub = np.pad(sub, ((0, rows * t - r), (0, cols * t - c)), constant_values=np.nan)
    if how == "max":  # fmax skips NaN unless both sides are NaN
        return _pool(sub, t, np.fmax)
    seen = ~np.isnan(sub)
    total = _pool(np.where(seen, sub, np.float32(0)), t, np.add)
    count = _pool(seen, t, np.add, np.int32)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).astype(np.float32)  # 0 / 0: an all-NaN tile stays NaN


def count(mask: np.ndarray, view: View) -> np.ndarray:
    """How many cells of each tile of mask[q0:q1, k0:k1] are True (int32; no float pass)."""
    sub = np.asarray(mask, dtype=bool)[view.q0 : view.q1, view.k0 : view.k1]
    t = view.tile
    r, c = sub.shape
    return _pool(np.pad(sub, ((0, -r % t), (0, -c % t))), t, np.add, np.int32)


def _pool(a: np.ndarray, t: int, op: np.ufunc, dtype: type | None = None) -> np.ndarray:
    """op-reduce each t x t tile of a (both sides multiples of t). Across the tile's rows first:
    that combines whole contiguous rows, and leaves t times less for the short key-axis reduce
    (the other order runs a t-long inner loop per cell: about 9x slower at 2048 x 2048).
    dtype: the accumulator (int32 counts True cells of a bool array without a cast copy)."""
    r, c = a.shape
    across_rows = op.reduce(a.reshape(r // t, t, c), axis=1, dtype=dtype)
    return op.reduce(across_rows.reshape(r // t, c // t, t), axis=2)


def view_labels(view: View, blocks: pd.DataFrame | None, n: int, axis: str) -> list[str]:
    """Axis labels: each block's label in full detail, 'B512–B519' per tile when tiled."""
    lo, hi = (view.q0, view.q1) if axis == "q" else (view.k0, view.k1)
    if not view.tiled:
        return block_labels(blocks, n)[lo:hi]
    return [f"B{s}–B{min(s + view.tile, hi) - 1}" for s in range(lo, hi, view.tile)]
