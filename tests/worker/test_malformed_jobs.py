"""Job rows whose request does not parse (a JSON list or string, 100,000-deep nesting, not JSON):
the job fails at once with one line, `worker --once` does not crash, and listing jobs works."""

from __future__ import annotations

import subprocess
import sys

import pytest
from job_rows import put_raw_job

from sketchwalk.store import open_store
from sketchwalk.worker.loop import Worker

MALFORMED = {
    "list": ('[{"prompt": "a"}]', "is a list, not a JSON object"),
    "string": ('"a prompt"', "is a string, not a JSON object"),
    "number": ("7", "is a number, not a JSON object"),
    "deep": ("[" * 100_000 + "]" * 100_000, "not valid JSON (or nested too deep)"),
    "deep-object": ('{"a":' * 100_000 + "1" + "}" * 100_000, "not valid JSON (or nested too deep)"),
    "not-json": ("{prompt: 'a'}", "not valid JSON"),
    "null": ("null", "is null, not a JSON object"),
    "truncated": ('{"prompt": "a', "not valid JSON"),
}


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "w.duckdb"))
    yield s
    s.close()


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_malformed_job_fails_at_once_with_one_line(store, shape):
    text, why = MALFORMED[shape]
    job_id = put_raw_job(store, text)
    listed = store.list_jobs()  # listing reads the row without raising
    assert [j.id for j in listed] == [job_id]
    assert listed[0].request == {} and why in listed[0].invalid

    def must_not_run(worker, job):
        raise AssertionError("a malformed job reached a runner")

    assert Worker(store, runner=must_not_run).drain() == [job_id]
    job = store.get_job(job_id)
    assert job.status == "failed" and job.attempts == 1  # failed on its first claim, not retried
    assert why in job.error and "\n" not in job.error and len(job.error) < 120
    assert job.finished_at is not None


def test_a_good_job_after_malformed_ones_still_runs(store):
    bad = [put_raw_job(store, text) for text, _ in MALFORMED.values()]
    good = store.enqueue_job({"prompt": "fine"})
    ran = []

    def record(worker, job):
        ran.append(job.request)
        worker.store.finish_job(job.id, claim=job.claim)

    assert Worker(store, runner=record).drain() == [*bad, good]
    assert ran == [{"prompt": "fine"}]
    assert [store.get_job(j).status for j in bad] == ["failed"] * len(bad)
    assert store.get_job(good).status == "done"


def test_worker_once_fails_malformed_jobs_without_a_traceback(tmp_path):
    db = str(tmp_path / "cli.duckdb")
    with open_store(db) as s:
        ids = [put_raw_job(s, text) for text, _ in MALFORMED.values()]
    out = subprocess.run(
        [sys.executable, "-m", "sketchwalk.cli.main", "worker", "--db", db, "--once"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 1  # some jobs failed
    assert f"ran {len(ids)} job(s), {len(ids)} failed" in out.stderr
    with open_store(db) as s:
        assert {s.get_job(j).status for j in ids} == {"failed"}
        assert {s.get_job(j).attempts for j in ids} == {1}
