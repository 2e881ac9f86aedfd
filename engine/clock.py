"""One clock for every timing in the engine: wall time in ms, CUDA synchronised first, so GPU work
is not under-counted (CPU work needs no sync)."""

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


class StageTimer:
    """Milliseconds per named stage, summed over calls (sketch, walk, select of one layer)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.ms: dict[str, float] = {}

    def run(self, stage: str, fn: Callable[[], T]) -> T:
        out, ms = timed(fn, self.device)
        self.ms[stage] = self.ms.get(stage, 0.0) + ms
        return out
