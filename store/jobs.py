"""The job queue the app's background worker and standalone workers take runs from.

Claiming is atomic: on PostgreSQL with SELECT ... FOR UPDATE SKIP LOCKED, so many workers never
take the same job; on DuckDB (one process) a transaction whose conditional UPDATE either wins or
hits a write conflict, which we treat as "someone else took it". A running job carries its
worker's name and a heartbeat: heartbeats and releases only touch a job its worker still owns,
so a worker whose job was recovered (heartbeat timeout) learns it and never revives the job.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sketchwalk.store import jsonio, schema
from sketchwalk.store.db import utcnow
from sketchwalk.store.errors import InvalidResultError, UnknownJobError

log = logging.getLogger(__name__)

_CLAIM_ATTEMPTS = 5


@dataclass
class Job:
    """One queued piece of work and how far it got; `request` is the run request dict."""

    id: str
    status: str
    request: dict[str, Any]
    progress: float
    message: str | None
    worker: str | None
    run_id: str | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> Job:
        values = dict(row)
        values["request"] = jsonio.loads(values["request"])
        return cls(**values)


def claim_query(dialect: str) -> sa.Select:
    """The oldest queued job's id; on PostgreSQL row-locked so concurrent workers skip it."""
    j = schema.jobs
    pick = sa.select(j.c.id).where(j.c.status == "queued").order_by(j.c.created_at, j.c.id).limit(1)
    if dialect == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    return pick


