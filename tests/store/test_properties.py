"""Property-based faults (hypothesis): random knob values and hostile prompts at `sketchwalk run`,
and damaged export files at the import, never leave the store unreadable or changed by a
refusal. Either the input is accepted and everything stored reads back, or it is refused with
one line (exit 2) and the store is exactly as before.

The example counts are the figures in the README's "What we promise" (PROPERTY_EXAMPLES).
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pg_testdb import fresh_schema, pg_enabled
from store_fixtures import saved_run

from sketchwalk.cli.main import main
from sketchwalk.errors import SketchWalkError
from sketchwalk.store import open_store
from sketchwalk.store import schema as sch
from sketchwalk.store.export import ImportLimits

CLI_EXAMPLES = 40
IMPORT_EXAMPLES = 150
RELAXED = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same cases every run: a failure is reproducible, the figures fixed
    database=None,
)


def snapshot(store) -> dict:
    """Every run table's rows, as sorted tuples: equal snapshots mean an unchanged store."""
    out = {}
    with store.engine.connect() as conn:
        for table in (*sch.RUN_TABLES, sch.jobs):
            rows = conn.execute(sa.select(table)).all()
            out[table.name] = sorted(map(repr, rows))
    return out


def readable(store) -> None:
    """Everything a user can open still opens: the run list, each run and its layer views."""
    df = store.list_runs()
    for run_id in df["id"]:
        store.get_run(run_id)
        steps = store.steps(run_id)
        store.tokens(run_id)
        store.blocks(run_id)
        for rec in steps.head(4).itertuples():
            store.heatmap(run_id, rec.phase, int(rec.step), int(rec.layer))


# ---- the CLI ---------------------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs", "Cc")), max_size=400
)
PROMPTS = st.one_of(
    TEXT,
    st.just("A plain prompt about blocks of tokens. " * 8),
    TEXT.map(lambda t: "Blocks of tokens, layer after layer. " * 6 + t),
    st.builds(lambda a, b: a + "\x00" + b, TEXT, TEXT),
    st.just("x" * 300_000),
)
KNOBS = st.fixed_dictionaries(
    {},
    optional={
        "--density": st.one_of(st.floats(allow_nan=True), st.sampled_from(["0.3", "abc", ""])),
        "--block-size": st.one_of(st.integers(-64, 300), st.sampled_from(["16", "x"])),
        "--sketch-dim": st.integers(-4, 5000),
        "--beta": st.one_of(st.floats(-2, 2), st.just(float("nan"))),
        "--degree": st.integers(-3, 80),
        "--tau": st.one_of(st.floats(-5, 200), st.sampled_from([float("inf"), float("nan")])),
        "--sink": st.floats(-1, 2),
        "--window": st.floats(-1, 2),
        "--dense-layers": st.sampled_from(["", "0", "0,1", "99", "-1", "a,b", "3,3"]),
        "--max-new-tokens": st.integers(-5, 3),
        "--method": st.sampled_from(["sketchwalk", "nowalk", "bogus"]),
        "--device": st.sampled_from(["cpu", "bogus", "cuda:99"]),
    },
)


@pytest.fixture(scope="module")
def cli_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("prop") / "cli.duckdb"
    with open_store(str(db)) as store:
        saved_run(store)
    return db


FAIR_KNOBS = st.fixed_dictionaries(
    {"--block-size": st.sampled_from(["16", "32"])},
    optional={
        "--density": st.floats(0.05, 1.0),
        "--beta": st.floats(0.0, 1.0),
        "--degree": st.integers(1, 4),
        "--sink": st.floats(0.0, 0.2),
        "--window": st.floats(0.0, 0.2),
        "--dense-layers": st.sampled_from(["", "0", "0,1", "3"]),
        "--max-new-tokens": st.integers(0, 3),
        "--method": st.sampled_from(["sketchwalk", "nowalk"]),
    },
)
"""Knobs inside their ranges: these cases must run (prompts may still carry control characters)."""
FAIR_PROMPTS = TEXT.map(
    lambda t: "Blocks of tokens, layer after layer. " * 6 + t.replace("\x00", "")
)


