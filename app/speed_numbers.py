"""The whole-model speed-up of a run's clean pass: one number per phase, read in one place.

The verdict, the Speed page's headline and the density sweep all show these numbers, so they
come from here and nowhere else. Prefill: the median of the clean passes' dense/sparse ratios
and their range (min-max over the repeats), as engine/run/runner.py stores them. Decode: the median
of the per-token ratios and their middle half. Runs stored before the ratios were kept fall back
to dense time over sparse time of the clean medians (no range known). Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sketchwalk.engine.run import speed

NOISE_MARGIN = 1.02  # a measure above ceiling x this is noise, not a speed-up


@dataclass(frozen=True)
class Measure:
    """One phase's speed-up: its value, its range (None: one pass, or an older run) and how the
    range was taken, in words."""

    phase: str  # "prefill" or "decode"
    value: float
    lo: float | None = None
    hi: float | None = None
    spread: str = ""  # how the value and its range were taken, in words ("" without a range)

    @property
    def has_range(self) -> bool:
        return self.lo is not None and self.hi is not None

    def text(self) -> str:
        """'1.02× (0.98–1.06)': the value with its range wherever it is shown."""
        head = f"{self.value:.2f}×"
        return f"{head} ({self.lo:.2f}–{self.hi:.2f})" if self.has_range else head

    def range_text(self) -> str:
        return f"{self.lo:.2f}–{self.hi:.2f}×" if self.has_range else "–"

    @property
    def spans_one(self) -> bool:
        return self.has_range and self.lo < 1.0 < self.hi

    @property
    def slower(self) -> bool:
        return self.value < 1.0


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return None if math.isnan(float(x)) else float(x)


def clean_speedup(timings: Mapping[str, Any] | None, phase: str) -> Measure | None:
    """The clean pass's whole-model speed-up of `phase`, None where the run timed none."""
    t = timings or {}
    if not speed.has_clean(t):
        return None
    mid = _num(t.get(f"clean_{phase}_speedup"))
    if mid is None:  # stored before the ratios were kept: the ratio of the clean medians
        pair = next(
            (p for p in speed.clean_pairs(t) if p.phase == phase and p.scope == "whole model"),
            None,
        )
        mid = pair.ratio if pair else None
        return None if mid is None else Measure(phase, mid)
    lo, hi = _num(t.get(f"clean_{phase}_speedup_lo")), _num(t.get(f"clean_{phase}_speedup_hi"))
    if lo is None or hi is None:
        return Measure(phase, mid)
    if phase == "decode":
        n = int(_num(t.get("clean_decode_tokens")) or 0)
        how = f"median of {n} clean tokens' ratios, middle half {lo:.2f}–{hi:.2f}×"
        return Measure(phase, mid, lo, hi, how)
    n = int(_num(t.get("clean_repeats")) or 1)
    if n <= 1:
        return Measure(phase, mid)
    return Measure(phase, mid, lo, hi, f"median of {n} clean passes, range {lo:.2f}–{hi:.2f}×")


def ceiling(timings: Mapping[str, Any] | None, run: Mapping[str, Any], phase: str):
    """The phase's ceiling (engine/run/speed.py) at the run's achieved density, else None."""
    metrics, config = run.get("metrics") or {}, run.get("config") or {}
    density = speed.ceiling_density(
        _num(metrics.get("density_achieved")), _num(config.get("density"))
    )
    return next((c for c in speed.ceilings(timings or {}, density) if c.phase == phase), None)


def noise_note(m: Measure, cap) -> str | None:
    """One line when a measure is above what its ceiling allows (a busy machine), else None."""
    if cap is None or m.value <= cap.at_density * NOISE_MARGIN:
        return None
    return (
        f"{m.phase.capitalize()} measured {m.value:.2f}× but at density {cap.density:.2f} the "
        f"whole model can be at most {cap.at_density:.2f}× faster (attention is "
        f"{cap.attention_share:.0%} of the dense {m.phase}): the measurement is noise (a busy "
        "machine), not a speed-up. Re-run on an idle machine."
    )


def words(m: Measure) -> str:
    """The measure in words beside its number: faster, slower, or no clear difference."""
    if m.spans_one:
        return "no clear difference: the range spans 1×"
    return "slower than dense" if m.slower else "faster than dense"
