"""Run writes: create, track status, save a RunResult in one transaction, delete.

The save is all or nothing (one transaction over every table), and a failed save still leaves
the run row saying why, so the app never shows a half-written run as if it were complete. A run
that shows its quality first is saved in two such transactions: every row with the run still
'running' (`save_quality`), then the clean timings merged in and the run done (`save_speed`).
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sketchwalk.engine.run.records import RunResult
from sketchwalk.engine.run.speed import CLEAN_FAILED
from sketchwalk.store import frames, jsonio, limits, schema
from sketchwalk.store.bulk import insert_arrow
from sketchwalk.store.db import db_clock, db_utcnow, utcnow
from sketchwalk.store.errors import (
    InvalidResultError,
    JobLostError,
    SaveError,
    UnknownRunError,
)
from sketchwalk.store.jobs import name_save_session
from sketchwalk.store.reads import require_run

log = logging.getLogger(__name__)

SPEED_PENDING = "quality saved; timing clean passes"
"""The job's message between a run's quality half and its speed half."""


class RunsMixin:
    """Run write methods of `Store`; expects `self.engine` and `self._begin()` / `self._connect()`."""

    engine: Engine

    def _begin(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def _connect(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    # ---- writes -------------------------------------------------------------------------

    def create_run(
        self,
        request: dict[str, Any],
        status: str | None = None,
        job: tuple[str, str] | None = None,
    ) -> str:
        """Record a requested run (status 'queued' or 'running') and return its new id.

        request: prompt (str), model (id), config (dict), method; kept verbatim as JSON too.
        `job` = (job id, claim token): link the run to that job in the same transaction, only
        while the claim still owns it (JobLostError and no run row otherwise).
        """
        if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
            raise InvalidResultError("a run request needs a 'prompt' string")
        status = status or request.get("status") or "queued"
        if status not in ("queued", "running"):
            raise InvalidResultError(f"a new run is 'queued' or 'running', not {status!r}")
        config = request.get("config") or {}
        if not isinstance(config, dict):
            raise InvalidResultError("a run request's 'config' must be a dict")
        run_id = str(uuid.uuid4())
        try:
            self._insert_run(run_id, request, status, config, job)
        except Exception as exc:
            if not _is_driver_error(exc):
                raise
            line = _first_line(getattr(exc, "orig", None) or exc)
            raise SaveError(f"cannot create the run: {line}; nothing was stored") from exc
        return run_id

    def _insert_run(
        self,
        run_id: str,
        request: dict[str, Any],
        status: str,
        config: dict[str, Any],
        job: tuple[str, str] | None,
    ) -> None:
        """The run row (and its job link) in one transaction."""
        values = {
            "model_id": request.get("model"),
            "prompt": request["prompt"],
            "method": request.get("method") or config.get("method"),
            "config": jsonio.dumps(config),
            "request": jsonio.dumps(request),
        }
        over = limits.run_text_over(values)
        if over is not None:
            raise InvalidResultError(f"the run's {over}; nothing was stored")
        with self._begin() as conn:
            now = db_utcnow(conn)
            conn.execute(
                schema.runs.insert().values(
                    id=run_id, created_at=now, updated_at=now, status=status, **values
                )
            )
            if job is not None:
                self.fence_job(  # type: ignore[attr-defined]  # JobsMixin
                    conn, job[0], job[1], {"run_id": run_id, "message": "starting"}
                )

    def set_status(self, run_id: str, status: str, error: str | None = None) -> None:
        """Move a run to `status` (queued/running/done/failed), keeping an error text if given."""
        if status not in schema.RUN_STATUSES:
            raise InvalidResultError(
                f"unknown run status {status!r}; use one of {', '.join(schema.RUN_STATUSES)}"
            )
        now = utcnow()
        if error is not None:  # kept within the store's limit: a failure is still recorded
            error = error[: limits.MAX_RUN_NOTE]
        values: dict[str, Any] = {"status": status, "error": error, "updated_at": now}
        if status in ("done", "failed"):
            values["finished_at"] = now
        with self._begin() as conn:
            require_run(conn, run_id)
            conn.execute(schema.runs.update().where(schema.runs.c.id == run_id).values(**values))

    def mark_failed(self, run_id: str, error: str) -> None:
        """The run ended with an error; the text is shown to the user as is."""
        self.set_status(run_id, "failed", error=str(error) or "failed")

    def save_result(
        self, run_id: str, result: RunResult, job: tuple[str, str] | None = None
    ) -> None:
        """Store everything a finished run produced, in ONE transaction, and mark it done.

        Either all rows land or none: on any exception the transaction rolls back, the run is
        marked failed with the error text, and the exception propagates (a database or disk
        failure as a one-line SaveError). Saving again replaces the earlier rows of the same run.
        `job` = (job id, claim token): the same transaction marks that job done, but only while
        the claim still owns it; otherwise JobLostError and nothing is written (the run keeps
        the state whoever recovered the job gave it).
        """
        self._save_rows(run_id, result, job, _finished_job(run_id), status="done")

    def save_quality(
        self,
        run_id: str,
        result: RunResult,
        job: tuple[str, str] | None = None,
        progress: float = 0.5,
        message: str = SPEED_PENDING,
    ) -> None:
        """The quality half of a run whose clean passes come next: every row of `result`, as
        `save_result` writes them (one transaction, fenced, a failure marks the run failed), but
        the run stays 'running' and its job says `message`, so the app can show the verdict's
        quality half while the speed half is measured. `save_speed` ends the run."""
        values = {"progress": progress, "message": message, "run_id": run_id}
        self._save_rows(run_id, result, job, values, status="running")

    def save_speed(
        self,
        run_id: str,
        timings: dict[str, Any],
        job: tuple[str, str] | None = None,
        failed: str | None = None,
        layer_dense_ms: dict[int, float] | None = None,
    ) -> None:
        """The speed half after `save_quality`: merge `timings` (the clean passes' keys) into the
        run's stored timings and mark the run and its job done, in one short transaction fenced
        like the save (a lost claim writes nothing: JobLostError). `failed`: the one line saying
        why the clean passes did not run; kept as the timings' `clean_failed` note, the run
        still done (its quality half is whole). `layer_dense_ms`: each layer's dense prefill
        attention time from the clean passes, written into the sparse prefill layers' records
        that have none (the quality half times no dense attention). Only a 'running' run takes
        it."""
        if not isinstance(timings, dict):
            raise InvalidResultError(f"save_speed takes a dict, not {type(timings).__name__}")
        dense_rows = [
            {"rid": run_id, "lyr": int(layer), "ms": float(ms)}
            for layer, ms in (layer_dense_ms or {}).items()
        ]
        extra = {**timings, **({CLEAN_FAILED: failed} if failed else {})}
        text = jsonio.dumps(extra)  # values JSON cannot hold are refused before any write
        try:
            with self._begin() as conn:
                name_save_session(conn, run_id if job is None else job[1])
                if job is not None:
                    self.check_claim(conn, job[0], job[1])  # type: ignore[attr-defined]
                stored = _running_timings(conn, run_id)
                merged = jsonio.dumps({**stored, **jsonio.loads(text)})
                if dense_rows:
                    t = schema.layer_stats
                    conn.execute(
                        t.update()
                        .where(
                            t.c.run_id == sa.bindparam("rid"),
                            t.c.phase == "prefill",
                            t.c.layer == sa.bindparam("lyr"),
                            sa.not_(t.c.dense),
                            t.c.t_dense_ms.is_(None),
                        )
                        .values(t_dense_ms=sa.bindparam("ms")),
                        dense_rows,
                    )
                self._end_save(
                    conn, run_id, {"timings": merged, "status": "done"}, job, _finished_job(run_id)
                )
        except Exception as exc:
            if not _is_driver_error(exc):
                raise
            line = _first_line(getattr(exc, "orig", None) or exc)
            raise SaveError(f"saving the clean timings failed: {line}") from exc

    def _save_rows(
        self,
        run_id: str,
        result: RunResult,
        job: tuple[str, str] | None,
        job_values: dict[str, Any],
        status: str,
    ) -> None:
        """Every row of `result` in one transaction; the run ends in `status`, the job (fenced)
        takes `job_values`. The job and run rows are written last (`_end_save`): the bulk rows
        stream in before any row another process waits on is locked, so a writer frozen
        mid-COPY holds neither and heartbeat recovery can take its job back."""
        with self._connect() as conn:
            require_run(conn, run_id)
        try:
            if not isinstance(result, RunResult):
                raise InvalidResultError(
                    f"save_result takes a RunResult, not {type(result).__name__}"
                )
            stats = frames.layer_stats_table(result.layers)
            scores = frames.block_scores_table(result.layers)
            spans = frames.blocks_table(result.blocks)
            toks = frames.tokens_table(result.tokens)
            fields = frames.run_fields(result)
            frames.check_limits(
                {"layer_stats": stats, "block_scores": scores, "blocks": spans, "tokens": toks},
                fields,
            )
            with self._begin() as conn:
                name_save_session(conn, run_id if job is None else job[1])  # for recovery to end
                if job is not None:  # a job already lost streams nothing
                    self.check_claim(conn, job[0], job[1])  # type: ignore[attr-defined]
                self._delete_rows(conn, run_id, keep_run=True)
                key = {"run_id": run_id}
                self._insert(conn, schema.layer_stats, stats, key)
                self._insert(conn, schema.block_scores, scores, key)
                self._insert(conn, schema.blocks, spans, key)
                self._insert(conn, schema.tokens, toks, key)
                self._end_save(conn, run_id, {**fields, "status": status}, job, job_values)
        except JobLostError:
            raise
        except BaseException as exc:
            if job is not None and self._lost(job):  # cut off after recovery took the job
                raise JobLostError(
                    f"job {job[0]} was recovered while its save ran (the save was cut off); "
                    "its result was not saved"
                ) from exc
            text = f"saving results failed: {type(exc).__name__}: {exc}".strip()
            text = text.splitlines()[0][:300] if text else "failed"
            try:
                self.mark_failed(run_id, text)
            except Exception as inner:  # the database itself is gone: report the first error
                log.warning("could not mark run %s failed: %s", run_id, inner)
            if isinstance(exc, OSError) or _is_driver_error(exc):
                raise SaveError(f"{text}; nothing of the run was stored") from exc
            raise

    def _lost(self, job: tuple[str, str]) -> bool:
        """Whether the claim no longer owns its job (False when that cannot be read: the
        database is gone, and the caller's own error says so)."""
        try:
            with self._connect() as conn:
                self.check_claim(conn, job[0], job[1])  # type: ignore[attr-defined]
        except JobLostError:
            return True
        except Exception:
            return False
        return False

    def _end_save(
        self,
        conn: Connection,
        run_id: str,
        run_values: dict[str, Any],
        job: tuple[str, str] | None,
        job_values: dict[str, Any],
    ) -> None:
        """A save's last statements, just before its commit: the job (fenced: JobLostError rolls
        everything back) and then the run row, stamped with the database's clock now, not the
        transaction's start (a long COPY lies between). These are the save's only row locks on
        `jobs` and `runs`, held for these few statements."""
        now = db_clock(conn)
        done = run_values.get("status") == "done"
        if job is not None:
            values = {**job_values, "heartbeat_at": now}
            if job_values.get("status") == "done":
                values["finished_at"] = now
            self.fence_job(conn, job[0], job[1], values)  # type: ignore[attr-defined]  # JobsMixin
        r = schema.runs
        hit = conn.execute(
            r.update()
            .where(r.c.id == run_id)
            .values(**run_values, error=None, updated_at=now, finished_at=now if done else None)
            .returning(r.c.id)
        ).scalar()
        if hit is None:  # deleted while its rows streamed in: keep none of them
            raise UnknownRunError(f"run {run_id} was deleted while it was being saved")

    def _insert(self, conn: Connection, table: sa.Table, data: pa.Table, key: dict) -> None:
        """One bulk insert; a seam tests use to fail a write half way."""
        insert_arrow(conn, table, data, key)

    def delete_run(self, run_id: str) -> None:
        """Remove a run and every row that belongs to it (scores, stats, tokens, jobs)."""
        self.delete_runs([run_id])

    def delete_runs(self, run_ids: list[str]) -> None:
        """Remove several runs in one transaction: all of them or, on any error or interrupt,
        none (an unknown id raises UnknownRunError before anything is deleted)."""
        ids = list(dict.fromkeys(str(i) for i in run_ids))
        try:
            with self._begin() as conn:
                for run_id in ids:
                    require_run(conn, run_id)
                for start in range(0, len(ids), 500):  # bounded IN lists
                    chunk = ids[start : start + 500]
                    for table in schema.RUN_TABLES:
                        conn.execute(table.delete().where(schema.run_key(table).in_(chunk)))
                    conn.execute(schema.jobs.delete().where(schema.jobs.c.run_id.in_(chunk)))
        except Exception as exc:  # a full disk, a lost server: the transaction rolled back
            if not _is_driver_error(exc):
                raise
            raise SaveError(
                f"cannot delete: {_first_line(getattr(exc, 'orig', None) or exc)}; "
                "no run was deleted"
            ) from None

    @staticmethod
    def _delete_rows(conn: Connection, run_id: str, keep_run: bool) -> None:
        for table in schema.RUN_TABLES:
            if keep_run and table is schema.runs:
                continue
            conn.execute(table.delete().where(schema.run_key(table) == run_id))


def _finished_job(run_id: str) -> dict[str, Any]:
    """A job's columns when its run's save ends it."""
    return {"status": "done", "progress": 1.0, "message": "done", "run_id": run_id, "error": None}


def _running_timings(conn: Connection, run_id: str) -> dict[str, Any]:
    """The stored timings of a run waiting for its speed half (UnknownRunError when there is no
    such run; InvalidResultError when it is not 'running': done, failed or recovered)."""
    r = schema.runs
    row = conn.execute(sa.select(r.c.status, r.c.timings).where(r.c.id == run_id)).first()
    if row is None:
        raise UnknownRunError(f"no run with id {run_id!r} in this store (see `sketchwalk runs`)")
    if row[0] != "running":
        raise InvalidResultError(f"run {run_id} is {row[0]}, not waiting for its clean timings")
    stored = jsonio.lenient(row[1])
    return stored if isinstance(stored, dict) else {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _is_driver_error(exc: BaseException) -> bool:
    """A database's own failure (disk full, connection lost), wrapped by SQLAlchemy or raised
    by DuckDB's columnar fast path."""
    import sys

    if isinstance(exc, sa.exc.DBAPIError):
        return True
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)