@pytest.mark.heavy
@settings(RELAXED, max_examples=CLI_EXAMPLES)
@given(
    case=st.one_of(
        st.tuples(FAIR_PROMPTS, FAIR_KNOBS, st.just(False)),
        st.tuples(PROMPTS, KNOBS, st.booleans()),
    )
)
def test_random_run_requests_are_run_or_refused_in_one_line(
    cli_db, tiny_model_dir, tmp_path, capsys, case
):
    prompt, knobs, binary = case
    with open_store(str(cli_db)) as store:
        before = snapshot(store)
    argv = ["run", "--model", str(tiny_model_dir), "--db", str(cli_db), "--json"]
    if binary:  # the prompt as a file, possibly not UTF-8
        path = tmp_path / "prompt.bin"
        path.write_bytes(prompt.encode("utf-8", "surrogatepass")[:5000] + b"\xff\xfe")
        argv += ["--prompt-file", str(path)]
    else:
        argv.append(prompt)
    for flag, value in knobs.items():
        argv += [f"{flag}={value}"]
    try:
        rc = main(argv)
    except SystemExit as stop:  # argparse: a usage error, one line
        rc = stop.code
    captured = capsys.readouterr()
    with open_store(str(cli_db)) as store:
        after = snapshot(store)
        readable(store)
        statuses = set(store.list_runs()["status"])
    assert "running" not in statuses
    event(f"exit {rc}")
    if rc == 0:
        new = json.loads(captured.out)["run_id"]
        with open_store(str(cli_db)) as store:
            assert store.get_run(new)["status"] == "done"
            store.delete_run(new)  # back to the starting store for the next case
            assert snapshot(store) == before
        return
    lines = [ln.split("\r")[-1].strip() for ln in captured.err.split("\n")]
    lines = [ln for ln in lines if ln]
    assert rc == 2 and len(lines) == 1 and "error:" in lines[0], (argv, captured.err[-2000:])
    assert after == before


# ---- imports ---------------------------------------------------------------------------------


def _export(tmp_path_factory) -> bytes:
    with open_store(str(tmp_path_factory.mktemp("src") / "src.duckdb")) as src:
        a, _ = saved_run(src)
        b, _ = saved_run(src, seed=3, n_blocks=6)
        return src.export_zip([a, b])


@pytest.fixture(scope="module")
def export_zip(tmp_path_factory) -> bytes:
    return _export(tmp_path_factory)


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, raw in members.items():
            zf.writestr(name, raw)
    return buf.getvalue()


VALUES = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=60),
    st.sampled_from(["{", "[]", "{}", "null", "done", "running", "decode", "\x00", "NaN"]),
)


@st.composite
def damaged(draw, original: bytes) -> bytes:
    """One way an export gets damaged or forged."""
    members = _members(original)
    kind = draw(st.sampled_from(["cell", "cell", "cell", "bytes", "truncate", "manifest", "drop"]))
    names = sorted(members)
    if kind == "bytes":  # flip bytes of the zip itself
        raw = bytearray(original)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] = draw(st.integers(0, 255))
        return bytes(raw)
    if kind == "truncate":
        return original[: draw(st.integers(0, len(original) - 1))]
    if kind == "drop":
        members.pop(draw(st.sampled_from(names)))
        return _zip(members)
    if kind == "manifest":
        manifest = json.loads(members["manifest.json"])
        key = draw(st.sampled_from(["format", "schema_version", "run_ids"]))
        manifest[key] = draw(st.one_of(VALUES, st.lists(st.text(max_size=40), max_size=3)))
        members["manifest.json"] = json.dumps(manifest).encode()
        return _zip(members)
    name = draw(st.sampled_from([n for n in names if n.endswith(".parquet")]))
    table = pq.read_table(pa.BufferReader(members[name]))
    if table.num_rows == 0:
        return _zip(members)
    column = draw(st.sampled_from(table.column_names))
    row = draw(st.integers(0, table.num_rows - 1))
    values = table[column].to_pylist()
    values[row] = draw(VALUES)
    try:
        array = pa.array(values)
    except (pa.ArrowException, OverflowError):
        array = pa.array([None if v is None else str(v) for v in values])
    table = table.set_column(table.column_names.index(column), column, array)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    members[name] = sink.getvalue()
    return _zip(members)


BACKENDS = ["duckdb"] + (["postgresql"] if pg_enabled() else [])


@pytest.fixture(scope="module", params=BACKENDS)
def target(request, tmp_path_factory):
    """A store holding one run of its own, shared by every example (kept unchanged)."""
    if request.param == "postgresql":
        with fresh_schema() as url, open_store(url) as store:
            saved_run(store, seed=9)
            yield store
        return
    with open_store(str(tmp_path_factory.mktemp("dst") / "dst.duckdb")) as store:
        saved_run(store, seed=9)
        yield store


