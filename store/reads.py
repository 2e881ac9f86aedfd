"""Reads for the app and CLI: run lists, per-layer stats, heatmaps, decode rows, tokens, blocks.

Everything comes back as pandas DataFrames (tables) or dicts of numpy arrays (matrices), never
ORM objects, so the app can plot them directly and never holds a database session. Block rows
are fetched as Arrow (the DuckDB fast path) and scattered into dense arrays in numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sketchwalk.store import jsonio, schema
from sketchwalk.store.bulk import READ_BATCH_ROWS, fetch_arrow, fetch_batches
from sketchwalk.store.errors import StoreError, UnknownRunError
from sketchwalk.store.limits import LAST_ROWS_LAYERS, MAX_BLOCKS, check_records, check_view

_SCORES = ("sketch", "walk", "exact")
LABEL_CHARS = 200
"""Characters of a text read for a label (the figures show at most 60)."""
RUN_JSON_COLUMNS = ("config", "request", "versions", "metrics", "timings")
RUN_TEXT_COLUMNS = (
    "prompt",
    "dense_text",
    "sparse_text",
    "error",
    "model_id",
    "model_hash",
    "device",
)
RUN_TEXT_CHARS = 1 << 24
"""Characters of each long runs column that opening a run reads: its texts cut there, a JSON column longer than that left out (None). An honest run's request holds its
prompt, 1M tokens of a few characters, well under; only an imported row can be longer, and it
still imports, exports and opens, with what was left out named."""
LIST_COLUMNS = (
    "id",
    "created_at",
    "finished_at",
    "status",
    "error",
    "model_id",
    "method",
    "prompt_tokens",
    "device",
    "prompt",
    "config",
    "metrics",
)


def require_run(conn: Connection, run_id: str) -> None:
    """Raise UnknownRunError unless the run exists (every per-run call checks this first)."""
    found = conn.execute(sa.select(schema.runs.c.id).where(schema.runs.c.id == str(run_id))).first()
    if found is None:
        raise UnknownRunError(f"no run with id {run_id!r} in this store (see `sketchwalk runs`)")


class ReadsMixin:
    """Read methods of `Store`; expects `self._connect()`."""

    engine: Engine

    def _connect(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def run_ids(self) -> list[str]:
        """Every run id, newest first."""
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(schema.runs.c.id).order_by(schema.runs.c.created_at.desc())
            )
            return [r[0] for r in rows]

    def resolve_run_id(self, prefix: str) -> str:
        """The one run whose id starts with `prefix` (the app shows 8 characters), else a
        one-line UnknownRunError: none, or several (naming a few)."""
        text = str(prefix).strip().lower()
        if not text or len(text) > 36 or any(c not in "0123456789abcdef-" for c in text):
            shown = str(prefix) if len(str(prefix)) <= 40 else str(prefix)[:39] + "…"
            raise UnknownRunError(f"{shown!r} is not a run id or the start of one")
        r = schema.runs
        with self._connect() as conn:
            found = [
                row[0]
                for row in conn.execute(
                    sa.select(r.c.id).where(r.c.id.like(f"{text}%")).order_by(r.c.id).limit(4)
                )
            ]
        if len(found) == 1:
            return found[0]
        if not found:
            raise UnknownRunError(f"no run id starts with {text!r} (see `sketchwalk runs`)")
        shown = ", ".join(f[: len(text) + 4] for f in found[:3])
        raise UnknownRunError(
            f"{text!r} matches several runs ({shown}{', ...' if len(found) > 3 else ''}); "
            "give more characters"
        )

    def list_runs(
        self,
        status: str | None = None,
        model: str | None = None,
        method: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """Runs newest first, optionally filtered; config and metrics parsed into dicts. A list
        shows labels: each prompt is cut to LABEL_CHARS (its length in `prompt_chars`), so a
        store of long prompts lists in little memory; `same_prompt_runs` and `runs_containing`
        ask the database about the whole texts."""
        r = schema.runs
        cols = [r.c[name] for name in LIST_COLUMNS if name != "prompt"]
        prompt = [
            sa.func.substr(r.c.prompt, 1, LABEL_CHARS).label("prompt"),
            sa.func.length(r.c.prompt, type_=sa.Integer).label("prompt_chars"),
        ]
        stmt = sa.select(*cols, *prompt).order_by(r.c.created_at.desc(), r.c.id)
        if status is not None:
            stmt = stmt.where(r.c.status == status)
        if model is not None:
            stmt = stmt.where(r.c.model_id == model)
        if method is not None:
            stmt = stmt.where(r.c.method == method)
        if limit is not None:
            stmt = stmt.limit(int(limit))
        with self._connect() as conn:
            df = fetch_arrow(conn, r, stmt).to_pandas()
        for name in ("config", "metrics"):
            df[name] = [jsonio.lenient(v) for v in df[name]]
        return df

    def get_run(self, run_id: str) -> dict[str, Any]:
        """Every column of one run, JSON columns parsed."""
        with self._connect() as conn:
            row = (
                conn.execute(sa.select(schema.runs).where(schema.runs.c.id == str(run_id)))
                .mappings()
                .first()
            )
        if row is None:
            raise UnknownRunError(
                f"no run with id {run_id!r} in this store (see `sketchwalk runs`)"
            )
        out = dict(row)
        for name in RUN_JSON_COLUMNS:
            out[name] = jsonio.lenient(out[name])
        return out

    def open_run(self, run_id: str) -> dict[str, Any]:
        """One run as the pages open it: get_run's columns, but the texts (prompt, generations,
        error, model, device) cut to RUN_TEXT_CHARS (their lengths in `<name>_chars`) and a JSON column longer than that
        None (named in `left_out`): a runs row may hold up to the import's cap, 1 GiB. The whole
        of a text is run_text's, read only where asked."""
        r = schema.runs
        long_ = (*RUN_TEXT_COLUMNS, *RUN_JSON_COLUMNS)
        sizes_of = sa.select(*(sa.func.length(r.c[n]).label(n) for n in long_))
        with self._connect() as conn:
            sizes = conn.execute(sizes_of.where(r.c.id == str(run_id))).mappings().first()
            if sizes is None:
                raise UnknownRunError(
                    f"no run with id {run_id!r} in this store (see `sketchwalk runs`)"
                )
            keep = [n for n in RUN_JSON_COLUMNS if (sizes[n] or 0) <= RUN_TEXT_CHARS]
            cols = [c for c in r.columns if c.name not in long_ or c.name in keep]
            cut = [sa.func.substr(r.c[n], 1, RUN_TEXT_CHARS).label(n) for n in RUN_TEXT_COLUMNS]
            row = conn.execute(sa.select(*cols, *cut).where(r.c.id == str(run_id))).mappings()
            out = dict(row.one())
        for name in RUN_JSON_COLUMNS:
            out[name] = jsonio.lenient(out[name]) if name in keep else None
        for name in RUN_TEXT_COLUMNS:
            out[f"{name}_chars"] = sizes[name]
        out["left_out"] = [n for n in RUN_JSON_COLUMNS if n not in keep]
        return out

    def run_text(self, run_id: str, name: str) -> str | None:
        """One long column of a run, whole (a re-run needs its prompt): read only when asked."""
        if name not in RUN_TEXT_COLUMNS:
            raise ValueError(f"{name!r} is not one of {RUN_TEXT_COLUMNS}")
        r = schema.runs
        with self._connect() as conn:
            require_run(conn, run_id)
            return conn.execute(sa.select(r.c[name]).where(r.c.id == str(run_id))).scalar()

    def same_prompt(self, run_a: str, run_b: str) -> bool:
        """Whether two runs have one prompt, compared by the database (neither is read)."""
        a, b = schema.runs.alias("a"), schema.runs.alias("b")
        stmt = sa.select(sa.func.count()).where(
            a.c.id == str(run_a), b.c.id == str(run_b), a.c.prompt == b.c.prompt
        )
        with self._connect() as conn:
            return bool(conn.execute(stmt).scalar())

    def same_prompt_runs(self, run_id: str) -> set[str]:
        """Ids of the runs whose prompt is this run's (itself included), compared by the
        database, no prompt read."""
        r, this = schema.runs, schema.runs.alias("this")
        stmt = sa.select(r.c.id).where(this.c.id == str(run_id), r.c.prompt == this.c.prompt)
        with self._connect() as conn:
            return {str(i) for i in conn.execute(stmt).scalars()}

    def runs_containing(self, text: str) -> set[str]:
        """Ids of the runs whose prompt contains `text`, ignoring case (searched by the
        database: a list holds only the prompts' first characters)."""
        r = schema.runs
        found = r.c.prompt.icontains(text, autoescape=True)
        with self._connect() as conn:
            return {str(i) for i in conn.execute(sa.select(r.c.id).where(found)).scalars()}

    def _frame(self, run_id: str, table: sa.Table, stmt: sa.Select) -> pd.DataFrame:
        with self._connect() as conn:
            require_run(conn, run_id)
            return fetch_arrow(conn, table, stmt).to_pandas()

    def layer_stats(
        self, run_id: str, phase: str | None = None, q_blocks: bool = True
    ) -> pd.DataFrame:
        """Per (phase, step, layer): densities, errors, timings; q_blocks as lists, or left out
        (`q_blocks=False`: the pages never use them, and a long run's lists, parsed, cost
        several times their JSON)."""
        t = schema.layer_stats
        cols = [c for c in t.columns if c.name != "run_id" and (q_blocks or c.name != "q_blocks")]
        stmt = (
            sa.select(*cols)
            .where(t.c.run_id == run_id)
            .order_by(t.c.phase.desc(), t.c.step, t.c.layer)
        )  # prefill first
        if phase is not None:
            stmt = stmt.where(t.c.phase == phase)
        df = self._frame(run_id, t, stmt)
        if q_blocks:
            df["q_blocks"] = [jsonio.loads(v) for v in df["q_blocks"]]
        return df

    def steps(self, run_id: str) -> pd.DataFrame:
        """Which (phase, step, layer) records a run has, with their block count and dense flag."""
        t = schema.layer_stats
        stmt = (
            sa.select(t.c.phase, t.c.step, t.c.layer, t.c.n_blocks, t.c.dense)
            .where(t.c.run_id == run_id)
            .order_by(t.c.phase.desc(), t.c.step, t.c.layer)  # prefill before decode
        )
        return self._frame(run_id, t, stmt)

    def tokens(
        self,
        run_id: str,
        start: int | None = None,
        stop: int | None = None,
        variant: str | None = None,
        text_chars: int | None = None,
    ) -> pd.DataFrame:
        """Tokens of both variants (dense, sparse) in position order; or only those of
        `variant`, at positions in [start, stop), text cut to `text_chars`: a page reads the
        window it shows (a run may hold 2M tokens of 1,024 characters)."""
        t = schema.tokens
        cols = [
            sa.func.substr(c, 1, int(text_chars)).label("text")
            if c.name == "text" and text_chars is not None
            else c
            for c in t.columns
            if c.name != "run_id"
        ]
        where = [t.c.run_id == run_id]
        if variant is not None:
            where.append(t.c.variant == variant)
        if start is not None:
            where.append(t.c.position >= int(start))
        if stop is not None:
            where.append(t.c.position < int(stop))
        stmt = sa.select(*cols).where(*where).order_by(t.c.variant, t.c.position)
        return self._frame(run_id, t, stmt)

    def token_texts(
        self, run_id: str, positions: list[int], text_chars: int = LABEL_CHARS
    ) -> dict[int, str]:
        """The sparse model's text at each of `positions` (a drill-down's few source tokens),
        cut to `text_chars`; a position the run lacks is left out."""
        t = schema.tokens
        wanted = sorted({int(p) for p in positions})
        out: dict[int, str] = {}
        with self._connect() as conn:
            require_run(conn, run_id)
            for at in range(0, len(wanted), 500):  # bounded IN lists
                stmt = sa.select(
                    t.c.position, sa.func.substr(t.c.text, 1, int(text_chars)).label("text")
                ).where(
                    t.c.run_id == run_id,
                    t.c.variant == "sparse",
                    t.c.position.in_(wanted[at : at + 500]),
                )
                out.update((int(p), str(x)) for p, x in conn.execute(stmt))
        return out

    def worst_tokens(self, run_id: str, k: int = 10, text_chars: int = LABEL_CHARS) -> pd.DataFrame:
        """The k prompt tokens (sparse variant) of highest KL, highest first, ties by position,
        as tokens() rows with text cut to `text_chars`: the KL is read in batches, numbers
        only, keeping the best k, and then those k rows alone."""
        t = schema.tokens
        with self._connect() as conn:
            require_run(conn, run_id)
            prompt_tokens = conn.execute(
                sa.select(schema.runs.c.prompt_tokens).where(schema.runs.c.id == run_id)
            ).scalar()
            stmt = sa.select(t.c.position, t.c.kl).where(
                t.c.run_id == run_id,
                t.c.variant == "sparse",
                t.c.position < int(prompt_tokens or 0),
                t.c.kl.isnot(None),
            )
            pos, kl = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
            with closing(fetch_batches(conn, t, stmt)) as batches:
                for b in batches:
                    pos = np.concatenate([pos, b.column("position").to_numpy().astype(np.int64)])
                    kl = np.concatenate([kl, _floats(b.column("kl")).astype(np.float64)])
                    pos, kl = top_k(pos, kl, k)
        rows = self.tokens(run_id, 0, 0, "sparse", text_chars)  # none: the columns
        if pos.size:
            rows = pd.concat(
                [
                    self.tokens(run_id, int(p), int(p) + 1, "sparse", text_chars)
                    for p in pos.tolist()
                ],
                ignore_index=True,
            )
        return rows.reset_index(drop=True)

    def prompt_texts(self, run_id: str) -> Iterator[list[str]]:
        """The prompt's token texts (the sparse variant's, position order) in pieces of at most
        READ_BATCH_ROWS tokens, each read by itself: a needle search holds one piece, however
        long the prompt. A position the run lacks is left out."""
        t = schema.tokens
        with self._connect() as conn:
            require_run(conn, run_id)
            prompt_tokens = conn.execute(
                sa.select(schema.runs.c.prompt_tokens).where(schema.runs.c.id == run_id)
            ).scalar()
        prompt_tokens = int(prompt_tokens or 0)
        for start in range(0, max(prompt_tokens, 0), READ_BATCH_ROWS):
            stop = min(start + READ_BATCH_ROWS, prompt_tokens)
            stmt = (
                sa.select(t.c.text)
                .where(
                    t.c.run_id == run_id,
                    t.c.variant == "sparse",
                    t.c.position >= start,
                    t.c.position < stop,
                )
                .order_by(t.c.position)
            )
            with self._connect() as conn:
                yield fetch_arrow(conn, t, stmt).column("text").to_pylist()

    def generated_text(self, run_id: str, limit: int, text_chars: int = LABEL_CHARS) -> list[str]:
        """The sparse model's first `limit` generated tokens' texts, in order, each cut to
        `text_chars` characters (labels; the whole generation is the run's sparse_text)."""
        t = schema.tokens
        prompt = sa.select(schema.runs.c.prompt_tokens).where(schema.runs.c.id == run_id)
        stmt = (
            sa.select(sa.func.substr(t.c.text, 1, int(text_chars)).label("text"))
            .where(
                t.c.run_id == run_id,
                t.c.variant == "sparse",
                t.c.position >= sa.func.coalesce(prompt.scalar_subquery(), 0),
            )
            .order_by(t.c.position)
            .limit(max(int(limit), 0))
        )
        return self._frame(run_id, t, stmt)["text"].tolist()

    def blocks(self, run_id: str, text_chars: int | None = None) -> pd.DataFrame:
        """Key blocks with their token span [token_start, token_end) and text, whole or cut to
        `text_chars` characters (a label shows 60: a block's text can be long, 16,384 of them)."""
        t = schema.blocks
        text = t.c.text if text_chars is None else sa.func.substr(t.c.text, 1, int(text_chars))
        cols = [t.c.block, t.c.token_start, t.c.token_end, text.label("text")]
        stmt = sa.select(*cols).where(t.c.run_id == run_id).order_by(t.c.block)
        return self._frame(run_id, t, stmt)

    def _layer_record(
        self, conn: Connection, run_id: str, phase: str, step: int, layer: int
    ) -> tuple[int, np.ndarray]:
        t = schema.layer_stats
        row = conn.execute(
            sa.select(t.c.n_blocks, t.c.q_blocks).where(
                t.c.run_id == run_id,
                t.c.phase == phase,
                t.c.step == int(step),
                t.c.layer == int(layer),
            )
        ).first()
        if row is None:
            raise StoreError(
                f"run {run_id} has no record for phase={phase!r} step={step} layer={layer} "
                "(see steps())"
            )
        return int(row[0]), np.asarray(jsonio.loads(row[1]), dtype=np.int64)

    def _scores(self, conn: Connection, run_id: str, *where: Any) -> pa.Table:
        t = schema.block_scores
        stmt = sa.select(
            t.c.step, t.c.q_block, t.c.k_block, t.c.sketch, t.c.walk, t.c.exact, t.c.selected
        ).where(t.c.run_id == run_id, *where)
        return fetch_arrow(conn, t, stmt)

    def heatmap(self, run_id: str, phase: str, step: int, layer: int) -> dict[str, Any]:
        """One layer's block matrices as dense [n, n] arrays indexed [q_block, k_block].

        sketch/walk/exact are float32 with NaN where the pair is not causal or was not recorded;
        selected is bool (False there). q_blocks lists the query blocks that have a row. The
        scores are read in batches straight into the matrices (13 bytes a cell, and one batch).
        """
        t = schema.block_scores
        with self._connect() as conn:
            require_run(conn, run_id)
            n, q_blocks = self._layer_record(conn, run_id, phase, step, layer)
            check_view(n * n, f"layer {layer} ({n} blocks)", _view_max_blocks())
            grids = {name: np.full(n * n, np.nan, dtype=np.float32) for name in _SCORES}
            selected = np.zeros(n * n, dtype=bool)
            stmt = sa.select(
                t.c.q_block, t.c.k_block, *(t.c[name] for name in _SCORES), t.c.selected
            )
            stmt = stmt.where(
                t.c.run_id == run_id,
                t.c.phase == phase,
                t.c.step == int(step),
                t.c.layer == int(layer),
            )
            with closing(fetch_batches(conn, t, stmt)) as batches:
                for b in batches:
                    # one flat index for the four scatters: 2D fancy indexing recomputes it each
                    # time (at 2048 blocks, 2M cells a matrix, most of a layer's read)
                    flat = b.column("q_block").to_numpy().astype(np.int64) * n
                    flat += b.column("k_block").to_numpy()
                    for name, grid in grids.items():
                        grid[flat] = _floats(b.column(name))
                    selected[flat] = (
                        b.column("selected").fill_null(False).to_numpy(zero_copy_only=False)
                    )
        out: dict[str, Any] = {"n_blocks": n, "q_blocks": q_blocks}
        out.update({name: grid.reshape(n, n) for name, grid in grids.items()})
        out["selected"] = selected.reshape(n, n)
        return out

    def decode_rows(self, run_id: str, layer: int) -> dict[str, Any]:
        """A layer's decode steps stacked: [steps, n] arrays for the token x block view.

        Row s is the query row of decode step steps[s] (its block in q_blocks[s]); the width is
        the largest block count, later blocks NaN/False in earlier steps. The scores are read
        in batches and only each record's last row kept (a record may hold other rows).
        """
        t = schema.block_scores
        ls = schema.layer_stats
        with self._connect() as conn:
            require_run(conn, run_id)
            recs = conn.execute(
                sa.select(ls.c.step, ls.c.n_blocks, ls.c.q_blocks)
                .where(ls.c.run_id == run_id, ls.c.phase == "decode", ls.c.layer == int(layer))
                .order_by(ls.c.step)
            ).all()
            width = max((int(r[1]) for r in recs), default=0)
            check_view(len(recs) * width, f"layer {layer}'s decode rows", _view_max_blocks())
            steps = np.array([r[0] for r in recs], dtype=np.int64)
            n_blocks = np.array([r[1] for r in recs], dtype=np.int64)
            last_q = np.array([max(jsonio.loads(r[2]), default=-1) for r in recs], dtype=np.int64)
            grids = {name: np.full(steps.size * width, np.nan, np.float32) for name in _SCORES}
            selected = np.zeros(steps.size * width, dtype=bool)
            stmt = sa.select(
                t.c.step, t.c.q_block, t.c.k_block, *(t.c[name] for name in _SCORES), t.c.selected
            ).where(
                t.c.run_id == run_id,
                t.c.phase == "decode",
                t.c.layer == int(layer),
                t.c.q_block >= (int(last_q.min()) if last_q.size else 0),
            )
            with closing(fetch_batches(conn, t, stmt)) as batches:
                for b in batches if steps.size else ():
                    row, k, keep = _decode_keep(b, steps, n_blocks, last_q)
                    flat = row[keep] * width + k[keep]
                    for name, grid in grids.items():
                        grid[flat] = _floats(b.column(name))[keep]
                    sel = b.column("selected").fill_null(False).to_numpy(zero_copy_only=False)
                    selected[flat] = sel[keep]
        out: dict[str, Any] = {"steps": steps, "n_blocks": n_blocks, "q_blocks": last_q}
        out.update({name: grid.reshape(steps.size, width) for name, grid in grids.items()})
        out["selected"] = selected.reshape(steps.size, width)
        return out

    def last_rows(self, run_id: str) -> list[dict[str, Any]]:
        """The query row that produces the next token, for every (phase, step, layer) record.

        Prefill: the last query block's row; decode: the new token's row. Each item holds
        phase, step, layer, dense, n_blocks, q_block and [n_blocks] walk/exact (NaN where not
        recorded) and selected, in record order (prefill first). The needle tracker reads
        these instead of whole layers, so it stays cheap at 128k tokens. Records and scores
        are read in batches and only these rows kept: memory holds 9 bytes a cell of the
        records' rows (at most LAST_ROWS_LAYERS layer views) and one batch.
        """
        ls = schema.layer_stats
        plain = (ls.c.run_id == run_id, ls.c.phase.in_(("prefill", "decode")))
        with self._connect() as conn:
            require_run(conn, run_id)
            count, cells = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ls.c.n_blocks), 0)).where(
                    *plain
                )
            ).one()
            what = "the run's last rows (every layer and step)"
            check_view(int(cells), what, _view_max_blocks(), layers=LAST_ROWS_LAYERS)
            check_records(int(count), what)
            recs = _records(conn, run_id)
            rows = _last_rows(conn, run_id, recs)
        out: list[dict[str, Any]] = []
        for i in range(recs.key.size):
            n = int(recs.n_blocks[i])
            walk, exact, selected = rows.get(i) or (_NAN[:n], _NAN[:n], _FALSE[:n])
            out.append(
                {
                    "phase": "decode" if recs.key[i] >> 40 else "prefill",
                    "step": int(recs.key[i] >> 10 & (1 << 30) - 1),
                    "layer": int(recs.key[i] & 1023),
                    "dense": bool(recs.dense[i]),
                    "n_blocks": n,
                    "q_block": int(recs.last[i]),
                    "walk": walk,
                    "exact": exact,
                    "selected": selected,
                }
            )
        return out


