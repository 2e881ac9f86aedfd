"""Parquet export/import: equal contents after a round trip, refusal of foreign or clashing
input with nothing changed, and clear errors for unwritable folders."""

from __future__ import annotations

import io
import json
import zipfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_fixtures import count_rows, saved_run

from sketchwalk.store import (
    ExportError,
    ForeignExportError,
    RunExistsError,
    SchemaVersionError,
    UnknownRunError,
    open_store,
)
from sketchwalk.store import schema as sch

TABLES = [t.name for t in sch.RUN_TABLES]


def _frames(source) -> dict[str, pd.DataFrame]:
    """Every table of an export folder, sorted so row order does not matter."""
    out = {}
    for name in TABLES:
        df = pq.read_table(source / f"{name}.parquet").to_pandas()
        out[name] = df.sort_values(list(df.columns[:6])).reset_index(drop=True)
    return out


def test_export_writes_one_file_per_table_and_a_manifest(store, tmp_path):
    keep, _ = saved_run(store)
    saved_run(store, seed=2)  # not exported
    paths = store.export_parquet([keep], tmp_path / "out")
    assert [p.name for p in paths] == [f"{n}.parquet" for n in TABLES] + ["manifest.json"]
    manifest = json.loads(paths[-1].read_text())
    assert manifest["format"] == "sketchwalk-export"
    assert manifest["schema_version"] == sch.SCHEMA_VERSION
    assert manifest["run_ids"] == [keep]
    assert manifest["sketchwalk_version"]
    frames = _frames(tmp_path / "out")
    counts = count_rows(store, keep)
    for name in TABLES:
        key = "id" if name == "runs" else "run_id"
        assert set(frames[name][key]) == {keep}, name
        assert len(frames[name]) == counts[name] == manifest["tables"][name]["rows"]
    # plain tools read it: block scores keep their float32 / bool types
    scores = pq.read_table(tmp_path / "out" / "block_scores.parquet")
    assert scores.schema.field("sketch").type == pa.float32()
    assert scores.schema.field("selected").type == pa.bool_()


def test_folder_round_trip_has_equal_contents(store, tmp_path):
    ids = [saved_run(store, seed=s)[0] for s in range(2)]
    queued = store.create_run({"prompt": "still waiting"})
    store.export_parquet(None, tmp_path / "a")
    with open_store(str(tmp_path / "other.duckdb")) as other:
        imported = other.import_parquet(tmp_path / "a")
        assert sorted(imported) == sorted([*ids, queued])
        other.export_parquet(None, tmp_path / "b")
        assert other.get_run(queued)["status"] == "queued"
    a, b = _frames(tmp_path / "a"), _frames(tmp_path / "b")
    for name in TABLES:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)


def test_zip_round_trip_and_heatmaps_match(store, tmp_path):
    run_id, _ = saved_run(store)
    data = store.export_zip([run_id])
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == sorted([f"{n}.parquet" for n in TABLES] + ["manifest.json"])
    (tmp_path / "x.zip").write_bytes(data)
    with open_store(str(tmp_path / "other.duckdb")) as other:
        assert other.import_parquet(data) == [run_id]  # bytes, as from an upload widget
        other.delete_run(run_id)
        assert other.import_parquet(tmp_path / "x.zip") == [run_id]  # a path
        for layer in range(4):
            want = store.heatmap(run_id, "prefill", 0, layer)
            got = other.heatmap(run_id, "prefill", 0, layer)
            for key in ("sketch", "walk", "exact", "selected"):
                pd.testing.assert_frame_equal(pd.DataFrame(want[key]), pd.DataFrame(got[key]))
        pd.testing.assert_frame_equal(store.tokens(run_id), other.tokens(run_id))
        assert store.get_run(run_id) == other.get_run(run_id)


def test_import_of_present_runs_is_refused_or_skipped(store, tmp_path):
    run_id, _ = saved_run(store)
    store.export_parquet([run_id], tmp_path / "e")
    before = count_rows(store, run_id)
    with pytest.raises(RunExistsError, match="already in the store"):
        store.import_parquet(tmp_path / "e")
    assert count_rows(store, run_id) == before
    assert store.import_parquet(tmp_path / "e", skip_existing=True) == []
    assert count_rows(store, run_id) == before


def test_skip_existing_imports_only_new_runs(store, tmp_path):
    a, _ = saved_run(store)
    b, _ = saved_run(store, seed=5)
    store.export_parquet(None, tmp_path / "e")
    b_rows = count_rows(store, b)
    store.delete_run(b)
    assert store.import_parquet(tmp_path / "e", skip_existing=True) == [b]
    assert count_rows(store, b) == b_rows
    assert len(store.list_runs()) == 2 and a in set(store.list_runs()["id"])


def _store_snapshot(store) -> pd.DataFrame:
    return store.list_runs()[["id", "status"]]


