"""Pure functions from store data (numpy arrays, DataFrames) to plotly figures.

No Streamlit here, so every figure is unit-tested on plain inputs. Two rules hold throughout:
- Text that comes from a prompt or a generation is escaped (`escape_text`) before it reaches a
  hover label or a tick: plotly renders a subset of HTML there, and a prompt must show literally.
- Block heatmaps put the block labels on categorical axes, so a hover names the block's token span
  and text with O(n) strings instead of one string per cell (n x n), which keeps an 8k-token layer
  cheap to build and to ship to the browser.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

# Colour-blind-safe choices: perceptually uniform sequential scales, Okabe-Ito for categories.
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
LOG_FLOOR = 1e-6
MATRIX_TITLES = {
    "sketch": "Sketch estimate A_l",
    "walk": "Walk score W_l",
    "exact": "Exact block mass",
    "mask": "Selected blocks",
}


# ---- text ----------------------------------------------------------------------------------


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


def _ticks(labels: Sequence[str], max_ticks: int = 12) -> dict[str, Any]:
    """Show a few block numbers on a categorical axis whose labels are long hover texts."""
    n = len(labels)
    step = max(1, math.ceil(n / max_ticks))
    idx = list(range(0, n, step))
    return {
        "tickmode": "array",
        "tickvals": [labels[i] for i in idx],
        "ticktext": [str(i) for i in idx],
    }


# ---- block heatmaps ------------------------------------------------------------------------


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


# ---- density preview -----------------------------------------------------------------------


def selection_rule(
    n: int, prompt_tokens: int, config: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(candidates [n, n], forced [n, n]) of prefill rows, from the engine's own rule
    (engine/select.py): causal candidates; sink, window and dense-tail rows forced."""
    import torch

    from sketchwalk.engine.config import SketchWalkConfig
    from sketchwalk.engine.select import ForcedRule, candidate_mask, forced_mask

    cfg = SketchWalkConfig.from_stored(config)
    rows = torch.arange(n)
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([max(int(prompt_tokens), 1)])
    cand = candidate_mask(rows, n, start // cfg.block_size)[0]
    forced = cand & forced_mask(rows, n, ForcedRule.of(cfg), start, end)[0]
    tail = rows >= n - cfg.dense_tail_blocks
    return cand.numpy(), (forced | (cand & tail[:, None])).numpy()


def preview_selection(
    scores: np.ndarray,
    prompt_tokens: int,
    config: dict[str, Any],
    density: float,
) -> np.ndarray:
    """[n, n] bool: the blocks a prefill layer would keep at `density`, from stored scores.

    Calls the engine's own selection (engine.pipeline.choose_blocks with the run's config), so
    a preview can never drift from what a real run at that density would select from the same
    scores; tests check it reproduces stored selections. Stored scores are averaged over KV-head
    groups, so for per-group runs the preview is one selection for the layer.
    """
    import torch

    from sketchwalk.engine.config import SketchWalkConfig
    from sketchwalk.engine.pipeline import choose_blocks
    from sketchwalk.engine.select import selection_mask

    cfg = SketchWalkConfig.from_stored({**config, "density": float(density)})
    scores = np.asarray(scores, dtype=np.float32)
    n = scores.shape[-1]
    s = torch.from_numpy(np.nan_to_num(scores, nan=-np.inf).copy())
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([int(prompt_tokens)])
    sel = choose_blocks(cfg, s[None, None], torch.arange(n), start, end, n)
    return selection_mask(sel, n)[0, 0].numpy()


def method_scores(hm: dict[str, Any], method: str) -> np.ndarray | None:
    """The stored scores a method ranks blocks by (the registry's preview), None where a stored
    record cannot reproduce them (methods scoring raw queries and keys)."""
    from sketchwalk.engine.methods import REGISTRY

    spec = REGISTRY.get(method)
    return None if spec is None or spec.preview is None else spec.preview(hm)


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


# ---- per-layer curves ----------------------------------------------------------------------

CURVES = {
    "density_achieved": ("achieved density", OKABE_ITO["blue"]),
    "sketch_error": ("sketch error (TV vs exact)", OKABE_ITO["orange"]),
    "walk_error": ("walk error (TV vs exact)", OKABE_ITO["purple"]),
    "mass_recall": ("mass recall", OKABE_ITO["green"]),
}


def layer_curves(stats: pd.DataFrame, current_layer: int | None = None) -> go.Figure:
    """Per-layer lines of one phase/step: achieved density, sketch/walk error, mass recall."""
    fig = go.Figure()
    stats = stats.sort_values("layer")
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


# ---- depth view ----------------------------------------------------------------------------


def depth_matrices(
    layers: Sequence[tuple[int, dict[str, Any]]],
    q_block: int,
    prompt_tokens: int,
    config: dict[str, Any],
) -> dict[str, Any]:
    """Row `q_block` of every sparse layer: [layers, n] sketch, walk, exact, selected, rescued.

    rescued = kept by the walk's selection but not by the same rule applied to the per-layer
    estimate A_l alone: the blocks the walk brought in. Only layers with a walk are included.
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
            preview_selection(hm["sketch"], prompt_tokens, config, _density(config))[q_block]
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


def _density(config: dict[str, Any]) -> float:
    return float(config.get("density", 0.2))


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


# ---- decode: which blocks each generated token attended to ---------------------------------


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
    return fig


# ---- compare -------------------------------------------------------------------------------


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


def kl_strip(tokens: pd.DataFrame, prompt_tokens: int, title: str = "Per-token KL") -> go.Figure:
    """KL(dense || sparse) per position (prompt and generation) as a one-row heatmap strip."""
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
    fig.update_layout(
        title={"text": title},
        height=260,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        xaxis={"title": {"text": "position (blue prompt, vermillion generated)"}},
        yaxis={"title": {"text": "KL"}},
        bargap=0,
    )
    return fig


# ---- speed ---------------------------------------------------------------------------------

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
