"""The worker: jobs run through the real engine, fail with readable messages, survive restarts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_helpers import tiny_config

from sketchwalk.settings import load
from sketchwalk.store import open_store
from sketchwalk.worker.loop import RESTART_REASON, Worker, make_request

HERE = Path(__file__).resolve().parent

TEXT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "w.duckdb"))
    yield s
    s.close()


def test_job_runs_stores_the_run_and_reuses_the_model(store, tiny_model, models):
    w = Worker(store, models=models)
    before = models.loads
    a = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    b = store.enqueue_job(  # time only: the run and its timings, no per-layer records
        make_request(TEXT, tiny_config(density=0.5), tiny_model, 2, time_only=True)
    )
    assert w.drain() == [a, b]
    assert models.loads - before <= 1  # loaded at most once (the session may have it already)
    for job_id in (a, b):
        job = store.get_job(job_id)
        assert job.status == "done" and job.progress == 1.0 and job.error is None
        run = store.get_run(job.run_id)
        assert run["status"] == "done" and run["prompt_tokens"] > 16
        assert run["request"]["job_id"] == job_id
    assert store.get_run(store.get_job(b).run_id)["config"]["density"] == 0.5
    assert not store.layer_stats(store.get_job(a).run_id).empty
    timed = store.get_run(store.get_job(b).run_id)
    assert timed["request"]["time_only"] is True and store.layer_stats(timed["id"]).empty
    assert timed["timings"]["clean_sparse_prefill_ms"] > 0 and timed["sparse_text"] is not None
    assert timed["metrics"]["density_achieved"] is not None and len(store.tokens(timed["id"]))
    recorded = store.get_run(store.get_job(a).run_id)["timings"]  # clean timing on by default
    assert "clean_sparse_prefill_ms" in recorded and "recording_overhead_prefill_ms" in recorded


@pytest.mark.parametrize(
    ("request_changes", "message"),
    [
        ({"config": {"density": 0.0}}, "density must be > 0"),
        ({"config": {"bogus": 1}}, "unknown config keys: bogus"),
        ({"prompt": "   "}, "the prompt is empty"),
        ({"max_new_tokens": 10_000}, "max new tokens must be between 0 and"),
        ({"model": "/nonexistent/model-folder"}, "cannot load model"),
        ({"time_only": "yes"}, "time only must be true or false"),
        ({"time_only": True, "clean_timing": False}, "always times a clean pass"),
    ],
)
def test_bad_input_fails_the_job_with_one_line_and_stores_no_run(
    store, tiny_model, models, request_changes, message
):
    req = make_request(TEXT, tiny_config(), tiny_model, 2)
    if "config" in request_changes:
        req["config"] = {**req["config"], **request_changes.pop("config")}
    req.update(request_changes)
    job_id = store.enqueue_job(req)
    Worker(store, models=models).drain()
    job = store.get_job(job_id)
    assert job.status == "failed"
    assert message in job.error and "\n" not in job.error and "Traceback" not in job.error
    assert store.list_runs().empty


def test_prompt_over_the_configured_limit_is_refused(store, tiny_model, models, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_MAX_PROMPT_TOKENS", "64")
    job_id = store.enqueue_job(make_request(TEXT * 3, tiny_config(), tiny_model, 2))
    Worker(store, settings=load(), models=models).drain()
    job = store.get_job(job_id)
    assert job.status == "failed" and "exceeds the limit of 64 tokens" in job.error


def test_a_crash_inside_the_run_fails_job_and_run_but_not_the_worker(
    store, tiny_model, models, monkeypatch
):
    import sketchwalk.engine.run.runner as runner

    def boom(*args, **kwargs):
        raise RuntimeError("out of memory\nsecond line")

    monkeypatch.setattr(runner, "run", boom)
    job_id = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    w = Worker(store, models=models)
    assert w.drain() == [job_id]
    job = store.get_job(job_id)
    assert job.status == "failed" and job.error == "the run failed: RuntimeError: out of memory"
    assert store.get_run(job.run_id)["status"] == "failed"


def _left_running(store, tiny_model) -> tuple[str, str, str]:
    """A job a dead process left 'running' with a half-made run, and one still queued."""
    running = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    claimed = store.claim_job("app@old")
    assert claimed.id == running and claimed.attempts == 1 and claimed.claim
    run_id = store.create_run(
        {"prompt": TEXT, "model": tiny_model, "config": tiny_config()}, status="running"
    )
    store.update_job(running, 0.4, "sparse prefill", run_id=run_id)
    queued = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    return running, run_id, queued


def _serve_until_done(w: Worker, store, jobs: list[str]) -> None:
    w.start()  # a new app process starting up
    try:
        deadline = time.monotonic() + 120
        while (
            any(store.get_job(j).status in ("queued", "running") for j in jobs)
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    finally:
        w.stop(timeout=60)


def test_restart_requeues_running_jobs_and_resumes_queued_ones(store, tiny_model, models):
    running, run_id, queued = _left_running(store, tiny_model)
    w = Worker(store, models=models)
    _serve_until_done(w, store, [running, queued])
    assert w.recovered == [running]
    again = store.get_job(running)
    assert again.status == "done" and again.attempts == 2 and again.run_id != run_id
    assert run_id not in store.run_ids()  # the half-made run was dropped, not left behind
    assert store.get_run(again.run_id)["status"] == "done"
    assert store.get_job(queued).status == "done"
    assert not w.alive


def test_restart_fails_a_job_out_of_attempts(store, tiny_model, models, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_JOB_MAX_ATTEMPTS", "1")
    running, run_id, queued = _left_running(store, tiny_model)
    w = Worker(store, settings=load(), models=models)
    _serve_until_done(w, store, [queued])
    assert w.recovered == [running]
    dead = store.get_job(running)
    assert dead.status == "failed" and dead.error.startswith(RESTART_REASON)
    assert "after 1 attempts" in dead.error
    assert store.get_run(run_id)["status"] == "failed"
    assert store.get_job(queued).status == "done"


def test_wake_runs_a_new_job_without_waiting_for_the_poll(store, tiny_model, models, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_POLL_S", "600")
    w = Worker(store, settings=load(), models=models).start()
    try:
        time.sleep(0.3)  # the loop is now waiting on the (10 minute) poll
        job_id = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 1))
        w.wake()
        deadline = time.monotonic() + 120
        while store.get_job(job_id).status != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.get_job(job_id).status == "done"
    finally:
        w.stop(timeout=60)


def test_progress_writes_are_throttled_and_fenced(store, monkeypatch):
    from sketchwalk.store.errors import JobLostError
    from sketchwalk.worker import context

    monkeypatch.setattr(context, "PROGRESS_EVERY_S", 60.0)
    job_id = store.enqueue_job({"prompt": "p"})
    ctx = context.JobContext(Worker(store), store.claim_job("w"))
    for i in range(100):
        ctx.progress(i / 100, f"m{i}")
    job = store.get_job(job_id)
    assert (job.progress, job.message) == (0.0, "m0")  # one write, not a hundred
    store.recover_jobs("taken over", max_attempts=5)  # the claim is gone
    with pytest.raises(JobLostError):
        ctx.report(0.5, "late")
    assert store.get_job(job_id).message == "re-queued: taken over"


@pytest.mark.heavy
def test_worker_cli_refuses_a_duckdb_file_held_by_another_process(tmp_path):
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from sketchwalk.store import open_store; s = open_store(sys.argv[1]); "
            "s.list_runs(); print('ready', flush=True); time.sleep(60)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        out = subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", "worker", "--db", str(db), "--once"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "open in another process" in out.stderr


@pytest.mark.heavy
def test_worker_cli_once_runs_queued_jobs(tmp_path, tiny_model):
    db = str(tmp_path / "cli.duckdb")
    with open_store(db) as s:
        job_id = s.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 1))
    out = subprocess.run(
        [sys.executable, "-m", "sketchwalk.cli.main", "worker", "--db", db, "--once"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "ran 1 job(s), 0 failed" in out.stderr
    with open_store(db) as s:
        assert s.get_job(job_id).status == "done"


def test_app_command_builds_a_headless_streamlit_command_and_checks_the_store(tmp_path):
    from sketchwalk.cli import app as cmd_app

    argv = cmd_app.streamlit_argv(8599, "localhost")
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4].endswith("streamlit_app.py")
    assert "--server.headless=true" in argv and "--server.port=8599" in argv
    assert "--runner.postScriptGC=false" in argv  # a full GC per rerun starves the worker
    bad = tmp_path / "not-a-db.duckdb"
    bad.write_text("hello")
    out = subprocess.run(
        [sys.executable, "-m", "sketchwalk.cli.main", "app", "--db", str(bad), "--port", "8599"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "not a valid DuckDB database file" in out.stderr


def test_a_job_for_an_unlisted_model_fails_and_stores_nothing(
    store, tiny_model, models, tmp_path, monkeypatch
):
    settings = tmp_path / "app.toml"
    settings.write_text(f'[models]\n[models.allowed]\ntiny = "{tiny_model}"\n')
    monkeypatch.setenv("SKETCHWALK_APP_CONFIG", str(settings))
    bad = store.enqueue_job(make_request(TEXT, tiny_config(), "/etc", 2))
    good = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    Worker(store, models=models).drain()
    refused = store.get_job(bad)
    assert refused.status == "failed" and "not on this deployment's list" in refused.error
    assert refused.run_id is None
    assert store.get_job(good).status == "done"
    assert len(store.run_ids()) == 1


def _listed_only(tmp_path, monkeypatch, tiny_model: str) -> None:
    """A deployment whose list holds the tiny model only (its default too)."""
    settings = tmp_path / "app.toml"
    settings.write_text(f'[models]\n[models.allowed]\ntiny = "{tiny_model}"\n')
    monkeypatch.setenv("SKETCHWALK_APP_CONFIG", str(settings))


def test_every_job_kind_is_held_to_the_list_and_refusals_reveal_nothing(
    store, tiny_model, models, tmp_path, monkeypatch
):
    import shutil

    from sketchwalk.eval.job import eval_request

    elsewhere = tmp_path / "unlisted-but-real"
    shutil.copytree(tiny_model, elsewhere)  # a loadable model that is not on the list
    _listed_only(tmp_path, monkeypatch, tiny_model)
    before = models.loads
    refused = [
        store.enqueue_job(eval_request(model=str(elsewhere), lengths=[256], new_tokens=2)),
        store.enqueue_job(eval_request(model="/no/such/folder", lengths=[256], new_tokens=2)),
        store.enqueue_job(make_request(TEXT, tiny_config(), str(elsewhere), 2)),
        store.enqueue_job(make_request(TEXT, tiny_config(), "/no/such/folder", 2)),
        store.enqueue_job({"kind": "eval", "model": ["not", "a", "name"]}),
    ]
    Worker(store, models=models).drain()
    errors = {store.get_job(j).error for j in refused[:4]}
    assert len(errors) == 1  # the same line whether the path exists or not, for both kinds
    (error,) = errors
    assert "not on this deployment's list" in error
    assert "unlisted" not in error and "/no/such" not in error
    assert all(store.get_job(j).status == "failed" for j in refused)
    assert models.loads == before  # nothing was loaded to find out
    assert store.eval_results().empty and store.run_ids() == []


def test_a_job_naming_no_model_gets_the_deployments_default(
    store, tiny_model, models, tmp_path, monkeypatch
):
    _listed_only(tmp_path, monkeypatch, tiny_model)
    job_id = store.enqueue_job(make_request(TEXT, tiny_config(), None, 2))
    Worker(store, models=models).drain()
    job = store.get_job(job_id)
    assert job.status == "done", job.error
    run = store.get_run(job.run_id)  # the listed default, never the engine's unlisted one
    assert run["model_id"] == tiny_model and run["request"]["model"] == tiny_model


@pytest.mark.heavy
def test_a_standalone_worker_sizes_torch_threads(tmp_path):
    db = str(tmp_path / "t.duckdb")
    with open_store(db) as s:
        job_id = s.enqueue_job({"prompt": "threads"})
    env = {
        **os.environ,
        "SKETCHWALK_THREADS": "3",  # torch's own default is the core count
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),  # worker_jobs, frozen_save
    }
    cmd = [sys.executable, "-m", "sketchwalk.cli.main", "worker", "--db", db, "--once"]
    proc = subprocess.run(
        [*cmd, "--runner", "worker_jobs:threads"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    with open_store(db) as s:
        run = s.get_run(s.get_job(job_id).run_id)
    assert run["model_id"] == "threads=3"


@pytest.mark.parametrize("backend", ["duckdb", "postgresql"])
def test_two_workers_race_on_an_eval_job_and_only_its_owner_writes(
    backend, tiny_model, models, tmp_path, request
):
    from sketchwalk.eval.job import eval_request
    from sketchwalk.store.errors import JobLostError

    url = (
        str(tmp_path / "race.duckdb") if backend == "duckdb" else request.getfixturevalue("pg_url")
    )
    small = {"lengths": [256], "depths": [0.5], "methods": ["sketchwalk"], "densities": [0.2, 0.4]}
    with open_store(url) as store:
        job_id = store.enqueue_job(
            eval_request(model=tiny_model, new_tokens=2, block_size=16, **small)
        )
        a = Worker(store, name="a", models=models)
        b = Worker(store, name="b", models=models)
        stalled = store.claim_job("a")  # a takes the job, then stalls (paused, swapped out)
        assert store.recover_jobs("a went silent", worker="a", max_attempts=3) == [job_id]
        assert b.run_once() == job_id  # b claims it again and runs it to the end
        done = store.get_job(job_id)
        rows = store.eval_results()
        with pytest.raises(JobLostError):  # a wakes up and runs its lost claim: refused at once
            a.runner(a, stalled)
        after = store.get_job(job_id)
        assert store.eval_results().equals(rows)  # a stored nothing
    assert (done.status, done.worker, done.attempts, done.error) == ("done", "b", 2, None)
    assert (after.status, after.worker, after.finished_at) == ("done", "b", done.finished_at)
    assert len(rows) == 2 and rows["eval_id"].nunique() == 1  # one grid: 2 densities


def test_a_new_job_kind_is_one_function_and_one_registry_line(store, monkeypatch):
    from sketchwalk.worker import kinds

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setitem(kinds.KINDS, "echo", "worker_jobs:echo_kind")  # the one line
    echo = store.enqueue_job({"kind": "echo", "text": "hello"})
    unknown = store.enqueue_job({"kind": "frobnicate", "prompt": "x"})
    Worker(store).drain()
    job = store.get_job(echo)
    assert job.status == "done" and store.get_run(job.run_id)["prompt"] == "hello"
    refused = store.get_job(unknown)
    assert refused.status == "failed" and "unknown job kind 'frobnicate'" in refused.error
    assert "echo" in refused.error and "eval" in refused.error and "\n" not in refused.error


def test_a_run_job_stores_its_quality_half_before_its_clean_passes(
    store, tiny_model, models, monkeypatch
):
    """The first write: metrics, layer stats (no dense time in the sparse layers' records), run
    still running, the job saying the clean passes are under way; the second: clean timings and
    each sparse layer's dense time from the clean dense passes merged in, run and job done."""
    import sketchwalk.engine.run.runner as runner
    from sketchwalk.store.runs import SPEED_PENDING

    real = runner.speed_timings
    seen: dict = {}

    def after_the_first_write(lm, prompt, cfg, opts, recorded, progress=None, layer_dense=None):
        (job,) = store.list_jobs()
        seen.update(job=job, run=store.get_run(job.run_id), stats=store.layer_stats(job.run_id))
        return real(lm, prompt, cfg, opts, recorded, progress, layer_dense)

    monkeypatch.setattr(runner, "speed_timings", after_the_first_write)
    job_id = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    Worker(store, models=models).drain()
    first, job = seen["run"], seen["job"]
    assert first["status"] == "running" and first["metrics"]["kl_mean"] is not None
    assert not seen["stats"].empty and first["timings"]["sparse_prefill_ms"] > 0
    assert not any(k.startswith("clean_") for k in first["timings"])
    assert (job.status, job.message) == ("running", SPEED_PENDING) and 0 < job.progress < 1
    done, finished = store.get_run(first["id"]), store.get_job(job_id)
    assert done["status"] == "done" and done["timings"]["clean_sparse_prefill_ms"] > 0
    assert done["timings"]["sparse_prefill_ms"] == first["timings"]["sparse_prefill_ms"]
    assert "recording_overhead_prefill_ms" in done["timings"]
    assert (finished.status, finished.progress, finished.error) == ("done", 1.0, None)
    assert len(store.layer_stats(first["id"])) == len(seen["stats"])

    def sparse_prefill(stats):
        return stats[(stats["phase"] == "prefill") & ~stats["dense"].astype(bool)]

    assert not sparse_prefill(seen["stats"]).empty
    assert sparse_prefill(seen["stats"])["t_dense_ms"].isna().all()
    assert (sparse_prefill(store.layer_stats(first["id"]))["t_dense_ms"] > 0).all()


def test_failed_clean_passes_keep_the_quality_half_and_say_so(
    store, tiny_model, models, monkeypatch
):
    import sketchwalk.engine.run.runner as runner

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory\nsecond line")

    monkeypatch.setattr(runner, "speed_timings", broken)
    job_id = store.enqueue_job(make_request(TEXT, tiny_config(), tiny_model, 2))
    Worker(store, models=models).drain()
    job = store.get_job(job_id)
    run = store.get_run(job.run_id)
    assert job.status == "done" and job.error is None
    assert run["status"] == "done" and run["metrics"]["kl_mean"] is not None
    assert run["timings"]["clean_failed"] == (
        "the clean timing passes failed: RuntimeError: out of memory"
    )
    assert not store.layer_stats(job.run_id).empty


def test_a_warm_worker_loads_the_default_model_before_any_job(
    store, tiny_model, tmp_path, monkeypatch
):
    """start(warm=True) (what `sketchwalk app` asks for) loads the deployment's default model
    before a job comes; the first job then finds it loaded. A model that cannot load is only
    logged: the worker serves on."""
    from sketchwalk.worker.loop import ModelCache

    models = ModelCache(2)  # its own: loads counted from zero
    _listed_only(tmp_path, monkeypatch, tiny_model)
    worker = Worker(store, models=models).start(warm=True)
    try:
        deadline = time.monotonic() + 120
        while models.loads == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert models.loads == 1
        job_id = store.enqueue_job(make_request(TEXT, tiny_config(), None, 2))
        worker.wake()
        while store.get_job(job_id).status not in ("done", "failed"):
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.05)
        assert store.get_job(job_id).status == "done" and models.loads == 1
    finally:
        worker.stop()
    broken = tmp_path / "broken.toml"
    broken.write_text('[models]\n[models.allowed]\nbad = "/no/such/model"\n')
    monkeypatch.setenv("SKETCHWALK_APP_CONFIG", str(broken))
    other = Worker(store, models=models)
    other.warm()  # logged, not raised
    assert models.loads == 1
