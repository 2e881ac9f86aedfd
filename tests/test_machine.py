"""The machine behind a timing: what it reads, what it falls back to, how it is shown."""

from __future__ import annotations

import torch

from sketchwalk.engine.method.estimators.sampled import score_dtype
from sketchwalk.machine import cpu_model, describe, machine_info, run_fields


def test_cpu_model_reads_the_first_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n\n"
        "processor\t: 1\nmodel name\t: something else\n"
    )
    assert cpu_model(str(info)) == "AMD EPYC 9B14"


def test_cpu_model_falls_back_without_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "x86_64")
    assert cpu_model(str(tmp_path / "missing")) == "x86_64"
    empty = tmp_path / "empty"
    empty.write_text("model name\t:\n")  # a blank name is no name
    monkeypatch.setattr("platform.processor", lambda: "")
    assert cpu_model(str(empty)) == "unknown"


def test_info_follows_the_score_knob_and_the_thread_count():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        info = machine_info("cpu", "float32")
    finally:
        torch.set_num_threads(threads)
    assert info["threads"] == 1 and info["score_dtype"] == "float32"
    assert machine_info("cpu", "bfloat16")["score_dtype"] == "bfloat16"
    auto = str(score_dtype("auto", "cpu")).removeprefix("torch.")
    assert machine_info()["score_dtype"] == auto
    assert "gpu" not in info


def test_describe_names_every_field():
    info = {"cpu": "AMD EPYC", "cores": 2, "threads": 2, "isa": "AVX2",
            "score_dtype": "float32", "c_kernels": "on", "torch": "2.13.0"}  # fmt: skip
    line = describe(info)
    assert line == (
        "machine: AMD EPYC, 2 cores, 2 threads, AVX2, score product float32, C kernels on, "
        "torch 2.13.0"
    )
    old = {k: v for k, v in info.items() if k != "c_kernels"}  # JSON rows from before it
    assert describe(old) == line.replace("C kernels on, ", "")
    assert describe({**info, "gpu": "NVIDIA H200"}).startswith("machine: NVIDIA H200, AMD EPYC")


def test_run_fields_are_strings_for_the_stored_versions():
    fields = run_fields("cpu")
    assert set(fields) == {"cpu", "isa", "threads", "c_kernels"}  # no GPU for a CPU run
    assert all(isinstance(v, str) and v for v in fields.values())
    assert fields["threads"] == str(torch.get_num_threads())
    assert machine_info("cpu").items() >= {"cpu": fields["cpu"], "isa": fields["isa"]}.items()
    assert fields["c_kernels"] == "on"  # this machine has a compiler (.ci/run installs one)


def test_c_kernels_say_off_where_they_are_turned_off(monkeypatch):
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert run_fields("cpu")["c_kernels"] == "off"
    assert machine_info("cpu")["c_kernels"] == "off"