@pytest.mark.heavy
@settings(RELAXED, max_examples=IMPORT_EXAMPLES)
@given(data=st.data())
def test_damaged_exports_are_refused_or_imported_whole(target, export_zip, data):
    blob = data.draw(damaged(export_zip))
    before = snapshot(target)
    try:
        ids = target.import_parquet(blob)
    except SketchWalkError as exc:
        event(f"refused: {type(exc).__name__}")
        assert "\n" not in str(exc)
        assert snapshot(target) == before
        readable(target)
        return
    event("imported")
    readable(target)  # accepted: every imported run reads back
    for run_id in ids:
        target.delete_run(run_id)
    assert snapshot(target) == before


# ---- hostile exports: deep nesting, invalid UTF-8, decoded-size bombs -----------------------

HOSTILE_EXAMPLES = 60
SMALL_CAPS = ImportLimits(decoded_bytes=4 << 20, rows=150_000)
"""Caps small enough that a bomb crosses them in a fraction of a second (the defaults are
checked by tests/store/test_import_faults.py)."""
JSON_CELLS = [("runs", c) for c in ("config", "request", "versions", "metrics", "timings")] + [
    ("layer_stats", "q_blocks")
]


def _nested(draw) -> str:
    depth = draw(st.one_of(st.integers(2, 400), st.integers(5_000, 120_000)))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a": ', "}")]))
    return opener * depth + "1" * (opener == "[") + "0" * (opener != "[") + closer * depth


def _write(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _declare(members: dict[str, bytes], name: str, rows: int) -> None:
    manifest = json.loads(members["manifest.json"])
    manifest["tables"][name]["rows"] = rows
    members["manifest.json"] = json.dumps(manifest).encode()


@st.composite
def hostile(draw, original: bytes) -> tuple[str, bytes]:
    """(kind, zip): an export made hostile the way the fault reports found."""
    members = _members(original)
    kind = draw(st.sampled_from(["nested manifest", "nested cell", "utf-8", "rows", "text"]))
    if kind == "nested manifest":
        text = members["manifest.json"].decode().rstrip().rstrip("}")
        members["manifest.json"] = (text + ', "extra": ' + _nested(draw) + "}").encode()
        return kind, _zip(members)
    if kind in ("nested cell", "utf-8"):
        if kind == "nested cell":
            name, column = draw(st.sampled_from(JSON_CELLS))
        else:
            name = draw(st.sampled_from(["runs", "layer_stats", "blocks", "tokens"]))
        table = pq.read_table(pa.BufferReader(members[f"{name}.parquet"]))
        if kind == "utf-8":
            strings = [f.name for f in table.schema if f.type == pa.string()]
            column = draw(st.sampled_from(strings))
        row = draw(st.integers(0, table.num_rows - 1))
        values = [None if v is None else v.encode() for v in table[column].to_pylist()]
        if kind == "nested cell":
            values[row] = _nested(draw).encode()
        else:  # some bytes, then a sequence no UTF-8 decoder accepts
            values[row] = draw(st.binary(max_size=20)) + draw(
                st.sampled_from([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80"])
            )
        array = pa.array(values, pa.binary()).view(pa.string())
        table = table.set_column(table.column_names.index(column), column, array)
        members[f"{name}.parquet"] = _write(table)
        return kind, _zip(members)
    # a bomb: one row repeated (its text made long), the manifest honest or not
    name = draw(st.sampled_from(["layer_stats", "block_scores", "blocks", "tokens"]))
    table = pq.read_table(pa.BufferReader(members[f"{name}.parquet"]))
    rows = draw(st.integers(1, 300_000))
    table = table.take(np.zeros(rows, dtype=np.int64))
    if kind == "text" and "text" in table.column_names:
        long = "x" * draw(st.integers(1, 5000))
        array = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), [long])
        table = table.set_column(table.column_names.index("text"), "text", array)
    members[f"{name}.parquet"] = _write(table)
    _declare(members, name, rows if draw(st.booleans()) else draw(st.integers(0, 10**7)))
    return kind, _zip(members)


@pytest.mark.heavy
@settings(RELAXED, max_examples=HOSTILE_EXAMPLES)
@given(data=st.data())
def test_hostile_exports_are_refused_in_one_line_or_imported_whole(target, export_zip, data):
    kind, blob = data.draw(hostile(export_zip))
    before = snapshot(target)
    try:
        ids = target.import_parquet(blob, limits=SMALL_CAPS)
    except SketchWalkError as exc:
        event(f"{kind}: refused")
        assert "\n" not in str(exc)
        assert snapshot(target) == before
        readable(target)
        return
    event(f"{kind}: imported")
    assert kind in ("nested cell", "nested manifest", "rows", "text")  # never invalid UTF-8
    readable(target)
    for run_id in ids:
        target.delete_run(run_id)
    assert snapshot(target) == before
