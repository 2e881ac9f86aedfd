"""Job runners for the worker-process tests, loaded with `sketchwalk worker --runner
worker_jobs:mixed` (PYTHONPATH points here).

A cheap job ({"prompt": ..., "sleep_s": S}) records its execution as a run whose prompt is the
job id, so a test can count how often each job really ran; it sleeps in small steps through the
worker's checkpoint, like a model run reporting progress. Any other request is a real engine run.
"""

from __future__ import annotations

import time

from sketchwalk.worker.loop import run_engine_job


def mixed(worker, job) -> None:
    req = job.request
    if "sleep_s" not in req:
        run_engine_job(worker, job)
        return
    store = worker.store
    run_id = store.create_run({"prompt": job.id, "model": worker.name}, status="running")
    store.update_job(job.id, 0.0, "sleeping", run_id=run_id)
    end = time.monotonic() + float(req["sleep_s"])
    while time.monotonic() < end:
        worker.checkpoint()
        time.sleep(0.02)
    worker.checkpoint()
    store.set_status(run_id, "done")
    store.finish_job(job.id, run_id=run_id)


def threads(worker, job) -> None:
    """Records the torch thread count the worker process runs jobs with (in the run's model)."""
    import torch

    run_id = worker.store.create_run(
        {"prompt": job.id, "model": f"threads={torch.get_num_threads()}"}, status="running"
    )
    worker.store.set_status(run_id, "done")
    worker.store.finish_job(job.id, run_id=run_id)
