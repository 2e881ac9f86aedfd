"""The eval as a worker job (eval/job.py): queued like a run, progress on the job, rows stored."""

from __future__ import annotations

from sketchwalk.eval.job import eval_request
from sketchwalk.store import open_store
from sketchwalk.worker.loop import Worker

SMALL = {
    "lengths": [256],
    "depths": [0.5],
    "methods": ["sketchwalk"],
    "densities": [0.3],
    "block_size": 16,
    "new_tokens": 2,
}


def test_an_eval_job_stores_its_rows_and_finishes(tmp_path, tiny_model, models):
    with open_store(str(tmp_path / "e.duckdb")) as store:
        job_id = store.enqueue_job(eval_request(model=tiny_model, **SMALL))
        bad = store.enqueue_job(eval_request(model=tiny_model, tasks="file:/etc/passwd"))
        Worker(store, models=models).drain()
        job = store.get_job(job_id)
        assert job.status == "done" and job.error is None and job.progress == 1.0
        rows = store.eval_results()
        assert len(rows) == 1 and rows["task"][0] == "retrieval" and rows["source"][0] == "passkey"
        assert rows["method"][0] == "sketchwalk" and rows["density_target"][0] == 0.3
        failed = store.get_job(bad)
        assert failed.status == "failed" and "cannot read files" in failed.error
        assert "\n" not in failed.error


def test_an_eval_job_says_the_same_for_every_file_path(tmp_path):
    """Whether a path exists, is unreadable or is missing on the worker's host is not said."""
    import pytest

    from sketchwalk.errors import SketchWalkError
    from sketchwalk.eval.job import EvalRequest

    unreadable = tmp_path / "secret.txt"
    unreadable.write_text("x")
    unreadable.chmod(0)
    messages = set()
    for path in ("/etc/passwd", str(unreadable), str(tmp_path / "missing.txt"), "/etc"):
        request = EvalRequest.from_dict(eval_request(tasks=f"lm,file:{path}"))
        with pytest.raises(SketchWalkError) as info:
            request.spec()
        messages.add(str(info.value))
    assert messages == {"an eval job cannot read files; use lm or retrieval tasks"}
