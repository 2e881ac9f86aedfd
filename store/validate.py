"""Row checks for imported tables: an export file is untrusted input.

The Parquet schema only says a column is a string or an integer; the store needs more (JSON that
parses, a known status, a well-formed run id, indices inside their matrix, no duplicate keys, no
text PostgreSQL cannot hold). A row that breaks any of these would import fine and then crash the
run list, the delete command or a heatmap, so every table is checked before anything is written,
and the first problem is reported as one line naming the file, the column and the run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from sketchwalk.store import limits, schema
from sketchwalk.store.errors import ForeignExportError

PHASES = ("prefill", "decode")
VARIANTS = ("dense", "sparse")

JSON_OBJECT_COLUMNS = {"config": False, "request": False, "versions": True}
"""runs columns holding a JSON object -> whether null is allowed."""
JSON_OPTIONAL_COLUMNS = ("metrics", "timings")

NON_NEGATIVE = {
    "runs": ("prompt_tokens",),
    "layer_stats": ("step", "layer", "n_blocks"),
    "block_scores": ("step", "layer", "q_block", "k_block"),
    "blocks": ("block", "token_start", "token_end"),
    "tokens": ("position", "token_id"),
}
UNIT_INTERVAL = {"layer_stats": ("density_target", "density_achieved", "mass_recall")}
PRIMARY_KEYS = {
    "runs": ("id",),
    "layer_stats": ("run_id", "phase", "step", "layer"),
    "blocks": ("run_id", "block"),
    "tokens": ("run_id", "variant", "position"),
}


def is_run_id(value: object) -> bool:
    """A canonical (lower-case, hyphenated) UUID, as `create_run` writes them."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


class _Checker:
    """Raises ForeignExportError on the first bad row of one table file."""

    def __init__(self, where: str, table: sa.Table, data: pa.Table, offset: int = 0) -> None:
        self.where, self.table, self.data, self.offset = where, table, data, offset
        self.key = schema.run_key(table).name

    def fail(self, column: str, mask: pa.ChunkedArray | pa.Array, why: str) -> None:
        """Report the first row where `mask` is true (nulls count as fine)."""
        mask = pc.fill_null(mask, False)
        if not pc.any(mask).as_py():
            return
        first = pc.index(mask, True).as_py()
        run = self.data[self.key][first].as_py()
        raise ForeignExportError(
            f"{self.where}: column {column!r} of run {str(run)[:40]!r} (row {first + self.offset}) "
            f"{why}; "
            "the export is damaged or was not written by sketchwalk, nothing was imported"
        )

    def not_null(self) -> None:
        for column in self.table.columns:
            if not column.nullable or column.primary_key:
                self.fail(column.name, pc.is_null(self.data[column.name]), "is empty")

    def strings(self) -> None:
        """Bounded VARCHARs fit, and no NUL byte (PostgreSQL text cannot hold one)."""
        for column in self.table.columns:
            if self.data.schema.field(column.name).type != pa.string():
                continue
            values = self.data[column.name]
            self.fail(column.name, pc.match_substring(values, "\x00"), "holds a NUL character")
            limit = getattr(column.type, "length", None) or limits.LONGEST.get(
                self.table.name, {}
            ).get(column.name)
            if limit:
                self.fail(
                    column.name,
                    pc.greater(pc.utf8_length(values), limit),
                    f"is longer than {limit} characters",
                )

    def ranges(self) -> None:
        for name in NON_NEGATIVE.get(self.table.name, ()):
            self.fail(name, pc.less(self.data[name], 0), "is negative")
        for name, most in limits.UPPER.get(self.table.name, {}).items():
            self.fail(name, pc.greater(self.data[name], most), f"is over the store's limit {most}")
        for name in UNIT_INTERVAL.get(self.table.name, ()):
            values = self.data[name]
            bad = pc.or_(pc.less(values, 0.0), pc.greater(values, 1.0))
            self.fail(name, bad, "is outside [0, 1]")

    def one_of(self, column: str, allowed: tuple[str, ...]) -> None:
        bad = pc.invert(pc.is_in(self.data[column], pa.array(allowed)))
        self.fail(column, bad, f"is not one of {', '.join(allowed)}")

    def phases(self) -> None:
        """'prefill', 'decode', or either with a KV-head group tag ('prefill:g2')."""
        from sketchwalk.engine.run.records import split_phase

        values = self.data["phase"]
        good = [
            v
            for v in pc.unique(values).to_pylist()
            if v is not None
            and split_phase(v)[0] in PHASES
            and (":" not in v or split_phase(v)[1] is not None)
        ]
        self.fail(
            "phase", pc.invert(pc.is_in(values, pa.array(good, pa.string()))), "is not a phase"
        )

    def unique(self) -> None:
        keys = PRIMARY_KEYS.get(self.table.name)
        if not keys or self.data.num_rows == 0:
            return
        counts = self.data.group_by(list(keys)).aggregate([([], "count_all")])
        if counts.num_rows != self.data.num_rows:
            raise ForeignExportError(
                f"{self.where}: {self.data.num_rows - counts.num_rows} row(s) repeat the key "
                f"({', '.join(keys)}); the export is damaged, nothing was imported"
            )

    def each(self, column: str, ok: Callable[[object], bool], why: str) -> None:
        """A per-value check (JSON parsing), row by row: only the small runs table uses it."""
        for i, value in enumerate(self.data[column].to_pylist()):
            if value is not None and not ok(value):
                self.fail(column, pa.array([j == i for j in range(self.data.num_rows)]), why)


