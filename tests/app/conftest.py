"""Fixtures for the app tests: a tiny model and a store holding real runs of it.

The runs go through the worker's own job path (enqueue -> claim -> execute), so every page test
also exercises what the worker wrote. AppTest runs the pages in this process; they find the store
through SKETCHWALK_DB, and the in-app worker is off (tests drive the worker explicitly).
"""

from __future__ import annotations

import os

import pytest
from run_helpers import INJECTION, tiny_config

from sketchwalk.app import prompts
from sketchwalk.worker.loop import Worker, make_request


@pytest.fixture(scope="session")
def seeded(tmp_path_factory, tiny_model, models):
    """A DuckDB store with three finished runs: sketchwalk (walking, beta 0.5) and nowalk on a
    license excerpt, and an HTML-injection prompt. Returns (url, {name: run_id})."""
    from sketchwalk.store import open_store

    url = str(tmp_path_factory.mktemp("db") / "app.duckdb")
    text = prompts.license_text()[:1100]
    store = open_store(url)
    jobs = {
        "sketchwalk": store.enqueue_job(make_request(text, tiny_config(beta=0.5), tiny_model, 4)),
        "nowalk": store.enqueue_job(
            make_request(text, tiny_config(method="nowalk", density=0.3), tiny_model, 4)
        ),
        "injection": store.enqueue_job(
            make_request(f"{INJECTION} {text[:300]}", tiny_config(), tiny_model, 3)
        ),
    }
    Worker(store, models=models).drain()
    ids = {}
    for name, job_id in jobs.items():
        job = store.get_job(job_id)
        assert job.status == "done", job.error
        ids[name] = job.run_id
    store.close()
    return url, ids


@pytest.fixture
def app_env(monkeypatch, seeded):
    url, ids = seeded
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url, ids


os.environ.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
