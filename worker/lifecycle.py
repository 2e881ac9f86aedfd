"""One run request, one lifecycle: load, check, create the run row, run, save, or fail honestly.

The CLI's `sketchwalk run`, the app's in-process worker and standalone workers all go through
`execute`, so a run ends the same way wherever it started: every check that can refuse the
request happens before the first row is written; once the run row exists it carries a heartbeat
(on shared databases) and ends either `done` with all its rows or `failed` with one line saying
why, including "interrupted" when a signal stopped it. A run without clean timing is saved in one
transaction; one with clean timing shows its quality first: all its rows in one transaction
while it is still running, then its clean timings in a second, which ends it. A run that belongs to a
job also moves the job, through the job's claim, so a worker that lost its job writes nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sketchwalk.engine.run.request import RequestError, RunRequest
from sketchwalk.errors import SketchWalkError
from sketchwalk.progress import Progress, no_progress

log = logging.getLogger(__name__)

T = TypeVar("T")


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM) stopped a run; `exit_code` is the shell's 128 + signal."""

    def __init__(self, signum: int, what: str = "") -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        said = f"interrupted by {signal.Signals(signum).name}"
        super().__init__(f"{said}: {what}" if what else said)


class JobInterrupted(BaseException):
    """Raised at a job's checkpoint to abandon it (any kind): released at a shutdown, or taken
    over by another process.

    A BaseException so that the job's own error handling (`except Exception`: fail the job with
    a message) does not swallow it: an interrupted job is released or was taken from us, it did
    not fail. `requeue` says which.
    """

    keeps_run_state = True  # the lifecycle writes nothing: release/recovery own the state

    def __init__(self, requeue: bool, reason: str) -> None:
        super().__init__(reason)
        self.requeue = requeue
        self.reason = reason


RESTART_RUN_REASON = (
    "the process running it stopped before it finished (killed or crashed); run it again"
)


def run_stale_reason(timeout_s: float) -> str:
    """Why a run whose process went silent is failed (CLI runs on a shared database)."""
    return (
        f"its process sent no heartbeat for over {timeout_s:g} s (killed or cut off from the "
        "database); run it again"
    )


def recover_dead_runs(store: Any) -> list[str]:
    """Mark runs whose process died failed, so none stays 'running' forever: on a DuckDB file
    this process holds alone, every running run; elsewhere, those whose heartbeat went stale
    (taken with SKIP LOCKED: a run some process is saving is never waited for). The CLI's
    `sketchwalk runs` and the app at start call it."""
    from sketchwalk.settings import load

    if store.engine.dialect.name == "duckdb":
        return store.recover_runs(RESTART_RUN_REASON)
    stale = load().run_stale_s
    return store.recover_runs(run_stale_reason(stale), stale_after_s=stale)


@dataclass(frozen=True)
class JobClaim:
    """The job a run belongs to and the claim token that fences its writes."""

    job_id: str
    claim: str | None


@dataclass
class Outcome:
    run_id: str | None
    result: Any  # RunResult


ModelLoader = Callable[[str | None, str], Any]
"""(model id or None for the default, dtype) -> LoadedModel."""


