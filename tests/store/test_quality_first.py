"""A run saved quality first: `save_quality` stores every row with the run still running, and
`save_speed` merges the clean timings and ends run and job. Both are fenced by the job's claim
(a lost job writes nothing), and the save locks the job and run rows only at its very end, so a
job can be recovered while its rows stream in (the save then writes nothing)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
from store_fixtures import REQUEST, count_rows, make_result

from sketchwalk.store import open_store
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


@pytest.mark.parametrize("write", ["save_result", "save_quality"])
def test_a_job_recovered_while_its_rows_stream_in_gets_nothing(pg_url, write):
    """PostgreSQL, two processes' worth of sessions: while a save streams its rows in, another
    session's recovery finds the job's row unlocked (the save locks it only at its end) and
    re-queues it; the save then writes nothing. (DuckDB and SQLite have one writer process.)"""
    with open_store(pg_url) as saver, open_store(pg_url) as other:
        fence, run_id = _started(saver)
        _age_heartbeat(saver, fence[0])
        real = type(saver)._insert
        recovered: list[list[str]] = []

        def recover_mid_stream(conn, table, data, key):
            real(saver, conn, table, data, key)
            if not recovered:  # from another session, bounded so a lock wait would show
                box: list[list[str]] = []
                t = threading.Thread(
                    target=lambda: box.append(
                        other.recover_jobs("silent", stale_after_s=60, max_attempts=3)
                    )
                )
                t.start()
                t.join(10)
                recovered.append(box[0] if box else ["still waiting"])

        saver._insert = recover_mid_stream  # type: ignore[method-assign]
        with pytest.raises(JobLostError):
            getattr(saver, write)(run_id, make_result(), job=fence)
        job = other.get_job(fence[0])
        with other.engine.connect() as conn:
            stats = conn.execute(sa.select(sa.func.count()).select_from(sch.layer_stats)).scalar()
    assert recovered == [[fence[0]]]  # the row was free: recovery did not wait
    assert job.status == "queued" and job.claim is None and job.attempts == 1
    assert stats == 0 and run_id not in other.run_ids()


def test_recovery_ends_the_server_sessions_saving_under_the_claims_it_took(pg_url):
    """A save's session is named after its claim; recovering that job ends it (the server would
    never time out a session waiting for COPY data), and leaves every other session alone."""
    from sketchwalk.store.jobs import name_save_session

    with open_store(pg_url) as store:
        lost, _ = _started(store, "w1")
        kept, _ = _started(store, "w2")
        _age_heartbeat(store, lost[0])
        sessions = {}
        for fence in (lost, kept):
            conn = store.engine.connect()
            conn.begin()
            name_save_session(conn, fence[1])
            sessions[fence] = conn
        assert store.recover_jobs("silent", stale_after_s=60, max_attempts=3) == [lost[0]]
        with pytest.raises(sa.exc.DBAPIError):
            sessions[lost].execute(sa.text("SELECT 1"))
        assert sessions[kept].execute(sa.text("SELECT 1")).scalar() == 1
        for conn in sessions.values():
            conn.close()


def test_the_speed_half_fills_the_sparse_layers_dense_times(store):
    """save_speed's layer_dense_ms goes into the sparse prefill records that the quality half
    left without a dense time; dense layers keep their own attention time."""
    fence, run_id = _started(store)
    result = make_result()
    for rec in result.layers:
        if not rec.dense:
            rec.t_dense_ms = None
    store.save_quality(run_id, result, job=fence, progress=0.4)
    layers = sorted({r.layer for r in result.layers})
    before = store.layer_stats(run_id, "prefill").set_index("layer")
    assert before.loc[~before["dense"], "t_dense_ms"].isna().all()
    store.save_speed(run_id, CLEAN, job=fence, layer_dense_ms={x: 100.0 + x for x in layers})
    after = store.layer_stats(run_id, "prefill").set_index("layer")
    for layer in layers:
        if after.loc[layer, "dense"]:
            assert after.loc[layer, "t_dense_ms"] == before.loc[layer, "t_dense_ms"]
        else:
            assert after.loc[layer, "t_dense_ms"] == 100.0 + layer
