"""A job row written raw, as a damaged or hand-edited row would be (tests of malformed jobs)."""

from __future__ import annotations

import uuid

from sketchwalk.store import schema
from sketchwalk.store.db import utcnow


def put_raw_job(store, text: str) -> str:
    """A queued job whose request column holds `text` verbatim; returns its id."""
    job_id = str(uuid.uuid4())
    with store.engine.begin() as conn:
        conn.execute(
            schema.jobs.insert().values(
                id=job_id, status="queued", request=text, progress=0.0, created_at=utcnow()
            )
        )
    return job_id
