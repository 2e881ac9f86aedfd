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
    _arr,
    _block_layout,
    block_labels,
)
from sketchwalk.app.figures.masks import causal_mask, find_misses, mask_figure


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
) -> go.Figure:
    """A block matrix as a heatmap; rows top to bottom like the matrix, hover names both blocks."""
    z = np.asarray(z, dtype=np.float32)
    zp = log_values(z) if log else z
    colorbar: dict[str, Any] = {"title": {"text": "log₁₀" if log else ""}, "thickness": 12}
    if log:
        lo = int(math.floor(math.log10(LOG_FLOOR)))
        colorbar.update(tickvals=list(range(lo, 1)), ticktext=[f"1e{k}" for k in range(lo, 1)])
    value = "log₁₀ %{z:.2f}" if log else "%{z:.4g}"
    trace = go.Heatmap(
        z=zp,
        x=_arr(x_labels),
        y=_arr(y_labels),
        colorscale=palette,
        colorbar=colorbar,
        hoverongaps=False,
        hovertemplate=f"{y_title}: %{{y}}<br>{x_title}: %{{x}}<br>{value}<extra></extra>",
    )
    # layout given to the constructor: update_layout afterwards deep-copies the data (slow)
    return go.Figure([trace], _block_layout(title, x_labels, y_labels, x_title, y_title, height))


def layer_figures(
    hm: dict[str, Any],
    blocks: pd.DataFrame | None,
    log: bool = False,
    palette: str = "Viridis",
    miss_threshold: float = 0.05,
) -> dict[str, go.Figure]:
    """The four matrices of one layer (store.heatmap output), keyed sketch/walk/exact/mask.

    Matrices a layer lacks (a dense layer has no walk or selection; long contexts no exact mass)
    are left out, so the page says so instead of drawing an empty chart.
    """
    q_blocks = np.asarray(hm["q_blocks"])
    n = int(hm["n_blocks"])
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
