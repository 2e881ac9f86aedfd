"""A run's peak memory: resident set (Linux VmHWM, reset at the start) and CUDA allocations.

The resident peak is the number that decides whether a long run is killed, so the runner reports
it with every run. Linux lets a process reset its high-water mark (clear_refs 5), which makes the
peak the run's own rather than the process's; elsewhere it falls back to ru_maxrss (lifetime).
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch

_STATUS = "/proc/self/status"


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_peak_mb() -> float:
    """Peak resident set of this process since the last reset, in MiB."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024


@dataclass
class PeakMemory:
    """Measure the peak over a `with` block: `peak_rss_mb` (and `peak_cuda_mb` on a GPU)."""

    device: torch.device | None = None
    peak_rss_mb: float = 0.0
    peak_cuda_mb: float | None = None
    run_own: bool = False  # True when the peak was reset at the start (not the process lifetime)

    def __enter__(self) -> PeakMemory:
        self.run_own = _reset_rss_peak()
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak_rss_mb = rss_peak_mb()
        if self._cuda:
            self.peak_cuda_mb = torch.cuda.max_memory_allocated(self.device) / 2**20

    @property
    def _cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def as_dict(self) -> dict[str, float]:
        out = {"peak_rss_mb": round(self.peak_rss_mb, 1)}
        if self.peak_cuda_mb is not None:
            out["peak_cuda_mb"] = round(self.peak_cuda_mb, 1)
        return out
