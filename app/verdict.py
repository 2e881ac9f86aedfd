"""One verdict per run: does the sparse model keep the dense one, and how fast is it?

Pure Python over what the store holds for a run (its metrics, timings, config, prompt, texts and
per-layer stats), so it is tested on plain dicts and shared by Explore (top of the page) and the
New run page (the summary of a finished run). Nothing here is computed anew: densities, KL and
top-1 are the runner's, mass kept is the recorder's mass recall, the density floor is the
engine's selection at a vanishing density (density_floor), the speed ceiling is
engine/run/speed.py's, and the needle answer check is the eval's (eval/retrieval.py is_correct).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sketchwalk.app import speed_numbers
from sketchwalk.engine.run import speed
from sketchwalk.errors import ConfigError
from sketchwalk.store.needle import pass_key

FAR_RATIO = 1.25  # achieved / target above this (and FAR_ABS above it) is "far from the target"
FAR_ABS = 0.01


@dataclass(frozen=True)
class Item:
    """One number of the verdict: a label, its value as shown, a note under it, and whether it
    is good news ("ok"), bad news ("bad"), a caution ("warn") or neutral ("info")."""

    key: str
    label: str
    value: str
    note: str = ""
    level: str = "info"


@dataclass
class Verdict:
    items: list[Item] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def item(self, key: str) -> Item | None:
        return next((i for i in self.items if i.key == key), None)

    def sentence(self) -> str:
        """The verdict in one line (for a caption or the CLI)."""
        return " · ".join(f"{i.label}: {i.value}" for i in self.items)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return None if math.isnan(float(x)) else float(x)


def density_floor(config: dict[str, Any], prompt_tokens: int) -> float | None:
    """The least density a prefill of this length can run at: the engine's own selection
    (engine.pipeline.choose_blocks) at a vanishing density, so what it keeps whatever the scores
    is counted as a run counts it: sink, local window, diagonal, dense tail, and the forced blocks
    of every row of a query tile (rows of a tile share one list)."""
    import torch

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import choose_blocks

    try:
        cfg = SketchWalkConfig.from_stored({**config, "density": 1e-6, "group_density": ()})
    except (ConfigError, TypeError, ValueError):
        return None
    n = -(-int(prompt_tokens) // cfg.block_size) if prompt_tokens > 0 else 0
    if n <= 0:
        return None
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([int(prompt_tokens)])
    sel = choose_blocks(cfg, torch.zeros(1, 1, n, n), torch.arange(n), start, end, n)
    return float(sel.density)


def _own_selection(method: Any) -> bool:
    """The method selects by a rule of its own (XAttention's threshold), not to the density."""
    from sketchwalk.engine.method.methods import REGISTRY

    spec = REGISTRY.get(method) if isinstance(method, str) else None
    return spec is not None and spec.rule is not None


def density_item(run: dict[str, Any]) -> tuple[Item, str | None]:
    """Achieved density beside the target, and a warning that says why when they are far apart."""
    metrics, config = run.get("metrics") or {}, run.get("config") or {}
    target = _num(metrics.get("density_target"))
    target = target if target is not None else _num(config.get("density"))
    achieved = _num(metrics.get("density_achieved"))
    if achieved is None:
        return Item("density", "Achieved density", "–", "no sparse prefill layer"), None
    if _own_selection(config.get("method")):  # a threshold, not the target, set the density
        return Item(
            "density", "Achieved density", f"{achieved:.2f}", "its own (no target)", "ok"
        ), None
    note = f"target {target:.2f}" if target is not None else ""
    if target is None or (achieved <= target * FAR_RATIO or achieved - target <= FAR_ABS):
        return Item("density", "Achieved density", f"{achieved:.2f}", note, "ok"), None
    tokens = int(run.get("prompt_tokens") or 0)
    floor = density_floor(config, tokens)
    block = config.get("block_size", "?")
    why = (
        f"at {tokens} tokens ({-(-tokens // int(block)) if isinstance(block, int) else '?'} "
        f"blocks of {block}) the forced blocks alone (sink, local window, dense tail) keep "
        f"{floor:.2f} of the causal pairs"
        if floor is not None
        else "the forced blocks (sink, local window) take a large share at this length"
    )
    tile = config.get("query_block")
    tiles = (
        f"; query tiles of {tile} tokens share one block list, so a tile keeps the forced "
        "blocks of all its rows"
        if isinstance(tile, int) and isinstance(block, int) and tile > block
        else ""
    )
    more = (
        f"{tiles}; a longer prompt (or smaller blocks) lets the density reach the target"
        if floor is not None and floor >= target * 0.8
        else f"{tiles}; the rest comes from per-layer budgets rounding up"
    )
    warning = (
        f"Achieved density {achieved:.2f} is far above the target {target:.2f}: {why}{more}. "
        "Quality and speed below are those of the achieved density."
    )
    return Item("density", "Achieved density", f"{achieved:.2f}", note, "warn"), warning


def mass_item(stats: pd.DataFrame | None) -> Item:
    """Mean attention mass kept (the recorder's mass recall) over the sparse prefill layers."""
    if stats is None or stats.empty or "mass_recall" not in stats:
        return Item("mass", "Mass kept", "–", "no per-layer records")
    rows = stats[(stats["phase"] == "prefill") & ~stats["dense"].astype(bool)]
    vals = pd.to_numeric(rows["mass_recall"], errors="coerce").dropna()
    if vals.empty:
        return Item("mass", "Mass kept", "–", "exact mass not recorded (longer than its limit)")
    worst = rows.loc[vals.idxmin(), "layer"]
    return Item(
        "mass",
        "Mass kept",
        f"{vals.mean():.1%}",
        f"attention mass, mean of {len(vals)} sparse layers; worst layer {int(worst)}: {vals.min():.1%}",
        "ok" if vals.mean() >= 0.9 else "warn",
    )


def quality_items(metrics: dict[str, Any]) -> list[Item]:
    kl, top1 = _num(metrics.get("kl_mean")), _num(metrics.get("top1_agreement"))
    return [
        Item(
            "kl",
            "KL to dense",
            "–" if kl is None else f"{kl:.4f}",
            "mean over prompt tokens (nats)",
            "info" if kl is None else "ok" if kl < 0.05 else "warn",
        ),
        Item(
            "top1",
            "Top-1 agreement",
            "–" if top1 is None else f"{top1:.1%}",
            "next-token argmax, dense vs sparse",
            "info" if top1 is None else "ok" if top1 >= 0.95 else "warn",
        ),
    ]


def needle_item(run: dict[str, Any]) -> Item | None:
    """Found or lost, when the prompt hides a pass key (None otherwise)."""
    from sketchwalk.eval.retrieval import is_correct

    key = pass_key(run.get("prompt") or "")
    if key is None:
        return None
    dense = is_correct(run.get("dense_text") or "", key)
    sparse = is_correct(run.get("sparse_text") or "", key)
    if not dense:
        return Item(
            "needle",
            f"Needle {key}",
            "dense misses it",
            "the dense model does not answer either, so this prompt cannot tell found from lost",
            "warn",
        )
    if sparse:
        return Item("needle", f"Needle {key}", "found", "dense and sparse both answer it", "ok")
    return Item("needle", f"Needle {key}", "lost", "dense answers it, sparse does not", "bad")


def walk_item(metrics: dict[str, Any]) -> Item | None:
    """What the walk does on this prompt (the runner's walk_effect over the sparse prefill
    layers): the blocks its selection adds and drops against A_l's alone and the exact mass it
    gains; for a run that selected without it, the same for the counterfactual walk. None where
    the run recorded no walk effect (a method that selects on neither, or an older run)."""
    eff = metrics.get("walk_effect")
    if not isinstance(eff, dict) or "added" not in eff:
        return None
    added, dropped = int(eff.get("added") or 0), int(eff.get("dropped") or 0)
    gain = _num(eff.get("mass_gain"))
    beta = _num(eff.get("beta"))
    used = bool(eff.get("used"))
    changed = added + dropped > 0
    value = f"+{added} −{dropped}" if changed else "same"  # short: it shares a row at 1024 px
    mass = "" if gain is None else f"; exact mass {gain:+.3f} summed over layers"
    damping = "" if beta is None else f" (damping {beta:g})"
    if used:
        note = f"the walk{damping} selected; against A_l alone it changed these blocks{mass}"
    elif changed:
        note = f"not used for selection: the walk{damping} would have changed these blocks{mass}"
    else:
        note = (
            f"not used for selection: the walk{damping} would keep the same blocks (the forced "
            "blocks or A_l already decide at this density)"
        )
    level = "info" if gain is None or abs(gain) < 0.01 else "ok" if gain > 0 else "warn"
    return Item("walk", "Walk: blocks", value, note, level)


TIMING_NOTE = "timing clean passes…"
"""The speed items' note while a run's quality half is stored and its clean passes run."""


def pending_speed(run: dict[str, Any]) -> tuple[str, str, str]:
    """Value, note and level of a speed item without clean timings: the passes failed (the
    run's one-line note), are still running (its quality half came first), or were never asked."""
    failed = (run.get("timings") or {}).get(speed.CLEAN_FAILED)
    if isinstance(failed, str) and failed:
        return "–", failed, "warn"
    if run.get("status") == "running":
        return "…", TIMING_NOTE, "info"
    return "–", "this run timed no clean pass", "info"


def speed_items(run: dict[str, Any]) -> tuple[list[Item], list[str]]:
    """Prefill and decode speed of the clean pass (app/speed_numbers.py: the one reading every
    page shows), with its range, held against the ceiling (above it the difference is noise,
    and the verdict says so)."""
    t = run.get("timings") or {}
    if not speed.has_clean(t):
        value, note, level = pending_speed(run)
        return [
            Item("prefill", "Prefill speed", value, note, level),
            Item("decode", "Decode speed", value, note, level),
        ], []
    items, warnings = [], []
    for phase, label in (("prefill", "Prefill speed"), ("decode", "Decode speed")):
        m = speed_numbers.clean_speedup(t, phase)
        if m is None:
            items.append(Item(phase, label, "–", "no new tokens" if phase == "decode" else ""))
            continue
        cap = speed_numbers.ceiling(t, run, phase)
        noise = speed_numbers.noise_note(m, cap)
        if noise is not None:
            items.append(Item(phase, label, "noise", f"measured {m.text()} > ceiling", "warn"))
            warnings.append(noise)
            continue
        how = m.spread if m.has_range else "one clean pass: no spread known"
        level = "info" if m.spans_one else "warn" if m.slower else "ok"
        ceiling = f"; ceiling {cap.at_density:.2f}×" if cap is not None else ""
        note = f"{speed_numbers.words(m)}; {how}{ceiling}"
        items.append(Item(phase, label, m.text(), note, level))
    return items, warnings


def verdict(run: dict[str, Any], stats: pd.DataFrame | None = None) -> Verdict:
    """The run's verdict: density (with why it is off target), mass kept, KL, top-1, the needle
    where there is one, what the walk changes, and clean-pass speed."""
    out = Verdict()
    dens, warning = density_item(run)
    out.items.append(dens)
    if warning:
        out.warnings.append(warning)
    out.items.append(mass_item(stats))
    out.items.extend(quality_items(run.get("metrics") or {}))
    needle = needle_item(run)
    if needle is not None:
        out.items.append(needle)
    walked = walk_item(run.get("metrics") or {})
    if walked is not None:
        out.items.append(walked)
    items, warnings = speed_items(run)
    out.items.extend(items)
    out.warnings.extend(warnings)
    return out
