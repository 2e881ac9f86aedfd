"""Long contexts: a layer's block matrices shown as tiles when zoomed out, full detail zoomed in.

At 32k tokens a layer has 512 x 512 blocks and at 128k 2048 x 2048 (4M cells, 16 MB per matrix
as float32): shipping that to the browser for every slider move is what made long runs slow.
A view is a region (query blocks x key blocks) drawn at no more than `max_side` cells a side:
cells are aggregated into square tiles, keeping the max (the colour) and the mean (the hover),
and the axes carry one short label per tile, never one hover string per cell.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sketchwalk.app.figures.common import block_labels

MAX_SIDE = 256  # cells per side drawn at once; 512 blocks or more are tiled when zoomed out


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
    return View(q0, q1 + 1, k0, k1 + 1, max(1, math.ceil(side / max_side)))


def aggregate(z: np.ndarray, view: View, how: str = "max") -> np.ndarray:
    """z[q0:q1, k0:k1] pooled over tile x tile cells (NaN cells ignored; all-NaN tiles stay NaN)."""
    sub = np.asarray(z)[view.q0 : view.q1, view.k0 : view.k1].astype(np.float32)
    t = view.tile
    if t == 1:
        return sub
    r, c = sub.shape
    pad = np.full((-(-r // t) * t, -(-c // t) * t), np.nan, dtype=np.float32)
    pad[:r, :c] = sub
    blocks = pad.reshape(pad.shape[0] // t, t, pad.shape[1] // t, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN tiles: NaN is the answer
        out = np.nanmax(blocks, axis=(1, 3)) if how == "max" else np.nanmean(blocks, axis=(1, 3))
    return out.astype(np.float32)


def view_labels(view: View, blocks: pd.DataFrame | None, n: int, axis: str) -> list[str]:
    """Axis labels: each block's label in full detail, 'B512–B519' per tile when tiled."""
    lo, hi = (view.q0, view.q1) if axis == "q" else (view.k0, view.k1)
    if not view.tiled:
        return block_labels(blocks, n)[lo:hi]
    return [f"B{s}–B{min(s + view.tile, hi) - 1}" for s in range(lo, hi, view.tile)]
