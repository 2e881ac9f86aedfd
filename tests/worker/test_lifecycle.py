"""The one run lifecycle, with stand-in models: what it writes when a run fails before, during
and after the run row exists, and how it rides out a short database outage."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.request import RequestError, RunRequest
from sketchwalk.store import open_store
from sketchwalk.store.errors import JobLostError
from sketchwalk.worker import lifecycle
from sketchwalk.worker.lifecycle import Interrupted, JobClaim, execute, retrying

TEXT = "Blocks of tokens, layer after layer. " * 8


@pytest.fixture
def store(tmp_path):
    with open_store(str(tmp_path / "l.duckdb")) as s:
        yield s


def _request(**kw) -> RunRequest:
    return RunRequest(prompt=TEXT, config=SketchWalkConfig(block_size=16), **kw)


def _claimed(store):
    job_id = store.enqueue_job(_request().to_dict())
    job = store.claim_job("w")
    return JobClaim(job_id, job.claim)


def test_an_unloadable_model_fails_the_job_in_one_line_and_stores_no_run(store):
    claim = _claimed(store)

    def broken(model, dtype):
        raise RuntimeError("Error while deserializing header: HeaderTooLarge\nmore detail")

    with pytest.raises(RequestError, match="cannot load model 'default': RuntimeError"):
        execute(_request(), store, broken, job=claim)
    job = store.get_job(claim.job_id)
    assert job.status == "failed" and "HeaderTooLarge" in job.error and "\n" not in job.error
    assert store.run_ids() == []


def test_an_interrupt_during_the_run_marks_it_failed(store, tiny_model, models):
    def stop(fraction, message):
        raise Interrupted(15)

    with pytest.raises(Interrupted):
        execute(_request(), store, lambda m, d: models.get(tiny_model, d, "cpu"), stop)
    (run_id,) = store.run_ids()
    run = store.get_run(run_id)
    assert run["status"] == "failed" and run["error"].startswith("interrupted (SIGTERM)")


def test_a_lost_job_writes_nothing(store, tiny_model, models):
    claim = _claimed(store)
    store.recover_jobs("taken back")  # while the worker is busy

    with pytest.raises(JobLostError):
        execute(_request(), store, lambda m, d: models.get(tiny_model, d, "cpu"), job=claim)
    assert store.get_job(claim.job_id).error == "taken back"
    assert store.run_ids() == []  # the run row of a lost job is never made


def test_state_writes_are_retried_through_a_short_outage(monkeypatch):
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise sa.exc.OperationalError("UPDATE jobs", {}, Exception("server closed"))
        return "ok"

    assert retrying(flaky, "test") == "ok" and len(calls) == 3

    def broken():
        raise sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(sa.exc.IntegrityError):  # not an outage: no retry
        retrying(broken, "test")


@pytest.mark.parametrize(
    ("write", "clean_timing"),
    [("save_result", False), ("save_quality", True), ("save_speed", True)],
)
def test_a_save_that_meets_an_outage_is_saved_once_it_is_over(
    store, tiny_model, models, monkeypatch, write, clean_timing
):
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: None)
    claim = _claimed(store)
    real = getattr(type(store), write)
    failures = []

    def flaky(self, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise sa.exc.OperationalError("COMMIT", {}, Exception("terminating connection"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(store), write, flaky)
    request = _request(clean_timing=clean_timing)
    out = execute(request, store, lambda m, d: models.get(tiny_model, d, "cpu"), job=claim)
    assert failures and store.get_run(out.run_id)["status"] == "done"
    assert store.get_job(claim.job_id).status == "done"
    assert ("clean_sparse_prefill_ms" in store.get_run(out.run_id)["timings"]) is clean_timing
