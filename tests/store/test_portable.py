"""The schema and queries compile for PostgreSQL (the planned multi-worker store) without a server."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from sketchwalk.store import open_store, schema
from sketchwalk.store.jobs import claim_query


def _ddl(dialect) -> str:
    out = []
    for table in schema.metadata.sorted_tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)))
    return "\n".join(out)


def test_schema_compiles_for_postgresql_with_portable_types():
    ddl = _ddl(postgresql.dialect())
    assert "SERIAL" not in ddl  # DuckDB has no SERIAL: keys are text uuids
    assert "DOUBLE PRECISION" in ddl and "REAL" in ddl and "TIMESTAMP WITHOUT TIME ZONE" in ddl
    assert "JSON" not in ddl  # JSON kept as text so NaN metrics survive everywhere


def test_layer_index_only_where_it_pays(tmp_path):
    """DuckDB relies on zone maps (an index triples insert time); other databases get one."""
    with open_store(f"duckdb:///{tmp_path}/a.duckdb") as store, store.engine.connect() as conn:
        found = conn.exec_driver_sql("SELECT index_name FROM duckdb_indexes()").all()
        assert found == []
    with open_store(f"sqlite:///{tmp_path}/a.sqlite") as store:
        names = {i["name"] for i in sa.inspect(store.engine).get_indexes("block_scores")}
        assert names == {"ix_block_scores_layer"}
    pg = postgresql.dialect()
    index = next(i for i in schema.block_scores.indexes if i.name == "ix_block_scores_layer")
    assert "CREATE INDEX ix_block_scores_layer" in str(CreateIndex(index).compile(dialect=pg))


def test_claim_uses_skip_locked_on_postgresql_only():
    pg = str(claim_query("postgresql").compile(dialect=postgresql.dialect()))
    assert "FOR UPDATE SKIP LOCKED" in pg
    duck = str(claim_query("duckdb").compile(dialect=postgresql.dialect()))
    assert "FOR UPDATE" not in duck
