"""Job runners for the worker-process tests, loaded with `sketchwalk worker --runner
worker_jobs:mixed` (PYTHONPATH points here).

A cheap job ({"prompt": ..., "sleep_s": S}) records its execution as a run whose prompt is the
job id, so a test can count how often each job really ran; it sleeps in small steps through the
worker's checkpoint, like a model run reporting progress. Any other request is a real engine run.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from frozen_save import stopped_inside_copy

from sketchwalk.engine.run.records import BlockSpan, LayerRecord, RunResult, TokenRecord
from sketchwalk.worker.loop import run_job_kind


def mixed(worker, job) -> None:
    req = job.request
    if req.get("freeze_in_save"):
        freeze_in_save(worker, job)
        return
    if req.get("freeze_in_copy"):
        freeze_in_copy(worker, job, req["freeze_in_copy"])
        return
    if "sleep_s" not in req:
        run_job_kind(worker, job)
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


def freeze_in_save(worker, job) -> None:
    """A fenced save of a small result; on the job's first attempt the worker stops itself
    (a real SIGSTOP) inside the save's transaction, after the job and run rows are locked."""
    store = worker.store
    fence = (job.id, job.claim)
    run_id = store.create_run({"prompt": job.id, "model": worker.name}, "running", job=fence)
    if job.attempts == 1:
        insert = store._insert
        stopped: list[bool] = []

        def stop_inside(conn, table, data, key):
            if not stopped:  # once: revived, the save goes on
                stopped.append(True)
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until SIGCONT
            insert(conn, table, data, key)

        store._insert = stop_inside
    try:
        store.save_result(run_id, small_result(job.id), job=fence)
    finally:
        store.__dict__.pop("_insert", None)


def freeze_in_copy(worker, job, write: str) -> None:
    """The fenced `write` ("save_result", or "save_quality" then "save_speed") of a small
    result; on the job's first attempt the worker stops itself in the middle of the COPY."""
    store = worker.store
    fence = (job.id, job.claim)
    run_id = store.create_run({"prompt": job.id, "model": worker.name}, "running", job=fence)
    with stopped_inside_copy(job.attempts == 1):
        getattr(store, write)(run_id, small_result(job.id), job=fence)
    if write == "save_quality":
        store.save_speed(run_id, {"clean_sparse_prefill_ms": 1.0}, job=fence)


def small_result(prompt: str) -> RunResult:
    """One prefill layer of two blocks, its spans and one token: every run table gets rows."""
    return RunResult(
        model_id="tiny",
        model_hash=None,
        prompt=prompt,
        prompt_tokens=2,
        method="sketchwalk",
        config={},
        device="cpu",
        versions={},
        dense_text="a",
        sparse_text="a",
        metrics={},
        timings={},
        layers=[
            LayerRecord(
                phase="prefill",
                step=0,
                layer=0,
                dense=True,
                n_blocks=2,
                q_blocks=np.arange(2),
                sketch=np.ones((2, 2), dtype=np.float32),
            )
        ],
        blocks=[BlockSpan(0, 0, 1, "a"), BlockSpan(1, 1, 2, "b")],
        tokens=[TokenRecord("dense", 0, 1, "a", None, None)],
    )


def echo_kind(ctx) -> str:
    """A job kind in one function (registered by a test with one line in worker.kinds.KINDS):
    it reports progress and ends the job, every write through the fenced context."""
    ctx.progress(0.5, "echoing")
    run_id = ctx.store.create_run({"prompt": ctx.request["text"]}, "running", job=ctx.fence)
    ctx.store.set_status(run_id, "done")
    ctx.finish(run_id)
    return run_id
