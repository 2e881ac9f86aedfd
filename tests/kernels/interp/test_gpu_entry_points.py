"""The GPU path end to end on this CPU: the real entry points (`sketchwalk run`, recorded and
time-only, `sketchwalk calibrate` and a run on its layer profile, the worker's run and eval jobs,
`sketchwalk bench model --random-weights`) with the Triton kernels (interpreter) and no C
kernels (SKETCHWALK_NATIVE=0), in bfloat16 as a GPU runs them and in float32.

test_engine_device_path.py watches one layer; this watches everything around it on the device:
the runner's passes and metrics, the recorder's copies to the host, the clean timing passes, the
layer profile, the worker and the benchmark. A DeviceTrace (device_trace.py) holds the model's
weights and inputs as device tensors: no op of the project's may mix them with host tensors
(each such op crashed on an H200: "Expected all tensors to be on the same device"), and host
reads happen only at the sites listed here.
"""

from __future__ import annotations

import json

import pytest
from device_trace import DeviceTrace, OpCount, pause_in_triton_launches

from sketchwalk.cli.main import main
from sketchwalk.engine.method.sketch import (
    all_on_host as host_all,  # the CPU's own, before patching
)

PROMPT = "Sketch and walk over blocks of tokens, layer after layer, " * 12  # ~145 tokens
BLOCK = "16"  # 9-10 key blocks: a real selection (density < 1) in the two sparse layers

# host reads a selection needs per sparse layer, and once per forward step (as in
# test_engine_device_path.py)
PER_LAYER = {
    ("engine/method/select.py", "selection_from_mask"),
    ("kernels/take_best.py", "take_best_reference"),  # its topk's width
    ("engine/method/select.py", "row_budget_keep"),
    ("engine/method/select.py", "of"),
}
# once per pass or per generated token: the runner's and the clean passes' tokens and results
PER_RUN = {
    ("engine/run/runner.py", "greedy"),
    ("engine/run/runner.py", "_run"),
    ("engine/run/runner.py", "_compare"),  # the prompt's ids on the host, for the comparison
    ("engine/run/runner.py", "forward_hidden"),
    ("engine/run/runner.py", "judge_logits"),  # the dense judge's logits of the continuation
    ("engine/run/runner.py", "dense_key"),  # the prompt's ids hashed once: the dense side's memo
    ("engine/run/runner.py", "_token_records"),
    ("engine/run/timing.py", "one_pass"),
    ("engine/run/metrics.py", "_compare_logprobs"),  # the comparison's per-position results
    ("engine/run/metrics.py", "perplexity"),
    ("engine/hf/session.py", "density"),
}
# what recording costs (per layer, by design: the records are host numpy arrays)
RECORDER = {
    ("engine/run/recorder.py", "_np"),
    ("engine/run/recorder.py", "_group_and_mean"),  # a layer's per-group scores, copied
    ("kernels/lists.py", "density"),  # a selection's achieved density
}
CALIBRATION = {("engine/method/layer_profile.py", "allocate"), ("engine/method/select.py", "of")}
EVAL = {("eval/grid.py", "lm_sums"), ("eval/grid.py", "<listcomp>")}


@pytest.fixture(autouse=True)
def _device_path(monkeypatch, tmp_path):
    """As on a GPU: no C library, no free `.all()` reads (engine/method/sketch.py all_on_host), the
    Triton backend by device; no user layer profile unless a test calibrates one."""
    from sketchwalk.engine.method import blockstats, score_basis, sketch

    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path / "profiles"))
    for module in (sketch, score_basis, blockstats):
        monkeypatch.setattr(module, "all_on_host", lambda x: False)


class Traced:
    """A DeviceTrace over a block, the models it loads or builds put on the "device", and the
    Triton launches counted."""

    def __init__(self, monkeypatch) -> None:
        from sketchwalk.benchmarks import random_model
        from sketchwalk.engine.run import models

        self.trace = DeviceTrace()
        self.kernels = OpCount()  # never entered: it only counts the launches
        pause_in_triton_launches(monkeypatch, [self.trace, self.kernels])
        load, build = models.load_model, random_model.build_random_model

        def loaded(*args, **kwargs):
            lm = load(*args, **kwargs)
            self._put_model(lm.model)
            return lm

        def built(*args, **kwargs):
            rm = build(*args, **kwargs)
            self._put_model(rm.model)
            return rm

        monkeypatch.setattr(models, "load_model", loaded)
        monkeypatch.setattr(random_model, "build_random_model", built)

    def _put_model(self, model) -> None:
        """The model's weights onto the "device", once the load under the trace is checked
        complete (a buffer left unloaded reads as whatever memory held: NaN now and then)."""
        named = [*model.named_parameters(), *model.named_buffers()]
        bad = [n for n, x in named if x.is_floating_point() and not bool(x.isfinite().all())]
        assert not bad, f"not finite after loading: {bad}"
        self.trace.put([x for _, x in named])

    def __enter__(self) -> Traced:
        self.trace.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.trace.__exit__(*exc)

    def check(self, allowed: set) -> None:
        """No mixed-device op; host reads only at the allowed sites; both Triton kernels ran."""
        assert not self.trace.mixed, dict(self.trace.mixed)
        assert set(self.trace.reads) <= allowed, set(self.trace.reads) - allowed
        names = " ".join(self.kernels.launches)
        assert "block_sparse_prefill_kernel" in names, dict(self.kernels.launches)
        assert "block_sparse_decode" in names, dict(self.kernels.launches)


