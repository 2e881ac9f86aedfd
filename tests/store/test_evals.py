"""Eval results in the store: round trip, filters, Parquet, and the additive v1 -> v2 upgrade."""

from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import pytest

from sketchwalk.store import InvalidResultError, SchemaVersionError, open_store
from sketchwalk.store import schema as sch


def row(**kw):
    base = dict(
        eval_id="e1",
        model_id="m",
        task="lm",
        source="gpl-3",
        length=2048,
        method="sketchwalk",
        phases="both",
        density_target=0.2,
        density_achieved=0.19,
        n_items=3,
        n_tokens=6000,
        ppl_dense=10.0,
        ppl_sparse=10.5,
        kl_mean=float("nan"),
        config={"density": 0.2},
        extra={"chunks": [1, 2]},
    )
    base.update(kw)
    return base


def test_rows_round_trip_and_filter(store, tmp_path):
    ids = store.save_eval_results(
        [row(), row(method="quest"), row(task="retrieval", acc_dense=1.0)]
    )
    assert len(set(ids)) == 3
    df = store.eval_results()
    assert len(df) == 3 and set(df["method"]) == {"sketchwalk", "quest"}
    assert df["config"][0] == {"density": 0.2} and df["extra"][0] == {"chunks": [1, 2]}
    assert df["kl_mean"].isna()[0] and df["ppl_sparse"][0] == 10.5
    assert list(store.eval_results(method="quest")["method"]) == ["quest"]
    assert len(store.eval_results(task=["lm", "retrieval"], model_id="m")) == 3
    assert store.eval_results(method=[]).empty
    out = store.export_eval_parquet(tmp_path / "x" / "evals.parquet", task="lm")
    back = pq.read_table(out).to_pandas()
    assert len(back) == 2 and back["config"][0] == '{"density": 0.2}'
    assert store.delete_eval("e1") == 3 and store.eval_results().empty


@pytest.mark.parametrize(
    "bad, words",
    [(row(task=None), "lacks task"), (row(nope=1), "unknown eval columns"), ("x", "is a dict")],
)
def test_bad_rows_are_refused_and_nothing_is_written(store, bad, words):
    with pytest.raises(InvalidResultError, match=words):
        store.save_eval_results([row(), bad])
    assert store.eval_results().empty
    with pytest.raises(InvalidResultError, match="unknown eval filter"):
        store.eval_results(colour="red")


def _make_v1(path):
    """A store as schema version 1 wrote it: no eval_results table."""
    open_store(str(path)).close()
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE eval_results")
    con.execute("UPDATE sketchwalk_meta SET value = '1' WHERE key = 'schema_version'")
    con.close()


def test_a_version_1_store_is_upgraded_in_place(db_path):
    _make_v1(db_path)
    with open_store(str(db_path)) as store:
        store.save_eval_results([row()])
        assert len(store.eval_results()) == 1
    con = duckdb.connect(str(db_path), read_only=True)
    version = con.execute("SELECT value FROM sketchwalk_meta WHERE key='schema_version'").fetchone()
    con.close()
    assert version == (str(sch.SCHEMA_VERSION),)


def test_versions_without_an_upgrade_path_are_still_refused(db_path):
    open_store(str(db_path)).close()
    con = duckdb.connect(str(db_path))
    con.execute("UPDATE sketchwalk_meta SET value = '0' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(SchemaVersionError, match="older"):
        open_store(str(db_path))
