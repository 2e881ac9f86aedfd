"""The attention benchmark and its CLI on tiny sizes: fields, ratios, errors, JSON."""

from __future__ import annotations

import json

import pytest
import torch

from sketchwalk.benchmarks.attention import decode_block_list, format_table, run_attention_bench
from sketchwalk.cli.main import main

KEYS = {
    "phase", "shape", "dtype", "device", "backend", "seq_len", "density", "achieved_density",
    "dense_ms", "sparse_ms", "overhead_ms", "kernel_ms", "speedup",
}  # fmt: skip


def _ratio_of_rounded(ratio: float, num: float, den: float) -> bool:
    """ratio == num / den where all three were rounded to 3 decimals: a sub-millisecond decode
    time carries a relative rounding error of up to 0.0005 / den (the test was flaky at 1%)."""
    want = num / den
    return abs(ratio - want) <= 1e-3 + want * (5e-4 / den + 5e-4 / num)


def test_rows_have_the_fields_and_consistent_ratios():
    rows = run_attention_bench(
        "cpu", [300], [0.2, 0.5], ["smollm2"], repeats=1, phases=("prefill", "decode")
    )
    assert [(r["phase"], r["density"]) for r in rows] == [
        ("prefill", 0.2), ("prefill", 0.5), ("decode", 0.2), ("decode", 0.5),
    ]  # fmt: skip
    for r in rows:
        assert r.keys() >= KEYS
        assert r["shape"] == "smollm2" and r["device"] == "cpu" and r["backend"] == "cpu"
        assert r["sparse_ms"] == pytest.approx(r["overhead_ms"] + r["kernel_ms"], abs=2e-3)
        assert _ratio_of_rounded(r["speedup"], r["dense_ms"], r["sparse_ms"])
        assert 0 < r["achieved_density"] <= 1
    assert rows[0]["overhead_ms"] > 0  # selection is timed, not skipped
    for r in rows:  # decode rows also time the session's paths: a kept selection, a fresh one
        for path in ("kept", "fresh"):
            assert (f"{path}_ms" in r) == (r["phase"] == "decode")
            if r["phase"] == "decode":
                assert _ratio_of_rounded(r[f"{path}_speedup"], r["dense_ms"], r[f"{path}_ms"])
    table = format_table(rows)
    assert table.splitlines()[0].split()[:3] == ["phase", "shape", "dtype"]
    assert len(table.splitlines()) == 2 + len(rows)


def test_decode_list_density_and_forced_blocks():
    idx, cnt = decode_block_list(100, 0.2, sink=3, window=5, device="cpu")
    ids = idx[0, 0, 0, : int(cnt)].tolist()
    assert ids == sorted(set(ids)) and len(ids) == 20
    assert {0, 1, 2, 95, 96, 97, 98, 99} <= set(ids)


def test_cli_json(capsys):
    argv = ["bench", "attention", "--seq-len", "200", "--density", "0.3", "--repeats", "1"]
    assert main([*argv, "--json", "--dtype", "bf16"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert len(rows) == 1 and rows[0]["dtype"] == "bfloat16" and rows[0].keys() >= KEYS
    machine = rows[0]["machine"]  # the numbers name their machine, in the rows and on stderr
    assert machine["isa"] == torch.backends.cpu.get_cpu_capability()
    assert machine["threads"] == torch.get_num_threads()
    assert f"{machine['isa']}, score product {machine['score_dtype']}" in out.err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--density", "0"], "density must be in (0, 1]"),
        (["--density", "1.5"], "density must be in (0, 1]"),
        (["--seq-len", "0"], "--seq-len must be in 1..2097152, got 0"),
        (["--repeats", "0"], "--repeats must be in 1..10000, got 0"),
        (["--device", "cuda"], "no CUDA device"),
        (["--layer-depth", "1.5"], "layer depth must be in [0, 1]"),
        (["--layer-depth", "nan"], "--layer-depth must be a finite number"),
    ],
)
def test_cli_bad_input_is_one_line(capsys, extra, message):
    assert main(["bench", "attention", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("depth, estimator", [(0.0, "sampled"), (0.69, "sampled"), (0.7, "mean")])
def test_cli_times_the_estimator_of_a_layer_at_the_given_depth(monkeypatch, depth, estimator):
    """The timed layer runs what a layer at --layer-depth of a model runs (sampled depth 0.7)."""
    import sketchwalk.benchmarks.attention as bench

    seen = []

    def fake(*args, knobs, **kw):
        seen.append(knobs)
        return []

    monkeypatch.setattr(bench, "run_attention_bench", fake)
    argv = ["bench", "attention", "--seq-len", "64", "--density", "0.2", "--repeats", "1"]
    assert (
        main([*argv, "--estimator", "mean", "--sampled-depth", "0.7", "--layer-depth", str(depth)])
        == 0
    )
    assert seen[0].estimator == estimator and seen[0].sampled_depth == 0.0
