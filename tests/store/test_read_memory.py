"""Peak memory of reading a run that was imported near the caps (tests/import_bombs.py):
`sketchwalk trace`, `sketchwalk export` (folder and zip) and the reads Explore makes to show one
layer, each measured in a child process against the bound the README states."""

from __future__ import annotations

import subprocess
import sys

import pytest
from import_bombs import NEEDLE, build
from store_fixtures import count_rows, saved_run

from sketchwalk.store import open_store

BOUND_MIB = 1024
SHAPES = {"near-cap-prompt": NEEDLE, "near-cap-scores": " w100 w101"}
"""Each shape and a needle text its prompt holds."""

EXPLORE = """
import sys
from sketchwalk.app.figures.layer_data import layer_data
from sketchwalk.store import open_store
from sketchwalk.store.needle import find_needle_in, needle_steps

db, run_id, text = sys.argv[1:4]
with open_store(db) as store:
    run = store.get_run(run_id)
    stats = store.layer_stats(run_id, q_blocks=False)
    blocks = store.blocks(run_id, text_chars=200)
    needle = find_needle_in(store, run_id, text)
    steps = needle_steps(store.last_rows(run_id), needle)
    decode = stats.loc[stats["phase"] != "prefill", "step"]
    generated = store.generated_text(run_id, int(decode.max()) if len(decode) else 0)
    record = stats.iloc[0]
    hm = store.heatmap(run_id, record["phase"], int(record["step"]), int(record["layer"]))
    view = layer_data(hm, blocks, None)
print(len(steps), hm["n_blocks"])
"""
"""What explore.py reads to open a run at its first layer with a needle (widgets.py's reads)."""


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Each shape imported into its own store: shape -> (database path, run id)."""
    work = tmp_path_factory.mktemp("near-cap-reads")
    with open_store(str(work / "src.duckdb")) as src:
        run_id, _ = saved_run(src)
        src.export_parquet([run_id], work / "export")
    out = {}
    for shape in SHAPES:
        db = work / f"{shape}.duckdb"
        zipped = build(shape, work / "export", work)
        done = subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", "import", "--db", str(db), str(zipped)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr
        zipped.unlink()
        out[shape] = (str(db), run_id)
    return out


def peak(argv: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """`argv` run by a fresh interpreter's child, and that child's peak resident memory (MiB)."""
    probe = (
        "import json, resource, subprocess, sys\n"
        "out = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True)\n"
        "print(out.returncode)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
        "sys.stdout.write(out.stderr)\n"
    )
    import json

    run = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    code, most, *said = run.stdout.splitlines()
    run.returncode, run.stderr = int(code), "\n".join(said)
    return run, int(most)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sketchwalk.cli.main", *args]


@pytest.mark.heavy
@pytest.mark.parametrize("shape", SHAPES)
def test_trace_peak_memory(imported, shape):
    db, run_id = imported[shape]
    out, most = peak(cli("trace", run_id, "--db", db, "--text", SHAPES[shape], "--json"))
    print(f"trace {shape}: peak {most} MiB")
    assert out.returncode == 0, out.stderr
    assert most <= BOUND_MIB, (shape, most)


@pytest.mark.heavy
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("zipped", [False, True], ids=["folder", "zip"])
def test_export_peak_memory(imported, shape, zipped, tmp_path):
    db, run_id = imported[shape]
    target = tmp_path / ("out.zip" if zipped else "out")
    flags = ["--zip"] if zipped else []
    out, most = peak(cli("export", run_id, "--db", db, "--out", str(target), *flags))
    print(f"export {shape} {'zip' if zipped else 'folder'}: peak {most} MiB")
    assert out.returncode == 0, out.stderr
    assert most <= BOUND_MIB, (shape, most)
    with open_store(db) as store:  # every row of the run went out
        stored = {t: n for t, n in count_rows(store, run_id).items() if t != "jobs"}
    assert written_rows(target) == stored


def written_rows(target) -> dict[str, int]:
    """Rows of each table file of an export (folder or zip), from the Parquet footers."""
    import zipfile

    import pyarrow.parquet as pq

    if target.suffix != ".zip":
        return {f.stem: pq.ParquetFile(f).metadata.num_rows for f in target.glob("*.parquet")}
    with zipfile.ZipFile(target) as zf:
        return {
            name.removesuffix(".parquet"): pq.ParquetFile(zf.open(name)).metadata.num_rows
            for name in zf.namelist()
            if name.endswith(".parquet")
        }


@pytest.mark.heavy
@pytest.mark.parametrize("shape", SHAPES)
def test_explore_layer_read_peak_memory(imported, shape):
    db, run_id = imported[shape]
    out, most = peak([sys.executable, "-c", EXPLORE, db, run_id, SHAPES[shape]])
    print(f"explore {shape}: peak {most} MiB")
    assert out.returncode == 0, out.stderr
    assert most <= BOUND_MIB, (shape, most)