def _run(capsys, model_dir, db, *flags: str) -> dict:
    argv = ["run", PROMPT, "--model", str(model_dir), "--block-size", BLOCK]
    argv += ["--max-new-tokens", "3", "--db", str(db), "--json", *flags]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _stored(db, run_id: str) -> tuple[dict, object]:
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        return store.get_run(run_id), store.layer_stats(run_id)


def _sparse(summary: dict) -> None:
    """A real selection happened, in prefill and decode."""
    assert summary["prompt_tokens"] >= 9 * int(BLOCK)
    assert 0 < summary["density_achieved"] < 1 and 0 < summary["density_decode"] < 1


def test_calibrate_then_a_recorded_run_on_its_profile_in_bfloat16(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    text = tmp_path / "text.txt"
    text.write_text(PROMPT * 2, encoding="utf-8")
    db = tmp_path / "runs.duckdb"
    with Traced(monkeypatch) as calibrating:
        argv = ["calibrate", "--model", str(tiny_model_dir), "--dtype", "bfloat16"]
        assert main([*argv, "--text", str(text), "--tokens", "128", "--block-size", BLOCK]) == 0
    assert not calibrating.trace.mixed, dict(calibrating.trace.mixed)  # allocate() mixed them
    assert set(calibrating.trace.reads) <= CALIBRATION, dict(calibrating.trace.reads)
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1
    capsys.readouterr()

    with Traced(monkeypatch) as t:
        out = _run(capsys, tiny_model_dir, db, "--dtype", "bfloat16")
    t.check(PER_LAYER | PER_RUN | RECORDER)
    _sparse(out)
    assert out["layer_densities"] and set(out["layer_densities"]) == {"2", "3"}  # the profile's
    run, layers = _stored(db, out["run_id"])
    assert run["status"] == "done" and run["request"]["dtype"] == "bfloat16"
    phases = set(layers["phase"])
    assert {"prefill", "decode"} <= phases and any(":g" in p for p in phases)  # per-group rows
    sparse = layers[(layers["phase"] == "prefill") & ~layers["dense"]]
    assert len(sparse) == 2 and sparse["mass_recall"].between(0, 1.0001).all()
    assert "clean_sparse_prefill_ms" in run["timings"]


def test_a_time_only_run_in_bfloat16(tiny_model_dir, tmp_path, monkeypatch, capsys):
    db = tmp_path / "runs.duckdb"
    with Traced(monkeypatch) as t:
        out = _run(capsys, tiny_model_dir, db, "--dtype", "bfloat16", "--time-only")
    t.check(PER_LAYER | PER_RUN)  # no recorder: none of its copies
    _sparse(out)
    assert out["time_only"] and out["layer_records"] == 0
    run, layers = _stored(db, out["run_id"])
    assert run["status"] == "done" and layers.empty
    assert run["timings"]["clean_sparse_prefill_ms"] > 0
    assert run["timings"]["clean_sparse_decode_ms_per_token"] > 0


def _generated(db, run: dict, variant: str) -> list[tuple[int, float]]:
    """(token id, its log-probability) of one variant's generated tokens, in order."""
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        t = store.tokens(run["run_id"])
    t = t[(t["variant"] == variant) & (t["position"] >= run["prompt_tokens"])]
    return list(zip(t["token_id"], t["logprob"], strict=True))


def _agree_until_a_tie(a: list, b: list) -> bool:
    """Greedy generations agree token for token, or part only at a near tie: the two runs' own
    choices there nearly equally likely. True where they agree all the way.

    Why a tie is allowed: float32 matmuls on this CPU are not bitwise repeatable within one
    process (MKL's results depend on memory alignment), and a tiny random model's next-token
    logits are nearly flat, so even the dense model (SDPA in both runs) can pick another token."""
    for (ta, la), (tb, lb) in zip(a, b, strict=False):
        if ta != tb:
            assert la == pytest.approx(lb, abs=1e-3), (a, b)  # not a tie: a real difference
            return False
    return len(a) == len(b)


def test_a_recorded_float32_run_matches_the_cpu_kernels(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """The same run through the C kernels on the CPU: the same selections and teacher-forced
    metrics (float32, so the kernels differ by rounding only), and the same generations up to a
    near tie."""
    from sketchwalk.engine.method import blockstats, score_basis, sketch

    with Traced(monkeypatch) as t:
        dev = _run(capsys, tiny_model_dir, tmp_path / "dev.duckdb")
    t.check(PER_LAYER | PER_RUN | RECORDER)
    _sparse(dev)
    monkeypatch.setenv("SKETCHWALK_NATIVE", "1")
    monkeypatch.setenv("SKETCHWALK_KERNEL", "cpu")
    for module in (sketch, score_basis, blockstats):  # the CPU path as it is
        monkeypatch.setattr(module, "all_on_host", host_all)
    cpu = _run(capsys, tiny_model_dir, tmp_path / "cpu.duckdb")
    assert dev["prompt_tokens"] == cpu["prompt_tokens"]
    for key in ("density_achieved", "density_achieved_all_layers"):
        assert dev[key] == pytest.approx(cpu[key], abs=1e-9), key
    for key in ("kl_mean", "ppl_sparse"):
        assert dev[key] == pytest.approx(cpu[key], rel=1e-3, abs=1e-6), key
    # a prompt position's top-1 may flip at a near tie too: at most two of them
    assert dev["top1_agreement"] == pytest.approx(
        cpu["top1_agreement"], abs=2.5 / dev["prompt_tokens"]
    )
    _agree_until_a_tie(
        _generated(tmp_path / "dev.duckdb", dev, "dense"),
        _generated(tmp_path / "cpu.duckdb", cpu, "dense"),
    )
    same = _agree_until_a_tie(
        _generated(tmp_path / "dev.duckdb", dev, "sparse"),
        _generated(tmp_path / "cpu.duckdb", cpu, "sparse"),
    )
    _, dev_layers = _stored(tmp_path / "dev.duckdb", dev["run_id"])
    _, cpu_layers = _stored(tmp_path / "cpu.duckdb", cpu["run_id"])
    if not same:  # decode ran over other tokens: only prefill's selections compare
        dev_layers = dev_layers[dev_layers["phase"] != "decode"]
        cpu_layers = cpu_layers[cpu_layers["phase"] != "decode"]
    else:
        assert dev["sparse_text"] == cpu["sparse_text"]
        assert dev["density_decode"] == pytest.approx(cpu["density_decode"], abs=1e-9)
        # a mean of 3 tokens' KL (~2e-4 here): the MKL noise above is a larger part of it
        assert dev["gen_kl_mean"] == pytest.approx(cpu["gen_kl_mean"], rel=0.05)
    key = ["phase", "step", "layer"]
    a, b = dev_layers.sort_values(key), cpu_layers.sort_values(key)
    assert len(a) == len(b) > 0
    assert list(a["density_achieved"].fillna(-1)) == list(b["density_achieved"].fillna(-1))


def test_the_worker_runs_a_run_job_and_an_eval_job_in_bfloat16(tiny_model, tmp_path, monkeypatch):
    """The app's two jobs: a run (recorded) and an eval over an lm text (its teacher-forced
    sums) and a retrieval prompt."""
    from sketchwalk.eval.job import eval_request
    from sketchwalk.store import open_store
    from sketchwalk.worker.loop import ModelCache, Worker, make_request

    with open_store(str(tmp_path / "w.duckdb")) as store:
        config = {"block_size": int(BLOCK)}
        run_job = store.enqueue_job(make_request(PROMPT, config, tiny_model, 2, "bfloat16"))
        small = {"lengths": [144], "depths": [0.5], "methods": ["sketchwalk"], "new_tokens": 2}
        eval_job = store.enqueue_job(
            eval_request(
                model=tiny_model, dtype="bfloat16", tasks="lm:gpl-3,retrieval:passkey",
                densities=[0.3], block_size=int(BLOCK), **small,
            )
        )  # fmt: skip
        with Traced(monkeypatch) as t:
            done = Worker(store, models=ModelCache(1), device="cpu").drain()
        assert done == [run_job, eval_job]
        for job_id in done:
            job = store.get_job(job_id)
            assert job.status == "done" and job.error is None, job.error
        run = store.get_run(store.get_job(run_job).run_id)
        assert run["status"] == "done" and not store.layer_stats(run["id"]).empty
        rows = store.eval_results()
        assert set(rows["task"]) == {"lm", "retrieval"}
        assert rows.loc[rows["task"] == "lm", "kl_mean"].notna().all()
    t.check(PER_LAYER | PER_RUN | RECORDER | EVAL)


def test_bench_model_on_random_weights_in_bfloat16(monkeypatch, capsys):
    argv = ["bench", "model", "--random-weights", "tiny", "--dtype", "bfloat16", "--json"]
    argv += ["--seq-len", "144", "--block-size", BLOCK, "--new-tokens", "2", "--repeats", "1"]
    with Traced(monkeypatch) as t:
        assert main(argv) == 0
    t.check(PER_LAYER | PER_RUN)
    (row,) = json.loads(capsys.readouterr().out)
    assert row["random_weights"] and row["dtype"] == "bfloat16" and row["seq_len"] == 144
    assert row["dense_prefill_ms"] > 0 and row["sparse_prefill_ms"] > 0
    assert row["sparse_decode_ms"] > 0 and row["dense_stages_ms"]["prefill_attention"] > 0
    assert {"prefill_sketch", "prefill_select", "prefill_attention"} <= set(row["sparse_stages_ms"])
