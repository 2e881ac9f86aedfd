"""Standalone `sketchwalk worker` processes on a real PostgreSQL: two workers share a queue and
run every job exactly once, a SIGKILLed worker's job is recovered after the heartbeat timeout,
a worker frozen (SIGSTOP) inside its save (between statements or mid-COPY) holds no row anyone
waits for, and its job is taken back within the heartbeat bound and rerun by another, and
SIGTERM finishes or re-queues the running job and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
from frozen_save import save_session, stopped
from run_helpers import tiny_config

from sketchwalk.store import open_store
from sketchwalk.store import schema as sch
from sketchwalk.worker.loop import make_request

HERE = Path(__file__).resolve().parent
REAL_TEXT = "The quick brown fox jumps over the lazy dog. " * 8


class WorkerProc:
    """One `sketchwalk worker` subprocess with the tests' runner; stderr collected to a file."""

    def __init__(self, url: str, tmp: Path, tag: str, *args: str, **env: str) -> None:
        self.log = tmp / f"worker-{tag}.log"
        environ = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
            ),
            SKETCHWALK_POLL_S="0.1",
            SKETCHWALK_HEARTBEAT_S="0.3",
            **env,
        )
        cmd = [sys.executable, "-m", "sketchwalk.cli.main", "worker", "--db", url]
        cmd += ["--name", tag, "--runner", "worker_jobs:mixed", *args]
        self.name = tag
        self.proc = subprocess.Popen(cmd, stderr=self.log.open("w"), env=environ)

    def output(self) -> str:
        return self.log.read_text()

    def wait_serving(self, timeout: float = 90) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited early:\n{self.output()}")
            return "serving" in self.output()

        wait_for(ready, timeout, f"{self.name} to start")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.kill()


def test_two_workers_run_twenty_jobs_exactly_once(pg_url, tmp_path, procs, tiny_model_dir):
    a = WorkerProc(pg_url, tmp_path, "wa")
    b = WorkerProc(pg_url, tmp_path, "wb")
    procs += [a, b]
    a.wait_serving()
    b.wait_serving()
    with open_store(pg_url) as store:
        real = store.enqueue_job(make_request(REAL_TEXT, tiny_config(), str(tiny_model_dir), 2))
        cheap = [store.enqueue_job({"prompt": f"job {i}", "sleep_s": 0.3}) for i in range(19)]
        wait_for(
            lambda: all(j.status in ("done", "failed") for j in store.list_jobs()),
            240,
            "20 jobs to finish",
        )
        jobs = {j.id: j for j in store.list_jobs()}
        runs = store.list_runs()
        real_run = store.get_run(jobs[real].run_id)
        real_stats = store.layer_stats(jobs[real].run_id)
    assert a.stop() == 0 and b.stop() == 0, a.output() + b.output()
    assert {j.status for j in jobs.values()} == {"done"}, [j.error for j in jobs.values()]
    # every cheap job ran exactly once: one run per job id, written by the job's own worker
    executions = Counter(runs["prompt"])
    assert all(executions[job_id] == 1 for job_id in cheap), executions
    assert len(runs) == 20
    assert {j.worker for j in jobs.values()} == {"wa", "wb"}  # both took a share
    for job_id in cheap:
        assert runs.loc[runs["prompt"] == job_id, "model_id"].item() == jobs[job_id].worker
    # the real model job went through the engine and stored its per-layer records
    assert real_run["status"] == "done" and real_run["prompt_tokens"] > 16
    assert not real_stats.empty and real_run["request"]["job_id"] == real


def test_a_killed_workers_job_is_requeued_and_finished_by_another(pg_url, tmp_path, procs):
    """Two workers serving; the one that took the job is killed mid-job (whichever it is: on a
    loaded machine the second may start late), and the other reruns it after the timeout."""
    timeout = {"SKETCHWALK_JOB_TIMEOUT_S": "2"}
    workers = {name: WorkerProc(pg_url, tmp_path, name, **timeout) for name in ("w1", "w2")}
    procs.extend(workers.values())
    for w in workers.values():
        w.wait_serving()
    with open_store(pg_url) as store:
        job_id = store.enqueue_job({"prompt": "medium", "sleep_s": 15})
        wait_for(lambda: store.get_job(job_id).run_id is not None, 30, "the job to start")
        first = store.get_job(job_id)
        victim = first.worker
        rescuer = next(name for name in workers if name != victim)
        workers[victim].kill()  # SIGKILL mid-job: re-queued after the timeout, run again
        wait_for(lambda: store.get_job(job_id).status == "done", 90, "the rerun")
        job = store.get_job(job_id)
        runs = store.list_runs()
    assert job.worker == rescuer and job.attempts == 2 and job.error is None
    assert first.run_id not in set(runs["id"])  # the victim's half-made run was dropped
    assert list(runs["prompt"]).count(job_id) == 1  # and the job ran to the end once
    assert workers[rescuer].stop() == 0


