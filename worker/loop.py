"""The background worker: takes jobs from the store's queue, runs them, saves the results.

In the default setup it is a thread inside the app's process, because DuckDB allows one writer
process and the app already holds the file; `sketchwalk worker` runs the same loop standalone
(for a server database, one per device). Models load once per (model, dtype, device) and stay
cached. Every job kind (worker/kinds.py: runs, evals) gets the same loop: claim, the model
list, heartbeat, release, recovery, and a context whose every write is fenced by the claim
(worker/context.py); a run job goes through the same lifecycle as `sketchwalk run`. Jobs
survive restarts: at start, jobs left 'running' by a dead process are re-queued (until they
have been claimed SKETCHWALK_JOB_MAX_ATTEMPTS times, then failed with the reason), and queued
jobs are simply taken in order.

With several processes on a server database, a worker cannot know whether another one is alive
except by its heartbeat: while a job runs, a side thread refreshes the job's heartbeat (on the
database's clock), and every worker periodically takes back jobs whose heartbeat is older than
the job timeout (their worker was killed or lost the database). Every write of a job names its
claim token, so a worker that lost its job writes nothing more to it. Stopping is cooperative: the run's progress callback is a
checkpoint where a requested release (SIGTERM after its grace period) or a lost job interrupts
the run, and the job goes back to the queue or is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sketchwalk import access
from sketchwalk.errors import SketchWalkError
from sketchwalk.settings import Settings
from sketchwalk.settings import load as load_settings
from sketchwalk.store.errors import JobLostError
from sketchwalk.worker.lifecycle import (  # noqa: F401  (JobInterrupted: its old home)
    RESTART_RUN_REASON,
    JobInterrupted,
    first_line,
    retrying,
    run_stale_reason,
)

log = logging.getLogger(__name__)

RESTART_REASON = "the worker stopped while this job was running (app or worker restarted)"
RELEASE_REASON = "re-queued: worker {name} shut down before finishing it"


def stale_reason(timeout_s: float) -> str:
    """Why a job whose worker went silent is failed (shown to the user as the job's error)."""
    return (
        f"its worker sent no heartbeat for over {timeout_s:g} s (killed, out of memory or cut "
        "off from the database)"
    )


class ModelCache:
    """Loaded models keyed by (model id, dtype, device), least recently used dropped first."""

    def __init__(self, size: int = 2) -> None:
        self.size = max(1, size)
        self._models: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # how many real loads happened (tests check models are reused)

    def get(self, model_id: str | None, dtype: str, device: str):
        from sketchwalk.engine.run.models import DEFAULT_MODEL, load_model

        key = (model_id or DEFAULT_MODEL, dtype, device)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            lm = load_model(model_id, dtype, device)
            self.loads += 1
            self._models[key] = lm
            while len(self._models) > self.size:
                self._models.popitem(last=False)
            return lm


def make_request(
    prompt: str,
    config: dict[str, Any],
    model: str | None = None,
    max_new_tokens: int = 32,
    dtype: str | None = None,
    time_only: bool = False,
    clean_timing: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The run job the app and the CLI queue: a RunRequest (checked here, and again by the
    worker under its deployment's limits) as its own `to_dict` writes it, the one shape of a
    run job. What a worker decides for its machine stays open unless given: dtype None (the
    worker's SKETCHWALK_DTYPE) and no exact_max_tokens (its SKETCHWALK_EXACT_MAX_TOKENS)."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.run.request import RunRequest

    data = RunRequest(
        prompt=prompt,
        config=SketchWalkConfig.from_dict(dict(config)),
        model=model or None,
        dtype=dtype or "float32",
        max_new_tokens=max_new_tokens,
        time_only=time_only,
        clean_timing=clean_timing,
        extra=extra,
    ).to_dict()
    data.pop("exact_max_tokens")
    if dtype is None:
        data["dtype"] = None
    return data


def run_job_kind(worker: Worker, job) -> Any:
    """The default job runner: the registered runner of the job's kind (worker/kinds.py), with
    a context whose every write is fenced by the claim. An unknown kind fails the job."""
    from sketchwalk.worker.context import JobContext
    from sketchwalk.worker.kinds import kind_of, runner

    ctx = JobContext(worker, job)
    try:
        kind = kind_of(job.request)
    except SketchWalkError as exc:
        ctx.fail(str(exc))
        return None
    return runner(kind)(ctx)


def worker_name(device: str, kind: str = "app") -> str:
    """Stable across restarts on one host, so a restarted worker recovers its own jobs."""
    return f"{kind}@{socket.gethostname()}/{device}"


def recover(store, name: str, max_attempts: int | None = None) -> list[str]:
    """Take back the jobs a dead process left 'running' (re-queued while they have attempts
    left, else failed). A DuckDB store has one process, so all of them; on a server database
    only this worker's own (others may still be alive)."""
    if store.engine.dialect.name == "duckdb":
        ids = store.recover_jobs(RESTART_REASON, max_attempts=max_attempts)
        store.recover_runs(RESTART_REASON)
        return ids
    return store.recover_jobs(RESTART_REASON, worker=name, max_attempts=max_attempts)


JobRunner = Callable[["Worker", Any], Any]
"""(worker, claimed job) -> anything: runs one job and records its outcome in the store. The
default runs the job's registered kind; tests plug in their own."""


class Worker:
    """A loop over the job queue in a daemon thread (or in the foreground with `serve`)."""

    def __init__(
        self,
        store,
        settings: Settings | None = None,
        name: str | None = None,
        device: str | None = None,
        models: ModelCache | None = None,
        runner: JobRunner | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or load_settings()
        self.device = device or self.settings.device
        self.name = name or worker_name(self.device)
        self.models = models or ModelCache(self.settings.model_cache_size)
        self.runner: JobRunner = runner or run_job_kind
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current_job: str | None = None
        self.recovered: list[str] = []
        self.released: list[str] = []  # jobs this worker put back in the queue
        self._release_at: float | None = None  # monotonic deadline set by request_release
        self._lost = threading.Event()  # the current job was recovered by someone else
        self._next_recovery = 0.0

    # ---- one job ------------------------------------------------------------------------

    def run_once(self) -> str | None:
        """Claim and run the oldest queued job; returns its id, or None when the queue is empty.

        While the job runs, a side thread keeps its heartbeat fresh. A JobInterrupted raised at
        a checkpoint ends the job here: released jobs go back to the queue.
        """
        if self.stopping:
            return None
        job = self.store.claim_job(self.name)
        if job is None:
            return None
        self.current_job = job.id
        self._lost.clear()
        if not self._admit(job):
            self.current_job = None
            return job.id
        beating = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat,
            args=(job.id, job.claim, beating),
            name=f"heartbeat-{job.id[:8]}",
        )
        beat.daemon = True
        if self.shared_store:
            beat.start()
        try:
            self.runner(self, job)
        except JobLostError as lost:  # a fenced write found the job taken over
            log.warning("worker %s: abandoned job %s: %s", self.name, job.id, lost)
        except JobInterrupted as stop:
            if stop.requeue and self.store.release_job(
                job.id, self.name, stop.reason, claim=job.claim
            ):
                self.released.append(job.id)
                log.info("worker %s: released job %s back to the queue", self.name, job.id)
            else:
                log.warning("worker %s: abandoned job %s: %s", self.name, job.id, stop.reason)
        finally:
            beating.set()
            if beat.is_alive():
                beat.join(timeout=5)
            self.current_job = None
        return job.id

    def _admit(self, job) -> bool:
        """A request that did not parse fails at once, then the deployment's model list, for every
        job kind and runner, before anything loads: a job naming no model gets the deployment's default; one naming an unlisted model is
        failed (through its claim) in a line that reveals nothing about the model."""
        try:
            if job.invalid is not None:
                raise SketchWalkError(job.invalid)
            model = access.load().job_model(job.request.get("model"))
        except SketchWalkError as exc:
            message = first_line(exc)
            with contextlib.suppress(JobLostError):  # recovered meanwhile: not ours to write
                retrying(
                    lambda: self.store.finish_job(job.id, error=message, claim=job.claim),
                    "record the refusal",
                )
            log.warning("worker %s: refused job %s: %s", self.name, job.id, message)
            return False
        if model is not None or "model" in job.request:
            job.request = {**job.request, "model": model}
        return True

    @property
    def shared_store(self) -> bool:
        """A server database other processes use too: heartbeats and stale recovery matter.

        Embedded files (DuckDB, SQLite) have a single process, which recovers everything at
        start; a heartbeat thread there would only race the job's own progress writes."""
        return self.store.engine.dialect.name not in ("duckdb", "sqlite")

    def _heartbeat(self, job_id: str, claim: str | None, done: threading.Event) -> None:
        every = max(0.05, float(self.settings.heartbeat_s))
        while not done.wait(every):
            try:
                if not self.store.heartbeat_job(job_id, self.name, claim=claim):
                    if done.is_set() or self._finished_by_us(job_id, claim):
                        return  # the job ended (our own save) between the wait and the write
                    log.warning("worker %s: job %s was taken from us", self.name, job_id)
                    self._lost.set()
                    return
            except Exception:  # database hiccup: the next beat (or the timeout) decides
                log.warning("worker %s: heartbeat for job %s failed", self.name, job_id)

    def _finished_by_us(self, job_id: str, claim: str | None) -> bool:
        """The job is done or failed under this worker's claim: a beat that missed it is no
        loss (a save ends the job before the runner returns and stops the beats)."""
        job = self.store.get_job(job_id)
        return job.status in ("done", "failed") and job.claim == claim and job.worker == self.name

    def checkpoint(self) -> None:
        """Called by the running job at progress points: stop it when asked to or when lost."""
        if self._lost.is_set():
            raise JobInterrupted(False, "the job was recovered by another process")
        if self._release_at is not None and time.monotonic() >= self._release_at:
            raise JobInterrupted(True, RELEASE_REASON.format(name=self.name))

    # ---- the loop -----------------------------------------------------------------------

    def drain(self) -> list[str]:
        """Run queued jobs until none is left (tests, `sketchwalk worker --once`)."""
        done = []
        while (job_id := self.run_once()) is not None:
            done.append(job_id)
        return done

    def recover_stale(self) -> list[str]:
        """Fail jobs whose worker went silent (server databases; DuckDB has one process)."""
        if not self.shared_store:
            return []
        timeout = float(self.settings.job_timeout_s)
        ids = self.store.recover_jobs(
            stale_reason(timeout),
            stale_after_s=timeout,
            max_attempts=self.settings.job_max_attempts,
        )
        if ids:
            log.warning("worker %s: took back %d job(s) of a dead worker", self.name, len(ids))
        runs = self.store.recover_runs(
            run_stale_reason(self.settings.run_stale_s), stale_after_s=self.settings.run_stale_s
        )
        if runs:
            log.warning("worker %s: failed %d run(s) of a dead process", self.name, len(runs))
        return ids

    def _maybe_recover(self) -> None:
        now = time.monotonic()
        if now >= self._next_recovery:
            self._next_recovery = now + max(1.0, self.settings.job_timeout_s / 4)
            self.recover_stale()

    def serve(self) -> None:
        """The loop: take jobs, sleep `poll_s` (or until woken) when the queue is empty, and
        now and then fail jobs whose worker died."""
        while not self.stopping:
            try:
                self._maybe_recover()
                if self.run_once() is None and not self.stopping:
                    self._wake.wait(self.settings.poll_s)
                    self._wake.clear()
            except Exception:  # database hiccup: log, back off, keep serving
                log.exception("worker %s: error while taking jobs", self.name)
                self._stop.wait(min(5.0, 5 * self.settings.poll_s))

    def warm(self) -> None:
        """Load the model a job naming none gets, before a job asks for it: the app's first run
        then does not wait for the load. A failure is logged; the first job tries again."""
        try:
            model = access.load().job_model(None)
            self.models.get(model, self.settings.dtype, self.settings.device)
        except Exception as exc:
            log.warning("worker %s: the default model did not load ahead: %s", self.name, exc)

    def start(self, warm: bool = False) -> Worker:
        """Recover jobs of a previous life, then serve in a daemon thread (loading the default
        model first when `warm`)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self.recovered = recover(self.store, self.name, self.settings.job_max_attempts)

        def main() -> None:
            if warm:
                self.warm()
            self.serve()

        self._thread = threading.Thread(target=main, name=f"sketchwalk-{self.name}", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look at the queue now (a job was just submitted)."""
        self._wake.set()

    def request_release(self, grace_s: float) -> None:
        """Stop taking jobs; the running job may finish within `grace_s` seconds, else it is
        released (back to the queue) at its next checkpoint. A second call can only shorten the
        grace. Safe in a signal handler: plain attribute writes only. Setting an Event takes a
        lock the interrupted main thread may hold (inside Event.wait), which would deadlock; the
        idle loop notices within `poll_s` instead."""
        deadline = time.monotonic() + max(0.0, grace_s)
        if self._release_at is None or deadline < self._release_at:
            self._release_at = deadline

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() or self._release_at is not None

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current job (a running model is not interrupted)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
