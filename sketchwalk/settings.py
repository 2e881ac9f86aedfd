"""Limits and defaults of the app and its worker, each overridable by an environment variable.

The limits exist so one request cannot exhaust the machine's memory: the recorder keeps n x n block
matrices per layer and the exact block mass costs a dense softmax, both growing with the prompt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sketchwalk.errors import SketchWalkError

ENV_PREFIX = "SKETCHWALK_"
STORED_PROMPT_CHARS = 1 << 21
"""The longest prompt the store keeps (store/limits.py MAX_RUN_TEXT): SKETCHWALK_MAX_PROMPT_CHARS
may not exceed it, so a prompt that passes the request's check is never refused at save."""


def _int(name: str, default: int) -> int:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise SketchWalkError(f"{ENV_PREFIX}{name} must be an integer, got {raw!r}") from None


def _float(name: str, default: float) -> float:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise SketchWalkError(f"{ENV_PREFIX}{name} must be a number, got {raw!r}") from None


@dataclass(frozen=True)
class Settings:
    """What one app process allows; read once per script run (cheap), so tests can set env vars."""

    max_prompt_tokens: int  # SKETCHWALK_MAX_PROMPT_TOKENS
    max_new_tokens: int  # SKETCHWALK_MAX_NEW_TOKENS
    max_prompt_chars: int  # SKETCHWALK_MAX_PROMPT_CHARS: refuse before tokenizing huge pastes
    exact_max_tokens: int  # SKETCHWALK_EXACT_MAX_TOKENS: exact block mass up to this context
    device: str  # SKETCHWALK_DEVICE: where the in-app worker runs models
    dtype: str  # SKETCHWALK_DTYPE
    in_app_worker: bool  # SKETCHWALK_APP_WORKER=0 when standalone workers serve the jobs
    poll_s: float  # SKETCHWALK_POLL_S: how often the worker looks for jobs, the UI for progress
    model_cache_size: int  # SKETCHWALK_MODEL_CACHE: models kept loaded at once
    heartbeat_s: float = 10.0  # SKETCHWALK_HEARTBEAT_S: a running job's "still alive" interval
    job_timeout_s: float = 120.0  # SKETCHWALK_JOB_TIMEOUT_S: silent this long = worker is dead
    stop_grace_s: float = 20.0  # SKETCHWALK_STOP_GRACE_S: on SIGTERM, finish within this or release
    # SKETCHWALK_THREADS: torch threads of the in-app worker; it leaves one core to the UI and the
    # browser. With every core in an OpenMP team, one busy core stalls each parallel region (a
    # tiny-model run went from 11 s to over 120 s beside one busy process; with one thread: 16 s).
    threads: int = 1
    import_max_member_mb: int = 2048  # SKETCHWALK_IMPORT_MAX_MB: largest file of an import
    import_max_total_mb: int = 8192  # SKETCHWALK_IMPORT_MAX_TOTAL_MB: all files of an import
    import_max_decoded_mb: int = 1024  # SKETCHWALK_IMPORT_MAX_DECODED_MB: a table, once decoded
    import_max_rows: int = 1 << 25  # SKETCHWALK_IMPORT_MAX_ROWS: rows of one table of an import
    run_stale_s: float = 120.0  # SKETCHWALK_RUN_STALE_S: a running CLI run silent this long died
    job_max_attempts: int = 3  # SKETCHWALK_JOB_MAX_ATTEMPTS: claims before a dying job fails
    # Server databases: every lock wait and every transaction is bounded, so one frozen process
    # (SIGSTOP, swapped out) inside its transaction cannot stall the others.
    db_lock_timeout_s: float = 5.0  # SKETCHWALK_DB_LOCK_TIMEOUT_S: longest wait for a row lock
    db_idle_tx_s: float = 30.0  # SKETCHWALK_DB_IDLE_TX_S: a transaction idle this long is cut off
    db_statement_s: float = 600.0  # SKETCHWALK_DB_STATEMENT_S: longest single statement
    view_max_blocks: int = 4096  # SKETCHWALK_VIEW_MAX_BLOCKS: widest layer the explorer draws
    # SKETCHWALK_WARM_MODEL: the in-app worker loads the default model as the app starts
    # (`sketchwalk app` sets it), so the first run does not wait for the load
    warm_model: bool = False


def load() -> Settings:
    threads = _int("THREADS", max(1, (os.cpu_count() or 2) - 1))
    if threads < 1:
        raise SketchWalkError(f"{ENV_PREFIX}THREADS must be at least 1, got {threads}")
    prompt_chars = _positive("MAX_PROMPT_CHARS", 200_000)
    if prompt_chars > STORED_PROMPT_CHARS:
        raise SketchWalkError(
            f"{ENV_PREFIX}MAX_PROMPT_CHARS must be at most {STORED_PROMPT_CHARS:,} (the longest "
            f"prompt the store keeps), got {prompt_chars:,}"
        )
    return Settings(
        max_prompt_tokens=_int("MAX_PROMPT_TOKENS", 8192),
        max_new_tokens=_int("MAX_NEW_TOKENS", 256),
        max_prompt_chars=prompt_chars,
        exact_max_tokens=_int("EXACT_MAX_TOKENS", 8192),
        device=os.environ.get(ENV_PREFIX + "DEVICE", "cpu"),
        dtype=os.environ.get(ENV_PREFIX + "DTYPE", "float32"),
        in_app_worker=os.environ.get(ENV_PREFIX + "APP_WORKER", "1") not in ("0", "false", "no"),
        warm_model=os.environ.get(ENV_PREFIX + "WARM_MODEL", "0") in ("1", "true", "yes"),
        poll_s=_float("POLL_S", 1.0),
        model_cache_size=_int("MODEL_CACHE", 2),
        heartbeat_s=_float("HEARTBEAT_S", 10.0),
        job_timeout_s=_float("JOB_TIMEOUT_S", 120.0),
        stop_grace_s=_float("STOP_GRACE_S", 20.0),
        threads=threads,
        import_max_member_mb=_positive("IMPORT_MAX_MB", 2048),
        import_max_total_mb=_positive("IMPORT_MAX_TOTAL_MB", 8192),
        import_max_decoded_mb=_positive("IMPORT_MAX_DECODED_MB", 1024),
        import_max_rows=_positive("IMPORT_MAX_ROWS", 1 << 25),
        run_stale_s=_float("RUN_STALE_S", 120.0),
        job_max_attempts=_positive("JOB_MAX_ATTEMPTS", 3),
        db_lock_timeout_s=_seconds("DB_LOCK_TIMEOUT_S", 5.0),
        db_idle_tx_s=_seconds("DB_IDLE_TX_S", 30.0),
        db_statement_s=_seconds("DB_STATEMENT_S", 600.0),
        view_max_blocks=_positive("VIEW_MAX_BLOCKS", 4096),
    )


def _positive(name: str, default: int) -> int:
    value = _int(name, default)
    if value < 1:
        raise SketchWalkError(f"{ENV_PREFIX}{name} must be at least 1, got {value}")
    return value


def _seconds(name: str, default: float) -> float:
    """A timeout: positive and finite (a database takes 0 as "no limit", which is not one)."""
    value = _float(name, default)
    if not 0 < value < 1e7:
        raise SketchWalkError(f"{ENV_PREFIX}{name} must be a positive number of seconds")
    return value
