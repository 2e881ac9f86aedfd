"""Eval grids on a Ray cluster: one Ray task per panel, rows written to the shared store.

A panel is the items of one (task, source, length). Cells never span panels (a cell is a panel
times a (method, density)), and the dense pass is shared only within an item, so panels are
independent: each Ray task loads the model once per Ray worker process, runs `run_grid` on its
panel exactly as a local run would, and returns the panel's rows. Concatenated in panel order
they are the local run's rows in the local order; only timings (and `extra.ray`, where the
cell ran) differ.

Rows reach the store exactly once. On a server database (PostgreSQL) each task saves its own
rows as soon as its panel is done, so a long sweep keeps what finished if the driver dies; an
embedded store (DuckDB: one process per file) is written by the driver at the end.

    ray_grid.run_grid_ray(ModelSpec("smollm2"), items, spec, eval_id,
                          address="auto", db_url="postgresql://...")

Each task asks for one GPU where the cluster has GPUs (Ray then sets CUDA_VISIBLE_DEVICES, so
the task's device is cuda:0), and none on a CPU-only cluster. Every node needs sketchwalk and
the model installed (the docker image has both).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sketchwalk.progress import Progress

if TYPE_CHECKING:  # torch-heavy: imported where used, so the CLI parser stays fast to build
    from sketchwalk.eval.grid import GridSpec
    from sketchwalk.eval.items import Item


_MODELS: dict[tuple[str | None, str, str], Any] = {}  # per Ray worker process: loaded once


@dataclass(frozen=True)
class ModelSpec:
    """What a task loads: model id or folder, dtype, device ('auto': cuda:0 if the task got a
    GPU, else cpu). Sent to tasks instead of the model itself (weights never travel)."""

    model_id: str | None
    dtype: str = "float32"
    device: str = "auto"

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"


def panels(items: list[Item]) -> list[list[Item]]:
    """Items grouped by (task, source, length), groups in order of first appearance."""
    groups: dict[tuple[str, str, int], list[Item]] = {}
    for item in items:
        groups.setdefault((item.task, item.source, item.length), []).append(item)
    return list(groups.values())


def is_server_store(url: str | None) -> bool:
    """Whether several processes may write `url` at once (not a DuckDB or SQLite file)."""
    if not url:
        return False
    from sketchwalk.store import resolve_url

    resolved = resolve_url(url)
    return resolved.split("://", 1)[0].split("+", 1)[0] not in ("duckdb", "sqlite")


def _model(spec: ModelSpec):
    from sketchwalk.engine.run.models import load_model

    key = (spec.model_id, spec.dtype, spec.resolved_device())
    if key not in _MODELS:
        _MODELS.clear()  # one model per worker process: a sweep uses one
        _MODELS[key] = load_model(*key)
    return _MODELS[key]


def run_panel(
    model: ModelSpec,
    items: list[Item],
    spec: GridSpec,
    eval_id: str,
    db_url: str | None = None,
    extra: dict[str, Any] | None = None,
) -> list[dict]:
    """One Ray task: the panel's rows (with `extra` merged into each row's extra), saved to
    `db_url` here when given. Plain module-level function, so Ray pickles it by reference."""
    from sketchwalk.eval.grid import run_grid

    lm = _model(model)
    rows = run_grid(lm, items, spec, eval_id)
    for row in rows:
        row["extra"].update(extra or {})
        row["extra"]["ray"] = _where_am_i()
    if db_url:
        from sketchwalk.store import open_store

        with open_store(db_url) as store:
            store.save_eval_results(rows)
    return rows


def _where_am_i() -> dict[str, Any]:
    """Which node, process and GPUs ran a cell (provenance in extra.ray)."""
    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "pid": os.getpid(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }


def gpus_per_task(ray_module) -> float:
    """1 where the cluster has GPUs, 0 on a CPU-only cluster."""
    return 1.0 if ray_module.cluster_resources().get("GPU", 0) >= 1 else 0.0


def run_grid_ray(
    model: ModelSpec,
    items: list[Item],
    spec: GridSpec,
    eval_id: str,
    address: str | None = None,
    db_url: str | None = None,
    extra: dict[str, Any] | None = None,
    progress: Progress | None = None,
    num_gpus: float | None = None,
) -> list[dict]:
    """The grid as Ray tasks; returns the rows in local-run order, saved once to `db_url`.

    Connects to Ray at `address` ('auto', 'ray://head:10001'; None: $RAY_ADDRESS or a new
    local instance) unless this process already did; a connection made here is closed at the
    end. `num_gpus` per task overrides the default (1 if the cluster has GPUs, else 0).
    """
    from sketchwalk.errors import SketchWalkError

    try:
        import ray
    except ImportError:
        raise SketchWalkError(
            "--ray needs Ray: pip install 'sketchwalk[cluster]' (on every node)"
        ) from None
    groups = panels(items)
    if not groups:
        raise SketchWalkError("the grid has no items")
    owns = not ray.is_initialized()
    if owns:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        gpus = gpus_per_task(ray) if num_gpus is None else float(num_gpus)
        task = ray.remote(num_gpus=gpus, num_cpus=1, max_retries=1)(run_panel)
        in_tasks = is_server_store(db_url)
        refs = [
            task.remote(model, group, spec, eval_id, db_url if in_tasks else None, extra)
            for group in groups
        ]
        order = {ref: i for i, ref in enumerate(refs)}
        results: list[list[dict] | None] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            i = order[done[0]]
            results[i] = ray.get(done[0])
            if progress is not None:
                first = groups[i][0]
                finished = sum(r is not None for r in results)
                progress(finished / len(refs), f"{first.task}/{first.source}/{first.length}")
    finally:
        if owns:
            ray.shutdown()
    rows = [row for panel_rows in results for row in panel_rows or []]
    if db_url and not in_tasks:
        from sketchwalk.store import open_store

        with open_store(db_url) as store:
            store.save_eval_results(rows)
    return rows


# ---- the hook for `sketchwalk eval --ray [ADDRESS]` -------------------------------------------


def add_ray_argument(parser) -> None:
    """`--ray [ADDRESS]` on an argparse parser: absent -> None (local run), bare -> '' ($RAY_ADDRESS
    or a new local Ray instance), with a value -> that cluster address."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run the grid as Ray tasks, one per (task, source, length), one GPU each where the "
        "cluster has GPUs; ADDRESS: 'auto', ray://HEAD:10001 (default: $RAY_ADDRESS or a local "
        "instance). Rows go to the shared store (--db) from the tasks on PostgreSQL",
    )


def eval_grid_on_ray(
    args,
    items: list[Item],
    spec: GridSpec,
    eval_id: str,
    progress: Progress | None = None,
    extra: dict[str, Any] | None = None,
) -> list[dict]:
    """What `sketchwalk eval` calls instead of `run_grid` when `args.ray is not None`.

    Uses args.model, args.dtype, args.db, args.no_store, args.ray. The rows are already in the
    store when it returns (unless --no-store): the caller must not save them again. `extra`
    (the generator settings) is merged into every row's extra before it is stored. Tasks pick
    their device themselves (cuda:0 when Ray gave them a GPU, else cpu).
    """
    from sketchwalk.store import resolve_url

    db_url = None if args.no_store else resolve_url(args.db)
    return run_grid_ray(
        ModelSpec(args.model, args.dtype, "auto"),
        items,
        spec,
        eval_id,
        address=args.ray or None,
        db_url=db_url,
        extra=extra,
        progress=progress,
    )
