"""The job queue the app's background worker and standalone workers take runs from.

Claiming is atomic: on PostgreSQL with SELECT ... FOR UPDATE SKIP LOCKED, so many workers never
take the same job (and recovery takes stale rows the same way: no caller ever waits on a row
another process holds, even one frozen inside its transaction); on DuckDB (one process) a transaction whose conditional UPDATE either wins or
hits a write conflict, which we treat as "someone else took it". A running job carries its
claim token and a heartbeat on the database's clock. Every later write of the job (progress,
heartbeat, release, failure, and the result save itself) is fenced: an UPDATE conditional on the
job still being 'running' under that token, in the same transaction as the write, so a worker
whose job was recovered (paused, cut off) learns it and never revives the job.
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
from sketchwalk.store.db import db_utcnow, utcnow
from sketchwalk.store.errors import InvalidResultError, JobLostError, UnknownJobError

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
    claim: str | None = None
    attempts: int | None = None
    invalid: str | None = None  # why the row's request is unusable ({} stands in for it)

    @classmethod
    def from_row(cls, row: Any) -> Job:
        values = dict(row)
        values["request"], values["invalid"] = parse_request(values["request"])
        return cls(**values)


def parse_request(text: object) -> tuple[dict[str, Any], str | None]:
    """A job row's request as a dict, or ({}, why) when the row holds something else (a list, a
    string, nesting too deep to parse, not JSON): one damaged row must not stop the worker or
    any page that lists jobs, and the worker fails that job with `why`."""
    if not isinstance(text, str):
        return {}, "the job's request is missing or not text; submit it again"
    try:
        value = jsonio.loads(text)
    except (ValueError, RecursionError):
        return {}, "the job's request is not valid JSON (or nested too deep); submit it again"
    if not isinstance(value, dict):
        kinds = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
        kind = kinds.get(type(value), "a number")
        return {}, f"the job's request is {kind}, not a JSON object; submit it again"
    return value, None


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
                    now = db_utcnow(conn)
                    won = conn.execute(
                        j.update()
                        .where(j.c.id == job_id, j.c.status == "queued")
                        .values(
                            status="running",
                            worker=str(worker),
                            started_at=now,
                            heartbeat_at=now,
                            progress=0.0,
                            claim=str(uuid.uuid4()),
                            attempts=sa.func.coalesce(j.c.attempts, 0) + 1,
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
        self,
        job_id: str,
        progress: float,
        message: str,
        run_id: str | None = None,
        claim: str | None = None,
    ) -> None:
        """Report progress (0..1) and a short message; also the heartbeat. run_id links the run.
        With `claim`, only while the job is still running under that claim (else JobLostError)."""
        values: dict[str, Any] = {
            "progress": min(max(float(progress), 0.0), 1.0),
            "message": message,
        }
        if run_id is not None:
            values["run_id"] = run_id
        self._update(job_id, values, claim, beat=True)

    def finish_job(
        self,
        job_id: str,
        run_id: str | None = None,
        error: str | None = None,
        claim: str | None = None,
    ) -> None:
        """The job ended: 'done' (progress 1) or, with an error text, 'failed'. With `claim`,
        only while this claim still owns it (JobLostError otherwise: someone recovered it)."""
        values: dict[str, Any] = {"error": error}
        values["status"] = "failed" if error else "done"
        if not error:
            values["progress"] = 1.0
        if run_id is not None:
            values["run_id"] = run_id
        self._update(job_id, values, claim, beat=True, finish=True)

    def heartbeat_job(self, job_id: str, worker: str, claim: str | None = None) -> bool:
        """Say `worker` is still alive on this job; False when the job is no longer its own
        (another process recovered it after a heartbeat timeout), so the worker can stop."""
        j = schema.jobs
        cond = [j.c.id == str(job_id), j.c.status == "running", j.c.worker == str(worker)]
        if claim is not None:
            cond.append(j.c.claim == claim)
        with self._begin() as conn:
            hit = conn.execute(
                j.update().where(*cond).values(heartbeat_at=db_utcnow(conn)).returning(j.c.id)
            ).scalar()
        return hit is not None

    def release_job(self, job_id: str, worker: str, reason: str, claim: str | None = None) -> bool:
        """Put a job `worker` is running back in the queue (graceful shutdown), in one transaction.

        The run it had started holds no results yet (those land at the very end, atomically), so
        it is deleted: the next worker starts the job afresh. Nothing changes, and False is
        returned, when the job is no longer this worker's (recovered meanwhile, or finished).
        """
        j = schema.jobs
        cond = [j.c.id == str(job_id), j.c.status == "running", j.c.worker == str(worker)]
        if claim is not None:
            cond.append(j.c.claim == claim)
        with self._begin() as conn:
            row = conn.execute(sa.select(j.c.run_id).where(*cond)).first()
            if row is None:
                return False
            conn.execute(j.update().where(*cond).values(**_requeued(reason)))
            _drop_unfinished_runs(conn, [row[0]])
        return True

    def fence_job(self, conn: Connection, job_id: str, claim: str, values: dict[str, Any]) -> None:
        """Inside the caller's transaction: update the job only while `claim` still owns it and
        it is running, else raise JobLostError (which rolls the caller's writes back too)."""
        j = schema.jobs
        hit = conn.execute(
            j.update()
            .where(j.c.id == str(job_id), j.c.status == "running", j.c.claim == claim)
            .values(**values)
            .returning(j.c.id)
        ).scalar()
        if hit is None:
            raise JobLostError(
                f"job {job_id} is no longer this worker's (recovered or re-queued meanwhile); "
                "its result was not saved"
            )

    def check_claim(self, conn: Connection, job_id: str, claim: str) -> None:
        """Inside the caller's transaction, without locking: JobLostError unless `claim` still
        owns the running job. A save asks first so a lost job streams nothing; `fence_job` at
        its end is what decides."""
        j = schema.jobs
        owned = conn.execute(
            sa.select(j.c.id).where(
                j.c.id == str(job_id), j.c.status == "running", j.c.claim == claim
            )
        ).first()
        if owned is None:
            raise JobLostError(
                f"job {job_id} is no longer this worker's (recovered or re-queued meanwhile); "
                "its result was not saved"
            )

    def _update(
        self,
        job_id: str,
        values: dict[str, Any],
        claim: str | None,
        beat: bool = False,
        finish: bool = False,
    ) -> None:
        j = schema.jobs
        with self._begin() as conn:
            now = db_utcnow(conn)
            values = dict(values)
            if beat:
                values["heartbeat_at"] = now
            if finish:
                values["finished_at"] = now
            if claim is not None:
                self.fence_job(conn, job_id, claim, values)
                return
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
        self,
        reason: str,
        worker: str | None = None,
        stale_after_s: float | None = None,
        max_attempts: int | None = None,
    ) -> list[str]:
        """Take back 'running' jobs whose worker died; queued jobs stay queued.

        By default every running job (right for DuckDB, where the app is the only process). With
        several workers on a server database, narrow it to one `worker` or to jobs whose heartbeat
        (database clock) is older than `stale_after_s`. The UPDATE itself re-checks status and
        heartbeat, so a job whose worker beat in between is left alone. With `max_attempts`, a
        job claimed fewer times goes back to the queue (its unfinished run deleted); otherwise it
        fails with `reason`, as do its unfinished runs. Returns the recovered job ids.
        """
        j = schema.jobs
        with self._begin() as conn:
            now = db_utcnow(conn)
            cond = [j.c.status == "running"]
            if worker is not None:
                cond.append(j.c.worker == worker)
            if stale_after_s is not None:
                cutoff = now - timedelta(seconds=float(stale_after_s))
                cond.append(sa.or_(j.c.heartbeat_at.is_(None), j.c.heartbeat_at < cutoff))
            pick = sa.select(j.c.id, j.c.run_id, j.c.attempts, j.c.claim).where(*cond)
            if conn.dialect.name == "postgresql":
                pick = pick.with_for_update(skip_locked=True)
            rows = conn.execute(pick).all()
            if not rows:
                return []
            runs_of = {row[0]: row[1] for row in rows}
            claims_of = {row[0]: row[3] for row in rows}
            retry = [
                row[0] for row in rows if max_attempts is not None and (row[2] or 0) < max_attempts
            ]
            requeued: list[str] = []
            if retry:
                requeued = list(
                    conn.execute(
                        j.update()
                        .where(j.c.id.in_(retry), *cond)
                        .values(**_requeued(f"re-queued: {reason}"))
                        .returning(j.c.id)
                    ).scalars()
                )
                _drop_unfinished_runs(conn, [runs_of[i] for i in requeued])
            rest = [row[0] for row in rows if row[0] not in retry]
            failed: list[str] = []
            if rest:
                tries = (
                    f" (after {max_attempts} attempts); submit it again"
                    if max_attempts is not None
                    else ""
                )
                failed = list(
                    conn.execute(
                        j.update()
                        .where(j.c.id.in_(rest), *cond)
                        .values(status="failed", error=reason + tries, finished_at=now)
                        .returning(j.c.id)
                    ).scalars()
                )
                _fail_unfinished_runs(conn, [runs_of[i] for i in failed], reason + tries, now)
        self._cut_off_saves([claims_of[i] for i in requeued + failed])
        return requeued + failed

    def _cut_off_saves(self, keys: list[str | None]) -> None:
        """End the server sessions still saving under keys just taken back (claims of recovered
        jobs, ids of failed runs: a process frozen mid-COPY, where the server applies no
        statement or idle timeout): their saves can only fail now, and ended, they hold no
        snapshot or connection. PostgreSQL only (embedded databases have one process); a role
        not allowed to signal them is logged."""
        names = [save_session_name(k) for k in keys if k]
        if not names or self.engine.dialect.name != "postgresql":
            return
        try:
            with self._begin() as conn:
                ended = conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = ANY(:names) AND pid <> pg_backend_pid()"
                    ),
                    {"names": names},
                ).scalar()
        except sa.exc.DBAPIError as exc:
            log.warning("could not end the sessions of recovered saves: %s", exc.orig or exc)
            return
        if ended:
            log.warning("ended %d server session(s) still saving a recovered job or run", ended)

    def recover_runs(self, reason: str, stale_after_s: float | None = None) -> list[str]:
        """Fail runs left 'running' by a process that died: every one (a DuckDB file this
        process holds has no other writer), or, on a shared database, those whose heartbeat
        (`updated_at`, database clock) is older than `stale_after_s`. The UPDATE re-checks.

        On PostgreSQL the rows are taken with SKIP LOCKED: a run whose row a process holds in
        its save's last statements is left to that save, instead of making this caller
        (`sketchwalk runs`, the app, a worker) wait. A run failed here whose process is
        frozen inside its save (a plain `sketchwalk run`, mid-COPY) has its server session
        ended, as a recovered job's is."""
        r = schema.runs
        with self._begin() as conn:
            now = db_utcnow(conn)
            cond = [r.c.status == "running"]
            if stale_after_s is not None:
                cond.append(r.c.updated_at < now - timedelta(seconds=float(stale_after_s)))
            pick = sa.select(r.c.id).where(*cond)
            if conn.dialect.name == "postgresql":
                pick = pick.with_for_update(skip_locked=True)
            ids = list(conn.execute(pick).scalars())
            if not ids:
                return []
            failed = list(
                conn.execute(
                    r.update()
                    .where(r.c.id.in_(ids), *cond)
                    .values(status="failed", error=reason, updated_at=now, finished_at=now)
                    .returning(r.c.id)
                ).scalars()
            )
        self._cut_off_saves(failed)
        return failed

    def touch_run(self, run_id: str) -> bool:
        """A running run's heartbeat (its `updated_at`); False once it is no longer running."""
        r = schema.runs
        with self._begin() as conn:
            hit = conn.execute(
                r.update()
                .where(r.c.id == str(run_id), r.c.status == "running")
                .values(updated_at=db_utcnow(conn))
                .returning(r.c.id)
            ).scalar()
        return hit is not None


