"""Imports are untrusted input: every damaged export is refused in one line with nothing
written, and a store that already holds bad rows (written before these checks) still lists and
deletes them."""

from __future__ import annotations

import io
import json
import re
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from store_fixtures import count_rows, saved_run

from sketchwalk.cli.main import main
from sketchwalk.store import ForeignExportError, open_store
from sketchwalk.store import schema as sch
from sketchwalk.store.export import ImportLimits


@pytest.fixture
def export_dir(tmp_path):
    with open_store(str(tmp_path / "src.duckdb")) as src:
        run_id, _ = saved_run(src)
        src.export_parquet([run_id], tmp_path / "export")
    return tmp_path / "export"


def _rewrite(folder, table: str, column: str, value) -> None:
    """Set `column` of the first row of `table`'s file to `value` (keeping the file's types)."""
    path = folder / f"{table}.parquet"
    data = pq.read_table(path)
    values = data[column].to_pylist()
    values[0] = value
    idx = data.column_names.index(column)
    data = data.set_column(idx, column, pa.array(values, data.schema.field(column).type))
    pq.write_table(data, path)


def _snapshot(store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
            for t in sch.RUN_TABLES
        }


BAD_ROWS = [
    ("runs", "config", "{not json", "not a JSON object"),
    ("runs", "config", "[1, 2]", "not a JSON object"),
    ("runs", "metrics", "NaN-ish}", "not a JSON object"),
    ("runs", "request", None, "is empty"),
    ("runs", "status", "exploded", "is not one of"),
    ("runs", "prompt", "nul\x00byte", "NUL character"),
    ("runs", "method", "m" * 40, "longer than 32"),
    ("runs", "prompt_tokens", -5, "is negative"),
    ("layer_stats", "phase", "sideways", "is not a phase"),
    ("block_scores", "phase", "prefill:gx", "is not a phase"),
    ("layer_stats", "q_blocks", "[0, -1]", "list of block indices"),
    ("layer_stats", "density_achieved", 7.5, "outside [0, 1]"),
    ("layer_stats", "layer", -1, "is negative"),
    ("block_scores", "q_block", 10_000, "outside its layer"),
    ("block_scores", "k_block", 10_000, "after its query block"),
    ("tokens", "variant", "both", "is not one of"),
    ("blocks", "token_end", -3, "is negative"),
]


@pytest.mark.parametrize(("table", "column", "value", "why"), BAD_ROWS)
def test_damaged_rows_are_refused_and_nothing_is_written(
    store, export_dir, table, column, value, why
):
    keep, _ = saved_run(store, seed=5)
    before = _snapshot(store)
    _rewrite(export_dir, table, column, value)
    with pytest.raises(ForeignExportError, match=re.escape(why)) as err:
        store.import_parquet(export_dir)
    assert "\n" not in str(err.value)
    assert _snapshot(store) == before
    assert store.get_run(keep)["status"] == "done"


