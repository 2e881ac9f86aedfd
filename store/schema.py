"""The store's tables, in SQLAlchemy Core, portable between DuckDB and PostgreSQL.

Choices that keep one schema working on both: text UUID keys (DuckDB has no SERIAL), JSON kept as
text (parsed in Python, so NaN metrics survive), naive UTC timestamps, no foreign keys (DuckDB
cannot delete rows that a foreign key points at within one transaction cleanly, and bulk loads
stay simple). Block rows carry no primary key: on DuckDB an ART index triples insert time while
zone maps already make per-layer reads fast (rows are written in layer order); other databases
get a plain index on the layer key instead.
"""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA_VERSION = 3
"""Bump on any change to the tables below; stores with another version are refused, except
older versions that UPGRADES can bring forward by creating tables or adding nullable columns
(nothing existing changes)."""

STORE_MARKER = "sketchwalk"
"""Value of the `app` key in the meta table: tells our store apart from someone else's file."""

RUN_STATUSES = ("queued", "running", "done", "failed")
JOB_STATUSES = ("queued", "running", "done", "failed")

metadata = sa.MetaData()

meta = sa.Table(
    "sketchwalk_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("model_id", sa.Text),
    sa.Column("model_hash", sa.Text),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("method", sa.String(32)),
    sa.Column("config", sa.Text, nullable=False),  # JSON
    sa.Column("request", sa.Text, nullable=False),  # JSON, as submitted
    sa.Column("device", sa.Text),
    sa.Column("versions", sa.Text),  # JSON: torch, transformers, sketchwalk, ...
    sa.Column("dense_text", sa.Text),
    sa.Column("sparse_text", sa.Text),
    sa.Column("metrics", sa.Text),  # JSON
    sa.Column("timings", sa.Text),  # JSON
)

layer_stats = sa.Table(
    "layer_stats",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("phase", sa.String(16), primary_key=True),
    sa.Column("step", sa.Integer, primary_key=True),
    sa.Column("layer", sa.Integer, primary_key=True),
    sa.Column("dense", sa.Boolean, nullable=False),
    sa.Column("n_blocks", sa.Integer, nullable=False),
    sa.Column("q_blocks", sa.Text, nullable=False),  # JSON list: query block of each row
    sa.Column("density_target", sa.Double),
    sa.Column("density_achieved", sa.Double),
    sa.Column("sketch_error", sa.Double),
    sa.Column("walk_error", sa.Double),
    sa.Column("mass_recall", sa.Double),
    sa.Column("t_sketch_ms", sa.Double),
    sa.Column("t_walk_ms", sa.Double),
    sa.Column("t_select_ms", sa.Double),
    sa.Column("t_attention_ms", sa.Double),
    sa.Column("t_dense_ms", sa.Double),
)

block_scores = sa.Table(
    "block_scores",
    metadata,
    sa.Column("run_id", sa.String(36), nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("layer", sa.Integer, nullable=False),
    sa.Column("q_block", sa.Integer, nullable=False),
    sa.Column("k_block", sa.Integer, nullable=False),
    sa.Column("sketch", sa.REAL),
    sa.Column("walk", sa.REAL),
    sa.Column("exact", sa.REAL),
    sa.Column("selected", sa.Boolean),
)
sa.Index(
    "ix_block_scores_layer",
    block_scores.c.run_id,
    block_scores.c.phase,
    block_scores.c.step,
    block_scores.c.layer,
).ddl_if(callable_=lambda ddl, target, bind, dialect=None, **kw: dialect.name != "duckdb")

blocks = sa.Table(
    "blocks",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("block", sa.Integer, primary_key=True),
    sa.Column("token_start", sa.Integer, nullable=False),
    sa.Column("token_end", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("variant", sa.String(16), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("token_id", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("logprob", sa.Double),
    sa.Column("kl", sa.Double),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("request", sa.Text, nullable=False),  # JSON
    sa.Column("progress", sa.Double, nullable=False),
    sa.Column("message", sa.Text),
    sa.Column("worker", sa.Text),
    sa.Column("run_id", sa.String(36)),
    sa.Column("error", sa.Text),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("started_at", sa.DateTime),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("heartbeat_at", sa.DateTime),
    # The fence: a fresh token per claim and the number of claims so far. Every later write of
    # the job (progress, heartbeat, result, failure) names the token, so a worker whose job was
    # recovered and handed to another can never write it again.
    sa.Column("claim", sa.String(36)),
    sa.Column("attempts", sa.Integer),
)
sa.Index("ix_jobs_status_created", jobs.c.status, jobs.c.created_at).ddl_if(
    callable_=lambda ddl, target, bind, dialect=None, **kw: dialect.name != "duckdb"
)

eval_results = sa.Table(
    "eval_results",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("eval_id", sa.String(36), nullable=False),  # one `sketchwalk eval` invocation
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("model_id", sa.Text, nullable=False),
    sa.Column("model_hash", sa.Text),
    sa.Column("task", sa.String(32), nullable=False),  # lm, retrieval, file
    sa.Column("source", sa.Text, nullable=False),  # gpl-3, passkey, kv, a file name, ...
    sa.Column("length", sa.Integer, nullable=False),  # nominal tokens per item
    sa.Column("method", sa.String(32), nullable=False),
    sa.Column("phases", sa.String(16), nullable=False),
    sa.Column("density_target", sa.Double, nullable=False),
    sa.Column("density_achieved", sa.Double),  # prefill, sparse layers
    sa.Column("density_achieved_all", sa.Double),  # prefill, all layers
    sa.Column("density_decode", sa.Double),
    sa.Column("n_items", sa.Integer, nullable=False),
    sa.Column("n_tokens", sa.Integer, nullable=False),  # scored tokens (lm) / prompt tokens
    sa.Column("ppl_dense", sa.Double),
    sa.Column("ppl_sparse", sa.Double),
    sa.Column("kl_mean", sa.Double),
    sa.Column("top1_agreement", sa.Double),
    sa.Column("acc_dense", sa.Double),  # retrieval: exact-match accuracy
    sa.Column("acc_sparse", sa.Double),
    sa.Column("dense_ms", sa.Double),  # mean dense forward time per item (prefill + decode)
    sa.Column("sparse_ms", sa.Double),
    sa.Column("config", sa.Text, nullable=False),  # JSON: the SketchWalkConfig of the cell
    sa.Column("extra", sa.Text),  # JSON: device, versions, per-item details
)
"""One row per (eval, model, task, source, length, method, density): written by `sketchwalk eval`."""

UPGRADES: dict[int, tuple[sa.Table | sa.Column, ...]] = {
    1: (eval_results,),
    2: (jobs.c.claim, jobs.c.attempts),
}
"""Version v -> tables to create / nullable columns to add that bring a v store to v + 1."""

RUN_TABLES: tuple[sa.Table, ...] = (runs, layer_stats, block_scores, blocks, tokens)
"""Tables holding one run's data, keyed by run id (runs by `id`, the others by `run_id`)."""


def run_key(table: sa.Table) -> sa.Column:
    """The column that names the run a row of `table` belongs to."""
    return table.c.id if table.name == "runs" else table.c.run_id
