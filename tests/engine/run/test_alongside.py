"""The second stream of a quality half: its result and errors come back to this thread, and
this thread's failure stops it at its next tick."""

from __future__ import annotations

import threading

import pytest
import torch

from sketchwalk.engine.run.alongside import Alongside, Handoff, spare_core


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
