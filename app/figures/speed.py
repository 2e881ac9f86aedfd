"""Stage times, speedups and density sweeps (the Speed page)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO

STAGES = (
    ("t_sketch_ms", "sketch", OKABE_ITO["orange"]),
    ("t_walk_ms", "walk", OKABE_ITO["purple"]),
    ("t_select_ms", "select", OKABE_ITO["yellow"]),
    ("t_attention_ms", "sparse attention", OKABE_ITO["blue"]),
)


def stage_figure(stats: pd.DataFrame) -> go.Figure:
    """Per sparse layer: stacked stage times beside dense attention time, speedup on a 2nd axis."""
    st = stats[~stats["dense"]].sort_values("layer")
    layers = st["layer"].to_numpy()
    fig = go.Figure()
    for col, name, colour in STAGES:
        fig.add_trace(
            go.Bar(
                x=layers,
                y=st[col].fillna(0).to_numpy(),
                name=name,
                marker={"color": colour},
                offsetgroup="sparse",
            )
        )
    fig.add_trace(
        go.Bar(
            x=layers,
            y=st["t_dense_ms"].to_numpy(dtype=float),
            name="dense attention",
            marker={"color": OKABE_ITO["grey"]},
            offsetgroup="dense",
        )
    )
    speed = speedups(st)
    fig.add_trace(
        go.Scatter(
            x=layers,
            y=speed,
            name="speedup",
            yaxis="y2",
            mode="lines+markers",
            line={"color": OKABE_ITO["green"]},
        )
    )
    fig.update_layout(
        title={"text": "Stage time per layer (ms) and speedup over dense"},
        barmode="relative",
        height=380,
        margin={"l": 40, "r": 40, "t": 40, "b": 40},
        xaxis={"title": {"text": "layer"}, "dtick": 1},
        yaxis={"title": {"text": "ms"}},
        yaxis2={
            "title": {"text": "speedup ×"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def speedups(stats: pd.DataFrame) -> np.ndarray:
    """Dense attention time / (sketch + walk + select + sparse attention), per row."""
    sparse = sum(stats[c].fillna(0).to_numpy(dtype=float) for c, _, _ in STAGES)
    dense = stats["t_dense_ms"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sparse > 0, dense / sparse, np.nan)


def overall_speedup(stats: pd.DataFrame) -> float | None:
    st = stats[~stats["dense"]]
    sparse = sum(float(st[c].fillna(0).sum()) for c, _, _ in STAGES)
    dense = float(st["t_dense_ms"].fillna(0).sum())
    return dense / sparse if sparse > 0 and dense > 0 else None


def sweep_figure(points: pd.DataFrame) -> go.Figure:
    """Speedup and KL against achieved density, one point per run of the same prompt."""
    p = points.sort_values("density")
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=p["density"],
            y=p["speedup"],
            name="attention speedup ×",
            mode="lines+markers",
            line={"color": OKABE_ITO["blue"]},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=p["density"],
            y=p["kl"],
            name="KL (dense‖sparse)",
            yaxis="y2",
            mode="lines+markers",
            line={"color": OKABE_ITO["vermillion"], "dash": "dash"},
        )
    )
    optional = (  # columns only runs with clean-pass timings have
        ("clean_speedup", "clean prefill speedup × (whole model)", "lines+markers", "solid"),
        ("ceiling", "whole-model ceiling × (free selection)", "lines", "dot"),
    )
    for col, name, mode, dash in optional:
        if col in p and p[col].notna().any():
            line = {"color": OKABE_ITO["green"], "dash": dash}
            fig.add_trace(go.Scatter(x=p["density"], y=p[col], name=name, mode=mode, line=line))
    fig.update_layout(
        title={"text": "Density sweep: speed and quality"},
        height=360,
        margin={"l": 40, "r": 40, "t": 40, "b": 40},
        xaxis={"title": {"text": "achieved density (sparse layers)"}},
        yaxis={"title": {"text": "speedup ×"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "KL"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
