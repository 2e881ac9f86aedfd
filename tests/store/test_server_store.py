"""What a server database adds: exact round trips through the bulk paths (COPY on PostgreSQL),
the psycopg driver behind a plain postgresql:// URL, and schema creation/upgrade on first use."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import sqlalchemy as sa

from sketchwalk.store import SCHEMA_VERSION, open_store, schema
from sketchwalk.store.bulk import _is_copy_pg, arrow_schema, fetch_arrow, insert_arrow

TEXTS = ["", None, 'quo"te', "comma, and\nnewline", "back\\slash \\N", "ünïcode ✓", "NULL", "  "]


def test_tricky_values_round_trip_exactly(store):
    """Empty vs NULL strings, NaN/inf, CSV metacharacters: what a COPY path gets wrong first."""
    n = len(TEXTS)
    floats = [0.1, float("nan"), float("inf"), -float("inf"), None, 1e-300, -2.5e38, 1 / 3]
    data = pa.table(
        {
            "variant": ["dense"] * n,
            "position": list(range(n)),
            "token_id": [7] * n,
            "text": [t if t is not None else "" for t in TEXTS],  # text is NOT NULL
            "logprob": floats,
            "kl": [None if t is None else 0.5 for t in TEXTS],
        },
        schema=arrow_schema(schema.tokens, [c.name for c in schema.tokens.columns][1:]),
    )
    t = schema.tokens
    with store.engine.begin() as conn:
        assert insert_arrow(conn, t, data, {"run_id": "r1"}) == n
    with store.engine.connect() as conn:
        back = fetch_arrow(conn, t, sa.select(t).order_by(t.c.position)).to_pylist()
    assert [r["run_id"] for r in back] == ["r1"] * n
    assert [r["text"] for r in back] == data["text"].to_pylist()
    assert [r["kl"] is None for r in back] == [x is None for x in TEXTS]
    for got, want in zip((r["logprob"] for r in back), floats, strict=True):
        if want is None:
            assert got is None
        elif math.isnan(want):
            if store.engine.dialect.name == "sqlite":  # SQLite itself stores NaN as NULL
                assert got is None
            else:
                assert math.isnan(got)
        else:
            assert got == want


def test_block_scores_float32_and_bools_are_bit_exact(store):
    import numpy as np

    rng = np.random.default_rng(3)
    vals = rng.random(500, dtype=np.float32) / 7
    sel = rng.random(500) < 0.5
    t = schema.block_scores
    cols = ["phase", "step", "layer", "q_block", "k_block", "sketch", "walk", "exact", "selected"]
    data = pa.table(
        {
            "phase": ["prefill"] * 500,
            "step": [0] * 500,
            "layer": [3] * 500,
            "q_block": list(range(500)),
            "k_block": [0] * 500,
            "sketch": vals,
            "walk": pa.nulls(500, pa.float32()),
            "exact": vals[::-1].copy(),
            "selected": pa.array([None if i % 7 == 0 else bool(s) for i, s in enumerate(sel)]),
        },
        schema=arrow_schema(t, cols),
    )
    with store.engine.begin() as conn:
        insert_arrow(conn, t, data, {"run_id": "r"})
    with store.engine.connect() as conn:
        back = fetch_arrow(conn, t, sa.select(*(t.c[c] for c in cols)).order_by(t.c.q_block))
    assert back["sketch"].to_numpy().tobytes() == vals.tobytes()
    assert back["walk"].null_count == 500
    assert back["selected"].to_pylist() == data["selected"].to_pylist()


def test_plain_postgresql_url_uses_psycopg_and_the_copy_path(pg_url):
    assert pg_url.startswith("postgresql://")
    with open_store(pg_url) as store:
        assert store.engine.dialect.driver == "psycopg"
        with store.engine.connect() as conn:
            assert _is_copy_pg(conn)


def test_schema_is_created_then_upgraded_from_version_1_on_first_use(pg_url):
    with open_store(pg_url) as store:
        tables = set(sa.inspect(store.engine).get_table_names())
        assert {t.name for t in schema.metadata.sorted_tables} <= tables
    # make it a version-1 store: no eval_results table, version 1 in meta
    with open_store(pg_url) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE eval_results")
        conn.execute(
            schema.meta.update().where(schema.meta.c.key == "schema_version").values(value="1")
        )
    with open_store(pg_url) as store:
        assert "eval_results" in sa.inspect(store.engine).get_table_names()
        with store.engine.connect() as conn:
            version = conn.execute(
                sa.select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
            ).scalar()
        assert int(version) == SCHEMA_VERSION
        assert store.save_eval_results(
            [
                {
                    "eval_id": "e",
                    "model_id": "m",
                    "task": "lm",
                    "source": "s",
                    "length": 8,
                    "method": "sketchwalk",
                    "phases": "both",
                    "density_target": 0.2,
                    "n_items": 1,
                    "n_tokens": 8,
                    "config": {},
                }
            ]
        )


def test_unreachable_server_is_a_one_line_error():
    from sketchwalk.store import StoreError

    with pytest.raises(StoreError, match="cannot open database") as info:
        open_store("postgresql://nobody:x@127.0.0.1:1/none?connect_timeout=2")
    assert "\n" not in str(info.value)
