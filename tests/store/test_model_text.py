"""Model-made text is untrusted too: a NUL in a generation is stored (as U+FFFD) on every
database, PostgreSQL included, and a DuckDB store that kept a raw NUL before exports it in a form
a PostgreSQL import accepts."""

from __future__ import annotations

import sqlalchemy as sa
from store_fixtures import REQUEST, make_result, saved_run

from sketchwalk.store import open_store
from sketchwalk.store import schema as sch

STAND_IN = "\ufffd"


def test_nul_in_model_output_is_stored_on_every_database(store):
    result = make_result()
    result.dense_text = "before\x00after"
    result.sparse_text = "\x00"
    result.tokens[0].text = "tok\x00en"
    result.blocks[0].text = "\x00block"
    run_id = store.create_run(dict(REQUEST), status="running")
    store.save_result(run_id, result)
    run = store.get_run(run_id)
    assert run["status"] == "done"
    assert run["dense_text"] == f"before{STAND_IN}after" and run["sparse_text"] == STAND_IN
    tokens = store.tokens(run_id)
    assert f"tok{STAND_IN}en" in set(tokens["text"])
    assert store.blocks(run_id)["text"][0] == f"{STAND_IN}block"


def test_a_duckdb_store_holding_nul_exports_what_postgresql_imports(tmp_path, pg_url):
    with open_store(str(tmp_path / "old.duckdb")) as old:
        run_id, _ = saved_run(old)
        with old.engine.begin() as conn:  # as a store written before NUL was replaced
            conn.execute(sch.runs.update().values(sparse_text="raw\x00nul"))
            conn.execute(sch.tokens.update().values(text=sa.literal("t\x00")))
        assert old.get_run(run_id)["sparse_text"] == "raw\x00nul"
        blob = old.export_zip([run_id])
    with open_store(pg_url) as pg:
        assert pg.import_parquet(blob) == [run_id]
        assert pg.get_run(run_id)["sparse_text"] == f"raw{STAND_IN}nul"
        assert set(pg.tokens(run_id)["text"]) == {f"t{STAND_IN}"}