def test_foreign_parquet_is_refused_with_nothing_changed(store, tmp_path):
    saved_run(store)
    before = _store_snapshot(store)
    folder = tmp_path / "foreign"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), folder / "data.parquet")
    with pytest.raises(ForeignExportError, match="not a sketchwalk export"):
        store.import_parquet(folder)
    with pytest.raises(ForeignExportError, match="not a sketchwalk export"):
        store.import_parquet(folder / "data.parquet")  # a lone Parquet file
    # a manifest that looks right but a table with other columns
    run_id = store.list_runs()["id"][0]
    store.export_parquet([run_id], tmp_path / "e")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "e" / "tokens.parquet")
    store.delete_run(run_id)
    with pytest.raises(ForeignExportError, match="tokens.parquet.*columns"):
        store.import_parquet(tmp_path / "e")
    assert store.list_runs().empty  # the valid tables before it were not imported either
    # garbage zip bytes
    with pytest.raises(ForeignExportError, match="neither an export folder nor a zip"):
        store.import_parquet(b"PK not really a zip")
    assert len(before) == 1


def test_rows_of_runs_outside_the_manifest_are_refused(store, tmp_path):
    run_id, _ = saved_run(store)
    store.export_parquet([run_id], tmp_path / "e")
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    manifest["run_ids"] = ["someone-else"]
    (tmp_path / "e" / "manifest.json").write_text(json.dumps(manifest))
    store.delete_run(run_id)
    with pytest.raises(ForeignExportError, match="manifest"):
        store.import_parquet(tmp_path / "e")
    assert store.list_runs().empty


def test_export_of_another_schema_version_is_refused(store, tmp_path):
    run_id, _ = saved_run(store)
    store.export_parquet([run_id], tmp_path / "e")
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    manifest["schema_version"] = sch.SCHEMA_VERSION + 1
    (tmp_path / "e" / "manifest.json").write_text(json.dumps(manifest))
    store.delete_run(run_id)
    with pytest.raises(SchemaVersionError, match="newer"):
        store.import_parquet(tmp_path / "e" / "manifest.json")
    assert store.list_runs().empty


def test_unwritable_export_folder_is_a_clear_error(store, tmp_path):
    run_id, _ = saved_run(store)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="cannot write the export to .*a_file") as info:
        store.export_parquet([run_id], blocker / "sub")
    assert "\n" not in str(info.value)


def test_export_of_unknown_run_is_a_clear_error(store, tmp_path):
    saved_run(store)
    with pytest.raises(UnknownRunError, match="'missing'"):
        store.export_parquet(["missing"], tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_missing_import_path(store, tmp_path):
    with pytest.raises(ForeignExportError, match="does not exist"):
        store.import_parquet(tmp_path / "nope")


@pytest.mark.parametrize("at", [0, 2])
def test_an_interrupted_export_leaves_no_partial_files(store, tmp_path, monkeypatch, at):
    """Ctrl-C while the export writes (before its first file's bytes, or part-way through the
    tables): the interrupt goes on, and no file of the export is left behind."""
    run_id, _ = saved_run(store)
    real, calls = pq.ParquetWriter.write_table, []

    def write(self, table, *args, **kw):  # each batch of rows the export writes
        calls.append(1)
        if len(calls) > at:
            raise KeyboardInterrupt
        return real(self, table, *args, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write)
    with pytest.raises(KeyboardInterrupt):
        store.export_parquet([run_id], tmp_path / "e")
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == []


@pytest.mark.parametrize(("chars", "imports"), [(100, True), (101, False)])
def test_a_runs_text_past_the_stores_limit_is_refused_before_import(
    store, tmp_path, monkeypatch, chars, imports
):
    """A runs value longer than store/limits.py allows is refused in one line, nothing
    imported; one at the limit imports (the limit lowered here to keep the files small)."""
    from sketchwalk.store import limits

    monkeypatch.setitem(limits.RUN_LONGEST, "prompt", 100)
    run_id, _ = saved_run(store)
    store.export_parquet([run_id], tmp_path / "e")
    store.delete_run(run_id)
    runs = pq.read_table(tmp_path / "e" / "runs.parquet")
    at = runs.schema.get_field_index("prompt")
    runs = runs.set_column(at, "prompt", pa.array(["p" * chars]))
    pq.write_table(runs, tmp_path / "e" / "runs.parquet")
    if imports:
        store.import_parquet(tmp_path / "e")
        assert store.get_run(run_id)["prompt"] == "p" * chars
        return
    with pytest.raises(ForeignExportError) as refused:
        store.import_parquet(tmp_path / "e")
    said = str(refused.value)
    assert "column 'prompt'" in said and "longer than 100 characters" in said
    assert "\n" not in said and store.list_runs().empty
