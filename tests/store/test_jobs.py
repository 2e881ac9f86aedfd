"""The job queue: FIFO claims, no double claims across threads, progress/heartbeat, finishing,
and recovery of jobs whose worker died."""

from __future__ import annotations

import threading
import time

import pytest
from store_fixtures import REQUEST, saved_run

from sketchwalk.store import Job, UnknownJobError


def test_enqueue_and_claim_in_order(store):
    first = store.enqueue_job({"prompt": "one"})
    time.sleep(0.002)
    second = store.enqueue_job({"prompt": "two"})
    job = store.claim_job("w1")
    assert isinstance(job, Job)
    assert job.id == first and job.status == "running" and job.worker == "w1"
    assert job.request == {"prompt": "one"}
    assert job.started_at is not None and job.heartbeat_at is not None
    assert store.claim_job("w2").id == second
    assert store.claim_job("w3") is None


def test_progress_heartbeat_and_finish(store):
    job_id = store.enqueue_job(dict(REQUEST))
    claimed = store.claim_job("w")
    time.sleep(0.002)
    run_id = store.create_run(dict(REQUEST), status="running")
    store.update_job(job_id, 0.4, "layer 12/30", run_id=run_id)
    job = store.get_job(job_id)
    assert job.progress == pytest.approx(0.4) and job.message == "layer 12/30"
    assert job.run_id == run_id
    assert job.heartbeat_at > claimed.heartbeat_at
    store.update_job(job_id, 7.0, "clamped")
    assert store.get_job(job_id).progress == 1.0
    store.finish_job(job_id, run_id=run_id)
    job = store.get_job(job_id)
    assert job.status == "done" and job.progress == 1.0 and job.finished_at is not None


def test_finish_with_error_fails_the_job(store):
    job_id = store.enqueue_job(dict(REQUEST))
    store.claim_job("w")
    store.finish_job(job_id, error="out of memory")
    job = store.get_job(job_id)
    assert job.status == "failed" and job.error == "out of memory"
    assert [j.id for j in store.list_jobs(status="failed")] == [job_id]
    assert store.list_jobs(status="queued") == []


def test_list_jobs_newest_first(store):
    ids = []
    for i in range(3):
        ids.append(store.enqueue_job({"prompt": str(i)}))
        time.sleep(0.002)
    assert [j.id for j in store.list_jobs()] == ids[::-1]


def test_unknown_job_is_a_clear_error(store):
    with pytest.raises(UnknownJobError, match="no job with id 'nope'"):
        store.get_job("nope")
    with pytest.raises(UnknownJobError):
        store.update_job("nope", 0.1, "x")
    with pytest.raises(UnknownJobError):
        store.finish_job("nope")


def test_recover_jobs_fails_running_keeps_queued(store):
    running = store.enqueue_job(dict(REQUEST))
    queued = store.enqueue_job(dict(REQUEST))
    store.claim_job("dead-worker")
    run_id = store.create_run(dict(REQUEST), status="running")
    store.update_job(running, 0.5, "half", run_id=run_id)
    assert store.recover_jobs("app restarted") == [running]
    job = store.get_job(running)
    assert job.status == "failed" and job.error == "app restarted"
    assert store.get_job(queued).status == "queued"
    run = store.get_run(run_id)
    assert run["status"] == "failed" and run["error"] == "app restarted"
    assert store.recover_jobs("again") == []


def test_recover_jobs_narrowed_to_a_worker_or_stale_heartbeat(store):
    a = store.enqueue_job({"prompt": "a"})
    b = store.enqueue_job({"prompt": "b"})
    store.claim_job("wa")
    store.claim_job("wb")
    assert store.recover_jobs("wa died", worker="wa") == [a]
    assert store.recover_jobs("stale", stale_after_s=3600) == []  # b beat just now
    time.sleep(0.05)
    assert store.recover_jobs("stale", stale_after_s=0.01) == [b]


def test_recover_runs(store):
    run_id = store.create_run(dict(REQUEST), status="running")
    queued = store.create_run(dict(REQUEST))
    assert store.recover_runs("crashed") == [run_id]
    assert store.get_run(run_id)["status"] == "failed"
    assert store.get_run(queued)["status"] == "queued"


def test_concurrent_claims_never_share_a_job(store):
    ids = {store.enqueue_job({"prompt": str(i)}) for i in range(12)}
    claimed: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            while True:
                job = store.claim_job(name)
                if job is None:
                    if not store.list_jobs(status="queued"):
                        return
                    continue  # lost a race; others remain
                with lock:
                    claimed.append(job.id)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(claimed) == sorted(ids)  # every job exactly once
    assert {j.status for j in store.list_jobs()} == {"running"}


def test_heartbeat_only_while_the_job_is_ours(store):
    job_id = store.enqueue_job({"prompt": "p"})
    first = store.claim_job("w1").heartbeat_at
    time.sleep(0.002)
    assert store.heartbeat_job(job_id, "w1") is True
    assert store.get_job(job_id).heartbeat_at > first
    assert store.heartbeat_job(job_id, "w2") is False  # someone else's job
    store.recover_jobs("stale", worker="w1")
    assert store.heartbeat_job(job_id, "w1") is False  # taken from us: the worker should stop


def test_release_requeues_and_drops_the_unfinished_run(store):
    job_id = store.enqueue_job({"prompt": "p"})
    store.claim_job("w1")
    run_id = store.create_run(dict(REQUEST), status="running")
    store.update_job(job_id, 0.5, "half", run_id=run_id)
    assert store.release_job(job_id, "w2", "not yours") is False
    assert store.get_job(job_id).status == "running"
    assert store.release_job(job_id, "w1", "re-queued: shutting down") is True
    job = store.get_job(job_id)
    assert (job.status, job.worker, job.run_id, job.progress) == ("queued", None, None, 0.0)
    assert job.message == "re-queued: shutting down" and job.started_at is None
    assert store.list_runs().empty
    assert store.claim_job("w3").id == job_id  # anyone can take it again
    assert store.release_job(job_id, "w1", "late") is False


def test_release_keeps_a_run_that_already_finished(store):
    job_id = store.enqueue_job({"prompt": "p"})
    store.claim_job("w1")
    run_id, _ = saved_run(store)
    store.update_job(job_id, 1.0, "saving results", run_id=run_id)
    assert store.release_job(job_id, "w1", "stopping") is True
    assert store.get_run(run_id)["status"] == "done"