@dataclass(frozen=True)
class _Records:
    """A run's prefill and decode records in record order (prefill, then by step and layer):
    each one's key (decode << 40 | step << 10 | layer, ascending), dense flag, n_blocks and
    last query block (the largest of its q_blocks, -1 for none)."""

    key: np.ndarray
    dense: np.ndarray
    n_blocks: np.ndarray
    last: np.ndarray


def _record_keys(phase: pa.Array, step: pa.Array, layer: pa.Array) -> np.ndarray:
    """The _Records key of each (phase, step, layer) of a batch."""
    decode = pc.equal(phase, "decode").to_numpy(zero_copy_only=False).astype(np.int64)
    steps = step.to_numpy(zero_copy_only=False).astype(np.int64)
    return decode << 40 | steps << 10 | layer.to_numpy(zero_copy_only=False).astype(np.int64)


def _records(conn: Connection, run_id: str) -> _Records:
    """The run's _Records, read in batches (a record's q_blocks text is parsed and dropped)."""
    ls = schema.layer_stats
    stmt = (
        sa.select(ls.c.phase, ls.c.step, ls.c.layer, ls.c.dense, ls.c.n_blocks, ls.c.q_blocks)
        .where(ls.c.run_id == run_id, ls.c.phase.in_(("prefill", "decode")))
        .order_by(ls.c.phase.desc(), ls.c.step, ls.c.layer)
    )
    parts: list[tuple[np.ndarray, ...]] = []
    with closing(fetch_batches(conn, ls, stmt)) as batches:
        for b in batches:
            parts.append(
                (
                    _record_keys(b.column("phase"), b.column("step"), b.column("layer")),
                    b.column("dense").to_numpy(zero_copy_only=False).astype(bool),
                    b.column("n_blocks").to_numpy(zero_copy_only=False).astype(np.int64),
                    np.array(
                        [
                            max(jsonio.loads(v), default=-1)
                            for v in b.column("q_blocks").to_pylist()
                        ],
                        dtype=np.int64,
                    ),
                )
            )
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return _Records(empty, empty.astype(bool), empty, empty)
    return _Records(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _last_rows(
    conn: Connection, run_id: str, recs: _Records
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Record index -> its last row's walk, exact and selected, for the records with scores
    there; the scores are read in batches and scattered record by record."""
    t = schema.block_scores
    if recs.key.size == 0:
        return {}
    prefill = recs.key >> 40 == 0
    pre = int(recs.last[prefill].max()) if prefill.any() else -1
    stmt = sa.select(
        t.c.phase, t.c.step, t.c.layer, t.c.q_block, t.c.k_block, t.c.walk, t.c.exact, t.c.selected
    ).where(
        t.c.run_id == run_id,
        t.c.phase.in_(("prefill", "decode")),
        sa.or_(t.c.phase == "decode", t.c.q_block == pre),
    )
    out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    with closing(fetch_batches(conn, t, stmt)) as batches:
        for b in batches:
            key = _record_keys(b.column("phase"), b.column("step"), b.column("layer"))
            at = np.minimum(np.searchsorted(recs.key, key), recs.key.size - 1)
            k = b.column("k_block").to_numpy(zero_copy_only=False).astype(np.int64)
            q = b.column("q_block").to_numpy(zero_copy_only=False).astype(np.int64)
            keep = (recs.key[at] == key) & (q == recs.last[at]) & (k < recs.n_blocks[at])
            if not keep.any():
                continue
            at, k = at[keep], k[keep]
            walk, exact = (_floats(b.column(name))[keep] for name in ("walk", "exact"))
            sel = b.column("selected").fill_null(False).to_numpy(zero_copy_only=False)[keep]
            order = np.argsort(at, kind="stable")
            starts = np.flatnonzero(np.r_[True, np.diff(at[order]) != 0])
            for lo, hi in zip(starts, np.r_[starts[1:], order.size], strict=True):
                i, rows = int(at[order[lo]]), order[lo:hi]
                mine = out.get(i)
                if mine is None:
                    n = int(recs.n_blocks[i])
                    mine = out[i] = (_NAN[:n].copy(), _NAN[:n].copy(), _FALSE[:n].copy())
                mine[0][k[rows]] = walk[rows]
                mine[1][k[rows]] = exact[rows]
                mine[2][k[rows]] = sel[rows]
    return out


_NAN = np.full(MAX_BLOCKS, np.nan, dtype=np.float32)
_NAN.flags.writeable = False
_FALSE = np.zeros(MAX_BLOCKS, dtype=bool)
_FALSE.flags.writeable = False
"""Rows of records with no scores there share these (read-only) instead of their own."""


def _decode_keep(
    b: pa.Table, steps: np.ndarray, n_blocks: np.ndarray, last_q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a batch of decode scores: each row's record (index into steps), its key block, and
    whether it is its record's last row within the record's blocks."""
    step = b.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.minimum(np.searchsorted(steps, step), steps.size - 1)
    q = b.column("q_block").to_numpy(zero_copy_only=False).astype(np.int64)
    k = b.column("k_block").to_numpy(zero_copy_only=False).astype(np.int64)
    keep = (steps[row] == step) & (q == last_q[row]) & (k >= 0) & (k < n_blocks[row])
    return row, k, keep


def top_k(pos: np.ndarray, kl: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k positions of highest finite KL and their KL, highest first, ties by position (as
    a stable sort of position-ordered rows gives): what a batch keeps of the ones before."""
    finite = np.isfinite(kl)
    pos, kl = pos[finite], kl[finite]
    order = np.lexsort((pos, -kl))[: max(int(k), 0)]
    return pos[order], kl[order]


def _view_max_blocks() -> int:
    from sketchwalk.settings import load

    return load().view_max_blocks


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    """float32 values with SQL NULL as NaN."""
    return column.fill_null(np.nan).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
