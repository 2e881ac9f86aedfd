"""The Benchmarks page through Streamlit's AppTest, on eval rows written to a fresh store."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from sketchwalk.store import open_store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "benchmarks.py"


def rows(eval_id: str, shift: float = 0.0) -> list[dict]:
    out = []
    for method in ("sketchwalk", "quest"):
        for d in (0.1, 0.3):
            out.append(
                dict(eval_id=eval_id, model_id="smollm2", task="lm", source="gpl-3", length=2048,
                     method=method, phases="both", density_target=d, density_achieved=d,
                     n_items=1, n_tokens=2048, ppl_dense=10.0,
                     ppl_sparse=10.0 + (0.005 if method == "sketchwalk" else 0.5) / d + shift,
                     kl_mean=0.01)
            )  # fmt: skip
    out.append(
        dict(eval_id=eval_id, model_id="smollm2", task="retrieval", source="passkey",
             length=2048, method="quest", phases="both", density_target=0.2, n_items=2,
             n_tokens=4000, acc_dense=1.0, acc_sparse=0.5)
    )  # fmt: skip
    return out


@pytest.fixture
def db(monkeypatch, tmp_path):
    url = str(tmp_path / "bench.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url


def page() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]


def test_empty_store_says_how_to_fill_it(db):
    at = page().run()
    assert not at.exception and "sketchwalk eval" in at.info[0].value


def test_plots_table_filters_and_latest_eval(db):
    with open_store(db) as store:
        store.save_eval_results(rows("old", shift=100.0))
        store.save_eval_results(rows("new"))
    at = page().run()
    assert not at.exception
    assert sorted(titles(at)) == ["lm · gpl-3 · 2048 tokens", "retrieval · passkey · 2048 tokens"]
    df = at.dataframe[0].value
    assert len(df) == 5 and set(df["eval_id"]) == {"new"}  # latest per cell only
    assert df["ppl_increase_pct"].max() < 100  # the old eval's +1000% rows are hidden
    assert any("density 0.1" in c.value for c in at.caption)  # sketchwalk within 1% at 0.1

    at.multiselect(key="bm_method").set_value(["quest"]).run()
    df = at.dataframe[0].value
    assert set(df["method"]) == {"quest"} and len(df) == 3
    lm_fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [t["name"] for t in lm_fig["data"]] == ["quest"]

    at.multiselect(key="bm_task").set_value(["retrieval"]).run()
    assert titles(at) == ["retrieval · passkey · 2048 tokens"]
    at.selectbox(key="bm_eval").set_value("old").run()
    assert set(at.dataframe[0].value["eval_id"]) == {"old"}
    at.multiselect(key="bm_task").set_value([]).run()
    assert "No eval rows match" in at.warning[0].value


def test_frontier_cells_show_their_distance_to_the_oracle(db):
    out = []
    for block, oracle_kl, sw_kl in ((16, 0.02, 0.05), (32, 0.03, 0.09)):
        cfg = {"block_size": block, "per_group": True}
        for method, kl in (("oracle", oracle_kl), ("sketchwalk", sw_kl)):
            timings = {"dense_attention_ms": 200.0, "selection_ms": block * 2.0}
            out.append(
                dict(eval_id="f", model_id="smollm2", task="lm", source="gpl-3", length=2048,
                     method=method, phases="prefill", density_target=0.2, density_achieved=0.2,
                     n_items=1, n_tokens=2048, ppl_dense=10.0, ppl_sparse=10.0 + 10 * kl,
                     kl_mean=kl, config=cfg, extra={} if block == 32 else {"timings": timings})
            )  # fmt: skip
    with open_store(db) as store:
        store.save_eval_results(out)
    at = page().run()
    assert not at.exception
    assert any(s.value == "Distance to the oracle" for s in at.subheader)
    gaps = at.dataframe[0].value  # the frontier table comes before the full table
    assert len(gaps) == 4  # both block sizes kept apart (latest-per-cell knows the variant)
    sw = gaps[gaps["method"] == "sketchwalk"].set_index("variant")
    assert sw.loc["b16 group", "kl_gap"] == pytest.approx(0.03)
    assert sw.loc["b32 group", "kl_gap"] == pytest.approx(0.06)
    # what the selection cost beside the dense attention; cells stored without timings: empty
    assert sw.loc["b16 group", "selection_share"] == pytest.approx(32.0 / 200.0)
    assert sw.loc["b32 group", "selection_share"] is None or pd.isna(
        sw.loc["b32 group", "selection_share"]
    )


def test_queue_a_small_eval_shows_progress_then_its_rows(db, monkeypatch, tiny_model, models):
    from sketchwalk.eval import job as eval_job
    from sketchwalk.worker.loop import Worker

    small = {"model": tiny_model, "lengths": [256], "depths": [0.5], "methods": ["sketchwalk"]}
    small.update(densities=[0.3], block_size=16, new_tokens=2)
    for k, v in small.items():
        monkeypatch.setitem(eval_job.SMALL_EVAL, k, v)
    at = page().run()
    assert at.expander[0].label == "Queue a small eval"
    at.button(key="btn_bm_eval").click().run()
    assert not at.exception, at.exception
    with open_store(db) as store:
        (job,) = store.list_jobs()
        assert job.request["kind"] == "eval" and job.request["model"] == tiny_model
        assert job.status == "queued"
        Worker(store, models=models).drain()
        assert store.get_job(job.id).status == "done"
    at.run()
    assert not at.exception, at.exception
    assert any("done" in s.value for s in at.success)
    assert titles(at)  # the eval's rows are plotted
    table = at.dataframe[0].value
    assert table["task"].tolist() == ["retrieval"] and table["method"].tolist() == ["sketchwalk"]
