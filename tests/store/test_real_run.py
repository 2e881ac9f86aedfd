"""A real run of the engine (tiny random Llama with the default tokenizer) into the store and
out through Parquet, with equal contents: the records the engine really produces fit the store."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sketchwalk.store import open_store
from sketchwalk.store import schema as sch

pytestmark = pytest.mark.slow  # builds a tiny model from the default model's tokenizer


@pytest.fixture(scope="module")
def real_result(tmp_path_factory):
    from tiny_models import make_tiny_model

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.run.models import load_model
    from sketchwalk.engine.run.runner import RunOptions, run

    path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    lm = load_model(str(path))
    cfg = SketchWalkConfig(block_size=16, dense_layers=(0,), dense_tail_blocks=1)
    with open("/usr/share/common-licenses/GPL-3") as fh:
        prompt = fh.read()[:1200]
    return cfg, run(lm, prompt, cfg, RunOptions(max_new_tokens=3))


def _causal_equal(stored: np.ndarray, rec, name: str) -> None:
    src = getattr(rec, name)
    q = np.asarray(rec.q_blocks)
    causal = np.arange(rec.n_blocks)[None, :] <= q[:, None]
    got = stored[q, : rec.n_blocks] if stored.shape[0] == rec.n_blocks else stored
    if src is None:
        assert (~got).all() if name == "selected" else np.isnan(got).all(), name
        return
    if name == "selected":
        np.testing.assert_array_equal(got[causal], np.asarray(src, dtype=bool)[causal], name)
    else:
        np.testing.assert_array_equal(got[causal], np.asarray(src, dtype=np.float32)[causal], name)


def test_real_run_round_trip(real_result, tmp_path):
    cfg, result = real_result
    assert result.layers and result.tokens and result.blocks
    with open_store(str(tmp_path / "a.duckdb")) as store:
        run_id = store.create_run(
            {"prompt": result.prompt, "model": result.model_id, "config": cfg.to_dict()},
            status="running",
        )
        store.save_result(run_id, result)
        run = store.get_run(run_id)
        assert run["status"] == "done"
        assert run["prompt_tokens"] == result.prompt_tokens
        assert run["sparse_text"] == result.sparse_text
        assert run["config"]["block_size"] == 16
        assert set(run["metrics"]) == set(result.metrics)

        assert len(store.layer_stats(run_id)) == len(result.layers)
        for rec in result.layers:
            if rec.phase == "prefill":
                hm = store.heatmap(run_id, rec.phase, rec.step, rec.layer)
                for name in ("sketch", "walk", "exact", "selected"):
                    _causal_equal(hm[name], rec, name)
        decode = [r for r in result.layers if r.phase == "decode" and r.layer == 1]
        rows = store.decode_rows(run_id, 1)
        assert len(rows["steps"]) == len(decode)
        for i, rec in enumerate(decode):
            for name in ("sketch", "walk", "selected"):
                _causal_equal(rows[name][i : i + 1, : rec.n_blocks], rec, name)
        assert len(store.tokens(run_id)) == len(result.tokens)
        assert len(store.blocks(run_id)) == len(result.blocks)

        store.export_parquet([run_id], tmp_path / "a")
        data = store.export_zip([run_id])
    with open_store(str(tmp_path / "b.duckdb")) as other:
        assert other.import_parquet(data) == [run_id]
        other.export_parquet([run_id], tmp_path / "b")
    for table in sch.RUN_TABLES:
        a = pq.read_table(tmp_path / "a" / f"{table.name}.parquet").to_pandas()
        b = pq.read_table(tmp_path / "b" / f"{table.name}.parquet").to_pandas()
        keys = list(a.columns[:6])
        pd.testing.assert_frame_equal(
            a.sort_values(keys).reset_index(drop=True),
            b.sort_values(keys).reset_index(drop=True),
            check_exact=True,
            obj=table.name,
        )
