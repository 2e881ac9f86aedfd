"""A run saved quality first: `save_quality` stores every row with the run still running, and
`save_speed` merges the clean timings and ends run and job. Both are fenced by the job's claim
(a lost job writes nothing)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from store_fixtures import REQUEST, count_rows, make_result

from sketchwalk.store import schema as sch
from sketchwalk.store.db import db_utcnow
from sketchwalk.store.errors import InvalidResultError, JobLostError, UnknownRunError
from sketchwalk.store.runs import SPEED_PENDING

CLEAN = {"clean_sparse_prefill_ms": 4.0, "clean_dense_prefill_ms": 6.0, "clean_repeats": 3}


def _started(store, worker: str = "w1") -> tuple[tuple[str, str], str]:
    """A claimed job and its run, linked through the claim, as the lifecycle makes them."""
    job_id = store.enqueue_job(dict(REQUEST))
    job = store.claim_job(worker)
    fence = (job_id, job.claim)
    return fence, store.create_run(dict(REQUEST), status="running", job=fence)


def _age_heartbeat(store, job_id: str, seconds: float = 600) -> None:
    with store.engine.begin() as conn:
        past = db_utcnow(conn) - timedelta(seconds=seconds)
        conn.execute(sch.jobs.update().where(sch.jobs.c.id == job_id).values(heartbeat_at=past))


def test_quality_half_then_speed_half(store):
    fence, run_id = _started(store)
    result = make_result()
    store.save_quality(run_id, result, job=fence, progress=0.4)
    run, job = store.get_run(run_id), store.get_job(fence[0])
    assert run["status"] == "running" and run["finished_at"] is None
    assert run["metrics"]["kl"] == 0.01 and run["timings"] == result.timings
    assert len(store.layer_stats(run_id)) == len(result.layers)
    assert count_rows(store, run_id)["block_scores"] > 0
    assert (job.status, job.progress, job.message) == ("running", 0.4, SPEED_PENDING)
    assert job.finished_at is None and job.run_id == run_id

    store.save_speed(run_id, CLEAN, job=fence)
    run, job = store.get_run(run_id), store.get_job(fence[0])
    assert run["status"] == "done" and run["timings"] == {**result.timings, **CLEAN}
    assert run["finished_at"] is not None and run["error"] is None
    assert (job.status, job.progress, job.message) == ("done", 1.0, "done")
    assert job.finished_at is not None
    assert len(store.layer_stats(run_id)) == len(result.layers)  # the quality rows stay


def test_failed_clean_passes_end_the_run_done_with_a_note(store):
    fence, run_id = _started(store)
    store.save_quality(run_id, make_result(), job=fence)
    why = "the clean timing passes failed: RuntimeError: out of memory"
    store.save_speed(run_id, {}, job=fence, failed=why)
    run = store.get_run(run_id)
    assert run["status"] == "done" and run["timings"]["clean_failed"] == why
    assert run["timings"]["dense_ms"] == 12.0  # the recorded timings are kept
    assert store.get_job(fence[0]).status == "done"


def test_a_lost_claim_writes_neither_half(store):
    fence, run_id = _started(store)
    _age_heartbeat(store, fence[0])
    assert store.recover_jobs("went silent", stale_after_s=60) == [fence[0]]
    with pytest.raises(JobLostError):
        store.save_quality(run_id, make_result(), job=fence)
    assert count_rows(store, run_id)["layer_stats"] == 0
    assert store.get_run(run_id)["metrics"] is None
    with pytest.raises(JobLostError):
        store.save_speed(run_id, CLEAN, job=fence)
    run, job = store.get_run(run_id), store.get_job(fence[0])
    assert run["status"] == "failed" and run["error"] == "went silent" and not run["timings"]
    assert job.status == "failed" and job.error == "went silent"


def test_a_job_lost_between_the_halves_keeps_the_new_owners_state(store):
    fence, run_id = _started(store)
    store.save_quality(run_id, make_result(), job=fence)
    _age_heartbeat(store, fence[0])
    assert store.recover_jobs("silent", stale_after_s=60, max_attempts=3) == [fence[0]]
    assert run_id not in store.run_ids()  # re-queued: the unfinished run is dropped whole
    second = store.claim_job("w2")
    with pytest.raises(JobLostError):
        store.save_speed(run_id, CLEAN, job=fence)
    again = store.get_job(fence[0])
    assert (again.status, again.worker, again.claim) == ("running", "w2", second.claim)


def test_speed_is_refused_for_a_run_not_waiting_for_it(store):
    done = store.create_run(dict(REQUEST), status="running")
    store.save_result(done, make_result())
    with pytest.raises(InvalidResultError, match="is done, not waiting"):
        store.save_speed(done, CLEAN)
    assert "clean_repeats" not in store.get_run(done)["timings"]
    with pytest.raises(UnknownRunError):
        store.save_speed("0" * 36, CLEAN)
    running = store.create_run(dict(REQUEST), status="running")
    with pytest.raises(InvalidResultError, match="takes a dict"):
        store.save_speed(running, [1.0])  # type: ignore[arg-type]
    assert store.get_run(running)["status"] == "running"
