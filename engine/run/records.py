"""Plain records of one run: what the engine hands to the store (numpy and Python values, no torch).

The store, the app and Parquet export all read these shapes, so they are the stable contract
between the engine and everything that looks at its results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

GROUP_TAG = ":g"
"""Per KV-head-group records (runs with per-group selection) carry phase 'prefill:g1' etc.:
the same tables hold them, and a store written before they existed still reads."""


def group_phase(phase: str, group: int) -> str:
    return f"{phase}{GROUP_TAG}{int(group)}"


def split_phase(phase: str) -> tuple[str, int | None]:
    """'prefill:g2' -> ('prefill', 2); 'prefill' -> ('prefill', None)."""
    base, tag, group = str(phase).partition(GROUP_TAG)
    return (base, int(group)) if tag and group.isdigit() else (str(phase), None)


@dataclass
class LayerRecord:
    """What one layer did in one phase/step, for batch element 0.

    Matrices are [rows, n_blocks] float32, row r describing query block q_blocks[r]:
    prefill has a row per query block (q_blocks = 0..n-1), a decode step one row (the block of the
    new token). sketch = the block transition estimate (A_l rows; in decode the window estimate r),
    walk = walk scores (W_l rows; decode s), exact = true softmax block mass averaged over heads and
    the block's queries (None when the context is too long to afford it), selected = kept blocks.
    Dense layers carry sketch/exact (when recorded) but no walk or selection.
    """

    phase: str
    step: int
    layer: int
    dense: bool
    n_blocks: int
    q_blocks: np.ndarray
    sketch: np.ndarray | None = None
    walk: np.ndarray | None = None
    exact: np.ndarray | None = None
    selected: np.ndarray | None = None
    density_target: float | None = None
    density_achieved: float | None = None
    sketch_error: float | None = None
    walk_error: float | None = None
    mass_recall: float | None = None
    t_sketch_ms: float | None = None
    t_walk_ms: float | None = None
    t_select_ms: float | None = None
    t_attention_ms: float | None = None
    t_dense_ms: float | None = None


@dataclass
class BlockSpan:
    """Token span [start, end) of a key block and its text, for hover labels."""

    block: int
    start: int
    end: int
    text: str


@dataclass
class TokenRecord:
    """One token of a variant ("dense" or "sparse").

    Positions below the prompt length are the prompt, teacher-forced: logprob is log p(token |
    prefix) under that variant (None at position 0). Later positions are that variant's greedy
    generation. kl is KL(dense || sparse) of the next-token distributions that produced this
    token (sparse variant only; None where it was not computed).
    """

    variant: str
    position: int
    token_id: int
    text: str
    logprob: float | None
    kl: float | None = None


@dataclass
class RunResult:
    """Everything one dense-vs-sparse run produced."""

    model_id: str
    model_hash: str | None
    prompt: str
    prompt_tokens: int
    method: str
    config: dict[str, Any]
    device: str
    versions: dict[str, str]
    dense_text: str
    sparse_text: str
    metrics: dict[str, float | None]
    timings: dict[str, float]
    layers: list[LayerRecord] = field(default_factory=list)
    blocks: list[BlockSpan] = field(default_factory=list)
    tokens: list[TokenRecord] = field(default_factory=list)
