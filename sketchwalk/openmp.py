"""How idle OpenMP workers wait, chosen before torch loads (libgomp reads it once, at load).

Why: torch's CPU ops run on libgomp threads. Spinning for long after each op (libgomp's default)
took the second core from this project's own worker threads (the estimator's parts waited
milliseconds to start) and, on a busy machine, made small parallel ops wait a scheduler tick;
sleeping at once (`OMP_WAIT_POLICY=PASSIVE`, the choice until 2026-12-07) made every op wake a
sleeping thread: a decode step's [1, 576] x [576, 1536] linear 133 us against 33 us, the whole
model's decode at 2048 tokens 71-73 ms a token against 44-55 ms. A short spin (GOMP_SPINCOUNT)
keeps a worker awake between the ops of one step and asleep between parts: measured in
docs/notes/speed-log.md (2026-12-07, fourth session).
"""

from __future__ import annotations

from collections.abc import Mapping

SPIN_COUNT = "30000"  # libgomp's busy-wait iterations before a worker sleeps (default 300000)


def short_spin_waits(env: Mapping[str, str]) -> dict[str, str]:
    """What to add to the environment env so idle OpenMP workers spin briefly, then sleep;
    nothing where env already says how they wait (OMP_WAIT_POLICY or GOMP_SPINCOUNT). Apply
    before torch is imported: `os.environ.update(short_spin_waits(os.environ))`."""
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return {}
    return {"GOMP_SPINCOUNT": SPIN_COUNT}
