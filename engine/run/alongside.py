"""Work run on the spare core while this thread runs the sparse side of a run.

The app's worker runs torch on one core fewer than the machine has, leaving one to the UI: an
OpenMP team that needs a core someone else holds stalls at every parallel region. A second,
independent stream has no such barrier: it shares no parallel region with this thread, so a
busy core slows it down and nothing more. The quality half uses one for the work that does
not depend on the sparse side's progress: the dense side of a new prompt (and then its prompt
comparison, once the sparse prefill hands over its states), or, on a prompt whose dense side
is known, the comparison alone (it needs only the sparse prefill), after the recorder's exact
block mass and metrics of each prefill layer, and before those of each decode step (a Stream).

Only where it cannot bend a measurement: the caller times nothing side by side while it runs
(the quality half; its speed half times clean passes alone).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def spare_core(device: torch.device) -> bool:
    """Whether a second CPU stream gets a core of its own: work on the CPU, with torch's
    threads fewer than the machine's cores."""
    return device.type == "cpu" and torch.get_num_threads() < (os.cpu_count() or 1)


class Handoff(Generic[T]):
    """One value this thread hands the second stream once it exists (the sparse prefill's
    prompt states, say)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._value: list[T] = []

    def put(self, value: T) -> None:
        self._value.append(value)
        self._ready.set()

    def wait(self, poll: Callable[[], None]) -> T:
        """The value; `poll` runs every 50 ms meanwhile (a stopped stream's tick raises there,
        so a side that failed before handing over never leaves the other waiting)."""
        while not self._ready.wait(0.05):
            poll()
        return self._value[0]


class _Stopped(Exception):
    """Raised inside the second thread at its next tick once this side has failed."""


class Alongside(Generic[T]):
    """`work(tick)` run in a second thread from construction on. `tick(n)` is its progress
    (read here as `done`; it never reports anywhere itself: progress and cancellation stay with
    this thread); the result, or the work's exception, comes from `result()`. Leaving the block
    with an exception stops the work at its next tick and waits for it."""

    def __init__(self, work: Callable[[Callable[[int], None]], T], name: str) -> None:
        self.done = 0
        self._stop = threading.Event()
        self._out: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _tick(self, n: int) -> None:
        if self._stop.is_set():
            raise _Stopped
        self.done = n

    def _main(self, work: Callable[[Callable[[int], None]], T]) -> None:
        try:
            self._out.append(work(self._tick))
        except BaseException as exc:  # handed to result(); a stopped work's is dropped
            self._error.append(exc)

    def result(self) -> T:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._out[0]

    def __enter__(self) -> Alongside[T]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            self._stop.set()
            self._thread.join()


class Stream:
    """Tasks run one after another, in the order given, on a second stream: `put` hands one
    over and returns at once (a Future of its value). Leaving the block waits for every task and
    raises the first one's error; leaving it with an exception drops what is left."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], object], Future] | None] = (
            queue.SimpleQueue()
        )
        self._side = Alongside(self._drain, name)

    def put(self, task: Callable[[], T]) -> Future[T]:
        done: Future[T] = Future()
        self._tasks.put((task, done))
        return done

    def _drain(self, tick: Callable[[int], None]) -> None:
        ran = 0
        while True:
            try:
                item = self._tasks.get(timeout=0.05)
            except queue.Empty:
                tick(ran)  # raises once this side has failed
                continue
            if item is None:
                return
            task, done = item
            try:
                done.set_result(task())
            except BaseException as exc:  # ends the stream: its Future and result() raise it
                done.set_exception(exc)
                raise
            ran += 1
            tick(ran)

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            self._side.__exit__(kind, exc, tb)
            return
        self._tasks.put(None)
        self._side.result()