def test_a_killed_workers_job_fails_when_out_of_attempts(pg_url, tmp_path, procs):
    timeout = {"SKETCHWALK_JOB_TIMEOUT_S": "2", "SKETCHWALK_JOB_MAX_ATTEMPTS": "1"}
    a = WorkerProc(pg_url, tmp_path, "victim", **timeout)
    procs.append(a)
    a.wait_serving()
    with open_store(pg_url) as store:
        stuck = store.enqueue_job({"prompt": "long", "sleep_s": 600})
        wait_for(lambda: store.get_job(stuck).status == "running", 30, "the job to start")
        # the rescuer starts only now, so the victim is sure to hold the job
        b = WorkerProc(pg_url, tmp_path, "rescuer", **timeout)
        procs.append(b)
        b.wait_serving()
        time.sleep(3.5)  # > timeout: the victim's heartbeat keeps its job alive
        job = store.get_job(stuck)
        assert job.status == "running" and job.worker == "victim"
        a.kill()  # SIGKILL: no chance to clean up
        wait_for(lambda: store.get_job(stuck).status != "running", 30, "recovery")
        job = store.get_job(stuck)
        after = store.enqueue_job({"prompt": "after", "sleep_s": 0.1})
        wait_for(lambda: store.get_job(after).status == "done", 30, "the rescuer to go on")
        run = store.get_run(job.run_id)
    assert job.status == "failed" and "no heartbeat for over 2 s" in job.error
    assert "after 1 attempts" in job.error
    assert run["status"] == "failed" and run["error"] == job.error
    assert store.get_job(after).worker == "rescuer"
    assert b.stop() == 0


def test_sigterm_lets_a_short_job_finish_and_exits_0(pg_url, tmp_path, procs):
    w = WorkerProc(pg_url, tmp_path, "finisher", "--grace", "30")
    procs.append(w)
    w.wait_serving()
    with open_store(pg_url) as store:
        job_id = store.enqueue_job({"prompt": "short", "sleep_s": 2.0})
        wait_for(lambda: store.get_job(job_id).status == "running", 30, "the job to start")
        assert w.stop(signal.SIGTERM) == 0, w.output()
        job = store.get_job(job_id)
    assert job.status == "done" and job.worker == "finisher"
    assert "stopped on SIGTERM; re-queued 0 job(s)" in w.output()


def test_sigterm_past_the_grace_requeues_the_job_and_exits_0(pg_url, tmp_path, procs):
    w = WorkerProc(pg_url, tmp_path, "leaver", "--grace", "0.5")
    procs.append(w)
    w.wait_serving()
    with open_store(pg_url) as store:
        job_id = store.enqueue_job({"prompt": "long", "sleep_s": 600})
        wait_for(lambda: store.get_job(job_id).run_id is not None, 30, "the job to start")
        started_run = store.get_job(job_id).run_id
        t0 = time.monotonic()
        assert w.stop(signal.SIGTERM) == 0, w.output()
        took = time.monotonic() - t0
        job = store.get_job(job_id)
        runs = store.list_runs()
        taken = store.claim_job("next")  # back in the queue for anyone
    assert took < 15
    assert job.status == "queued" and job.worker is None and job.run_id is None
    assert job.message == "re-queued: worker leaver shut down before finishing it"
    assert started_run not in set(runs["id"])  # the unfinished run left no trace
    assert taken is not None and taken.id == job_id
    assert "stopped on SIGTERM; re-queued 1 job(s)" in w.output()


def test_sigterm_on_an_idle_worker_exits_0_quickly(pg_url, tmp_path, procs):
    w = WorkerProc(pg_url, tmp_path, "idle")
    procs.append(w)
    w.wait_serving()
    t0 = time.monotonic()
    assert w.stop(signal.SIGTERM) == 0, w.output()
    assert time.monotonic() - t0 < 10


def row_locked(store, table: sa.Table, row_id: str) -> bool:
    """Whether another session holds the row (a SKIP LOCKED pick misses it)."""
    with store.engine.begin() as conn:
        pick = sa.select(table.c.id).where(table.c.id == row_id).with_for_update(skip_locked=True)
        return conn.execute(pick).first() is None


