"""A saved run's and job's `finished_at` is when the rows were in (not the transaction's start),
and a heartbeat that finds its job finished by its own save says nothing."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from datetime import timedelta

from store_fixtures import REQUEST, make_result

from sketchwalk.settings import load
from sketchwalk.store.db import utcnow
from sketchwalk.worker.loop import Worker

SLOW_S = 0.6


def test_finished_at_is_after_the_rows_not_at_the_transaction_start(store, monkeypatch):
    job_id = store.enqueue_job(dict(REQUEST))
    job = store.claim_job("w")
    run_id = store.create_run(dict(REQUEST), status="running", job=(job_id, job.claim))
    real_insert = type(store)._insert

    def slow_insert(self, conn, table, data, key):  # a long COPY
        time.sleep(SLOW_S / 4)
        real_insert(self, conn, table, data, key)

    monkeypatch.setattr(type(store), "_insert", slow_insert)
    before = utcnow()
    store.save_result(run_id, make_result(), job=(job_id, job.claim))
    after = utcnow()
    run, done = store.get_run(run_id), store.get_job(job_id)
    assert done.status == "done" and run["status"] == "done"
    slack = timedelta(seconds=0.25)  # the database's clock against this process's
    for stamp in (run["finished_at"], done.finished_at):
        assert before + timedelta(seconds=SLOW_S) - slack <= stamp <= after + slack


def _beat_once(store, job, worker: Worker) -> None:
    done = threading.Event()
    beat = threading.Thread(target=worker._heartbeat, args=(job.id, job.claim, done))
    beat.start()
    beat.join(5)
    done.set()
    assert not beat.is_alive()


def test_no_taken_warning_after_our_own_save(store, caplog):
    settings = dataclasses.replace(load(), heartbeat_s=0.05)
    worker = Worker(store, settings=settings, name="w1")
    store.enqueue_job({"prompt": "x"})
    job = store.claim_job("w1")
    store.finish_job(job.id, claim=job.claim)  # the save ended the job before the beats stopped
    with caplog.at_level(logging.WARNING):
        _beat_once(store, job, worker)
    assert "taken from us" not in caplog.text and not worker._lost.is_set()


def test_a_job_recovered_by_another_is_still_reported_taken(store, caplog):
    settings = dataclasses.replace(load(), heartbeat_s=0.05)
    worker = Worker(store, settings=settings, name="w1")
    store.enqueue_job({"prompt": "x"})
    job = store.claim_job("w1")
    store.recover_jobs("gone quiet", max_attempts=5)  # back in the queue
    store.claim_job("w2")  # and another worker's now
    with caplog.at_level(logging.WARNING):
        _beat_once(store, job, worker)
    assert "taken from us" in caplog.text and worker._lost.is_set()
