"""The prepared GPU check's kernel stages, in this process, on tiny inputs through the interpreter.

A lent GPU comes with minutes of device time; a script that breaks on its first line wastes them.
tests/kernels/test_gpu_check_script.py runs the whole script (every stage, the merge) end to end.
"""

from __future__ import annotations

import json

import pytest

from sketchwalk.benchmarks import gpu_check


def _stage(tmp_path, letter: str) -> tuple[int, dict]:
    rc = gpu_check.run_stage(letter, tmp_path, "cpu", smoke=True)
    return rc, json.loads((tmp_path / f"{letter}.json").read_text())


def test_kernel_stage_checks_every_case_against_the_oracle(tmp_path):
    rc, data = _stage(tmp_path, "b")
    assert rc == 0 and data["finished"] and not data["errors"]
    items = data["items"]
    assert len(items) == 2 * len(gpu_check.SMOKE_CASES) + 1  # fp16 and fp32, then density 1.0
    assert {i["dtype"] for i in items} == {"float16", "float32"}
    assert all(i["ok"] and i["rel_err"] < 1e-2 for i in items)


def test_attention_stage_times_triton_against_sdpa(tmp_path):
    rc, data = _stage(tmp_path, "d")
    assert rc == 0 and not data["errors"]
    rows = data["items"]
    # density 0.2 first, then 0.1 where time allows (no deadline here: always)
    cases = [(r["phase"], r["seq_len"], r["density"]) for r in rows]
    assert cases == [("prefill", 96, 0.2), ("decode", 200, 0.2)] + [
        ("prefill", 96, 0.1),
        ("decode", 200, 0.1),
    ]
    for r in rows:
        assert r["backend"] == "triton" and r["dense_ms"] > 0 and r["kernel_ms"] > 0
        assert r["sparse_ms"] == pytest.approx(r["overhead_ms"] + r["kernel_ms"], abs=2e-3)


def test_optional_cases_are_left_out_when_the_deadline_is_near(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("GPU_CHECK_DEADLINE", str(time.time() + 1))  # already too late for more
    rc, data = _stage(tmp_path, "d")
    assert rc == 0 and {r["density"] for r in data["items"]} == {0.2}


def test_a_cpu_device_without_the_interpreter_is_a_recorded_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    rc, data = _stage(tmp_path, "b")
    assert rc == 1 and data["items"] == [] and data["finished"]
    assert "a CPU device needs TRITON_INTERPRET=1" in data["errors"][0]["error"]
    assert gpu_check.device_problem("nonsense") == "unknown device 'nonsense'"