class JobsMixin:
    """Job methods of `Store`; expects `self.engine` and `self._begin()` / `self._connect()`."""

    engine: Engine

    def _begin(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def _connect(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def enqueue_job(self, request: dict[str, Any]) -> str:
        """Queue a run request for a worker; returns the job id."""
        if not isinstance(request, dict):
            raise InvalidResultError("a job request must be a dict")
        job_id = str(uuid.uuid4())
        with self._begin() as conn:
            conn.execute(
                schema.jobs.insert().values(
                    id=job_id,
                    status="queued",
                    request=jsonio.dumps(request),
                    progress=0.0,
                    created_at=utcnow(),
                )
            )
        return job_id

    def claim_job(self, worker: str) -> Job | None:
        """Take the oldest queued job for `worker` (now 'running'), or None when none is left."""
        j = schema.jobs
        for _ in range(_CLAIM_ATTEMPTS):
            try:
                with self._begin() as conn:
                    job_id = conn.execute(claim_query(conn.dialect.name)).scalar()
                    if job_id is None:
                        return None
                    now = utcnow()
                    won = conn.execute(
                        j.update()
                        .where(j.c.id == job_id, j.c.status == "queued")
                        .values(
                            status="running",
                            worker=str(worker),
                            started_at=now,
                            heartbeat_at=now,
                            progress=0.0,
                        )
                        .returning(j.c.id)
                    ).scalar()
                if won is not None:
                    return self.get_job(won)
            except sa.exc.DBAPIError as exc:
                if "conflict" not in str(exc).lower():
                    raise
                log.debug("claim conflict, retrying: %s", exc)
        return None

    def update_job(
        self, job_id: str, progress: float, message: str, run_id: str | None = None
    ) -> None:
        """Report progress (0..1) and a short message; also the heartbeat. run_id links the run."""
        values: dict[str, Any] = {
            "progress": min(max(float(progress), 0.0), 1.0),
            "message": message,
            "heartbeat_at": utcnow(),
        }
        if run_id is not None:
            values["run_id"] = run_id
        self._update(job_id, values)

    def finish_job(self, job_id: str, run_id: str | None = None, error: str | None = None) -> None:
        """The job ended: 'done' (progress 1) or, with an error text, 'failed'."""
        now = utcnow()
        values: dict[str, Any] = {"finished_at": now, "heartbeat_at": now, "error": error}
        values["status"] = "failed" if error else "done"
        if not error:
            values["progress"] = 1.0
        if run_id is not None:
            values["run_id"] = run_id
        self._update(job_id, values)

    def heartbeat_job(self, job_id: str, worker: str) -> bool:
        """Say `worker` is still alive on this job; False when the job is no longer its own
        (another process recovered it after a heartbeat timeout), so the worker can stop."""
        j = schema.jobs
        with self._begin() as conn:
            hit = conn.execute(
                j.update()
                .where(j.c.id == str(job_id), j.c.status == "running", j.c.worker == str(worker))
                .values(heartbeat_at=utcnow())
                .returning(j.c.id)
            ).scalar()
        return hit is not None

    def release_job(self, job_id: str, worker: str, reason: str) -> bool:
        """Put a job `worker` is running back in the queue (graceful shutdown), in one transaction.

        The run it had started holds no results yet (those land at the very end, atomically), so
        it is deleted: the next worker starts the job afresh. Nothing changes, and False is
        returned, when the job is no longer this worker's (recovered meanwhile, or finished).
        """
        j, r = schema.jobs, schema.runs
        with self._begin() as conn:
            row = conn.execute(
                sa.select(j.c.run_id).where(
                    j.c.id == str(job_id), j.c.status == "running", j.c.worker == str(worker)
                )
            ).first()
            if row is None:
                return False
            conn.execute(
                j.update()
                .where(j.c.id == str(job_id))
                .values(
                    status="queued",
                    worker=None,
                    started_at=None,
                    heartbeat_at=None,
                    progress=0.0,
                    message=reason,
                    run_id=None,
                    error=None,
                )
            )
            run_id = row[0]
            if run_id is not None:
                unfinished = conn.execute(
                    sa.select(r.c.id).where(r.c.id == run_id, r.c.status != "done")
                ).first()
                if unfinished is not None:
                    for table in schema.RUN_TABLES:
                        conn.execute(table.delete().where(schema.run_key(table) == run_id))
        return True

    def _update(self, job_id: str, values: dict[str, Any]) -> None:
        j = schema.jobs
        with self._begin() as conn:
            hit = conn.execute(
                j.update().where(j.c.id == str(job_id)).values(**values).returning(j.c.id)
            ).scalar()
            if hit is None:
                raise UnknownJobError(f"no job with id {job_id!r} in this store")

    def get_job(self, job_id: str) -> Job:
        with self._connect() as conn:
            row = (
                conn.execute(sa.select(schema.jobs).where(schema.jobs.c.id == str(job_id)))
                .mappings()
                .first()
            )
        if row is None:
            raise UnknownJobError(f"no job with id {job_id!r} in this store")
        return Job.from_row(row)

    def list_jobs(self, status: str | None = None) -> list[Job]:
        """Jobs newest first, optionally only those in one status."""
        j = schema.jobs
        stmt = sa.select(j).order_by(j.c.created_at.desc(), j.c.id)
        if status is not None:
            stmt = stmt.where(j.c.status == status)
        with self._connect() as conn:
            return [Job.from_row(r) for r in conn.execute(stmt).mappings()]

    def recover_jobs(
        self, reason: str, worker: str | None = None, stale_after_s: float | None = None
    ) -> list[str]:
        """Fail 'running' jobs whose worker died (app start); queued jobs stay queued.

        By default every running job (right for DuckDB, where the app is the only process). With
        several workers on a server database, narrow it to one `worker` or to jobs whose heartbeat
        is older than `stale_after_s`. Runs linked to a recovered job that never finished are
        marked failed with the same reason. Returns the recovered job ids.
        """
        j = schema.jobs
        r = schema.runs
        now = utcnow()
        cond = [j.c.status == "running"]
        if worker is not None:
            cond.append(j.c.worker == worker)
        if stale_after_s is not None:
            cutoff = now - timedelta(seconds=float(stale_after_s))
            cond.append(sa.or_(j.c.heartbeat_at.is_(None), j.c.heartbeat_at < cutoff))
        with self._begin() as conn:
            rows = conn.execute(sa.select(j.c.id, j.c.run_id).where(*cond)).all()
            ids = [row[0] for row in rows]
            if not ids:
                return []
            conn.execute(
                j.update()
                .where(j.c.id.in_(ids))
                .values(status="failed", error=reason, finished_at=now)
            )
            run_ids = [row[1] for row in rows if row[1] is not None]
            if run_ids:
                conn.execute(
                    r.update()
                    .where(r.c.id.in_(run_ids), r.c.status.in_(("queued", "running")))
                    .values(status="failed", error=reason, updated_at=now, finished_at=now)
                )
        return ids

    def recover_runs(self, reason: str) -> list[str]:
        """Fail runs left 'running' by a process that died (single-process DuckDB stores)."""
        r = schema.runs
        now = utcnow()
        with self._begin() as conn:
            ids = [
                row[0]
                for row in conn.execute(sa.select(r.c.id).where(r.c.status == "running")).all()
            ]
            if ids:
                conn.execute(
                    r.update()
                    .where(r.c.id.in_(ids))
                    .values(status="failed", error=reason, updated_at=now, finished_at=now)
                )
        return ids
