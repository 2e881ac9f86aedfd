"""An eval as a worker job: the Benchmarks page queues `{"kind": "eval", ...}` and the worker
runs the grid (run_grid, as `sketchwalk eval` does), reporting progress on the job and storing
the rows in eval_results, where the Benchmarks page reads them.

Only retrieval tasks and lm tasks over bundled sources are accepted here (no file paths: the
request may come from a browser).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sketchwalk.errors import SketchWalkError

log = logging.getLogger(__name__)

KIND = "eval"
SMALL_EVAL: dict[str, Any] = {
    "kind": KIND,
    "model": None,  # the default SmolLM2
    "tasks": "retrieval:passkey",
    "lengths": [2048],
    "depths": [0.25, 0.75],
    "methods": ["sketchwalk", "streaming"],
    "densities": [0.1, 0.2],
    "new_tokens": 8,
    "block_size": 32,
}
"""A first look that takes a few minutes on two CPU cores: pass-key retrieval at 2k tokens, where
both densities are reachable (at 1k tokens and blocks of 64 the forced sink and window blocks
alone kept ~0.33, so 0.1 and 0.3 ran alike; at 2k and blocks of 32, 0.1 runs at ~0.12)."""


def eval_request(**changes: Any) -> dict[str, Any]:
    """The small eval's request with some fields changed (model, lengths, ...)."""
    return {**SMALL_EVAL, **changes}


def _spec(req: dict[str, Any]):
    from sketchwalk.eval.grid import GridSpec, configs
    from sketchwalk.eval.items import parse_tasks

    tasks = parse_tasks(str(req.get("tasks", "")))
    if any(kind == "file" for kind, _ in tasks):
        raise SketchWalkError("an eval job cannot read files; use lm or retrieval tasks")
    spec = GridSpec(
        methods=tuple(str(m) for m in req.get("methods", ())),
        densities=tuple(float(d) for d in req.get("densities", ())),
        new_tokens=int(req.get("new_tokens", 8)),
        base={"block_size": int(req.get("block_size", 64))},
    )
    configs(spec)  # bad knobs fail before the model loads
    return spec, tasks


def run_eval_job(worker: Any, job: Any) -> str | None:
    """Run one claimed eval job to the end; returns the eval id (None when it failed)."""
    from sketchwalk.eval.grid import run_grid
    from sketchwalk.eval.items import build_items
    from sketchwalk.worker.loop import JobInterrupted

    store, req = worker.store, dict(job.request)
    try:
        spec, tasks = _spec(req)
        store.update_job(job.id, 0.0, "loading the model")
        lm = worker.models.get(req.get("model"), req.get("dtype") or "float32", worker.device)
        lengths = tuple(int(n) for n in req.get("lengths", (1024,)))
        depths = tuple(float(d) for d in req.get("depths", (0.5,)))
        items = build_items(
            lm.tokenizer, tasks, lengths, depths, 1, 0, 1, lm.max_context - spec.new_tokens
        )
        if not items:
            raise SketchWalkError("the eval's tasks produced no prompts")
        eval_id = str(uuid.uuid4())

        def progress(fraction: float, msg: str) -> None:
            store.update_job(job.id, 0.98 * fraction, f"eval: {msg}"[:200])
            worker.checkpoint()  # may raise JobInterrupted: the worker releases the job

        rows = run_grid(lm, items, spec, eval_id, progress)
        store.save_eval_results(rows)
        store.finish_job(job.id)
        return eval_id
    except JobInterrupted:
        raise
    except SketchWalkError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "eval failed"
    except Exception as exc:  # keep the worker alive; tell the user
        log.exception("eval job %s failed", job.id)
        message = f"the eval failed: {type(exc).__name__}: {exc}".splitlines()[0]
    store.finish_job(job.id, error=message[:500])
    return None
