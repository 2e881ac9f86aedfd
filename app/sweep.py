"""The Speed page's density sweep: runs of one prompt that differ only in density.

A sweep line joins runs whose other settings match (every knob but the density, and whether a
clean pass was timed), so a point never sits beside a run of another preset or block size.
Pure pandas over rows the page hands in (tested without Streamlit).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from sketchwalk.app import speed_numbers
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run import speed
from sketchwalk.errors import ConfigError

VARYING = ("density", "group_density", "extra")  # what a sweep may change, or no setting
COLUMNS = ["run", "target", "density", "speedup", "clean_speedup", "clean_range", "ceiling"]
COLUMNS += ["kl", "top1"]
HEADERS = {
    "run": "Run",
    "target": "Target density",
    "density": "Achieved density",
    "speedup": "Attention speed-up (recorded) ×",
    "clean_speedup": "Clean prefill speed-up ×",
    "clean_range": "Clean prefill range ×",
    "ceiling": "Ceiling ×",
    "kl": "KL",
    "top1": "Top-1",
}
FORMATS = {"target": "{:g}", "density": "{:.3f}", "speedup": "{:.2f}", "clean_speedup": "{:.2f}"}
FORMATS |= {"ceiling": "{:.2f}", "kl": "{:.4f}", "top1": "{:.1%}"}


def settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every knob of a stored config but the density (older configs read with the values that
    reproduce them, so two runs of one setting compare equal)."""
    raw = dict(config or {})
    with contextlib.suppress(ConfigError, TypeError, ValueError):
        raw = SketchWalkConfig.from_stored(raw).to_dict()
    return {k: v for k, v in raw.items() if k not in VARYING}


def setting_key(config: Mapping[str, Any] | None, timings: Mapping[str, Any] | None) -> str:
    """What runs of one sweep line share: the knobs and whether a clean pass was timed."""
    clean = speed.has_clean(timings or {})
    return json.dumps([settings(config), clean], sort_keys=True, default=str)


def differences(run: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """In words, how `other` differs from `run` in what a sweep line holds fixed."""
    a, b = settings(run.get("config")), settings(other.get("config"))
    out = [f"{k} {b.get(k)!s}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    ca, cb = speed.has_clean(run.get("timings") or {}), speed.has_clean(other.get("timings") or {})
    if ca != cb:
        out.append("a clean pass" if cb else "no clean pass")
    return out


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return None if math.isnan(float(x)) else float(x)


def point(
    row: Mapping[str, Any], timings: Mapping[str, Any], recorded_speedup: float | None
) -> dict[str, Any]:
    """One run's sweep point: densities, speed-ups (the clean one from speed_numbers), quality."""
    met = row.get("metrics") or {}
    m = speed_numbers.clean_speedup(timings, "prefill")
    cap = speed_numbers.ceiling(timings, {"metrics": met, "config": row.get("config")}, "prefill")
    return {
        "run": str(row["id"])[:8],
        "target": _num((row.get("config") or {}).get("density")),
        "density": _num(met.get("density_achieved")),
        "speedup": recorded_speedup,
        "clean_speedup": m.value if m else None,
        "clean_range": m.range_text() if m else "–",
        "ceiling": cap.at_density if cap else None,
        "kl": _num(met.get("kl_mean")),
        "top1": _num(met.get("top1_agreement")),
    }


def sweep(
    runs: pd.DataFrame,
    run: Mapping[str, Any],
    same_prompt: set[str],
    timings_of: Callable[[str], Mapping[str, Any]],
    recorded_of: Callable[[str], float | None],
) -> tuple[pd.DataFrame, list[str]]:
    """(points, left out): this run's sweep line (same prompt, model, method and settings but
    the density), and one line per other run of the prompt saying what differs. same_prompt:
    the ids of the runs of this run's prompt (the store compares whole prompts)."""
    same = runs[
        runs["id"].isin(same_prompt)
        & (runs["model_id"] == run.get("model_id"))
        & (runs["method"] == run.get("method"))
    ]
    key = setting_key(run.get("config"), run.get("timings"))
    rows, left_out = [], []
    for _, r in same.iterrows():
        t = timings_of(r["id"])
        if setting_key(r["config"], t) != key:
            diff = differences(run, {"config": r["config"], "timings": t})
            left_out.append(f"{str(r['id'])[:8]} ({', '.join(diff)})")
            continue
        rows.append(point(r, t, recorded_of(r["id"])))
    df = pd.DataFrame(rows, columns=COLUMNS)
    df = df.dropna(subset=["density"]).sort_values("density").reset_index(drop=True)
    return df, left_out


def shown(points: pd.DataFrame) -> pd.DataFrame:
    """The points as the table shows them: numbers formatted, '–' where a run has none."""
    out = points.copy()
    for col in COLUMNS:
        fmt = FORMATS.get(col)
        out[col] = [
            "–" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v) if fmt
            else str(v)
            for v in out[col]
        ]  # fmt: skip
    return out.rename(columns=HEADERS)