def execute(
    request: RunRequest,
    store: Any | None,
    load: ModelLoader,
    progress: Progress = no_progress,
    job: JobClaim | None = None,
    heartbeat_s: float = 10.0,
) -> Outcome:
    """Run `request` to its end and return the run id (None without a store) and its result.

    Any failure is recorded first (the run failed with one line, the job failed through its
    claim) and then raised, so callers decide how to report it. Exceptions with a true
    `keeps_run_state` attribute (a worker releasing or abandoning its job) pass through without a
    write: whoever took the job over owns its state. `store=None` runs without storing anything.
    """
    run_id: str | None = None
    try:
        lm = load_checked(load, request)
        request.check_model(lm)  # bad input writes nothing
        if store is not None:
            fence = (job.job_id, job.claim) if job is not None and job.claim else None
            run_id = retrying(  # linked to its job in the same transaction, fenced
                lambda: store.create_run(
                    {
                        **request.to_dict(),
                        "model": lm.model_id,
                        **({"job_id": job.job_id} if job else {}),
                    },
                    status="running",
                    job=fence,
                ),
                "create the run",
            )
            if job is not None and fence is None:
                store.update_job(job.job_id, 0.0, "starting", run_id=run_id)
        from sketchwalk.engine.run.runner import run

        opts = request.run_options()
        with _run_heartbeat(store, run_id, heartbeat_s):
            if store is not None and opts.clean_timing:
                result = _quality_then_speed(lm, request, store, run_id, job, fence, progress)
                return Outcome(run_id, result)
            result = run(lm, request.prompt, request.config, opts, progress)
            if store is not None:
                progress(1.0, "saving results")
                retrying(lambda: store.save_result(run_id, result, job=fence), "save the run")
                if job is not None and fence is None:
                    store.finish_job(job.job_id, run_id=run_id)
        return Outcome(run_id, result)
    except BaseException as exc:
        if getattr(exc, "keeps_run_state", False) or _is_lost(exc):
            raise
        with shielded():
            _record_failure(store, run_id, job, failure_text(exc))
        raise


def quality_share(repeats: int) -> float:
    """The part of a run's progress its quality half takes: the clean passes (prefill and
    decode, dense and sparse, each about half a recorded pass) take the rest."""
    return 2 / (2 + max(1, repeats))


def _quality_then_speed(
    lm: Any,
    request: RunRequest,
    store: Any,
    run_id: str,
    job: JobClaim | None,
    fence: tuple[str, str] | None,
    progress: Progress,
) -> Any:
    """A run with clean timing, quality first: the recorded run is stored at once (run still
    'running', its job saying the clean passes are under way), then the clean passes run and a
    second fenced write merges their timings and ends run and job. Clean passes that fail leave
    the run done with its quality half and a one-line `clean_failed` timings note: what was
    measured is whole, only the speed half is missing."""
    from sketchwalk.engine.run.runner import run, speed_timings, with_layer_dense
    from sketchwalk.store.runs import SPEED_PENDING

    opts = request.run_options()
    share = quality_share(opts.clean_repeats)
    result = run(
        lm, request.prompt, request.config, opts, lambda f, m: progress(f * share, m), speed=False
    )
    progress(share, "saving the quality half")
    retrying(
        lambda: store.save_quality(run_id, result, job=fence, progress=share),
        "save the quality half",
    )
    if job is not None and fence is None:
        store.update_job(job.job_id, share, SPEED_PENDING, run_id=run_id)
    failed = None
    layer_dense: dict[int, float] = {}  # the per-layer dense timing the quality half left out
    try:
        more = speed_timings(
            lm,
            request.prompt,
            request.config,
            opts,
            result.timings,
            lambda f, m: progress(share + (1 - share) * f, m),
            layer_dense,
        )
    except Exception as exc:
        if _is_lost(exc):
            raise
        why = (
            first_line(exc)
            if isinstance(exc, SketchWalkError)
            else f"{type(exc).__name__}: {first_line(exc)}"
        )
        more, failed, layer_dense = {}, f"the clean timing passes failed: {why}", {}
        log.warning("run %s: %s", run_id, failed)
    retrying(
        lambda: store.save_speed(
            run_id, more, job=fence, failed=failed, layer_dense_ms=layer_dense
        ),
        "save the clean timings",
    )
    if job is not None and fence is None:
        store.finish_job(job.job_id, run_id=run_id)
    result.timings.update(more)
    with_layer_dense(result.layers, layer_dense)
    if failed:
        from sketchwalk.engine.run.speed import CLEAN_FAILED

        result.timings[CLEAN_FAILED] = failed
    return result


def failure_text(exc: BaseException) -> str:
    """The one line a failed run shows: the user's own error as is, a signal as
    'interrupted', anything else with its type (the log has the traceback)."""
    if isinstance(exc, Interrupted):
        return f"interrupted ({signal.Signals(exc.signum).name}); the run was stopped"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT); the run was stopped"
    if isinstance(exc, SketchWalkError):
        return first_line(exc)
    return f"the run failed: {type(exc).__name__}: {first_line(exc)}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def load_checked(load: ModelLoader, request: RunRequest) -> Any:
    """The model, or one line saying why not: a damaged weights file or an unknown device is
    the user's to fix, not a traceback."""
    try:
        return load(request.model, request.dtype)
    except SketchWalkError:
        raise
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:
        raise RequestError(
            f"cannot load model {request.model or 'default'!r}: {type(exc).__name__}: "
            f"{first_line(exc)[:200]}"
        ) from exc


