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

from sketchwalk.app.figures.common import LOG_FLOOR, MATRIX_TITLES, OKABE_ITO, _arr, _block_layout
from sketchwalk.app.figures.layer_data import LayerData, layer_data, mask_data
from sketchwalk.app.figures.masks import find_misses, mask_figure
from sketchwalk.app.figures.tiles import MAX_SIDE, View, view_labels


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

    Matrices a layer lacks are left out, so the page says so instead of drawing an empty chart.
    A layer wider than `max_side` blocks, or a `region` (q_lo, q_hi, k_lo, k_hi), is tiled
    (see layer_data). The page caches `layer_data` and calls `data_figures` itself.
    """
    return data_figures(layer_data(hm, blocks, region, max_side), log, palette, miss_threshold)


def data_figures(
    data: LayerData, log: bool = False, palette: str = "Viridis", miss_threshold: float = 0.05
) -> dict[str, go.Figure]:
    """A layer's built arrays drawn: heatmaps (max colours, mean in the hover when tiled) and the
    kept mask (share kept per tile when tiled, else kept vs dropped with the misses)."""
    out = {
        name: heatmap_figure(
            z, MATRIX_TITLES[name] + data.note, data.x, data.y, log, palette, mean=mean
        )
        for name, (z, mean) in data.mats.items()
    }
    arrays = {"share": data.share, "kept": data.kept, "causal": data.causal, "exact": data.exact}
    mask = _mask_figure(arrays, data.x, data.y, miss_threshold, MATRIX_TITLES["mask"])
    if mask is not None:
        out["mask"] = mask
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
    n = np.shape(selected)[-1]
    x, y = view_labels(view, blocks, n, "k"), view_labels(view, blocks, n, "q")
    return _mask_figure(mask_data(selected, exact, view), x, y, miss_threshold, title)


def _mask_figure(
    mask: dict[str, Any],
    x: Sequence[str],
    y: Sequence[str],
    miss_threshold: float,
    title: str,
) -> go.Figure | None:
    """From mask_data's arrays (share, or kept/causal/exact); None when there is no mask."""
    if mask.get("share") is not None:
        fig = heatmap_figure(mask["share"], f"{title} · share kept per tile", x, y)
        fig.data[0].update(zmin=0, zmax=1, colorscale=[[0, "#EEEEEE"], [1, OKABE_ITO["blue"]]])
        return fig
    if mask.get("kept") is None:
        return None
    misses = find_misses(mask["exact"], mask["kept"], miss_threshold)
    return mask_figure(mask["kept"], mask["causal"], x, y, title=title, misses=misses)
