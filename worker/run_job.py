"""The "run" job kind: one dense-vs-sparse run, queued as a RunRequest's JSON.

It goes through the same lifecycle as `sketchwalk run` (worker/lifecycle.py), which links the run
to the job and saves it with the job's claim, so a worker that lost its job writes nothing.
"""

from __future__ import annotations

import logging

from sketchwalk.errors import SketchWalkError
from sketchwalk.store.errors import JobLostError
from sketchwalk.worker.context import JobContext
from sketchwalk.worker.lifecycle import execute, first_line

log = logging.getLogger(__name__)


def run(ctx: JobContext) -> str | None:
    """Run one claimed run job to its end; returns the run id (None when nothing was stored).

    The request is checked as a RunRequest under this deployment's limits, before anything
    loads; the lifecycle records any later failure in the run and, fenced, in the job.
    JobInterrupted from a checkpoint passes through (the worker releases the job).
    """
    from sketchwalk.engine.run.request import Limits, RunRequest

    settings = ctx.worker.settings
    try:
        request = RunRequest.from_dict(
            ctx.request,
            Limits.from_settings(settings),
            dtype=settings.dtype,
            exact_max_tokens=settings.exact_max_tokens,
        )
    except SketchWalkError as exc:
        ctx.fail(first_line(exc))
        return None
    ctx.checkpoint()
    ctx.report(0.0, "loading model")
    models, device = ctx.worker.models, ctx.worker.device
    try:
        outcome = execute(
            request,
            ctx.store,
            lambda model, dtype: models.get(model, dtype, device),
            ctx.progress,
            job=ctx.claim,
            heartbeat_s=settings.heartbeat_s,
        )
    except JobLostError as exc:
        log.warning("job %s: %s", ctx.job.id, exc)
        return None
    except SketchWalkError:
        return None  # recorded by the lifecycle
    except Exception:  # a bug or the machine: keep the worker alive; the lifecycle recorded it
        log.exception("job %s failed", ctx.job.id)
        return None
    return outcome.run_id
