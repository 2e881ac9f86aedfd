"""The second stream of a quality half: its result and errors come back to this thread, and
this thread's failure stops it at its next tick."""

from __future__ import annotations

import threading

import pytest
import torch

from sketchwalk.engine.run.alongside import Alongside, Handoff, Stream, spare_core


def test_the_result_and_the_progress_come_back():
    def work(tick):
        for i in range(1, 6):
            tick(i)
        return threading.current_thread().name

    with Alongside(work, "side-test") as side:
        assert side.result() == "side-test"  # it ran in its own, named thread
    assert side.done == 5


def test_the_works_error_is_raised_by_result():
    def work(tick):
        raise ValueError("broken side")

    with Alongside(work, "side-test") as side, pytest.raises(ValueError, match="broken side"):
        side.result()


def test_leaving_with_an_error_stops_the_work_at_its_next_tick():
    started, ticks = threading.Event(), []

    def work(tick):
        for i in range(10**7):
            started.set()
            ticks.append(i)
            tick(i)
            threading.Event().wait(0.001)
        return "ran to the end"

    with pytest.raises(KeyError), Alongside(work, "side-test") as side:
        started.wait()
        raise KeyError("this side failed")
    assert not side._thread.is_alive()
    assert len(ticks) < 10**7  # stopped, not run to its end


def test_a_handoff_reaches_the_other_stream_and_a_failed_side_never_leaves_it_waiting():
    handed: Handoff[str] = Handoff()
    with Alongside(lambda tick: handed.wait(lambda: tick(0)) + " received", "side-test") as side:
        handed.put("states")
        assert side.result() == "states received"
    never: Handoff[str] = Handoff()
    with pytest.raises(KeyError), Alongside(lambda tick: never.wait(lambda: tick(0)), "w") as s2:
        raise KeyError("this side failed before handing over")
    assert not s2._thread.is_alive()


def test_a_spare_core_is_a_cpu_core_torch_does_not_use(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert spare_core(torch.device("cpu"))
    assert not spare_core(torch.device("meta"))  # another device: its own streams
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not spare_core(torch.device("cpu"))


def test_a_stream_runs_its_tasks_in_order_in_its_own_thread():
    order: list[int] = []
    names: set[str] = set()

    def task(i: int):
        def run() -> int:
            names.add(threading.current_thread().name)
            order.append(i)
            return i * i

        return run

    with Stream("stream-test") as stream:
        done = [stream.put(task(i)) for i in range(20)]
        assert done[3].result(timeout=10) == 9  # a value is there before the stream ends
    assert order == list(range(20)) and names == {"stream-test"}
    assert [d.result() for d in done] == [i * i for i in range(20)]
    assert not [t for t in threading.enumerate() if t.name == "stream-test"]


def test_a_failing_task_ends_the_stream_and_its_error_comes_back():
    ran: list[int] = []

    def broken() -> None:
        raise ValueError("broken task")

    with pytest.raises(ValueError, match="broken task"), Stream("stream-test") as stream:
        first = stream.put(broken)
        stream.put(lambda: ran.append(1))
        with pytest.raises(ValueError, match="broken task"):
            first.result(timeout=10)  # a waiter on it is never left waiting
    assert ran == []  # what came after it never ran
    assert not [t for t in threading.enumerate() if t.name == "stream-test"]


def test_leaving_a_stream_with_an_error_drops_its_waiting_tasks():
    gate = threading.Event()
    ran: list[int] = []
    with pytest.raises(KeyError), Stream("stream-test") as stream:
        stream.put(gate.wait)  # busy until after this side has failed
        for i in range(5):
            stream.put(lambda i=i: ran.append(i))
        threading.Timer(0.2, gate.set).start()
        raise KeyError("this side failed")
    assert ran == []  # stopped at its next tick: nothing queued after it ran
    assert not [t for t in threading.enumerate() if t.name == "stream-test"]
