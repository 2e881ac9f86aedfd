"""Keep freed memory in the process for reuse instead of handing it back to the OS (glibc malloc).

Why: a prefill allocates and frees tensors of the same few megabytes layer after layer (the
sampled estimator's score chunks, the kernel's gathered keys and values, the MLP's activations).
glibc returns a freed block above its mmap threshold (adjusted as it goes, at most 32 MB) to the
OS and trims the free top of its heap above the trim threshold, so the next layer faults the same
pages in again: a fresh 10 MB matmul output took ~9 ms here where a reused one took ~6.5. With
both thresholds raised a 7376-token sparse prefill of the default model ran ~9% faster and the
dense one ~5% (docs/notes/speed-log.md). The price: after a run the process keeps up to its peak heap
resident, and the next run reuses it.

The `sketchwalk` command applies this at start (`SKETCHWALK_KEEP_FREED_MEMORY=0` turns it off;
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set by the user win); Python users may call
`keep_freed_memory()` themselves.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap and are reused when freed
TRIM_THRESHOLD = 1 << 30  # free heap top kept resident up to this much
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter ids
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
OPT_OUT = "SKETCHWALK_KEEP_FREED_MEMORY"


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Not turned off, and no malloc thresholds of the user's own to respect."""
    return environ.get(OPT_OUT, "1") != "0" and not any(k in environ for k in ENV)


_applied: list[bool] = []  # set once this process raised them


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process and, through the environment, in
    the processes it starts (glibc reads them at start). False where not wanted or not glibc."""
    if _applied:
        return True
    if not wanted():
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if ok:
        os.environ.update(ENV)
        _applied.append(True)
    return ok
