"""One clock for every timing in the engine: wall time in ms on CPU; on CUDA, events on the stream,
so timing a stage never stops the GPU's queue.

A whole pass is timed with `now_ms`/`timed` (a sync at each end is what a caller waiting for the
result pays anyway). The stages inside one layer (sketch, walk, select, attention) are timed with
`StageTimer`/`Stopwatch`: on CUDA each records a pair of events and returns `Millis`, which waits
for the GPU only when read as a number (the session reads a pass's sums once, at its end). A sync
per stage was ~10 per layer, ~240 per decode token of a Llama-3.1-8B-shaped model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def now_ms(device: torch.device) -> float:
    """Wall clock in ms after the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """(fn(), its wall time in ms)."""
    t0 = now_ms(device)
    out = fn()
    return out, now_ms(device) - t0


class Millis:
    """A sum of durations in ms, some of them CUDA event pairs still in flight: adding keeps the
    pairs, float() waits for the last one and reads them all (then they are gone)."""

    __slots__ = ("_ms", "_laps")

    def __init__(self, ms: float = 0.0, laps: list | None = None) -> None:
        self._ms = ms
        self._laps = laps or []

    def __add__(self, other: float | Millis) -> Millis:
        if isinstance(other, Millis):
            return Millis(self._ms + other._ms, self._laps + other._laps)
        return Millis(self._ms + float(other), self._laps)

    __radd__ = __add__

    def __float__(self) -> float:
        if self._laps:
            self._laps[-1][1].synchronize()
            self._ms += sum(a.elapsed_time(b) for a, b in self._laps)
            self._laps = []
        return self._ms

    def __repr__(self) -> str:
        return f"Millis({self._ms:.3f} ms + {len(self._laps)} pending)"


Duration = float | Millis


class Stopwatch:
    """Started at creation; stop() -> ms so far: a float on CPU, Millis on CUDA (no sync)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter() * 1e3

    def stop(self) -> Duration:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            return Millis(laps=[(self.start, end)])
        return time.perf_counter() * 1e3 - self.t0


class StageTimer:
    """Milliseconds per named stage, summed over calls (sketch, walk, select of one layer)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.ms: dict[str, Duration] = {}

    def run(self, stage: str, fn: Callable[[], T]) -> T:
        watch = Stopwatch(self.device)
        out = fn()
        self.ms[stage] = self.ms.get(stage, 0.0) + watch.stop()
        return out
