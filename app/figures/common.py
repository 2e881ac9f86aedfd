"""Shared pieces of every chart: palettes, escaped text, block labels, axis ticks.

Text that comes from a prompt or a generation is escaped (`escape_text`) before it reaches a
hover label or a tick: plotly renders a subset of HTML there, and a prompt must show literally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

PALETTES = ("Viridis", "Cividis", "Plasma", "Inferno")
OKABE_ITO = {
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "orange": "#E69F00",
    "green": "#009E73",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "grey": "#BBBBBB",
}
HOUSE_COLOURWAY = [OKABE_ITO[c] for c in ("blue", "vermillion", "green", "orange", "sky", "purple")]
"""Trace colours in order for charts whose traces name no colour (the eval's quality panels)."""
LOG_FLOOR = 1e-6
MATRIX_TITLES = {
    "sketch": "Sketch estimate A_l",
    "walk": "Walk score W_l",
    "exact": "Exact block mass",
    "mask": "Selected blocks",
}


def escape_text(text: str, max_chars: int | None = None) -> str:
    """Text safe for plotly labels: & < > escaped, newlines shown as a visible mark, cut short."""
    text = str(text)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "⏎").replace("\t", "→")


def block_labels(blocks: pd.DataFrame | None, n: int, max_chars: int = 60) -> list[str]:
    """One unique label per block: 'B12 · t768-831 · «text»' (escaped), for hover and axes."""
    spans: dict[int, tuple[int, int, str]] = {}
    if blocks is not None and len(blocks):
        for b, s, e, t in zip(
            blocks["block"], blocks["token_start"], blocks["token_end"], blocks["text"], strict=True
        ):
            spans[int(b)] = (int(s), int(e), str(t))
    out = []
    for j in range(n):
        if j in spans:
            s, e, t = spans[j]
            out.append(f"B{j} · t{s}-{e - 1} · «{escape_text(t, max_chars)}»")
        else:
            out.append(f"B{j}")
    return out


def _arr(labels: Sequence[str]) -> np.ndarray:
    """Labels as a numpy object array: plotly validates those in one step, lists item by item."""
    return np.asarray(labels, dtype=object)


MAX_TICKS = 6
"""Tick labels per categorical axis: a heatmap is about 250 px wide beside another at 1024 px,
and six four-digit block numbers fit there without touching."""


def tick_step(n: int, max_ticks: int = MAX_TICKS) -> int:
    """The smallest step of 1, 2 or 5 x 10^k that labels n categories with at most max_ticks."""
    need = max(1, math.ceil(n / max_ticks))
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= need:
                return m * scale
        scale *= 10


def _ticks(labels: Sequence[str], max_ticks: int = MAX_TICKS) -> dict[str, Any]:
    """Show a few block numbers on a categorical axis whose labels are long hover texts."""
    idx = list(range(0, len(labels), tick_step(len(labels), max_ticks)))
    return {
        "tickmode": "array",
        "tickvals": [labels[i] for i in idx],
        "ticktext": [_block_number(labels[i], i) for i in idx],
    }


def sparse_ticks(labels: Sequence[str], max_ticks: int = MAX_TICKS) -> dict[str, Any]:
    """At most max_ticks of a categorical axis's own labels (every one stays in the hover)."""
    idx = list(range(0, len(labels), tick_step(len(labels), max_ticks)))
    return {"tickmode": "array", "tickvals": [labels[i] for i in idx]}


def _block_number(label: str, fallback: int) -> str:
    """'B512 · t...' or 'B512–B519' (a tile) -> '512': ticks name blocks, also in zoomed views."""
    head = str(label).split(" ", 1)[0].split("–", 1)[0]
    return head[1:] if head[:1] == "B" and head[1:].isdigit() else str(fallback)


def _block_layout(
    title: str,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    x_title: str,
    y_title: str,
    height: int,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "height": height,
        "margin": {"l": 40, "r": 10, "t": 40, "b": 40},
        "xaxis": {"title": {"text": x_title}, **_ticks(x_labels)},
        "yaxis": {"title": {"text": y_title}, "autorange": "reversed", **_ticks(y_labels)},
        **extra,
    }
