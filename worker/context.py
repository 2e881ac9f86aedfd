"""What a job kind's runner gets: the claimed job and the only writes it may make to it.

Every write of every kind goes through here and names the job's claim token, so a worker whose
job was recovered (paused past the heartbeat timeout, cut off from the database) and handed to
another can no longer move it: the write raises JobLostError and changes nothing. The runner of
a kind (worker/kinds.py) never calls the store's job methods itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sketchwalk.store.errors import JobLostError
from sketchwalk.worker.lifecycle import JobClaim, first_line, retrying

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
"""Progress is written at most this often (each report is a database write)."""


@dataclass
class JobContext:
    """One claimed job as its runner sees it. `worker` supplies the store, the model cache, the
    settings, the device and the checkpoint (a release or a lost claim stops the job there)."""

    worker: Any
    job: Any
    _last_report: float = field(default=0.0, repr=False)

    @property
    def store(self) -> Any:
        return self.worker.store

    @property
    def request(self) -> dict[str, Any]:
        return self.job.request

    @property
    def claim(self) -> JobClaim:
        return JobClaim(self.job.id, self.job.claim)

    @property
    def fence(self) -> tuple[str, str] | None:
        """(job id, claim token) for the store's fenced writes (None: an unclaimed test job)."""
        return (self.job.id, self.job.claim) if self.job.claim else None

    def checkpoint(self) -> None:
        """May raise JobInterrupted (released at a shutdown, or recovered by another process)."""
        self.worker.checkpoint()

    def progress(self, fraction: float, message: str) -> None:
        """A checkpoint, then (at most every PROGRESS_EVERY_S) the progress, fenced. A lost job
        raises JobLostError; any other failed write is only logged (not worth failing for)."""
        self.checkpoint()
        now = time.monotonic()
        if now - self._last_report < PROGRESS_EVERY_S:
            return
        self._last_report = now
        self.report(fraction, message)

    def report(self, fraction: float, message: str) -> None:
        """The progress now, fenced (no throttle, no checkpoint)."""
        try:
            self.store.update_job(self.job.id, fraction, message[:200], claim=self.job.claim)
        except JobLostError:
            raise
        except Exception as exc:
            log.warning("job %s: progress write failed: %s", self.job.id, first_line(exc))

    def fail(self, message: str) -> None:
        """End the job failed with one line, fenced and retried through a short outage."""
        text = message.strip().splitlines()[0][:500] if message.strip() else "failed"
        retrying(
            lambda: self.store.finish_job(self.job.id, error=text, claim=self.job.claim),
            "record the failure",
        )

    def finish(self, run_id: str | None = None) -> None:
        """End the job done (for kinds whose result is not saved with the job in one write)."""
        retrying(
            lambda: self.store.finish_job(self.job.id, run_id=run_id, claim=self.job.claim),
            "finish the job",
        )


Runner = Callable[[JobContext], Any]
"""A job kind's runner: runs the job to its end and records the outcome through the context."""
