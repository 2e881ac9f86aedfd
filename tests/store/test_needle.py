"""Needle tracking (store/needle.py) and `sketchwalk trace` on a stored run whose masks are known."""

from __future__ import annotations

import json

import numpy as np
import pytest
from known_runs import save_known

from sketchwalk.cli.main import main
from sketchwalk.store import open_store
from sketchwalk.store.needle import (
    MAX_SPANS,
    NeedleNotFound,
    find_needle,
    needle_spans,
    score_ranks,
    trace,
)


@pytest.fixture
def stored(tmp_path):
    url = str(tmp_path / "needle.duckdb")
    with open_store(url) as store:
        run_id = save_known(store)
    return url, run_id


def test_trace_reports_kept_rank_and_mass_per_layer_and_step(stored):
    url, run_id = stored
    with open_store(url) as store:
        t = trace(store, run_id, "KEY-4242")
    assert t.needle.blocks == [2] and t.needle.spans == [(9, 11)]
    got = [(s.label, s.layer, s.kept, s.ranks) for s in t.steps]
    assert got == [
        ("prefill", 0, [True], [None]),
        ("prefill", 1, [True], [2]),
        ("prefill", 2, [False], [5]),
        ("decode 1", 1, [False], [4]),
        ("decode 1", 2, [True], [1]),
    ]
    assert all(s.mass == pytest.approx(0.5) for s in t.steps)
    assert t.first_drop().layer == 2 and t.first_drop().phase == "prefill"
    assert "first dropped at prefill, layer 2" in t.sentence() and "rank 5" in t.sentence()


def test_trace_cli_table_json_and_missing_text(stored, capsys):
    url, run_id = stored
    assert main(["trace", run_id, "--text", "4242", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "prefill        2      B2  NO        5  0.5000" in out
    assert "first dropped at prefill, layer 2" in out
    assert main(["trace", run_id, "--text", "KEY", "--db", url, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["blocks"] == [2] and obj["first_drop"]["layer"] == 2
    assert [s["kept"] for s in obj["steps"]] == [[True], [True], [False], [False], [True]]
    assert main(["trace", run_id, "--text", "no such needle", "--db", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not occur" in err
    assert main(["trace", "not-a-run", "--text", "KEY", "--db", url]) == 2


def test_find_needle_spans_blocks_and_every_occurrence():
    import pandas as pd

    toks = pd.DataFrame(
        {
            "variant": "sparse",
            "position": range(8),
            "text": ["ab", "c", "d ", "x", "ab", "cd", "e", "f"],
        }
    )
    blocks = pd.DataFrame({"block": [0, 1, 2], "token_start": [0, 3, 6], "token_end": [3, 6, 8]})
    nd = find_needle("bcd", toks, blocks, 8)
    assert nd.spans == [(0, 3), (4, 6)] and nd.blocks == [0, 1]
    assert find_needle("d xa", toks, blocks, 8).blocks == [0, 1]
    with pytest.raises(NeedleNotFound):
        find_needle("zz", toks, blocks, 8)
    with pytest.raises(NeedleNotFound):
        find_needle("", toks, blocks, 8)
    assert score_ranks(np.array([0.1, 0.9, np.nan, 0.5]), [0, 1, 2, 3]) == [3, 1, None, 2]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_needle_spans_read_piece_by_piece_match_the_whole_prompt(size):
    """Occurrences across piece borders, overlapping ones and ones inside one long token are
    found once each, with the token indices of a search over the prompt joined whole."""
    texts = ["ab", "a", "b", "aba", "", "b", "xababx", "ab", "a", "bab"]
    joined = "".join(texts)
    starts = np.cumsum([0] + [len(t) for t in texts])
    for needle in ("ab", "aba", "bab", "b", "xa", "abab", "babx", "zz"):
        at, expected = joined.find(needle), []
        while at >= 0:
            lo = int(np.searchsorted(starts, at, side="right") - 1)
            hi = int(np.searchsorted(starts, at + len(needle), side="left"))
            expected.append((lo, max(hi, lo + 1)))
            at = joined.find(needle, at + 1)
        pieces = [texts[i : i + size] for i in range(0, len(texts), size)]
        assert needle_spans(pieces, needle) == expected, (needle, size)


def test_needle_spans_stop_at_max_spans():
    pieces = [["x"] * 1000] * 10  # a needle repeated all over the prompt
    assert len(needle_spans(pieces, "x")) == MAX_SPANS


def test_last_rows_are_each_records_last_heatmap_row(store):
    """store.last_rows, read in batches, holds for every record the row the heatmap has at its
    last query block (prefill: the prompt's last block; decode: the new token's row)."""
    from store_fixtures import saved_run

    run_id, result = saved_run(store)
    rows = store.last_rows(run_id)
    pre = max(int(max(r.q_blocks)) for r in result.layers if r.phase == "prefill")
    assert len(rows) == len(result.layers)
    for row, rec in zip(rows, result.layers, strict=True):
        assert (row["phase"], row["step"], row["layer"]) == (rec.phase, rec.step, rec.layer)
        q = int(max(rec.q_blocks))
        assert row["q_block"] == q and row["n_blocks"] == rec.n_blocks
        hm = store.heatmap(run_id, rec.phase, rec.step, rec.layer)
        if rec.phase == "prefill" and q != pre:
            assert np.isnan(row["walk"]).all()
            continue
        for name in ("walk", "exact", "selected"):
            np.testing.assert_array_equal(row[name], hm[name][q], err_msg=name)


def test_batched_reads_match_whole_reads_on_every_backend(store):
    """fetch_batches (DuckDB's reader, PostgreSQL's COPY parsed as it arrives, a cursor
    elsewhere) gives the rows fetch_arrow gives, texts with quotes, newlines, commas and empty
    strings included, in batches of the size asked; the prompt read piece by piece too."""
    from contextlib import closing

    import pyarrow as pa
    import sqlalchemy as sa
    from store_fixtures import saved_run

    from sketchwalk.store import schema
    from sketchwalk.store.bulk import fetch_arrow, fetch_batches

    run_id, result = saved_run(store)
    t = schema.tokens
    texts = ['a "quoted", text', "two\nlines", "", "\r\n", "ünï", ",", '""']
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(t)
            .where(t.c.run_id == run_id, t.c.position < len(texts), t.c.variant == "sparse")
            .values(text=sa.case(*((t.c.position == i, x) for i, x in enumerate(texts))))
        )
    stmt = sa.select(t).where(t.c.run_id == run_id).order_by(t.c.variant, t.c.position)
    with store.engine.connect() as conn:
        whole = fetch_arrow(conn, t, stmt)
        with closing(fetch_batches(conn, t, stmt, rows=7)) as batches:
            parts = list(batches)
    assert max(b.num_rows for b in parts) <= 7
    assert pa.Table.from_batches(parts, whole.schema).equals(whole)
    prompt = [tok.text for tok in result.tokens if tok.variant == "sparse"][: result.prompt_tokens]
    prompt[: len(texts)] = texts
    assert [x for piece in store.prompt_texts(run_id) for x in piece] == prompt
