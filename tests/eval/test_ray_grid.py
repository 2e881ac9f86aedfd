"""An eval grid as Ray tasks on a local Ray instance (CPU, tiny model) writes the same rows as
the local run of the same items: to PostgreSQL from the tasks, to DuckDB from the driver."""

from __future__ import annotations

import argparse
import math
import os
import sys
import uuid

import pytest

from sketchwalk.eval import ray_grid
from sketchwalk.eval.grid import GridSpec, run_grid
from sketchwalk.eval.items import build_items, parse_tasks
from sketchwalk.store import open_store

pytestmark = pytest.mark.heavy  # Ray starts a local cluster: tens of seconds

TIMINGS = ("dense_ms", "sparse_ms")  # wall-clock: the only columns allowed to differ
GENERATOR = {"generator": {"seed": 0, "depths": [0.5]}}


@pytest.fixture(scope="module")
def ray_local():
    import ray  # the `cluster` extra; `make setup` installs it

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def grid(tiny_model_dir):
    """Items of three panels (two lm lengths, one retrieval) and a 2 x 2 grid."""
    from sketchwalk.engine.run.models import load_model

    lm = load_model(str(tiny_model_dir))
    items = build_items(
        lm.tokenizer, parse_tasks("lm,retrieval:passkey"), (128, 256), (0.5,), 1, 0, 1
    )
    items = [i for i in items if not (i.task == "retrieval" and i.length == 256)]
    spec = GridSpec(
        methods=("sketchwalk", "quest"),
        densities=(0.3, 0.6),
        new_tokens=2,
        base={"block_size": 16, "dense_layers": (0,)},
    )
    return lm, items, spec


def _same(a: dict, b: dict) -> None:
    """Two rows agree on everything but timings and the Ray provenance."""
    assert set(a) == set(b)
    for key in a:
        if key in TIMINGS:
            continue
        x, y = a[key], b[key]
        if key == "extra":  # its per-stage timings are timings too
            x = {k: v for k, v in x.items() if k not in ("ray", "timings")}
            y = {k: v for k, v in y.items() if k not in ("ray", "timings")}
            _same_nested(x, y, key)
        else:
            _same_nested(x, y, key)