def _json(text: object) -> object:
    """Parsed JSON, or a sentinel for text that is not JSON (or nested too deep to parse)."""
    try:
        return json.loads(str(text))
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


def _json_object(text: object) -> bool:
    return isinstance(_json(text), dict)


def _json_int_list(text: object) -> bool:
    value = _json(text)
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limits.MAX_BLOCKS for v in value
    )


def _q_blocks_inside(where: str, data: pa.Table) -> None:
    """Each record's query blocks lie inside its n_blocks (the views index rows by them)."""
    for i, (text, n) in enumerate(
        zip(data["q_blocks"].to_pylist(), data["n_blocks"].to_pylist(), strict=True)
    ):
        value = _json(text)
        if isinstance(value, list) and (len(value) > n or any(v >= n for v in value)):
            run = data["run_id"][i].as_py()
            raise ForeignExportError(
                f"{where}: column 'q_blocks' of run {str(run)[:40]!r} (row {i}) lies outside its "
                "n_blocks; the export is damaged, nothing was imported"
            )


def check_table(where: str, table: sa.Table, data: pa.Table, offset: int = 0) -> None:
    """Every rule for one table's rows (columns and types are already the store's); `data` may
    be one batch of the file, starting at row `offset` (keys repeated across batches are the
    database's primary keys to refuse)."""
    c = _Checker(where, table, data, offset)
    c.not_null()
    c.strings()
    c.ranges()
    c.unique()
    if table is schema.runs:
        c.each("id", is_run_id, "is not a well-formed run id (a UUID)")
        c.one_of("status", schema.RUN_STATUSES)
        for name, nullable in JSON_OBJECT_COLUMNS.items():
            c.each(name, _json_object, "is not a JSON object")
            if not nullable:
                c.fail(name, pc.is_null(data[name]), "is empty")
        for name in JSON_OPTIONAL_COLUMNS:
            c.each(name, _json_object, "is not a JSON object")
        c.fail(
            "updated_at", pc.less(data["updated_at"], data["created_at"]), "is before created_at"
        )
    elif table is schema.layer_stats:
        c.phases()
        c.each("q_blocks", _json_int_list, "is not a JSON list of block indices")
        _q_blocks_inside(where, data)
    elif table is schema.block_scores:
        c.phases()
        c.fail("k_block", pc.greater(data["k_block"], data["q_block"]), "is after its query block")
    elif table is schema.tokens:
        c.one_of("variant", VARIANTS)
    elif table is schema.blocks:
        c.fail(
            "token_end", pc.less(data["token_end"], data["token_start"]), "is before token_start"
        )


LAYER_KEYS = ["run_id", "phase", "step", "layer"]


def top_blocks(scores: pa.Table) -> pa.Table:
    """Per recorded layer, the largest query block of `scores` (a batch or all of them)."""
    top = scores.group_by(LAYER_KEYS).aggregate([("q_block", "max")])
    return pa.table({**{k: top[k] for k in LAYER_KEYS}, "q_block": top["q_block_max"]})


def check_blocks_in_range(where: str, scores: pa.Table, stats: pa.Table) -> None:
    """Every block score belongs to a recorded layer and lies inside its n x n matrix (the
    heatmap scatters scores by index into an array of that size). `scores` may be the
    `top_blocks` of each batch, concatenated."""
    if scores.num_rows == 0:
        return
    keys = LAYER_KEYS
    top = scores.group_by(keys).aggregate([("q_block", "max")])
    joined = top.join(stats.select([*keys, "n_blocks"]), keys=keys, join_type="left outer")
    missing = pc.is_null(joined["n_blocks"])
    if pc.any(missing).as_py():
        raise ForeignExportError(
            f"{where}: block scores of a layer with no layer_stats record; the export is "
            "damaged, nothing was imported"
        )
    if pc.any(pc.greater_equal(joined["q_block_max"], joined["n_blocks"])).as_py():
        raise ForeignExportError(
            f"{where}: a block index lies outside its layer's n_blocks x n_blocks matrix; "
            "the export is damaged, nothing was imported"
        )
