"""The Benchmarks page's first eval (issue 39): at a length where its densities are reachable,
a "done" line that stays once the expander closes, charts in the house palette, word headers,
and a warning where a cell ran far from its target density."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from sketchwalk.app.figures import HOUSE_COLOURWAY
from sketchwalk.app.verdict import density_floor
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.eval import job as eval_job
from sketchwalk.store import open_store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "benchmarks.py"


@pytest.fixture
def db(monkeypatch, tmp_path):
    url = str(tmp_path / "bench.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url


def _row(method: str, target: float, achieved: float, length: int, block: int) -> dict:
    cfg = SketchWalkConfig(method=method, density=target, block_size=block).to_dict()
    return dict(eval_id="e1", model_id="smollm2", task="retrieval", source="passkey",
                length=length, method=method, phases="both", density_target=target,
                density_achieved=achieved, n_items=2, n_tokens=2 * length, acc_dense=1.0,
                acc_sparse=0.5, kl_mean=0.05, config=cfg)  # fmt: skip


def test_the_first_eval_runs_where_its_densities_are_reachable():
    small = eval_job.SMALL_EVAL
    assert min(small["lengths"]) >= 2048
    cfg = SketchWalkConfig(density=0.1, block_size=small["block_size"]).to_dict()
    for length in small["lengths"]:
        floor = density_floor(cfg, length)  # forced blocks: the least density reachable
        assert floor < min(small["densities"]), (length, floor)


def test_charts_in_house_colours_word_headers_and_off_target_cells_warned(db):
    with open_store(db) as store:
        store.save_eval_results(
            [
                _row("sketchwalk", 0.1, 0.33, 1024, 64),  # the first eval: off target
                _row("sketchwalk", 0.3, 0.36, 1024, 64),
                _row("streaming", 0.1, 0.33, 1024, 64),
            ]
        )
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    assert not at.exception, at.exception
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert fig["layout"]["colorway"] == HOUSE_COLOURWAY
    (warning,) = [w.value for w in at.warning if "far from its target" in w.value]
    assert "sketchwalk at target 0.1 (retrieval, 1024 tokens) ran at 0.33" in warning
    assert "forced blocks alone keep" in warning
    assert "sketchwalk at target 0.3" not in warning  # 0.36 is near 0.3
    table = at.dataframe[-1]
    labels = {c: json.loads(table.proto.columns).get(c, {}).get("label") for c in ("method",)}
    assert labels == {"method": "Method"}  # shown in words; the data keeps its names


def test_a_finished_first_eval_says_done_outside_the_closed_expander(
    db, monkeypatch, tiny_model, models
):
    from sketchwalk.worker.loop import Worker

    small = {"model": tiny_model, "lengths": [256], "depths": [0.5], "methods": ["sketchwalk"]}
    small.update(densities=[0.3], block_size=16, new_tokens=2)
    for k, v in small.items():
        monkeypatch.setitem(eval_job.SMALL_EVAL, k, v)
    at = AppTest.from_file(str(PAGE), default_timeout=120).run()
    at.button(key="btn_bm_eval").click().run()
    with open_store(db) as store:
        Worker(store, models=models).drain()
    at.run()
    assert not at.exception, at.exception
    done = [s.value for s in at.success if "done" in s.value]
    assert len(done) == 1 and done[0].startswith("Eval job ") and "rows are in" in done[0]
    assert not any("done" in s.value for s in at.expander[0].success)  # not hidden inside it
