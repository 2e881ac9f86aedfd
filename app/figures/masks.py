"""Kept-vs-dropped block masks, misses, and the mass a mask keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sketchwalk.app.figures.common import MATRIX_TITLES, OKABE_ITO, _arr, _block_layout


def causal_mask(n_rows: int, n: int, q_blocks: np.ndarray | None = None) -> np.ndarray:
    """[rows, n] bool: key block j is causal for row r when j <= q_blocks[r]."""
    q = np.arange(n_rows) if q_blocks is None else np.asarray(q_blocks)
    return np.arange(n)[None, :] <= q[:, None]


def find_misses(
    exact: np.ndarray | None, selected: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of blocks with exact mass >= threshold that were not selected."""
    if exact is None:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    with np.errstate(invalid="ignore"):
        miss = (np.nan_to_num(exact, nan=0.0) >= threshold) & ~selected
    rows, cols = np.nonzero(miss)
    return rows, cols


def mask_figure(
    selected: np.ndarray,
    causal: np.ndarray,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    title: str = MATRIX_TITLES["mask"],
    misses: tuple[np.ndarray, np.ndarray] | None = None,
    x_title: str = "key block",
    y_title: str = "query block",
    height: int = 420,
) -> go.Figure:
    """Kept (blue) vs dropped (light) causal blocks; misses overlaid as vermillion crosses."""
    z = np.where(causal, selected.astype(np.float32), np.nan).astype(np.float32)
    scale = [[0.0, "#EEEEEE"], [0.5, "#EEEEEE"], [0.5, OKABE_ITO["blue"]], [1.0, OKABE_ITO["blue"]]]
    traces: list[Any] = [
        go.Heatmap(
            z=z,
            x=_arr(x_labels),
            y=_arr(y_labels),
            zmin=0,
            zmax=1,
            colorscale=scale,
            showscale=False,
            hoverongaps=False,
            name="kept",
            hovertemplate=f"{y_title}: %{{y}}<br>{x_title}: %{{x}}<br>kept: %{{z}}<extra></extra>",
        )
    ]
    if misses is not None:
        rows, cols = misses
        traces.append(
            go.Scatter(
                x=_arr(x_labels)[cols],
                y=_arr(y_labels)[rows],
                mode="markers",
                marker={"symbol": "x", "size": 7, "color": OKABE_ITO["vermillion"]},
                name=f"misses ({len(rows)})",
                hovertemplate="missed: %{y} → %{x}<extra></extra>",
            )
        )
    layout = _block_layout(
        title,
        x_labels,
        y_labels,
        x_title,
        y_title,
        height,
        showlegend=misses is not None,
        legend={"orientation": "h", "y": -0.12},
    )
    return go.Figure(traces, layout)


def mass_recall(exact: np.ndarray | None, kept: np.ndarray) -> float | None:
    """Mean over rows of the exact attention mass inside the kept blocks."""
    if exact is None:
        return None
    e = np.nan_to_num(np.asarray(exact, dtype=np.float64), nan=0.0)
    tot = e.sum(1)
    ok = tot > 0
    if not ok.any():
        return None
    return float(((e * kept).sum(1)[ok] / tot[ok]).mean())


def kept_density(kept: np.ndarray, causal: np.ndarray) -> float:
    return float(kept[causal].sum() / max(int(causal.sum()), 1))
