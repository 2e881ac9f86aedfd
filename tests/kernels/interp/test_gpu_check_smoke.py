"""The prepared GPU check script, run end to end on tiny inputs through the interpreter.

A lent GPU comes with minutes of device time; a script that breaks on its first line wastes them.
"""

from __future__ import annotations

import json

from sketchwalk.benchmarks import gpu_check


def test_gpu_check_smoke_runs_checks_and_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--device", "cpu", "--smoke", "--prefill", "96", "--decode", "200"]
    argv += ["--density", "0.3", "--shape", "smollm2", "--repeats", "1"]
    assert gpu_check.main(argv) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["versions"]["triton"] and report["versions"]["gpu"] is None
    assert len(report["checks"]) == 2 * len(gpu_check.SMOKE_CASES) + 1
    assert all(c["ok"] and c["rel_err"] < 1e-2 for c in report["checks"])
    phases = [(r["phase"], r["seq_len"]) for r in report["timings"]]
    assert phases == [("prefill", 96), ("decode", 200)]
    for row in report["timings"]:
        assert row["backend"] == "triton" and row["dense_ms"] > 0 and row["sparse_ms"] > 0


def test_gpu_check_refuses_cpu_without_the_interpreter_and_unknown_devices(monkeypatch, capsys):
    assert gpu_check.main(["--device", "nonsense"]) == 2
    assert "unknown device 'nonsense'" in capsys.readouterr().err
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gpu_check.main(["--device", "cpu", "--smoke"]) == 2
