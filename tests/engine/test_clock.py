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
    StageTimer(dev).run("walk", lambda: calls.append("work"))
    assert calls == ["sync cuda:1", "read", "work", "sync cuda:1", "read"]
    calls.clear()
    now_ms(torch.device("cpu"))
    assert calls == ["read"]  # CPU work is done when the call returns: no sync