def save_session_name(key: str) -> str:
    """The application_name a save gives its server session (within PostgreSQL's 63
    characters), so recovery can find and end it. key: the job's claim token, or the run's
    id for a run saved outside a job."""
    return f"sketchwalk save {key}"


def name_save_session(conn: Connection, key: str) -> None:
    """For this transaction only, name the server session after the claim or run it saves
    (PostgreSQL; nothing elsewhere)."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT set_config('application_name', :name, true)"),
            {"name": save_session_name(key)},
        )


def _requeued(message: str) -> dict[str, Any]:
    """A job's columns when it goes back to the queue (attempts are kept: they count claims)."""
    return {
        "status": "queued",
        "worker": None,
        "claim": None,
        "started_at": None,
        "heartbeat_at": None,
        "progress": 0.0,
        "message": message,
        "run_id": None,
        "error": None,
    }


def _drop_unfinished_runs(conn: Connection, run_ids: list[str | None]) -> None:
    """Delete the runs a re-queued job had started (never a finished one)."""
    r = schema.runs
    ids = [i for i in run_ids if i is not None]
    if not ids:
        return
    doomed = list(
        conn.execute(sa.select(r.c.id).where(r.c.id.in_(ids), r.c.status != "done")).scalars()
    )
    if doomed:
        for table in schema.RUN_TABLES:
            conn.execute(table.delete().where(schema.run_key(table).in_(doomed)))


def _fail_unfinished_runs(
    conn: Connection, run_ids: list[str | None], reason: str, now: datetime
) -> None:
    r = schema.runs
    ids = [i for i in run_ids if i is not None]
    if ids:
        conn.execute(
            r.update()
            .where(r.c.id.in_(ids), r.c.status.in_(("queued", "running")))
            .values(status="failed", error=reason, updated_at=now, finished_at=now)
        )
