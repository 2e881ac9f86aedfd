"""Jobs are fenced by their claim: a worker that lost its job (paused past the heartbeat
timeout, then resumed) can neither save its result nor move the job, and nothing it tried to
write lands. Recovery re-queues up to an attempt limit; staleness uses the database clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from store_fixtures import count_rows, make_result

from sketchwalk.store import schema as sch
from sketchwalk.store.db import db_utcnow
from sketchwalk.store.errors import JobLostError


def _claimed(store, worker: str = "w1"):
    job_id = store.enqueue_job({"prompt": "p"})
    job = store.claim_job(worker)
    assert job is not None and job.id == job_id and job.claim
    run_id = store.create_run({"prompt": "p", "job_id": job_id}, status="running")
    store.update_job(job_id, 0.5, "halfway", run_id=run_id, claim=job.claim)
    return job, run_id


def _age_heartbeat(store, job_id: str, seconds: float) -> None:
    with store.engine.begin() as conn:
        past = db_utcnow(conn) - timedelta(seconds=seconds)
        conn.execute(sch.jobs.update().where(sch.jobs.c.id == job_id).values(heartbeat_at=past))


def test_a_revived_worker_cannot_save_into_a_recovered_job(store):
    job, run_id = _claimed(store)
    _age_heartbeat(store, job.id, 600)
    assert store.recover_jobs("worker went silent", stale_after_s=60) == [job.id]
    assert store.get_job(job.id).status == "failed"
    # the paused worker wakes up and saves: refused, nothing written
    with pytest.raises(JobLostError):
        store.save_result(run_id, make_result(), job=(job.id, job.claim))
    assert store.get_job(job.id).status == "failed"
    assert store.get_run(run_id)["status"] == "failed"
    assert store.get_run(run_id)["error"] == "worker went silent"
    assert count_rows(store, run_id)["block_scores"] == 0
    for write in (
        lambda: store.update_job(job.id, 0.9, "late", claim=job.claim),
        lambda: store.finish_job(job.id, run_id=run_id, claim=job.claim),
    ):
        with pytest.raises(JobLostError):
            write()
    assert not store.heartbeat_job(job.id, "w1", claim=job.claim)
    assert not store.release_job(job.id, "w1", "bye", claim=job.claim)


def test_an_old_claim_cannot_touch_the_job_after_a_requeue(store):
    job, run_id = _claimed(store)
    _age_heartbeat(store, job.id, 600)
    assert store.recover_jobs("silent", stale_after_s=60, max_attempts=3) == [job.id]
    again = store.get_job(job.id)
    assert again.status == "queued" and again.message == "re-queued: silent"
    assert run_id not in store.run_ids()  # the half-made run is gone
    second = store.claim_job("w2")
    assert second.id == job.id and second.attempts == 2 and second.claim != job.claim
    with pytest.raises(JobLostError):
        store.update_job(job.id, 0.9, "late", claim=job.claim)
    new_run = store.create_run({"prompt": "p"}, status="running")
    store.save_result(new_run, make_result(), job=(job.id, second.claim))
    done = store.get_job(job.id)
    assert done.status == "done" and done.run_id == new_run and done.worker == "w2"


def test_jobs_out_of_attempts_fail_with_the_reason(store):
    job_id = store.enqueue_job({"prompt": "p"})
    for attempt in (1, 2):
        job = store.claim_job("w")
        assert job.attempts == attempt
        _age_heartbeat(store, job_id, 600)
        store.recover_jobs("died", stale_after_s=60, max_attempts=2)
    failed = store.get_job(job_id)
    assert failed.status == "failed" and failed.error.startswith("died (after 2 attempts)")


def test_recovery_leaves_a_job_whose_worker_beat_in_time(store):
    job, run_id = _claimed(store)
    assert store.recover_jobs("silent", stale_after_s=60) == []  # fresh heartbeat
    assert store.heartbeat_job(job.id, "w1", claim=job.claim)
    assert store.get_job(job.id).status == "running"
    assert store.get_run(run_id)["status"] == "running"


def test_stale_runs_fail_by_their_heartbeat(store):
    live = store.create_run({"prompt": "live"}, status="running")
    dead = store.create_run({"prompt": "dead"}, status="running")
    with store.engine.begin() as conn:
        past = db_utcnow(conn) - timedelta(seconds=600)
        conn.execute(sch.runs.update().where(sch.runs.c.id == dead).values(updated_at=past))
    assert store.touch_run(live)
    assert store.recover_runs("gone", stale_after_s=60) == [dead]
    assert store.get_run(dead)["status"] == "failed" and store.get_run(dead)["error"] == "gone"
    assert store.get_run(live)["status"] == "running"
    store.mark_failed(live, "x")
    assert not store.touch_run(live)


def test_heartbeats_use_the_database_clock(store):
    job, _ = _claimed(store)
    with store.engine.connect() as conn:
        now = db_utcnow(conn)
        beat = conn.execute(
            sa.select(sch.jobs.c.heartbeat_at).where(sch.jobs.c.id == job.id)
        ).scalar()
    assert abs((now - beat).total_seconds()) < 3600  # same clock and zone, not local time
    assert beat <= now
