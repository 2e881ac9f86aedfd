"""The app pointed at PostgreSQL behaves as on DuckDB: the same runs draw the same pages, a job
runs through the worker into the server store, and Parquet exports hold the same data."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from run_helpers import new_app, spec, tiny_config
from test_pages import on_page

from sketchwalk.store import open_store
from sketchwalk.worker.loop import Worker, make_request

PAGES = ("explore", "compare", "speed")


@pytest.fixture
def pg_copy(pg_url, seeded):
    """The seeded DuckDB runs imported into a fresh PostgreSQL store: (pg url, duckdb url, ids)."""
    duck_url, ids = seeded
    with open_store(duck_url) as src:
        data = src.export_zip(list(ids.values()))
    with open_store(pg_url) as dst:
        assert sorted(dst.import_parquet(data)) == sorted(ids.values())
    return pg_url, duck_url, ids


def page_view(monkeypatch, url: str, page: str, run_id: str) -> dict:
    """What a person sees on a page: every chart's JSON, the metrics and the texts."""
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = on_page(new_app().run(), page, run_id)
    assert not at.error, [e.value for e in at.error]
    return {
        "charts": [spec(c) for c in at.get("plotly_chart")],
        "metrics": {m.label: m.value for m in at.metric},
        "texts": [t.value for t in at.text],
    }


@pytest.mark.parametrize("page", PAGES)
def test_pages_draw_the_same_on_postgresql_and_duckdb(pg_copy, monkeypatch, page):
    pg_url, duck_url, ids = pg_copy
    on_pg = page_view(monkeypatch, pg_url, page, ids["sketchwalk"])
    on_duck = page_view(monkeypatch, duck_url, page, ids["sketchwalk"])
    assert on_pg["charts"], "the page drew no chart"
    assert on_pg == on_duck


def test_runs_page_lists_the_server_stores_runs(pg_copy, monkeypatch):
    pg_url, _, ids = pg_copy
    monkeypatch.setenv("SKETCHWALK_DB", pg_url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = on_page(new_app().run(), "runs")
    assert set(at.dataframe[0].value["id"]) == set(ids.values())


def _tables(zip_bytes: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
        return {
            n: pq.read_table(io.BytesIO(zf.read(n)))
            for n in zf.namelist()
            if n.endswith(".parquet")
        }


def test_a_job_runs_into_postgresql_and_exports_like_duckdb(
    pg_copy, tiny_model, models, tmp_path, monkeypatch
):
    pg_url, duck_url, ids = pg_copy
    with open_store(pg_url) as store:
        job_id = store.enqueue_job(
            make_request("The quick brown fox jumps. " * 10, tiny_config(beta=0.5), tiny_model, 2)
        )
        assert Worker(store, models=models).drain() == [job_id]
        job = store.get_job(job_id)
        assert job.status == "done", job.error
        fresh = store.heatmap(job.run_id, "prefill", 0, 2)
        pg_zip = store.export_zip([*ids.values(), job.run_id])
    view = page_view(monkeypatch, pg_url, "explore", job.run_id)  # a run only the server has
    walk = next(c for c in view["charts"] if c["layout"]["title"]["text"] == "Walk score W_l")
    assert walk["data"][0]["z"]
    with open_store(duck_url) as duck:
        duck_tables = _tables(duck.export_zip(list(ids.values())))
    pg_tables = _tables(pg_zip)
    assert set(pg_tables) == set(duck_tables)
    for name, duck_table in duck_tables.items():
        key = "id" if name == "runs.parquet" else "run_id"
        seeded_rows = pg_tables[name].filter(
            np.isin(pg_tables[name][key].to_numpy(zero_copy_only=False), list(ids.values()))
        )
        assert seeded_rows.schema.equals(duck_table.schema, check_metadata=False), name
        cols = duck_table.column_names
        order = [(c, "ascending") for c in cols if c not in ("sketch", "walk", "exact")]
        assert seeded_rows.sort_by(order).equals(duck_table.sort_by(order)), name
    # the new run's export loads into an embedded store and reads back the same matrices
    with open_store(str(tmp_path / "back.duckdb")) as back:
        back.import_parquet(pg_zip)
        again = back.heatmap(job.run_id, "prefill", 0, 2)
    for k in ("sketch", "walk", "exact", "selected"):
        np.testing.assert_array_equal(again[k], fresh[k])