def _record_failure(store: Any, run_id: str | None, job: JobClaim | None, text: str) -> None:
    if store is None:
        return
    try:
        if run_id is not None:
            retrying(lambda: _fail_run(store, run_id, text), "record the failure")
        if job is not None:
            retrying(
                lambda: store.finish_job(job.job_id, run_id=run_id, error=text, claim=job.claim),
                "record the failure",
            )
    except Exception as exc:  # lost the job, or the database stayed down: recovery decides
        log.warning("could not record the failure of run %s: %s", run_id, first_line(exc))


def _fail_run(store: Any, run_id: str, text: str) -> None:
    if store.get_run(run_id)["status"] != "done":
        store.mark_failed(run_id, text)


def _is_lost(exc: BaseException) -> bool:
    from sketchwalk.store.errors import JobLostError

    return isinstance(exc, JobLostError)


# ---- staying alive across a short outage -------------------------------------------------


DISK_FULL = ("No space left on device", "File too large", "Disk quota exceeded", "disk is full")
"""How a full disk reads in a driver's error: not transient, retrying only delays the line."""
DISK_FULL_STATES = ("53100", "53000")  # PostgreSQL disk_full, insufficient_resources


def is_transient(exc: BaseException) -> bool:
    """A lost connection, a restarting server, a lock held past its timeout: worth trying
    again shortly. A full disk is not."""
    import sqlalchemy as sa

    from sketchwalk.store.errors import StoreBusyError

    chain = [e for e in (exc, exc.__cause__) if e is not None]
    if any(_disk_full(e) for e in chain):
        return False
    for e in chain:
        if isinstance(e, (sa.exc.OperationalError, StoreBusyError)) or (
            isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated
        ):
            return True
    return False


def _disk_full(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) in DISK_FULL_STATES:
        return True
    return any(words in str(orig) for words in DISK_FULL)


def retrying(fn: Callable[[], T], what: str, within_s: float = 30.0) -> T:
    """Call `fn` until it succeeds, retrying transient database errors for up to `within_s`
    seconds (a worker's own state writes must survive a database restart), then give up."""
    deadline = time.monotonic() + within_s
    wait = 0.25
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + wait > deadline:
                raise
            log.warning("could not %s (%s); retrying in %.2g s", what, first_line(exc), wait)
            time.sleep(wait)
            wait = min(wait * 2, 4.0)


# ---- heartbeat and signals ---------------------------------------------------------------


@contextmanager
def _run_heartbeat(store: Any, run_id: str | None, every_s: float) -> Iterator[None]:
    """Keep a running run's `updated_at` fresh on a database other processes can open, so any
    of them can tell a live run from one whose process died. A DuckDB file has one process (it
    is locked), which is alive while it holds the file: nothing to do."""
    if store is None or run_id is None or store.engine.dialect.name == "duckdb":
        yield
        return
    done = threading.Event()

    def beat() -> None:
        while not done.wait(max(0.05, every_s)):
            try:
                if not store.touch_run(run_id):
                    return
            except Exception as exc:  # a hiccup: the next beat or the stale timeout decides
                log.warning("heartbeat of run %s failed: %s", run_id, first_line(exc))

    thread = threading.Thread(target=beat, name=f"run-heartbeat-{run_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


@contextmanager
def shielded() -> Iterator[None]:
    """While a failure is written or an outcome read back, further SIGINT/SIGTERM are ignored
    (main thread only), so a second Ctrl-C cannot cut that short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside, SIGTERM (and SIGINT) raise Interrupted in the main thread, so a run stopped by
    the shell or a process manager is marked failed before the process exits."""

    def on_signal(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, on_signal) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
