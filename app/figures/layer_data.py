"""A layer's figure-ready arrays, built once and drawn many times.

Building is the costly half of a layer's heatmaps at long context (tiling 2048 x 2048 matrices);
drawing (log scale, palette, miss threshold, needle outlines) is cheap. Splitting them lets the
page cache what `layer_data` returns (app/layer_views.py) and redraw it under other display
settings without touching the layer's full matrices again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sketchwalk.app.figures.common import block_labels
from sketchwalk.app.figures.masks import causal_mask
from sketchwalk.app.figures.tiles import (
    MAX_SIDE,
    View,
    aggregate,
    count,
    plan_view,
    view_labels,
)

MATRICES = ("sketch", "walk", "exact")


@dataclass(frozen=True)
class LayerData:
    """What a layer's four heatmaps show, at most `max_side` cells a side.

    mats: name -> (z, mean); z is each tile's max (or the cell) and mean each tile's mean
    (None in full detail). Mask: `share` (kept share per tile) when tiled, else `kept`, `causal`
    and `exact` for the region's cells (exact for the misses). `exact_full` and `kept_full` keep
    the whole layer only when exact mass was recorded (short contexts), for the misses metric.
    """

    n: int
    view: View
    x: list[str]
    y: list[str]
    mats: dict[str, tuple[np.ndarray, np.ndarray | None]]
    share: np.ndarray | None = None
    kept: np.ndarray | None = None
    causal: np.ndarray | None = None
    exact: np.ndarray | None = None
    exact_full: np.ndarray | None = None
    kept_full: np.ndarray | None = None

    @property
    def note(self) -> str:
        return (
            f" · tiles of {self.view.tile}×{self.view.tile} blocks (max)" if self.view.tiled else ""
        )


def layer_data(
    hm: dict[str, Any],
    blocks: pd.DataFrame | None,
    region: tuple[int, int, int, int] | None = None,
    max_side: int = MAX_SIDE,
) -> LayerData:
    """The arrays of one layer (store.heatmap output) as the page draws them.

    Matrices a layer lacks (a dense layer has no walk or selection; long contexts no exact mass)
    are left out. A layer wider than `max_side` blocks, or a `region` (q_lo, q_hi, k_lo, k_hi),
    goes through `tiles`; otherwise the recorded query rows are shown in full detail.
    """
    n = int(hm["n_blocks"])
    view = plan_view(n, region, max_side)
    exact = hm.get("exact")
    full = {}
    if exact is not None:
        full = {"exact_full": np.asarray(exact), "kept_full": np.asarray(hm["selected"], bool)}
    if view.tiled or region is not None:
        return _region_data(hm, blocks, view, full)
    labels = block_labels(blocks, n)
    q_blocks = np.asarray(hm["q_blocks"])
    rows = q_blocks if q_blocks.size else np.arange(n)
    mats: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name in MATRICES:
        z = hm.get(name)
        if z is not None and not np.isnan(z := np.asarray(z, dtype=np.float32)[rows]).all():
            mats[name] = (z, None)
    mask = {}
    if "walk" in mats:
        mask = {
            "kept": np.asarray(hm["selected"], bool)[rows],
            "causal": causal_mask(len(rows), n, rows),
            "exact": None if exact is None else np.asarray(exact)[rows],
        }
    return LayerData(n, view, labels, [labels[int(q)] for q in rows], mats, **mask, **full)


def _region_data(
    hm: dict[str, Any], blocks: pd.DataFrame | None, view: View, full: dict[str, np.ndarray]
) -> LayerData:
    """A region of a layer, tiled (max and mean per tile, share kept) or in full detail."""
    n = int(hm["n_blocks"])
    mats: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name in MATRICES:
        z = hm.get(name)
        if z is None or np.isnan(z).all():
            continue
        mats[name] = (aggregate(z, view, "max"), aggregate(z, view, "mean") if view.tiled else None)
    x, y = view_labels(view, blocks, n, "k"), view_labels(view, blocks, n, "q")
    if "walk" not in mats:
        return LayerData(n, view, x, y, mats, **full)
    return LayerData(
        n, view, x, y, mats, **mask_data(hm["selected"], hm.get("exact"), view), **full
    )


def mask_data(
    selected: np.ndarray, exact: np.ndarray | None, view: View
) -> dict[str, np.ndarray | None]:
    """A kept mask [n, n] in a view: the kept share per tile when tiled (kept / causal blocks,
    counted in integers), else the region's kept, causal and exact cells."""
    selected = np.asarray(selected, dtype=bool)
    n = selected.shape[-1]
    causal = causal_mask(n, n)
    if view.tiled:
        n_causal = count(causal, view)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = count(selected & causal, view) / n_causal  # no causal block: NaN, blank
        return {"share": share.astype(np.float32)}
    sl = (slice(view.q0, view.q1), slice(view.k0, view.k1))
    return {
        "kept": selected[sl],
        "causal": causal[sl],
        "exact": None if exact is None else np.asarray(exact)[sl],
    }