JOB_TIMEOUT_S = 3.0
RECOVERY_EVERY_S = 1.0  # max(1, JOB_TIMEOUT_S / 4): how often each worker looks for stale jobs
BOUND_S = JOB_TIMEOUT_S + RECOVERY_EVERY_S
"""A frozen worker's job is taken back at most this long after its last heartbeat."""


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("request_", "session_state"),
    [
        ({"freeze_in_save": True}, "idle in transaction"),  # between two statements
        ({"freeze_in_copy": "save_result"}, "active"),  # inside the COPY, no timeout applies
        ({"freeze_in_copy": "save_quality"}, "active"),  # the quality half's COPY
    ],
    ids=["between-statements", "in-copy", "in-copy-quality-half"],
)
def test_a_worker_frozen_inside_its_save_is_cut_off_and_its_job_rerun(
    pg_url, tmp_path, procs, request_, session_state
):
    env = {
        "SKETCHWALK_JOB_TIMEOUT_S": f"{JOB_TIMEOUT_S:g}",  # its job looks dead after 3 s ...
        "SKETCHWALK_RUN_STALE_S": "1",  # ... its run after 1 s: recovery tries both at once
        "SKETCHWALK_DB_IDLE_TX_S": "45",  # the server's own timeouts come far too late here
    }
    workers = [WorkerProc(pg_url, tmp_path, f"w{i}", **env) for i in range(3)]
    procs += workers
    for w in workers:
        w.wait_serving()
    with open_store(pg_url) as store:
        frozen_job = store.enqueue_job({"prompt": "freeze", **request_})
        wait_for(
            lambda: any(stopped(w.proc.pid) for w in workers),
            60,
            "a worker to stop itself inside its save",
        )
        froze_at = time.monotonic()
        (frozen,) = [w for w in workers if stopped(w.proc.pid)]
        first = store.get_job(frozen_job)
        state, query = save_session(store, first.claim) or ("gone", "")
        assert state == session_state, (state, query)
        if "freeze_in_copy" in request_:
            assert query.startswith("COPY "), query  # frozen while the server waits for data
        # the save locks no row anyone else needs: the job's and run's rows are free
        assert not row_locked(store, sch.jobs, frozen_job)
        assert not row_locked(store, sch.runs, first.run_id)
        wait_for(lambda: store.get_job(frozen_job).attempts == 2, 30, "another worker's claim")
        retaken_s = time.monotonic() - froze_at
        assert save_session(store, first.claim) is None  # recovery ended the frozen session
        cheap = [store.enqueue_job({"prompt": f"job {i}", "sleep_s": 0.2}) for i in range(8)]
        wait_for(
            lambda: all(store.get_job(j).status == "done" for j in cheap + [frozen_job]),
            60,
            "the other workers to drain the queue and rerun the frozen job",
        )
        runs = subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", "runs", "--db", pg_url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert runs.returncode == 0, runs.stderr
        assert stopped(frozen.proc.pid)  # all of that while it stayed frozen
        done = store.get_job(frozen_job)
        os.kill(frozen.proc.pid, signal.SIGCONT)  # revived: its late writes are refused
        assert frozen.stop() == 0, frozen.output()
        after = store.get_job(frozen_job)
        listed = store.list_runs()
        jobs = {j.id: j for j in store.list_jobs()}
        final = store.get_run(done.run_id)
    print(f"frozen {session_state}: job taken back by another worker {retaken_s:.1f} s after")
    assert retaken_s <= BOUND_S + 2.0  # + the freeze's detection and a loaded machine's slack
    assert done.worker != frozen.name and done.attempts == 2
    assert (after.status, after.worker, after.run_id) == ("done", done.worker, done.run_id)
    assert list(listed["prompt"]).count(frozen_job) == 1  # one run of it: the second attempt's
    assert store_status(listed, done.run_id) == "done"
    if request_.get("freeze_in_copy") == "save_quality":
        assert final["timings"] == {"clean_sparse_prefill_ms": 1.0}  # its speed half too
    assert {jobs[j].worker for j in cheap} <= {w.name for w in workers if w is not frozen}
    assert all(list(listed["prompt"]).count(j) == 1 for j in cheap)
    assert "Traceback" not in frozen.output() and "abandoned job" in frozen.output()
    for w in workers:
        if w is not frozen:
            assert w.stop() == 0, w.output()
            assert "is busy" not in w.output()  # no one even waited out a lock timeout


def store_status(listed, run_id: str) -> str:
    return listed.loc[listed["id"] == run_id, "status"].item()