def _declare_rows(folder, table: str, rows: int) -> None:
    """Make the manifest agree with a rewritten table file (a forger would)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tables"][table]["rows"] = rows
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_block_pair_scored_twice_is_refused(store, export_dir):
    """block_scores has no primary key: a pair repeated in another batch (here, the file's end)
    is found by the query after the rows are in, and the import rolls back."""
    path = export_dir / "block_scores.parquet"
    data = pq.read_table(path)
    pq.write_table(pa.concat_tables([data, data.slice(0, 1)]), path, row_group_size=8)
    _declare_rows(export_dir, "block_scores", data.num_rows + 1)
    before = _snapshot(store)
    with pytest.raises(ForeignExportError, match="same block pair twice") as err:
        store.import_parquet(export_dir)
    assert "\n" not in str(err.value)
    assert _snapshot(store) == before


def test_duplicate_keys_are_refused(store, export_dir):
    path = export_dir / "tokens.parquet"
    data = pq.read_table(path)
    pq.write_table(pa.concat_tables([data, data.slice(0, 1)]), path)
    _declare_rows(export_dir, "tokens", data.num_rows + 1)
    before = _snapshot(store)
    with pytest.raises(ForeignExportError, match="repeat the key"):
        store.import_parquet(export_dir)
    assert _snapshot(store) == before


@pytest.mark.parametrize("run_id", ["../../etc", "ABC", "2b1f9ab0-8619-4516-bf40-365b57dde9e3x"])
def test_malformed_run_ids_in_the_manifest_are_refused(store, export_dir, run_id):
    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["run_ids"] = [run_id]
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ForeignExportError, match="not a well-formed run id"):
        store.import_parquet(export_dir)
    assert store.run_ids() == []


@pytest.mark.parametrize("version", ["two", 2.5, None, True, [2]])
def test_a_non_integer_schema_version_is_one_line(db_path, export_dir, capsys, version):
    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["schema_version"] = version
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    assert main(["import", "--db", str(db_path), str(export_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema_version" in err and "not an integer" in err
    with open_store(str(db_path)) as store:
        assert store.run_ids() == []


def _zip(members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_a_zip_with_two_manifests_says_so(store, export_dir):
    members = {p.name: p.read_bytes() for p in export_dir.iterdir()}
    both = {f"a/{n}": d for n, d in members.items()} | {f"b/{n}": d for n, d in members.items()}
    with pytest.raises(ForeignExportError, match="holds 2 manifest.json files"):
        store.import_parquet(_zip(both))
    assert store.run_ids() == []


def test_a_zip_bomb_manifest_is_refused_before_it_is_expanded(store):
    # 64 MiB of spaces compress to ~64 KiB: the declared size alone refuses it.
    bomb = _zip({"manifest.json": b" " * (64 << 20)})
    assert len(bomb) < 1 << 20
    limits = ImportLimits(member_bytes=1 << 20, total_bytes=1 << 21, manifest_bytes=1 << 20)
    with pytest.raises(ForeignExportError, match="over the import limit"):
        store.import_parquet(bomb, limits=limits)


def test_member_and_total_caps_are_configurable(store, export_dir, monkeypatch):
    biggest = max(p.stat().st_size for p in export_dir.glob("*.parquet"))
    small = ImportLimits(member_bytes=biggest - 1)
    with pytest.raises(ForeignExportError, match="per file"):
        store.import_parquet(export_dir, limits=small)
    total = sum(p.stat().st_size for p in export_dir.iterdir())
    with pytest.raises(ForeignExportError, match="import limit"):
        store.import_parquet(export_dir, limits=ImportLimits(total_bytes=total - 1))
    monkeypatch.setenv("SKETCHWALK_IMPORT_MAX_MB", "1")
    assert ImportLimits.from_settings().member_bytes == 1 << 20
    assert store.run_ids() == []
    assert store.import_parquet(export_dir, limits=ImportLimits(total_bytes=total))


def test_a_store_with_bad_rows_still_lists_and_deletes_them(db_path, capsys):
    with open_store(str(db_path)) as store:
        good, _ = saved_run(store)
        bad, _ = saved_run(store, seed=1)
        with store.engine.begin() as conn:  # rows written before imports were checked
            conn.execute(
                sch.runs.update()
                .where(sch.runs.c.id == bad)
                .values(config="{broken", metrics="nope", status="exploded")
            )
    assert main(["runs", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert bad in out and "exploded" in out and good in out
    assert main(["runs", "--db", str(db_path), "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[bad]["config"] is None and rows[good]["config"]
    assert main(["delete", "--db", str(db_path), bad]) == 0
    with open_store(str(db_path)) as store:
        assert store.run_ids() == [good]
        assert sum(count_rows(store, good).values()) > 0


def test_round_trip_still_imports_everything(store, export_dir):
    ids = store.import_parquet(export_dir)
    assert len(ids) == 1
    data = pq.read_table(export_dir / "block_scores.parquet")
    assert count_rows(store, ids[0])["block_scores"] == data.num_rows
    assert pc.all(pc.less_equal(data["k_block"], data["q_block"])).as_py()


# ---- the store's limits, nesting, encodings, decoded-size bombs -----------------------------

NESTED = '{"a": ' * 30_000 + "1" + "}" * 30_000  # RecursionError in json.loads; under MAX_RUN_NOTE


@pytest.mark.parametrize(
    ("table", "column", "value", "why"),
    [
        ("layer_stats", "n_blocks", 1_000_000, "over the store's limit 16384"),
        ("layer_stats", "layer", 5000, "over the store's limit 1023"),
        ("layer_stats", "q_blocks", "[0, 99]", "lies outside its n_blocks"),
        ("tokens", "position", 1 << 21, "over the store's limit"),
        ("blocks", "token_end", 1 << 21, "over the store's limit"),
        ("runs", "prompt_tokens", 1 << 30, "over the store's limit"),
        ("tokens", "text", "x" * 1025, "longer than 1024 characters"),
        ("runs", "config", NESTED, "not a JSON object"),
        ("runs", "metrics", "[" * 50_000 + "]" * 50_000, "not a JSON object"),
        ("layer_stats", "q_blocks", "[" * 50_000 + "]" * 50_000, "list of block indices"),
    ],
)
def test_values_past_the_stores_limits_are_refused(store, export_dir, table, column, value, why):
    before = _snapshot(store)
    _rewrite(export_dir, table, column, value)
    with pytest.raises(ForeignExportError, match=re.escape(why)) as err:
        store.import_parquet(export_dir)
    assert "\n" not in str(err.value)
    assert _snapshot(store) == before


def test_a_deeply_nested_manifest_is_one_line(db_path, export_dir, capsys):
    (export_dir / "manifest.json").write_text(NESTED)
    assert main(["import", "--db", str(db_path), str(export_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json" in err and "not valid JSON" in err


def _invalid_utf8(folder, table: str, column: str) -> None:
    """Put bytes that are not UTF-8 into a string column (Parquet does not check them)."""
    path = folder / f"{table}.parquet"
    data = pq.read_table(path)
    values = [v.encode() if v is not None else None for v in data[column].to_pylist()]
    values[0] = b"ok \xff\xfe\xc3\x28 not utf-8"
    broken = pa.array(values, pa.binary()).view(pa.string())
    pq.write_table(data.set_column(data.column_names.index(column), column, broken), path)


@pytest.mark.parametrize(
    ("table", "column"),
    [("runs", "prompt"), ("layer_stats", "phase"), ("tokens", "text"), ("blocks", "text")],
)
def test_invalid_utf8_in_a_string_column_is_one_line(db_path, export_dir, capsys, table, column):
    _invalid_utf8(export_dir, table, column)
    assert main(["import", "--db", str(db_path), str(export_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"column {column!r}" in err and "not valid UTF-8" in err
    with open_store(str(db_path)) as store:
        assert store.run_ids() == []


def test_invalid_utf8_never_reaches_the_database(store, export_dir):
    _invalid_utf8(export_dir, "tokens", "text")
    with pytest.raises(ForeignExportError, match="not valid UTF-8"):
        store.import_parquet(export_dir)
    assert store.run_ids() == []


def test_a_store_holding_deeply_nested_json_still_lists_it(db_path, capsys):
    with open_store(str(db_path)) as store:
        run_id, _ = saved_run(store)
        with store.engine.begin() as conn:  # written before imports were checked
            conn.execute(sch.runs.update().values(config=NESTED, metrics=NESTED))
        assert store.get_run(run_id)["config"] is None
    assert main(["runs", "--db", str(db_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == run_id and row["config"] is None


def test_a_manifest_without_row_counts_is_refused(store, export_dir):
    manifest = json.loads((export_dir / "manifest.json").read_text())
    del manifest["tables"]["tokens"]["rows"]
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ForeignExportError, match="no row count for tokens"):
        store.import_parquet(export_dir)
    assert store.run_ids() == []


def _bomb_tokens(folder, rows: int, text_chars: int, declare: int | None = None) -> None:
    """tokens.parquet replaced by `rows` rows of one long text: a few MB on disk, `rows` x
    `text_chars` bytes once decoded; the manifest declares `declare` rows (default: the truth)."""
    run_id = pq.read_table(folder / "runs.parquet")["id"][0].as_py()
    zeros = pa.array(np.zeros(rows, dtype=np.int32))

    def repeated(value: str) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(zeros, pa.array([value]))

    bomb = pa.table(
        {
            "run_id": repeated(run_id),
            "variant": repeated("dense"),
            "position": pa.array(np.arange(rows, dtype=np.int32)),
            "token_id": zeros,
            "text": repeated("x" * text_chars),
            "logprob": pa.nulls(rows, pa.float64()),
            "kl": pa.nulls(rows, pa.float64()),
        }
    )
    pq.write_table(bomb, folder / "tokens.parquet", compression="zstd")
    _declare_rows(folder, "tokens", rows if declare is None else declare)


_PEAK = """
import resource, sys
from sketchwalk.store import open_store
with open_store(sys.argv[1]) as store:
    try:
        store.import_parquet(sys.argv[2])
        print("imported")
    except Exception as exc:
        print(type(exc).__name__, exc)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _import_peak(db, source) -> tuple[str, int]:
    """What an import in a fresh process says, and its peak resident memory (MiB)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(db), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    said, peak = out.stdout.strip().splitlines()
    return said, int(peak)


@pytest.mark.heavy
def test_a_decoded_size_bomb_is_refused_while_it_is_read(tmp_path, export_dir):
    import shutil

    honest = tmp_path / "honest"
    shutil.copytree(export_dir, honest)
    said, baseline = _import_peak(tmp_path / "a.duckdb", honest)
    assert said == "imported"
    _bomb_tokens(export_dir, rows=1_500_000, text_chars=1000)  # 1.5 GB decoded
    assert (export_dir / "tokens.parquet").stat().st_size < 8 << 20
    said, peak = _import_peak(tmp_path / "b.duckdb", export_dir)
    assert said.startswith("ForeignExportError") and "decodes to over 1024 MiB" in said
    assert peak - baseline < 400, (baseline, peak)  # far below the 1.5 GB it decodes to


@pytest.mark.parametrize("declare", [None, 102])
def test_millions_of_constant_rows_are_refused_before_they_are_decoded(
    tmp_path, export_dir, declare
):
    _bomb_tokens(export_dir, rows=3_000_000, text_chars=8, declare=declare)
    said, peak = _import_peak(tmp_path / "c.duckdb", export_dir)
    why = "declares 3,000,000 tokens rows" if declare is None else "holds 3000000 rows"
    assert said.startswith("ForeignExportError") and why in said, said
