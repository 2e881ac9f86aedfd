"""The job kinds a worker runs, one line each: the request's "kind" -> "module:runner".

A runner takes a JobContext (worker/context.py), whose writes are all fenced by the job's claim.
Adding a kind is one module with its request type and runner, and one line here; the worker's
loop (claim, model list, heartbeat, release, recovery) is the same for every kind. Modules load
when a job of their kind first runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from sketchwalk.errors import SketchWalkError
from sketchwalk.worker.context import Runner

DEFAULT_KIND = "run"
KINDS: dict[str, str] = {
    "run": "sketchwalk.worker.run_job:run",  # one dense-vs-sparse run (RunRequest)
    "eval": "sketchwalk.eval.job:run",  # an eval grid from the Benchmarks page (EvalRequest)
}


def kind_of(request: Any) -> str:
    """The kind a request names (a request without one is a run, as every older one is)."""
    kind = request.get("kind", DEFAULT_KIND) if isinstance(request, dict) else DEFAULT_KIND
    if not isinstance(kind, str) or kind not in KINDS:
        raise SketchWalkError(
            f"unknown job kind {str(kind)[:40]!r}; this worker runs {', '.join(sorted(KINDS))}"
        )
    return kind


def runner(kind: str) -> Runner:
    """The runner of a registered kind."""
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)
