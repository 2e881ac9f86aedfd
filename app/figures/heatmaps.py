"""Block heatmaps of one layer: sketch estimate, walk score, exact mass, kept mask.

Block labels sit on categorical axes, so a hover names the block's token span and text with
O(n) strings instead of one string per cell (n x n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import (
    LOG_FLOOR,
    MATRIX_TITLES,
    OKABE_ITO,
    _arr,
    _block_layout,
    block_labels,
)
from sketchwalk.app.figures.masks import causal_mask, find_misses, mask_figure
from sketchwalk.app.figures.tiles import MAX_SIDE, View, aggregate, plan_view, view_labels


def log_values(z: np.ndarray) -> np.ndarray:
    """log10 with a floor, NaN kept (non-causal cells stay blank)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log10(np.maximum(z.astype(np.float32), LOG_FLOOR))


def heatmap_figure(
    z: np.ndarray,
    title: str,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    log: bool = False,
    palette: str = "Viridis",
    x_title: str = "key block",
    y_title: str = "query block",
    height: int = 420,
    mean: np.ndarray | None = None,
) -> go.Figure:
    """A block matrix as a heatmap; rows top to bottom like the matrix, hover names both blocks.

    `mean` (tiled views): each tile's mean, shown in the hover beside the max that colours it;
    a numeric array, so it costs no strings per cell.
    """
    z = np.asarray(z, dtype=np.float32)
    zp = log_values(z) if log else z
    colorbar: dict[str, Any] = {"title": {"text": "log₁₀" if log else ""}, "thickness": 12}
    if log:
        lo = int(math.floor(math.log10(LOG_FLOOR)))
        colorbar.update(tickvals=list(range(lo, 1)), ticktext=[f"1e{k}" for k in range(lo, 1)])
    value = "log₁₀ %{z:.2f}" if log else "%{z:.4g}"
    extra: dict[str, Any] = {}
    if mean is not None:
        value = f"max {value}<br>mean %{{customdata:.4g}}"
        extra["customdata"] = np.asarray(mean, dtype=np.float32)
    trace = go.Heatmap(
        z=zp,
        x=_arr(x_labels),
        y=_arr(y_labels),
        colorscale=palette,
        colorbar=colorbar,
        hoverongaps=False,
        hovertemplate=f"{y_title}: %{{y}}<br>{x_title}: %{{x}}<br>{value}<extra></extra>",
        **extra,
    )
    # layout given to the constructor: update_layout afterwards deep-copies the data (slow)
    return go.Figure([trace], _block_layout(title, x_labels, y_labels, x_title, y_title, height))


def layer_figures(
    hm: dict[str, Any],
    blocks: pd.DataFrame | None,
    log: bool = False,
    palette: str = "Viridis",
    miss_threshold: float = 0.05,
    region: tuple[int, int, int, int] | None = None,
    max_side: int = MAX_SIDE,
) -> dict[str, go.Figure]:
    """The four matrices of one layer (store.heatmap output), keyed sketch/walk/exact/mask.

    Matrices a layer lacks (a dense layer has no walk or selection; long contexts no exact mass)
    are left out, so the page says so instead of drawing an empty chart. A layer wider than
    `max_side` blocks, or a `region` (q_lo, q_hi, k_lo, k_hi), is drawn through `tiles`.
    """
    q_blocks = np.asarray(hm["q_blocks"])
    n = int(hm["n_blocks"])
    view = plan_view(n, region, max_side)
    if view.tiled or region is not None:
        return _view_figures(hm, blocks, view, log, palette, miss_threshold)
    labels = block_labels(blocks, n)
    rows = q_blocks if q_blocks.size else np.arange(n)
    y_labels = [labels[int(q)] for q in rows]
    out: dict[str, go.Figure] = {}
    for name in ("sketch", "walk", "exact"):
        z = hm.get(name)
        if z is None:
            continue
        z = np.asarray(z)[rows]
        if np.isnan(z).all():
            continue
        out[name] = heatmap_figure(z, MATRIX_TITLES[name], labels, y_labels, log, palette)
    walk = hm.get("walk")
    if walk is not None and not np.isnan(np.asarray(walk)[rows]).all():
        selected = np.asarray(hm["selected"])[rows]
        exact = hm.get("exact")
        exact_rows = None if exact is None else np.asarray(exact)[rows]
        misses = find_misses(exact_rows, selected, miss_threshold)
        out["mask"] = mask_figure(
            selected, causal_mask(len(rows), n, rows), labels, y_labels, misses=misses
        )
    return out


def _view_figures(
    hm: dict[str, Any],
    blocks: pd.DataFrame | None,
    view: View,
    log: bool,
    palette: str,
    miss_threshold: float,
) -> dict[str, go.Figure]:
    """A region of a layer, tiled (max colours, mean in the hover) or in full detail."""
    n = int(hm["n_blocks"])
    y = view_labels(view, blocks, n, "q")
    x = view_labels(view, blocks, n, "k")
    note = f" · tiles of {view.tile}×{view.tile} blocks (max)" if view.tiled else ""
    out: dict[str, go.Figure] = {}
    for name in ("sketch", "walk", "exact"):
        z = hm.get(name)
        if z is None or np.isnan(np.asarray(z)).all():
            continue
        zmax = aggregate(z, view, "max")
        mean = aggregate(z, view, "mean") if view.tiled else None
        out[name] = heatmap_figure(zmax, MATRIX_TITLES[name] + note, x, y, log, palette, mean=mean)
    walk = hm.get("walk")
    if walk is None or np.isnan(np.asarray(walk)).all():
        return out
    exact = hm.get("exact")
    out["mask"] = mask_view_figure(hm["selected"], exact, view, blocks, miss_threshold)
    return out


def mask_view_figure(
    selected: np.ndarray,
    exact: np.ndarray | None,
    view: View,
    blocks: pd.DataFrame | None,
    miss_threshold: float = 0.05,
    title: str = MATRIX_TITLES["mask"],
) -> go.Figure:
    """A kept mask [n, n] in a view: share kept per tile when tiled, else the region's mask."""
    selected = np.asarray(selected, dtype=bool)
    n = selected.shape[-1]
    y = view_labels(view, blocks, n, "q")
    x = view_labels(view, blocks, n, "k")
    causal = causal_mask(n, n)
    if view.tiled:
        share = aggregate(np.where(causal, selected, np.nan), view, "mean")
        fig = heatmap_figure(share, f"{title} · share kept per tile", x, y)
        fig.data[0].update(zmin=0, zmax=1, colorscale=[[0, "#EEEEEE"], [1, OKABE_ITO["blue"]]])
        return fig
    sl = (slice(view.q0, view.q1), slice(view.k0, view.k1))
    ex = None if exact is None else np.asarray(exact)[sl]
    misses = find_misses(ex, selected[sl], miss_threshold)
    return mask_figure(selected[sl], causal[sl], x, y, title=title, misses=misses)
