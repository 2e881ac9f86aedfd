"""Mask diff: two runs of the same prompt, which blocks each kept (A only / B only / both).

Each run's mass recall is measured against its own exact block mass (the two sparse models'
hidden states differ after the first sparse layer, so each has its own ground truth).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO, _arr, _block_layout
from sketchwalk.app.figures.masks import mass_recall

# codes of a diff cell; NaN = not causal
NEITHER, A_ONLY, B_ONLY, BOTH = 0, 1, 2, 3
DIFF_COLOURS = {
    NEITHER: "#EEEEEE",
    A_ONLY: OKABE_ITO["orange"],
    B_ONLY: OKABE_ITO["blue"],
    BOTH: OKABE_ITO["green"],
}
DIFF_NAMES = {NEITHER: "neither", A_ONLY: "A only", B_ONLY: "B only", BOTH: "both"}


@dataclass
class MaskDiff:
    """One layer's diff: codes [rows, n] (NaN where not causal), counts, each run's recall."""

    codes: np.ndarray
    a_only: int
    b_only: int
    both: int
    recall_a: float | None
    recall_b: float | None

    @property
    def jaccard(self) -> float | None:
        union = self.a_only + self.b_only + self.both
        return self.both / union if union else None


def _kept(hm: dict[str, Any], n: int) -> np.ndarray:
    sel = hm.get("selected")
    if sel is None or hm.get("walk") is None or np.isnan(np.asarray(hm["walk"])).all():
        return np.tril(np.ones((n, n), dtype=bool))  # a dense layer keeps every causal block
    return np.asarray(sel, dtype=bool)


def mask_diff(a: dict[str, Any], b: dict[str, Any]) -> MaskDiff:
    """Diff two layers' heatmaps (store.heatmap output) of the same prompt and block size."""
    n = int(a["n_blocks"])
    if int(b["n_blocks"]) != n:
        raise ValueError(f"the runs have {n} and {int(b['n_blocks'])} blocks: not the same prompt")
    ka, kb = _kept(a, n), _kept(b, n)
    causal = np.tril(np.ones((n, n), dtype=bool))
    codes = np.where(causal, ka.astype(np.int8) + 2 * kb.astype(np.int8), -1).astype(np.float32)
    codes[codes < 0] = np.nan
    return MaskDiff(
        codes=codes,
        a_only=int((ka & ~kb & causal).sum()),
        b_only=int((kb & ~ka & causal).sum()),
        both=int((ka & kb & causal).sum()),
        recall_a=mass_recall(a.get("exact"), ka & causal),
        recall_b=mass_recall(b.get("exact"), kb & causal),
    )


def diff_figure(
    d: MaskDiff, x_labels: Sequence[str], title: str = "Kept by A only / B only / both"
) -> go.Figure:
    """The diff as one categorical heatmap (colour-blind-safe: orange A, blue B, green both)."""
    scale = []
    for code in range(4):
        scale += [[code / 4, DIFF_COLOURS[code]], [(code + 1) / 4, DIFF_COLOURS[code]]]
    names = np.array([DIFF_NAMES[c] for c in range(4)], dtype=object)
    trace = go.Heatmap(
        z=d.codes,
        x=_arr(x_labels),
        y=_arr(x_labels),
        zmin=-0.5,
        zmax=3.5,
        colorscale=scale,
        colorbar={
            "tickvals": [0, 1, 2, 3],
            "ticktext": list(names),
            "thickness": 12,
        },
        hoverongaps=False,
        hovertemplate="query block: %{y}<br>key block: %{x}<br>code %{z} "
        "(0 neither, 1 A only, 2 B only, 3 both)<extra></extra>",
    )
    layout = _block_layout(
        f"{title}: {d.a_only} A only, {d.b_only} B only, {d.both} both",
        x_labels,
        x_labels,
        "key block",
        "query block",
        480,
    )
    return go.Figure([trace], layout)


def diff_curves(per_layer: pd.DataFrame) -> go.Figure:
    """Per-layer summary: overlap (Jaccard of kept blocks) and each run's mass recall."""
    p = per_layer.sort_values("layer")
    fig = go.Figure()
    for col, name, colour, dash in (
        ("jaccard", "overlap (both / either)", OKABE_ITO["green"], None),
        ("recall_a", "mass recall A", OKABE_ITO["orange"], "dash"),
        ("recall_b", "mass recall B", OKABE_ITO["blue"], "dot"),
    ):
        if col not in p or p[col].isna().all():
            continue
        fig.add_trace(
            go.Scatter(
                x=p["layer"].to_numpy(),
                y=p[col].to_numpy(dtype=float),
                name=name,
                mode="lines+markers",
                line={"color": colour, "dash": dash},
            )
        )
    fig.update_layout(
        title={"text": "Mask diff per layer"},
        height=320,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        xaxis={"title": {"text": "layer"}, "dtick": 1},
        yaxis={"range": [0, 1.05]},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
