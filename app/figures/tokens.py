"""Generated tokens: decode-step masks, dense-vs-sparse token tables, per-token KL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sketchwalk.app.figures.common import OKABE_ITO, block_labels, escape_text
from sketchwalk.app.figures.heatmaps import heatmap_figure
from sketchwalk.app.figures.masks import mask_figure


def decode_figure(
    rows: dict[str, Any], token_texts: Sequence[str], blocks: pd.DataFrame | None
) -> go.Figure | None:
    """Generated tokens x key blocks: kept blocks coloured by exact mass (grey when unknown)."""
    steps = np.asarray(rows.get("steps", []))
    if steps.size == 0:
        return None
    sel = np.asarray(rows["selected"])
    n = sel.shape[1]
    exact = rows.get("exact")
    labels = block_labels(blocks, n)
    y = [
        f"step {int(s)} · «{escape_text(token_texts[i] if i < len(token_texts) else '', 24)}»"
        for i, s in enumerate(steps)
    ]
    valid = np.arange(n)[None, :] < np.asarray(rows["n_blocks"])[:, None]
    if exact is not None and not np.isnan(exact).all():
        z = np.where(sel, np.nan_to_num(exact, nan=0.0), np.nan)
        z = np.where(valid, z, np.nan).astype(np.float32)
        fig = heatmap_figure(
            z,
            "Decode: kept blocks per generated token (colour = exact mass)",
            labels,
            y,
            y_title="token",
            height=max(300, 18 * len(y) + 120),
        )
    else:
        fig = mask_figure(
            sel,
            valid,
            labels,
            y,
            "Decode: kept blocks per generated token",
            y_title="token",
            height=max(300, 18 * len(y) + 120),
        )
    # one row per token, 18 px each: every row's tick names its token, not its index
    ticks = [
        f"{int(s)} «{escape_text(token_texts[i] if i < len(token_texts) else '', 12)}»"
        for i, s in enumerate(steps)
    ]
    fig.layout.yaxis.update(tickmode="array", tickvals=list(y), ticktext=ticks)
    return fig


def token_table(tokens: pd.DataFrame, prompt_tokens: int) -> pd.DataFrame:
    """Generated tokens of both variants aligned by position, with a divergence flag and KL."""
    gen = tokens[tokens["position"] >= prompt_tokens]
    d = gen[gen["variant"] == "dense"].set_index("position")
    s = gen[gen["variant"] == "sparse"].set_index("position")
    idx = sorted(set(d.index) | set(s.index))
    out = pd.DataFrame(
        {
            "position": idx,
            "dense": [d["text"].get(i, "") for i in idx],
            "sparse": [s["text"].get(i, "") for i in idx],
            "kl": [s["kl"].get(i, np.nan) for i in idx],
        }
    )
    same = [
        (i in d.index and i in s.index and int(d["token_id"][i]) == int(s["token_id"][i]))
        for i in idx
    ]
    out["same"] = same
    first = next((k for k, v in enumerate(same) if not v), None)
    out["diverged"] = [first is not None and k >= first for k in range(len(idx))]
    return out


MAX_BARS = 160
"""Bars shown at once: at least 3 px each in the ~560 px a full-width chart gets at 1024 px."""


STRIP_TOKENS = 1 << 14
"""Positions the KL strip reads, around the prompt token of highest KL: its range slider moves
within them (a run may hold 1M positions; the strip opens on MAX_BARS of them anyway)."""


def strip_span(centre: int, size: int = STRIP_TOKENS) -> tuple[int, int]:
    """The positions [start, stop) the KL strip reads: `size` of them around `centre`."""
    start = max(int(centre) - size // 2, 0)
    return start, start + size


def kl_window(
    pos: np.ndarray, kl: np.ndarray, prompt_tokens: int, max_bars: int = MAX_BARS
) -> tuple[float, float]:
    """The x range first shown: every position when they fit, else max_bars of them around the
    prompt token of highest KL (the first the drill-down below offers to explain)."""
    if len(pos) <= max_bars:
        return float(pos.min()) - 0.5, float(pos.max()) + 0.5
    finite = np.where(np.isfinite(kl) & (pos < prompt_tokens), kl, -np.inf)
    centre = int(np.argmax(finite))
    lo = min(max(centre - max_bars // 2, 0), len(pos) - max_bars)
    return float(pos[lo]) - 0.5, float(pos[lo + max_bars - 1]) + 0.5


def kl_strip(tokens: pd.DataFrame, prompt_tokens: int, title: str = "Per-token KL") -> go.Figure:
    """KL(dense || sparse) per position (prompt and generation) as bars. Past MAX_BARS positions
    it opens on MAX_BARS of them around the highest KL, with a range slider to move, so a bar
    stays wide enough to see and click."""
    s = tokens[tokens["variant"] == "sparse"].sort_values("position")
    pos = s["position"].to_numpy()
    kl = s["kl"].to_numpy(dtype=float)
    text = [escape_text(t, 30) for t in s["text"]]
    fig = go.Figure(
        go.Bar(
            x=pos,
            y=kl,
            customdata=text,
            marker={
                "color": np.where(pos >= prompt_tokens, OKABE_ITO["vermillion"], OKABE_ITO["blue"])
            },
            hovertemplate="position %{x}: «%{customdata}»<br>KL %{y:.4g}<extra></extra>",
        )
    )
    fig.add_vline(x=prompt_tokens - 0.5, line={"dash": "dot", "color": "#666666"})
    xaxis: dict[str, Any] = {"title": {"text": "position (blue prompt, vermillion generated)"}}
    if len(pos) > MAX_BARS:
        xaxis.update(
            range=list(kl_window(pos, kl, prompt_tokens)),
            rangeslider={"visible": True, "thickness": 0.12},
        )
        xaxis["title"]["text"] += f" · {MAX_BARS} of {len(pos)} shown: drag the slider to move"
    fig.update_layout(
        title={"text": title},
        height=300 if len(pos) > MAX_BARS else 260,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        xaxis=xaxis,
        yaxis={"title": {"text": "KL"}},
        bargap=0,
    )
    return fig


def worst_tokens(tokens: pd.DataFrame, prompt_tokens: int, k: int = 10) -> pd.DataFrame:
    """The k prompt tokens with the highest KL(dense || sparse), highest first (the drill-down
    explains prompt tokens: their sparse prefill row is what a re-run can read)."""
    s = tokens[(tokens["variant"] == "sparse") & (tokens["position"] < prompt_tokens)]
    s = s.dropna(subset=["kl"])
    return s.sort_values("kl", ascending=False, kind="stable").head(k).reset_index(drop=True)


def token_choice_labels(tokens: pd.DataFrame, positions: Sequence[int]) -> dict[int, str]:
    """'t123 «text» · KL 0.53' per position (escaped: option labels render as text only)."""
    s = tokens[tokens["variant"] == "sparse"].set_index("position")
    out = {}
    for p in positions:
        if p in s.index:
            kl = s["kl"].get(p)
            kl_text = "" if kl is None or np.isnan(kl) else f" · KL {kl:.3g}"
            out[int(p)] = f"t{int(p)} «{escape_text(s['text'][p], 24)}»{kl_text}"
    return out
