"""Pages that list jobs (Runs, Speed) still render when job rows hold requests that do not
parse, or dicts with the wrong shapes inside."""

from __future__ import annotations

import pytest
from job_rows import put_raw_job
from run_helpers import new_app

from sketchwalk.store import open_store

ROWS = [
    '[{"prompt": "a"}]',
    '"a prompt"',
    "[" * 100_000 + "]" * 100_000,
    "{not json",
    '{"prompt": ["x"], "config": [0.3], "model": 7}',
]


@pytest.fixture
def damaged(monkeypatch, tmp_path, seeded):
    """A store with one real run (for Speed) and a queued and a running copy of each row."""
    src_url, ids = seeded
    url = str(tmp_path / "damaged.duckdb")
    with open_store(src_url) as src:
        data = src.export_zip([ids["sketchwalk"]])
    with open_store(url) as dst:
        dst.import_parquet(data)
        jobs = [put_raw_job(dst, text) for text in ROWS]
        running = [put_raw_job(dst, text) for text in ROWS]
        for _ in running:
            dst.claim_job("w")  # oldest first: the first len(ROWS) rows go running
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return ids["sketchwalk"], jobs + running


def test_runs_and_speed_render_with_malformed_job_rows(damaged):
    run_id, jobs = damaged
    at = new_app().run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "Job" in d.value.columns)
    assert sorted(table["Job"]) == sorted(j[:8] for j in jobs)
    at.session_state["run_id"] = run_id
    at.switch_page("pages/speed.py").run()
    assert not at.exception, at.exception
    assert at.button(key="btn_sweep").label.startswith("Queue a sweep (")
