"""The engine's one clock: stage times add up per stage and a timed call returns its result."""

import time

import torch

from sketchwalk.engine.clock import StageTimer, now_ms, timed


def test_timed_returns_the_result_and_a_wall_time():
    out, ms = timed(lambda: (time.sleep(0.02), 7)[1], torch.device("cpu"))
    assert out == 7 and ms >= 15.0
    a = now_ms(torch.device("cpu"))
    assert now_ms(torch.device("cpu")) >= a


def test_stage_timer_sums_each_stage():
    t = StageTimer(torch.device("cpu"))
    for _ in range(2):
        t.run("walk", lambda: time.sleep(0.01))
    assert t.run("sketch", lambda: "x") == "x"
    assert set(t.ms) == {"walk", "sketch"} and t.ms["walk"] >= 15.0


def test_on_cuda_every_reading_waits_for_the_queued_work(monkeypatch):
    """GPU work is queued: a clock read before synchronising would time the launches, not the
    work. Shown here with a fake CUDA device (no GPU needed): each read follows a sync of the
    timed tensors' device, so `timed` covers everything fn queued."""
    from sketchwalk.engine import clock

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(f"sync {d}"))
    monkeypatch.setattr(clock.time, "perf_counter", lambda: calls.append("read") or 1.0)
    dev = torch.device("cuda", 1)
    out, ms = timed(lambda: calls.append("work") or 5, dev)
    assert out == 5 and ms == 0.0
    assert calls == ["sync cuda:1", "read", "work", "sync cuda:1", "read"]
    calls.clear()
    now_ms(torch.device("cpu"))
    assert calls == ["read"]  # CPU work is done when the call returns: no sync


class FakeEvent:
    """A CUDA event on a fake stream: recording notes the call; its time is the order."""

    log: list[str] = []
    count = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = None

    def record(self) -> None:
        FakeEvent.count += 1
        self.t = FakeEvent.count * 10.0
        FakeEvent.log.append("record")

    def synchronize(self) -> None:
        FakeEvent.log.append("wait")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.t - self.t


def test_stages_on_cuda_record_events_and_wait_only_when_read(monkeypatch):
    """Inside a layer the stages are timed by events on the stream: nothing waits for the GPU
    until the sums are read as numbers, and then once (the last event), whatever their count."""
    from sketchwalk.engine import clock
    from sketchwalk.engine.clock import Millis, Stopwatch

    FakeEvent.log, FakeEvent.count = [], 0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: FakeEvent.log.append("sync"))
    dev = torch.device("cuda")
    t = StageTimer(dev)
    for _ in range(3):
        t.run("walk", lambda: FakeEvent.log.append("work"))
    t.run("select", lambda: None)
    watch = Stopwatch(dev)
    attention = watch.stop()
    assert "sync" not in FakeEvent.log and "wait" not in FakeEvent.log
    assert FakeEvent.log.count("record") == 10 and FakeEvent.log.count("work") == 3
    total = 2.5 + t.ms["walk"] + t.ms["select"] + attention  # sums keep the pending pairs
    assert isinstance(total, Millis) and "wait" not in FakeEvent.log
    assert float(total) == 2.5 + 5 * 10.0  # each pair's start and end are consecutive records
    assert FakeEvent.log.count("wait") == 1
    assert float(total) == 52.5 and FakeEvent.log.count("wait") == 1  # read once, kept
    assert isinstance(StageTimer(torch.device("cpu")).run("x", lambda: 1), int)
    assert isinstance(clock.Stopwatch(torch.device("cpu")).stop(), float)


def test_a_session_reads_its_stage_times_once(monkeypatch):
    """A session sums the layers' stage times as they come and turns them into numbers only
    when its timings are asked for."""
    from sketchwalk.engine.clock import Millis
    from sketchwalk.engine.hf.session import Session
    from sketchwalk.engine.method.config import SketchWalkConfig

    s = Session(SketchWalkConfig())
    pending = [Millis(1.0), Millis(2.0)]
    s._time("sketch", pending[0])
    s._time("sketch", pending[1])
    s._time("walk", 0.5)
    assert isinstance(s.stage_ms["sketch"], Millis)
    assert s.timings == {"sketch": 3.0, "walk": 0.5}
