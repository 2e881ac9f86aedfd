"""Eval rows as a text table and as quality-vs-density figures (one panel per task/source/length).

Shared by `sketchwalk eval` (prints the table, writes HTML and PNG) and the Benchmarks page
(same figures from the store), so the command line and the app always show the same thing.
Quality axis: for language modelling the perplexity increase over dense in percent (0 = lossless,
the paper's "near-lossless" claim reads directly off it); for retrieval the exact-match accuracy,
with dense drawn as a dashed line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METHOD_ORDER = (
    "sketchwalk",
    "nowalk",
    "oracle",
    "streaming",
    "quest",
    "xattention",
    "xattention-threshold",
)
COLUMNS = (
    ("task", "task", "{}"),
    ("source", "source", "{}"),
    ("length", "len", "{}"),
    ("method", "method", "{}"),
    ("density_target", "target", "{:.2f}"),
    ("density_achieved", "dens", "{:.3f}"),
    ("density_decode", "dec", "{:.3f}"),
    ("n_items", "items", "{}"),
    ("ppl_dense", "ppl_d", "{:.3f}"),
    ("ppl_sparse", "ppl_s", "{:.3f}"),
    ("ppl_increase_pct", "dppl%", "{:+.2f}"),
    ("kl_mean", "KL", "{:.4f}"),
    ("top1_agreement", "top1", "{:.3f}"),
    ("acc_dense", "acc_d", "{:.2f}"),
    ("acc_sparse", "acc_s", "{:.2f}"),
    ("selection_share", "select", "{:.1%}"),
)


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def ppl_increase_pct(row: dict) -> float | None:
    d, s = _num(row.get("ppl_dense")), _num(row.get("ppl_sparse"))
    return None if d is None or s is None or d == 0 else (s / d - 1.0) * 100.0


def selection_share(row: dict[str, Any]) -> float | None:
    """A cell's selection time (sketch and estimate, walk, select) over the dense model's
    attention time on the same prompts, from the timings the grid keeps in `extra`; None for
    rows stored before they were kept. One pass each: as noisy as the machine."""
    t = (row.get("extra") or {}).get("timings") or {}
    dense = t.get("dense_attention_ms")
    return t["selection_ms"] / dense if dense and t.get("selection_ms") is not None else None


def _sort_key(row: dict) -> tuple:
    m = row.get("method")
    rank = METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER)
    return (row.get("task"), row.get("source"), row.get("length"), rank, m, row["density_target"])


def with_derived(rows: Iterable[dict]) -> list[dict]:
    """Rows (sorted) with ppl_increase_pct and selection_share added."""
    out = [
        dict(r, ppl_increase_pct=ppl_increase_pct(r), selection_share=selection_share(r))
        for r in rows
    ]
    return sorted(out, key=_sort_key)


def format_table(rows: Iterable[dict]) -> str:
    """Plain-text table; columns that are empty in every row are left out."""
    rows = with_derived(rows)
    cols = [c for c in COLUMNS if any(_cell(r, c) != "" for r in rows)]
    cells = [[_cell(r, c) for c in cols] for r in rows]
    heads = [c[1] for c in cols]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(row: dict, col: tuple[str, str, str]) -> str:
    key, _, fmt = col
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return fmt.format(v)


def within(rows: Iterable[dict], method: str, pct: float = 1.0) -> dict[tuple, float | None]:
    """Per (task, source, length): the lowest target density at which `method`'s perplexity is
    within pct % of dense (None when no density in the grid gets there)."""
    best: dict[tuple, float | None] = {}
    for r in with_derived(rows):
        if r["method"] != method or r.get("ppl_increase_pct") is None:
            continue
        key = (r["task"], r["source"], r["length"])
        best.setdefault(key, None)
        if r["ppl_increase_pct"] <= pct and (best[key] is None or r["density_target"] < best[key]):
            best[key] = r["density_target"]
    return best


def _items(n: Any) -> str:
    """'n=2' under a point, '' where the row does not say."""
    v = _num(n)
    return "" if v is None else f"n={int(v)}"


def panels(rows: Sequence[dict]) -> list[tuple[str, str, int]]:
    return sorted({(r["task"], r["source"], r["length"]) for r in rows})


def quality_figure(rows: Sequence[dict], task: str, source: str, length: int, x: str = "achieved"):
    """One plotly figure: quality vs density per method for one (task, source, length)."""
    import plotly.graph_objects as go

    sel = [
        r
        for r in with_derived(rows)
        if (r["task"], r["source"], r["length"]) == (task, source, length)
    ]
    answered = any(_num(r.get("acc_sparse")) is not None for r in sel)
    metric, label = (
        ("acc_sparse", "exact-match accuracy")
        if answered
        else (
            "ppl_increase_pct",
            "perplexity increase over dense (%)",
        )
    )
    fig = go.Figure()
    methods = sorted(
        {r["method"] for r in sel}, key=lambda m: _sort_key({"method": m, "density_target": 0})
    )
    for m in methods:
        pts = [r for r in sel if r["method"] == m]
        xs = [
            (_num(r.get("density_achieved")) if x == "achieved" else None) or r["density_target"]
            for r in pts
        ]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[_num(r.get(metric)) for r in pts],
                mode="lines+markers+text",
                name=m,
                # each point names the items it averages: 2 items are not 200
                text=[_items(r.get("n_items")) for r in pts],
                textposition="top center",
                textfont={"size": 10},
                customdata=[[r["density_target"], _num(r.get("kl_mean"))] for r in pts],
                hovertemplate=(
                    f"{m}<br>density %{{x:.3f}} (target %{{customdata[0]:.2f}})"
                    f"<br>{label} %{{y:.3f}}<br>KL %{{customdata[1]:.4f}}"
                    "<br>items averaged: %{text}<extra></extra>"
                ),
            )
        )
    if answered:
        dense = [_num(r.get("acc_dense")) for r in sel if _num(r.get("acc_dense")) is not None]
        if dense:
            fig.add_hline(y=dense[0], line_dash="dash", annotation_text="dense")
    else:
        fig.add_hline(y=0.0, line_dash="dash", annotation_text="dense")
    fig.update_layout(
        title={"text": f"{task} · {source} · {length} tokens"},
        xaxis_title="attention density (achieved, prefill sparse layers)"
        if x == "achieved"
        else "target density",
        yaxis_title=label,
        legend_title="method",
        template="plotly_white",
        height=420,
    )
    return fig


def figures(rows: Sequence[dict], x: str = "achieved") -> list:
    return [quality_figure(rows, *p, x=x) for p in panels(rows)]


def write_html(rows: Sequence[dict], path: Path, title: str = "sketchwalk eval") -> Path:
    """All panels in one self-contained HTML file (plotly.js inlined: opens offline)."""
    figs = figures(rows)
    parts = [
        f.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False)
        for i, f in enumerate(figs)
    ]
    body = "\n".join(parts) or "<p>no rows</p>"
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><h1>{title}</h1>{body}</body></html>",
        encoding="utf-8",
    )
    return path


def write_pngs(rows: Sequence[dict], folder: Path) -> tuple[list[Path], str | None]:
    """One PNG per panel through kaleido; ([], reason) when kaleido or a Chrome is missing."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return [], "PNG skipped: kaleido is not installed (pip install kaleido; it needs Chrome)"
    out = []
    for (task, source, length), fig in zip(panels(rows), figures(rows), strict=True):
        name = f"quality_{task}_{_slug(source)}_{length}.png"
        try:
            fig.write_image(folder / name, width=900, height=450)
        except Exception as exc:  # kaleido raises its own types when Chrome is absent
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return out, f"PNG skipped: kaleido could not render ({first[:160]})"
        out.append(folder / name)
    return out, None


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in str(text))[:60]
