"""`sketchwalk worker`: serve the job queue from the command line, outside the app.

For a server database (PostgreSQL), run one per device next to an app started with --no-worker:
claims are row-locked (no job runs twice), running jobs carry a heartbeat, and every worker fails
the jobs of workers that went silent. SIGTERM/SIGINT stop it gracefully: no new job is taken,
the running one may finish within --grace seconds, else it goes back to the queue; exit 0.
A DuckDB file the app already holds cannot be opened here (one process per file): the store's
lock error says so.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sketchwalk.errors import SketchWalkError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="take queued runs from a store's job table and run them")
    p.add_argument(
        "--db",
        default=None,
        help="store URL or DuckDB file (default $SKETCHWALK_DB or the user data dir)",
    )
    p.add_argument("--device", default=None, help="cpu (default) or cuda:N")
    p.add_argument("--once", action="store_true", help="run the queued jobs, then exit")
    p.add_argument("--name", default=None, help="worker name (default worker@HOST/DEVICE/PID)")
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="S",
        help="on SIGTERM, let the running job finish within S seconds, else re-queue it "
        "(default $SKETCHWALK_STOP_GRACE_S or 20; a second signal re-queues at once)",
    )
    # A plug-in point for other job kinds (and the tests' cheap jobs): MODULE:FUNCTION taking
    # (worker, job). Not advertised: the engine run is what users queue.
    p.add_argument("--runner", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_worker)


def standalone_name(device: str) -> str:
    """Unique per process: two workers on one host and device must never share a name, since
    recovery and release are keyed by it."""
    from sketchwalk.worker.loop import worker_name

    return f"{worker_name(device, kind='worker')}/{os.getpid()}"


def load_runner(spec: str | None):
    """MODULE:FUNCTION -> the callable, or None for the engine run."""
    if not spec:
        return None
    module, _, func = spec.partition(":")
    if not module or not func:
        raise SketchWalkError(f"--runner takes MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise SketchWalkError(f"cannot load job runner {spec!r}: {exc}") from None


@contextmanager
def graceful_signals(worker, grace_s: float) -> Iterator[list[int]]:
    """While inside, SIGTERM/SIGINT ask `worker` to stop (first: with grace, again: at once).

    The handler only sets flags (no logging, no database): it runs between two bytecodes of
    whatever the main thread was doing. Yields the list of signals received.
    """
    received: list[int] = []

    def on_signal(signum: int, frame) -> None:
        received.append(signum)
        worker.request_release(0.0 if len(received) > 1 else grace_s)

    sigs = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, on_signal) for s in sigs}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def cmd_worker(args: argparse.Namespace) -> int:
    from sketchwalk.settings import load
    from sketchwalk.store import open_store
    from sketchwalk.worker.loop import Worker, recover

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    settings = load()
    device = args.device or settings.device
    grace = settings.stop_grace_s if args.grace is None else args.grace
    if grace < 0:
        raise SketchWalkError(f"--grace must be >= 0 seconds, got {grace:g}")
    runner = load_runner(args.runner)
    name = args.name or standalone_name(device)
    import torch

    # Like the app's worker: several workers on one host, each with every core in its OpenMP
    # team, stall each other (3 workers x 2 threads on 2 cores); SKETCHWALK_THREADS sizes it.
    torch.set_num_threads(settings.threads)
    store = open_store(args.db)  # StoreLockedError (one line) when the app holds the file
    try:
        worker = Worker(store, settings, name=name, device=device, runner=runner)
        # DuckDB: this is the only process, so every 'running' job is a leftover. A server
        # database: only jobs whose heartbeat went stale (other workers may be mid-job).
        recovered = (
            worker.recover_stale()
            if worker.shared_store
            else recover(store, name, settings.job_max_attempts)
        )
        if recovered:
            print(
                f"sketchwalk: took back {len(recovered)} interrupted job(s) (re-queued or failed)",
                file=sys.stderr,
            )
        with graceful_signals(worker, grace) as received:
            if args.once:
                done = worker.drain()
            else:
                print(
                    f"sketchwalk: worker {name} serving {store.url} (Ctrl-C to stop)",
                    file=sys.stderr,
                )
                sys.stderr.flush()
                worker.serve()
                done = []
        if received:
            print(
                f"sketchwalk: worker {name} stopped on {signal.Signals(received[0]).name}; "
                f"re-queued {len(worker.released)} job(s)",
                file=sys.stderr,
            )
            return 0
        if args.once:
            failed = [j for j in done if store.get_job(j).status == "failed"]
            print(f"sketchwalk: ran {len(done)} job(s), {len(failed)} failed", file=sys.stderr)
            return 1 if failed else 0
    finally:
        store.close()
    return 0
