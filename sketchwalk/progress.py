"""The one progress callback every long job reports through: fraction done and a short message.

Runs and eval grids are driven from the CLI (a tqdm bar), from workers (a job row the app polls)
and from tests; one shape lets any driver follow any job. A callback may raise (a checkpoint) to
stop the job; whoever runs the job ends it as that exception says.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def __call__(self, fraction: float, message: str) -> None: ...


def no_progress(fraction: float, message: str) -> None:
    """A Progress that reports nothing."""
