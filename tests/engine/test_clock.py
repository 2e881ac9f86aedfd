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
