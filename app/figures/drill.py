"""The drill-down from a bad token to its cause: which layers dropped the blocks that carried
the token's attention (layers x KV groups), and inside a layer the token's top source tokens per
head (as bertviz and CircuitsVis list them), marked kept or dropped.

Inputs are engine.recorder.QueryLayer records (the on-demand probe of engine.runner.
probe_queries); token texts come from the store and are escaped before they reach a label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO, escape_text
from sketchwalk.app.figures.tiles import View

DROPPED_SCALE = [[0.0, "#FFFFFF"], [0.2, OKABE_ITO["yellow"]], [1.0, OKABE_ITO["vermillion"]]]


def dropped_table(layers: Sequence[Any]) -> pd.DataFrame:
    """One row per (layer, KV group): the exact attention mass of the token that fell on blocks
    its row did not keep, largest first. Dense layers drop nothing and are left out."""
    rows = [
        {"Layer": ql.layer, "KV group": g, "Dropped attention": float(m)}
        for ql in layers
        if not ql.dense
        for g, m in enumerate(ql.dropped_by_group)
    ]
    df = pd.DataFrame(rows, columns=["Layer", "KV group", "Dropped attention"])
    return df.sort_values("Dropped attention", ascending=False, kind="stable").reset_index(
        drop=True
    )


def dropped_figure(layers: Sequence[Any], position: int) -> go.Figure:
    """Layers x KV groups: colour and text = the token's attention mass on dropped blocks."""
    sparse = sorted((ql for ql in layers if not ql.dense), key=lambda q: q.layer)
    groups = max((len(ql.dropped_by_group) for ql in sparse), default=1)
    z = np.full((len(sparse), groups), np.nan, dtype=np.float32)
    for i, ql in enumerate(sparse):
        z[i, : len(ql.dropped_by_group)] = ql.dropped_by_group
    y = np.asarray([f"layer {ql.layer}" for ql in sparse], dtype=object)
    x = np.asarray([f"group {g}" for g in range(groups)], dtype=object)
    text = np.vectorize(lambda v: "" if np.isnan(v) else f"{v:.2f}")(z) if z.size else z
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            zmin=0,
            zmax=max(0.05, float(np.nanmax(z)) if np.isfinite(z).any() else 0.05),
            colorscale=DROPPED_SCALE,
            text=text,
            texttemplate="%{text}",
            colorbar={"title": {"text": "dropped"}, "thickness": 12},
            hovertemplate="%{y} · %{x}<br>attention on dropped blocks: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": f"Token t{position}: its attention on dropped blocks, per layer and group"},
        height=max(240, 22 * len(sparse) + 110),
        margin={"l": 70, "r": 10, "t": 40, "b": 40},
        yaxis={"autorange": "reversed"},
    )
    return fig


def top_sources_figure(ql: Any, texts: Mapping[int, str], title: str | None = None) -> go.Figure:
    """Heads x rank: the query's top source tokens in one layer, colour = attention weight, the
    token's text in the cell; sources in dropped blocks are marked ✗ (the sparse model never
    read them)."""
    heads = len(ql.top)
    k = max((len(t) for t in ql.top), default=0)
    z = np.full((heads, k), np.nan, dtype=np.float32)
    cells = np.full((heads, k), "", dtype=object)
    hover = np.full((heads, k), "", dtype=object)
    for h, row in enumerate(ql.top):
        for r, (pos, w, kept) in enumerate(row):
            tok = escape_text(texts.get(pos, ""), 14)
            mark = "" if kept else "✗ "
            z[h, r] = w
            cells[h, r] = f"{mark}{tok}"
            hover[h, r] = f"t{pos} «{tok}» · weight {w:.3f} · " + (
                "block kept" if kept else "block DROPPED"
            )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=np.asarray([f"#{r + 1}" for r in range(k)], dtype=object),
            y=np.asarray([f"head {h}" for h in range(heads)], dtype=object),
            zmin=0,
            colorscale="Blues",
            text=cells,
            texttemplate="%{text}",
            customdata=hover,
            colorbar={"title": {"text": "weight"}, "thickness": 12},
            hovertemplate="%{y} · %{x}: %{customdata}<extra></extra>",
        )
    )
    fig.update_layout(
        title={
            "text": title
            or f"Layer {ql.layer}: top source tokens of t{ql.position} per head (✗ = dropped)"
        },
        height=max(240, 26 * heads + 110),
        margin={"l": 70, "r": 10, "t": 40, "b": 40},
        yaxis={"autorange": "reversed"},
        xaxis={"title": {"text": "rank by attention weight (exact softmax, this layer)"}},
    )
    return fig


def outline_row(fig: go.Figure, row: int, n: int, view: View | None = None) -> go.Figure:
    """Outline one query-block row (y = row on a categorical axis) across the whole width."""
    q0, q1, t = (0, n, 1) if view is None else (view.q0, view.q1, view.tile)
    if not q0 <= int(row) < min(q1, n):
        return fig
    y = (int(row) - q0) // t
    fig.add_shape(
        type="rect",
        xref="paper",
        yref="y",
        x0=0,
        x1=1,
        y0=y - 0.5,
        y1=y + 0.5,
        line={"color": OKABE_ITO["vermillion"], "width": 2},
        fillcolor="rgba(0,0,0,0)",
        name="query row",
    )
    return fig
