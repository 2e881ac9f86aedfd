"""Depth view: one query row through every sparse layer, and the blocks the walk rescued."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO, _arr, block_labels
from sketchwalk.app.figures.heatmaps import heatmap_figure
from sketchwalk.app.figures.preview import layer_target, preview_selection


def depth_matrices(
    layers: Sequence[tuple[int, dict[str, Any]]],
    q_block: int,
    prompt_tokens: int,
    config: dict[str, Any],
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Row `q_block` of every sparse layer: [layers, n] sketch, walk, exact, selected, rescued.

    rescued = kept by the walk's selection but not by the same rule applied to the per-layer
    estimate A_l alone, at the density the run aimed at in that layer (its layer profile's, from
    the run's metrics): the blocks the walk brought in. Only layers with a walk are included.
    """
    ids, sk, wk, ex, sel, per_layer = [], [], [], [], [], []
    n = 0
    for layer, hm in layers:
        walk = hm.get("walk")
        if walk is None or np.isnan(walk[q_block]).all():
            continue
        n = int(hm["n_blocks"])
        ids.append(layer)
        sk.append(hm["sketch"][q_block])
        wk.append(walk[q_block])
        ex.append(hm["exact"][q_block] if hm.get("exact") is not None else np.full(n, np.nan))
        sel.append(hm["selected"][q_block])
        per_layer.append(
            preview_selection(
                hm["sketch"], prompt_tokens, config, layer_target(config, metrics, layer)
            )[q_block]
        )
    if not ids:
        return {"layers": [], "n_blocks": 0}
    selected = np.stack(sel)
    alone = np.stack(per_layer)
    exact = np.stack(ex).astype(np.float32)
    rescued = selected & ~alone
    return {
        "layers": ids,
        "n_blocks": n,
        "sketch": np.stack(sk).astype(np.float32),
        "walk": np.stack(wk).astype(np.float32),
        "exact": exact,
        "selected": selected,
        "rescued": rescued,
        "rescued_mass": float(np.nansum(np.where(rescued, exact, 0.0))) / max(len(ids), 1),
    }


def depth_figures(
    depth: dict[str, Any],
    blocks: pd.DataFrame | None,
    log: bool = False,
    palette: str = "Viridis",
) -> dict[str, go.Figure]:
    """Layers x key blocks heatmaps (direct estimate, walk score, exact mass) for one query row;
    blocks the walk rescued are marked with orange circles on the walk and exact maps."""
    n = depth["n_blocks"]
    labels = block_labels(blocks, n)
    y = [f"layer {layer}" for layer in depth["layers"]]
    out: dict[str, go.Figure] = {}
    rows, cols = np.nonzero(depth["rescued"])
    for name, title in (
        ("sketch", "Direct estimate (rows of A_l)"),
        ("walk", "Walk score (rows of W_l)"),
        ("exact", "Exact block mass"),
    ):
        z = depth[name]
        if np.isnan(z).all():
            continue
        fig = heatmap_figure(z, title, labels, y, log, palette, y_title="layer", height=360)
        fig.update_layout(yaxis={"autorange": "reversed", "tickmode": "auto"})
        if name != "sketch":
            fig.add_trace(
                go.Scatter(
                    x=_arr(labels)[cols],
                    y=_arr(y)[rows],
                    mode="markers",
                    marker={
                        "symbol": "circle-open",
                        "size": 9,
                        "color": OKABE_ITO["orange"],
                        "line": {"width": 2},
                    },
                    name=f"kept thanks to the walk ({len(rows)})",
                    hovertemplate="walk kept: %{y} → %{x}<extra></extra>",
                )
            )
            fig.update_layout(showlegend=True, legend={"orientation": "h", "y": -0.2})
        out[name] = fig
    return out