def _same_nested(x, y, where: str) -> None:
    if isinstance(x, float) or isinstance(y, float):
        if x is None or y is None:
            assert x is y, where
        elif math.isnan(x):
            assert math.isnan(y), where
        else:  # Ray workers run torch with other thread counts: last-bit reductions may differ
            assert y == pytest.approx(x, rel=1e-5, abs=1e-9), where
    elif isinstance(x, dict):
        assert set(x) == set(y), where
        for k in x:
            _same_nested(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _same_nested(u, v, f"{where}[{i}]")
    else:
        assert x == y, where


def test_ray_grid_writes_the_local_runs_rows_to_postgresql(ray_local, grid, pg_url, tiny_model_dir):
    lm, items, spec = grid
    eval_id = str(uuid.uuid4())
    local = run_grid(lm, items, spec, eval_id)
    for row in local:
        row["extra"].update(GENERATOR)
    seen = []
    rows = ray_grid.run_grid_ray(
        ray_grid.ModelSpec(str(tiny_model_dir), "float32", "auto"),
        items,
        spec,
        eval_id,
        db_url=pg_url,
        extra=GENERATOR,
        progress=lambda fraction, msg: seen.append(fraction),
    )
    assert len(ray_grid.panels(items)) == 3 and len(local) == 12
    assert seen == [1 / 3, 2 / 3, 1.0]  # one report per finished panel
    assert [(r["task"], r["length"], r["method"], r["density_target"]) for r in rows] == [
        (r["task"], r["length"], r["method"], r["density_target"]) for r in local
    ]  # same rows, same order
    for got, want in zip(rows, local, strict=True):
        _same(got, want)
    pids = {r["extra"]["ray"]["pid"] for r in rows}
    assert os.getpid() not in pids  # the cells ran in Ray worker processes
    assert all(r["extra"]["ray"]["gpu_ids"] == [] for r in rows)  # CPU cluster: no GPU asked
    with open_store(pg_url) as store:
        stored = store.eval_results(eval_id=eval_id)
    assert len(stored) == 12  # written once, by the tasks
    key = ["task", "length", "method", "density_target"]
    stored = stored.astype(object).where(stored.notna(), None)  # pandas NaN -> SQL NULL
    stored_rows = {tuple(r[k] for k in key): r for r in stored.to_dict("records")}
    for want in local:
        got = stored_rows[tuple(want[k] for k in key)]
        _same({k: got[k] for k in want}, want)


def test_eval_hook_on_an_embedded_store_is_saved_by_the_driver(
    ray_local, grid, tmp_path, tiny_model_dir
):
    """The function `sketchwalk eval --ray` calls, with the CLI's own argument parsing."""
    _, items, spec = grid
    one_panel = ray_grid.panels(items)[0]
    db = str(tmp_path / "evals.duckdb")
    eval_id = str(uuid.uuid4())
    parser = argparse.ArgumentParser()
    ray_grid.add_ray_argument(parser)
    args = parser.parse_args(["--ray"])
    assert args.ray == ""
    args.model, args.dtype, args.db, args.no_store = str(tiny_model_dir), "float32", db, False
    rows = ray_grid.eval_grid_on_ray(args, one_panel, spec, eval_id, extra=GENERATOR)
    with open_store(db) as store:
        stored = store.eval_results(eval_id=eval_id)
    assert len(rows) == len(stored) == 4
    assert sorted(stored["kl_mean"]) == pytest.approx(sorted(r["kl_mean"] for r in rows))
    assert all(e["generator"] == GENERATOR["generator"] for e in stored["extra"])


def test_panels_keep_first_appearance_order_and_never_split_a_cell(grid):
    _, items, _ = grid
    groups = ray_grid.panels(items)
    keys = [(g[0].task, g[0].source, g[0].length) for g in groups]
    assert keys == list(dict.fromkeys((i.task, i.source, i.length) for i in items))
    assert sum(len(g) for g in groups) == len(items)
    assert all(len({(i.task, i.source, i.length) for i in g}) == 1 for g in groups)


def test_ray_argument_forms():
    parser = argparse.ArgumentParser()
    ray_grid.add_ray_argument(parser)
    assert parser.parse_args([]).ray is None  # local run
    assert parser.parse_args(["--ray", "ray://head:10001"]).ray == "ray://head:10001"


def test_missing_ray_is_a_one_line_error(monkeypatch, grid):
    from sketchwalk.errors import SketchWalkError

    _, items, spec = grid
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SketchWalkError, match=r"pip install 'sketchwalk\[cluster\]'"):
        ray_grid.run_grid_ray(ray_grid.ModelSpec("m"), items, spec, "e")


def test_server_store_detection():
    assert ray_grid.is_server_store("postgresql://u:p@h/db")
    assert not ray_grid.is_server_store("/tmp/x.duckdb")
    assert not ray_grid.is_server_store("sqlite:///x.db") and not ray_grid.is_server_store(None)


def test_eval_cli_with_ray_stores_the_same_cells_as_locally(ray_local, tiny_model_dir, tmp_path):
    """`sketchwalk eval --ray` on the running local Ray instance (address 'auto')."""
    from sketchwalk.cli.main import main
    from sketchwalk.store import open_store

    common = [
        "eval", "--model", str(tiny_model_dir), "--methods", "sketchwalk", "--densities", "0.5",
        "--tasks", "lm", "--lengths", "128", "--max-chunks", "1", "--block-size", "16",
        "--dense-layers", "0", "--window", "0", "--dense-tail-blocks", "0", "--window-blocks", "0", "--sink-blocks", "0", "--no-png",
    ]  # fmt: skip
    results = {}
    for name, extra in (("local", []), ("ray", ["--ray", "auto"])):
        db = tmp_path / f"{name}.duckdb"
        assert main([*common, "--db", str(db), "--out", str(tmp_path / name), *extra]) == 0
        with open_store(str(db)) as store:
            results[name] = store.eval_results()
    local, ray_ = results["local"], results["ray"]
    assert len(local) == len(ray_) == 1
    assert ray_["kl_mean"].iloc[0] == pytest.approx(local["kl_mean"].iloc[0], rel=1e-4, abs=1e-7)
    assert ray_["density_achieved"].iloc[0] == pytest.approx(local["density_achieved"].iloc[0])
