"""Independent CPU work split into parts on a thread pool, one intra-op thread per part.

Why: work made of many short ops (the sparse kernel's flash calls and gathers, the sampled
estimator's score chunks) keeps the second core idle much of the time when each op is
parallelised on its own, and every op first hands work to (or wakes) the other thread. Cutting
the work into one part per core, each on one thread, keeps both cores busy; idle OpenMP workers
must not spin long meanwhile, or a part waits for its core (sketchwalk/openmp.py;
docs/notes/speed-log.md has the measurements).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


def workers() -> int:
    """Parts to cut CPU work into: torch's intra-op thread count (tests override it)."""
    return torch.get_num_threads()


def run_in_parts(fn: Callable[[int, int], None], bounds: list[int]) -> None:
    """fn(bounds[i], bounds[i + 1]) for every i, in parallel, each with one intra-op thread and
    the caller's grad / inference modes. The parts must write disjoint memory. Every part
    restores the caller's thread count, so the count a new thread inherits is never a part's."""
    threads = torch.get_num_threads()
    modes = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def part(i0: int, i1: int) -> None:
        torch.set_num_threads(1)
        try:
            with torch.inference_mode(modes[1]), torch.set_grad_enabled(modes[0]):
                fn(i0, i1)
        finally:
            torch.set_num_threads(threads)

    pool = _pool(len(bounds) - 1)
    futures = [pool.submit(part, i0, i1) for i0, i1 in zip(bounds, bounds[1:], strict=False)]
    for f in futures:
        f.result()


@functools.lru_cache(maxsize=4)
def _pool(size: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(size, thread_name_prefix="sketchwalk-part")
