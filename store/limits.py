"""The store's own limits: the largest value a run can produce for everything that later sizes
memory (a heatmap allocates n_blocks x n_blocks cells, the token view one row per position).

One declaration for both sides: a save refuses a run past them (it cannot happen with a real
model: a layer record of 16k blocks already holds 1 GiB per matrix) and an import refuses a file
past them, so whatever the store holds can be exported and imported again, and nothing in it
makes a later read allocate more than these figures allow. What the explorer draws has its own,
smaller bound (Settings.view_max_blocks), checked by the reads that allocate.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sketchwalk.settings import STORED_PROMPT_CHARS
from sketchwalk.store.errors import StoreError

MAX_TOKENS = 1 << 20
"""Tokens of one run: prompt_tokens, token positions, block spans (a 1M-token context)."""
MAX_BLOCKS = 1 << 14
"""Key blocks of one layer record (n_blocks), and so every block index: 16384."""
MAX_LAYERS = 1 << 10
"""Layer indices (models have tens to a few hundred)."""
MAX_STEPS = 1 << 20
"""Decode step indices (one per generated token)."""

UPPER = {
    "runs": {"prompt_tokens": MAX_TOKENS},
    "layer_stats": {"step": MAX_STEPS, "layer": MAX_LAYERS - 1, "n_blocks": MAX_BLOCKS},
    "block_scores": {
        "step": MAX_STEPS,
        "layer": MAX_LAYERS - 1,
        "q_block": MAX_BLOCKS - 1,
        "k_block": MAX_BLOCKS - 1,
    },
    "blocks": {"block": MAX_BLOCKS - 1, "token_start": MAX_TOKENS, "token_end": MAX_TOKENS},
    "tokens": {"position": MAX_TOKENS - 1},
}
"""Largest allowed value of each bounded integer column, per table (inclusive)."""

MAX_TOKEN_TEXT = 1024
"""Characters of one token's text (a tokenizer's longest piece is a few hundred): a read of
READ_BATCH_ROWS tokens (store/bulk.py) then holds at most 64 MiB of their text."""
MAX_RUN_TEXT = STORED_PROMPT_CHARS
"""Characters of a run's prompt and of each generation (2,097,152): an honest prompt is at most
SKETCHWALK_MAX_PROMPT_CHARS (200,000 by default). Bounding every text of the runs row bounds
what importing or opening one run decodes, whatever the upload: an import holds several copies
of the row, and one at these limits, four-byte characters throughout, peaks under 1 GiB."""
MAX_RUN_REQUEST = 4 * MAX_RUN_TEXT
"""Characters of the request JSON: it holds the prompt again, escaped (a newline or quote takes
two characters, others up to six), so it is allowed four prompts' worth."""
MAX_RUN_NOTE = 1 << 18
"""Characters of the error text and of the config, versions, metrics and timings JSON (a few
hundred scalars for a real run)."""
MAX_RUN_NAME = 1 << 12
"""Characters of the model id (a name or a local path), model hash and device."""
RUN_LONGEST = {
    **dict.fromkeys(("prompt", "dense_text", "sparse_text"), MAX_RUN_TEXT),
    "request": MAX_RUN_REQUEST,
    **dict.fromkeys(("error", "config", "versions", "metrics", "timings"), MAX_RUN_NOTE),
    **dict.fromkeys(("model_id", "model_hash", "device"), MAX_RUN_NAME),
}
LONGEST = {"tokens": {"text": MAX_TOKEN_TEXT}, "runs": RUN_LONGEST}
"""Longest text of each value, per table and column (characters): where reads take many rows,
and every text of the runs row (one value is decoded whole)."""

ROWS_PER_RUN = {"runs": 1, "blocks": MAX_BLOCKS, "tokens": 2 * MAX_TOKENS}
"""Rows one run can have in a table whose key is bounded above (others: the import row cap)."""


def first_over(table: str, data: pa.Table) -> str | None:
    """The first bounded column of `data` (rows of `table`) holding a value over its limit."""
    for name, most in UPPER.get(table, {}).items():
        if name in data.column_names and pc.any(pc.greater(data[name], most)).as_py():
            return f"{name} over the store's limit {most}"
    for name, most in LONGEST.get(table, {}).items():
        if (
            name in data.column_names
            and pc.any(pc.greater(pc.utf8_length(data[name]), most)).as_py()
        ):
            return f"{name} longer than the store's limit of {most} characters"
    return None


def run_text_over(values: dict[str, Any]) -> str | None:
    """The first text of a runs row (column -> value) longer than its limit, in first_over's
    words: checked before a run row is written, as an import checks it before decoding."""
    for name, most in RUN_LONGEST.items():
        value = values.get(name)
        if isinstance(value, str) and len(value) > most:
            return f"{name} longer than the store's limit of {most} characters"
    return None


class TooLargeError(StoreError):
    """A layer (or a stack of them) is wider than a view may allocate; one line says which."""


LAST_ROWS_LAYERS = 4
"""The needle tracker's row of every record may take as much as this many full layer views."""


def check_view(cells: int, what: str, max_blocks: int, layers: int = 1) -> None:
    """Refuse a read that would allocate more than `layers` heatmaps of `max_blocks` squared
    cells (about 13 bytes a cell: three float32 matrices and a mask)."""
    if cells > layers * max_blocks * max_blocks:
        raise TooLargeError(
            f"{what} is too large to draw ({cells:,} cells; the explorer draws at most "
            f"{max_blocks} x {max_blocks} blocks a layer, SKETCHWALK_VIEW_MAX_BLOCKS)"
        )


LAST_ROWS_RECORDS = 1 << 17
"""Prefill and decode records the needle tracker follows (32 layers x 4,096 decode steps):
each costs about 1 KB of its own beside its row."""


def check_records(records: int, what: str) -> None:
    """Refuse the needle tracker's read of more than LAST_ROWS_RECORDS records."""
    if records > LAST_ROWS_RECORDS:
        raise TooLargeError(
            f"{what} are too many to follow ({records:,} records; the explorer follows at "
            f"most {LAST_ROWS_RECORDS:,})"
        )


def view_refusal(stats: Any, max_blocks: int) -> str | None:
    """The one line the explorer shows instead of a run it cannot draw in bounded memory (its
    widest layer, or the needle tracker's rows of every record), or None. `stats`: the run's
    layer_stats frame (n_blocks per record)."""
    widths = [int(n) for n in stats["n_blocks"]]
    plain = int(stats["phase"].isin(("prefill", "decode")).sum())
    try:
        check_view(
            max(widths, default=0) ** 2, f"a layer of {max(widths, default=0)} blocks", max_blocks
        )
        check_view(sum(widths), "this run's records, all together", max_blocks, LAST_ROWS_LAYERS)
        check_records(plain, "this run's records")
    except TooLargeError as exc:
        return str(exc)
    return None
