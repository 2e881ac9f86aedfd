"""Needle views: the needle's key blocks outlined on heatmaps, and the layers x steps strip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO, escape_text, sparse_ticks
from sketchwalk.app.figures.tiles import View

NEEDLE_COLOUR = OKABE_ITO["orange"]


def outline_blocks(
    fig: go.Figure, blocks: Sequence[int], n: int, view: View | None = None
) -> go.Figure:
    """Outline key-block columns (x = block index on a categorical axis) over the whole height.

    Consecutive blocks share one rectangle, so a needle costs a shape or two, not one per cell.
    With a `view` (a region or tiles), the columns are the view's: (block - k0) // tile.
    """
    k0, k1, t = (0, n, 1) if view is None else (view.k0, view.k1, view.tile)
    cols = {(int(b) - k0) // t for b in blocks if k0 <= int(b) < min(k1, n)}
    runs: list[list[int]] = []
    for b in sorted(cols):
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    for lo, hi in runs:
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=lo - 0.5,
            x1=hi + 0.5,
            y0=0,
            y1=1,
            line={"color": NEEDLE_COLOUR, "width": 2},
            fillcolor="rgba(0,0,0,0)",
            name="needle",
        )
    return fig


def needle_strip(strip: dict[str, Any], token_texts: Sequence[str] = ()) -> go.Figure:
    """Layers x (prefill, decode 1, ...): colour = share of the needle's blocks kept; each cell's
    text gives the best rank in the selecting scores and the exact mass share where known.
    token_texts: the generated tokens in order, named beside their decode steps on the axis
    (the i-th decode column with the i-th token, as the decode-tokens view pairs them)."""
    kept = np.asarray(strip["kept"], dtype=np.float32)
    mass = np.asarray(strip["mass"], dtype=np.float32)
    rank = np.asarray(strip["rank"], dtype=np.float32)
    dense = np.asarray(strip["dense"], dtype=bool)
    cells = np.empty(kept.shape, dtype=object)
    for i, j in np.ndindex(kept.shape):
        if np.isnan(kept[i, j]):
            cells[i, j] = ""
        elif dense[i, j]:
            cells[i, j] = "dense"
        else:
            r = "" if np.isnan(rank[i, j]) else f"#{int(rank[i, j])}"
            m = "" if np.isnan(mass[i, j]) else f" {mass[i, j]:.2f}"
            cells[i, j] = (r + m).strip()
    y = [f"layer {layer}" for layer in strip["layers"]]
    x, d = [], 0
    for col in strip["columns"]:
        if col.startswith("decode") and d < len(token_texts):
            col = f"{col} «{escape_text(token_texts[d], 12)}»"
        d += col.startswith("decode")
        x.append(col)
    scale = [[0.0, OKABE_ITO["vermillion"]], [0.5, OKABE_ITO["yellow"]], [1.0, OKABE_ITO["blue"]]]
    fig = go.Figure(
        go.Heatmap(
            z=kept,
            x=np.asarray(x, dtype=object),
            y=np.asarray(y, dtype=object),
            zmin=0,
            zmax=1,
            colorscale=scale,
            text=cells,
            texttemplate="%{text}",
            customdata=mass,
            colorbar={"title": {"text": "kept"}, "thickness": 12},
            hoverongaps=False,
            hovertemplate="%{y} · %{x}<br>needle blocks kept: %{z:.0%}<br>"
            "best rank, mass: %{text}<extra></extra>",
        ),
        {
            "title": {"text": "Needle through the layers (kept share; #rank and exact mass)"},
            "height": max(220, 28 * len(y) + 110),
            "margin": {"l": 60, "r": 10, "t": 40, "b": 40},
            "yaxis": {"autorange": "reversed"},
            "xaxis": {"side": "bottom", **sparse_ticks(x)},
        },
    )
    return fig
