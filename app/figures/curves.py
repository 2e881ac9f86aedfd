"""Per-layer summary curves of one phase/step."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO

CURVES = {
    "density_achieved": ("achieved density", OKABE_ITO["blue"]),
    "sketch_error": ("sketch error (TV vs exact)", OKABE_ITO["orange"]),
    "walk_error": ("walk error (TV vs exact)", OKABE_ITO["purple"]),
    "mass_recall": ("mass recall", OKABE_ITO["green"]),
}


def layer_curves(
    stats: pd.DataFrame, current_layer: int | None = None, targets: dict[int, float] | None = None
) -> go.Figure:
    """Per-layer lines of one phase/step: achieved density, sketch/walk error, mass recall, and
    (a run with a layer profile) each sparse layer's target density, dashed."""
    fig = go.Figure()
    stats = stats.sort_values("layer")
    if targets:
        xs = sorted(targets)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[targets[x] for x in xs],
                mode="lines",
                name="target density (layer profile)",
                line={"color": CURVES["density_achieved"][1], "dash": "dash"},
            )
        )
    for col, (name, colour) in CURVES.items():
        if col not in stats or stats[col].isna().all():
            continue
        fig.add_trace(
            go.Scatter(
                x=stats["layer"].to_numpy(),
                y=stats[col].to_numpy(dtype=float),
                mode="lines+markers",
                name=name,
                line={"color": colour},
            )
        )
    if current_layer is not None:
        fig.add_vline(x=current_layer, line={"dash": "dot", "color": "#666666"})
    fig.update_layout(
        title={"text": "Per layer"},
        height=320,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        xaxis={"title": {"text": "layer"}, "dtick": 1},
        yaxis={"range": [0, 1.05]},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
