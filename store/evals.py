"""Eval results: the rows `sketchwalk eval` writes (one per grid cell) and the Benchmarks page reads.

Kept apart from runs: a grid cell aggregates many prompts and holds no per-layer records, so it
is a flat row (metrics as columns, so the app and Parquet readers filter without parsing JSON;
the cell's config and details stay JSON text like the run tables).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sketchwalk.store import jsonio, schema
from sketchwalk.store.bulk import arrow_schema, fetch_arrow, insert_arrow
from sketchwalk.store.db import db_clock, db_utcnow, utcnow
from sketchwalk.store.errors import ExportError, InvalidResultError

EVAL_COLUMNS = tuple(c.name for c in schema.eval_results.columns)
_REQUIRED = ("eval_id", "model_id", "task", "source", "length", "method", "phases")
_JSON = ("config", "extra")
FILTERS = ("eval_id", "model_id", "task", "source", "method")


class EvalsMixin:
    """Eval-result methods of `Store`; expects `self._begin()` / `self._connect()`."""

    engine: Engine

    def _begin(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def _connect(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def save_eval_results(
        self, rows: Iterable[dict[str, Any]], job: tuple[str, str] | None = None
    ) -> list[str]:
        """Insert eval rows in one transaction; returns their new ids.

        Each row needs eval_id, model_id, task, source, length, method, phases, density_target,
        n_items and n_tokens; metric columns may be None; config/extra are dicts (stored as JSON).
        `job` = (job id, claim token): the same transaction marks that job done, first and only
        while the claim still owns it; otherwise JobLostError and no row is written.
        """
        prepared = [_prepare(r) for r in rows]
        data = pa.Table.from_pylist(prepared, schema=arrow_schema(schema.eval_results))
        with self._begin() as conn:
            if job is not None:
                now = db_utcnow(conn)
                self.fence_job(  # type: ignore[attr-defined]  # JobsMixin
                    conn,
                    job[0],
                    job[1],
                    {
                        "status": "done",
                        "progress": 1.0,
                        "message": "done",
                        "error": None,
                        "finished_at": now,
                        "heartbeat_at": now,
                    },
                )
            if prepared:
                insert_arrow(conn, schema.eval_results, data)
            if job is not None:  # finished when the rows are in (just before the commit)
                done_at = db_clock(conn)
                conn.execute(
                    schema.jobs.update()
                    .where(schema.jobs.c.id == job[0])
                    .values(finished_at=done_at, heartbeat_at=done_at)
                )
        return [r["id"] for r in prepared]

    def eval_results(self, **filters: str | Iterable[str] | None) -> pd.DataFrame:
        """Eval rows, oldest first, optionally filtered by eval_id, model_id, task, source, method
        (a value or a list of values). config/extra come back parsed."""
        unknown = sorted(set(filters) - set(FILTERS))
        if unknown:
            raise InvalidResultError(f"unknown eval filter {', '.join(unknown)}")
        table = schema.eval_results
        stmt = sa.select(table).order_by(table.c.created_at, table.c.id)
        for name, value in filters.items():
            if value is None:
                continue
            values = [value] if isinstance(value, str) else list(value)
            stmt = stmt.where(table.c[name].in_(values)) if values else stmt.where(sa.false())
        with self._connect() as conn:
            df = fetch_arrow(conn, table, stmt).to_pandas()
        for col in _JSON:
            df[col] = [jsonio.loads(v) if isinstance(v, str) else {} for v in df[col]]
        return df

    def export_eval_parquet(self, path: str | Path, **filters: str | Iterable[str] | None) -> Path:
        """Write the (filtered) eval rows to one Parquet file; config/extra stay JSON text."""
        df = self.eval_results(**filters)
        for col in _JSON:
            df[col] = [jsonio.dumps(v) for v in df[col]]
        data = pa.Table.from_pandas(
            df, schema=arrow_schema(schema.eval_results), preserve_index=False
        )
        out = Path(path).expanduser()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(data, out, compression="zstd")
        except OSError as exc:
            raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None
        return out

    def delete_eval(self, eval_id: str) -> int:
        """Remove every row of one eval; returns how many went."""
        table = schema.eval_results
        with self._begin() as conn:
            return conn.execute(table.delete().where(table.c.eval_id == eval_id)).rowcount or 0


def _prepare(row: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise InvalidResultError(f"an eval row is a dict, not {type(row).__name__}")
    missing = [k for k in _REQUIRED if row.get(k) in (None, "")]
    if missing:
        raise InvalidResultError(f"an eval row lacks {', '.join(missing)}")
    unknown = sorted(set(row) - set(EVAL_COLUMNS))
    if unknown:
        raise InvalidResultError(f"unknown eval columns: {', '.join(unknown)}")
    out: dict[str, Any] = {c: row.get(c) for c in EVAL_COLUMNS}
    out["id"] = str(row.get("id") or uuid.uuid4())
    out["created_at"] = row.get("created_at") or utcnow()
    for col in _JSON:
        out[col] = jsonio.dumps(row.get(col) or {})
    for col in ("density_target", "n_items", "n_tokens"):
        if out[col] is None:
            raise InvalidResultError(f"an eval row lacks {col}")
    return out
