"""benchmarks/gpu_check.sh end to end: `--smoke --device cpu` (the Triton interpreter) runs every
stage, a failing or hanging stage is recorded while the others run, the shim stands in for an
install, bad arguments are one line, and gpu_table.py renders the report.

Why: a lent GPU comes with 15 minutes; the script must not lose them to a typo or a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sketchwalk.benchmarks import gpu_check, gpu_table

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

# What a bare GPU host looks like: the project not installed, the store's packages absent.
HOST_LIKE = """
import sys

def _editable(finder) -> bool:
    return getattr(finder, "__module__", "").startswith("__editable__")


sys.meta_path[:] = [f for f in sys.meta_path if not _editable(f)]


class _Absent:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in {"sqlalchemy", "duckdb", "streamlit"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Absent)
"""


def _run(out: Path, *args: str, env: dict | None = None, timeout: int = 900):
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, **(env or {})}
    env.pop("TRITON_INTERPRET", None)  # the script sets it for --device cpu
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _report(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


@pytest.mark.interp
def test_smoke_runs_every_stage_into_one_report(tmp_path):
    proc = _run(tmp_path, "--smoke", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = _report(tmp_path)
    stages = report["stages"]
    assert list(stages) == list(gpu_check.STAGES)
    for letter, s in stages.items():
        assert s["status"] == "ok" and s["rc"] == 0 and not s["errors"], (letter, s)
        assert s["items"] and s["seconds"] is not None and s["timeout_s"] == 300
    v = report["versions"]
    assert v["torch"] and v["triton"] and v["transformers"] and v["gpu"] is None
    assert report["smoke"] and report["date"][:2] == "20"

    env = stages["a"]["items"]
    assert {i["module"] for i in env if "module" in i} >= set(gpu_check.MODULES)
    (check,) = [i for i in env if "check" in i]
    assert check["ok"] and check["triton_interpret"] and check["shim"] is None

    assert all(i["ok"] for i in stages["b"]["items"])
    sel = stages["c"]["items"]
    assert [(i["seq_len"], i["config"]) for i in sel] == [
        (t, c) for t in (256, 512) for c in gpu_check._selection_configs()
    ]
    for i in sel:
        assert i["ratio"] == pytest.approx(i["selection_ms"] / i["dense_ms"], rel=1e-2, abs=1e-3)
        assert i["meets_target"] == (i["ratio"] <= gpu_check.SELECTION_TARGET)
    assert {i["estimator"] for i in sel} == {"sampled", "mean"}

    att = stages["d"]["items"]
    assert {(r["phase"], r["density"]) for r in att} >= {("prefill", 0.2), ("decode", 0.2)}
    assert all(r["backend"] == "triton" for r in att)

    rows = stages["e"]["items"]
    timed = [r for r in rows if not r["warmup"]]
    assert [(r["shape"], r["layers"], r["seq_len"]) for r in timed] == [
        (s, n, t) for s, n, _, t in gpu_check.model_cases(smoke=True)
    ]
    assert all(r["random_weights"] and r["model"] == "random:tiny" for r in rows)
    assert len(rows) == 2 * len(timed)  # each case's warm-up row beside it

    md = (tmp_path / "gpu_table.md").read_text()
    assert md.startswith("GPU check: no GPU (cpu)") and "smoke run" in md
    for title in ("| stage |", "One layer's selection", "One layer of attention", "Whole model"):
        assert title in md
    assert md.count("| random:") == 0 and md.count("| tiny x ") == len(timed)
    assert "a env" in proc.stdout and "wrote" in proc.stdout


@pytest.mark.interp
def test_a_failing_and_a_hanging_stage_are_recorded_and_the_next_one_runs(tmp_path):
    fault = {gpu_check.FAULT_ENV: "b=fail,c=hang"}
    args = ("--stages", "b,c,a", "--timeout", "c=3", "--smoke", "--device", "cpu")
    proc = _run(tmp_path, *args, env=fault)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    stages = _report(tmp_path)["stages"]
    assert list(stages) == ["b", "c", "a"]
    b, c, a = stages["b"], stages["c"], stages["a"]
    assert (
        b["status"] == "failed" and b["rc"] == 1 and "injected failure" in b["errors"][0]["error"]
    )
    assert "injected failure" in b["tail"]
    assert c["status"] == "timeout" and c["rc"] == 124 and c["timeout_s"] == 3
    assert c["items"] == [{"injected": "hang"}]  # what it wrote before it hung is kept
    assert "injected hang" in c["tail"]
    assert a["status"] == "ok" and "tail" not in a
    md = gpu_table.markdown(_report(tmp_path))
    assert "| c selection | timeout |" in md and "killed at its 3 s timeout" in md


@pytest.mark.interp
def test_the_shim_stands_in_for_an_install_on_a_bare_host(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOST_LIKE)
    env = {"PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c", "import sketchwalk.benchmarks"], cwd="/", env={**os.environ, **env}
    )
    assert probe.returncode != 0  # the host-like interpreter really lacks the project
    out = tmp_path / "out"
    proc = _run(out, "--stages", "a,e", "--smoke", "--device", "cpu", env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "using the shim" in proc.stdout
    stages = _report(out)["stages"]
    (check,) = [i for i in stages["a"]["items"] if "check" in i]
    assert check["shim"] and check["sketchwalk"].startswith(check["shim"])
    missing = {i["module"] for i in stages["a"]["items"] if "missing" in i}
    assert {"sqlalchemy", "duckdb"} <= missing and stages["a"]["status"] == "ok"
    assert stages["e"]["status"] == "ok" and stages["e"]["items"]
    assert not Path(check["shim"]).exists()  # removed at exit


@pytest.mark.parametrize(
    "args,message",
    [
        (["--stages", "a,x"], "unknown stage x; choose from a-e"),
        (["--timeout", "c=soon"], "--timeout wants STAGE=SECONDS"),
        (["--timeout", "z=10"], "--timeout wants STAGE=SECONDS"),
        (["--budget", "-1"], "--budget wants seconds"),
        (["--fast"], "unknown argument --fast"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, args, message):
    proc = _run(tmp_path, *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gpu_check.json").exists()


def test_stage_status_comes_from_the_rc_the_script_recorded(tmp_path):
    for letter, rc in {"a": "0", "b": "1", "c": "124", "d": "skip"}.items():
        (tmp_path / f"{letter}.rc").write_text(rc + "\n")
    (tmp_path / "c.log").write_text("compiling...\n")
    status = {s: gpu_check.stage_record(s, tmp_path)["status"] for s in gpu_check.STAGES}
    assert status == {"a": "ok", "b": "failed", "c": "timeout", "d": "skipped", "e": "not run"}
    assert gpu_check.stage_record("c", tmp_path)["tail"] == "compiling...\n"


def test_gpu_table_renders_a_report_and_refuses_other_files(tmp_path, capsys):
    report = {
        "date": "2026-01-02T03:04:05+00:00",
        "device": "cuda",
        "versions": {"gpu": "Some GPU", "driver": "1.2", "cuda": "13.0", "torch": "2.11"},
        "stages": {
            "c": {
                "name": "selection",
                "status": "ok",
                "seconds": 12,
                "timeout_s": 50,
                "errors": [],
                "items": [
                    {"seq_len": 32768, "config": "fast", "block_size": 64, "selection_ms": 1.5,
                     "dense_ms": 30.0, "ratio": 0.05, "meets_target": True, "target": 0.1}
                ],
            }
        },
    }  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert gpu_table.main([str(path)]) == 0
    md = capsys.readouterr().out
    assert md.splitlines()[0].startswith("GPU check: Some GPU, driver 1.2, CUDA 13.0, torch 2.11")
    assert "| 32768 | fast | 64 | 1.50 | 30.00 | **5.0%** |" in md
    assert "| c selection | ok | 12 | 50 |  |" in md
    path.write_text("[]")
    assert gpu_table.main([str(path)]) == 2
    assert "not a gpu_check.json" in capsys.readouterr().err


def test_gpu_check_py_without_a_subcommand_runs_the_whole_script(monkeypatch):
    """`gpu_check.py --smoke --device cpu` starts what `gpu_check.sh --smoke --device cpu` does;
    its exit code is the script's."""
    seen = []

    def fake_run(cmd, check):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    assert gpu_check.main(["--smoke", "--device", "cpu"]) == 3
    assert seen == [["bash", str(SCRIPT), "--smoke", "--device", "cpu"]]
    with pytest.raises(SystemExit):  # a subcommand still parses as one (here: missing --work)
        gpu_check.main(["merge"])
    assert len(seen) == 1
