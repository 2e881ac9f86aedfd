"""What a method is: its needs, its abilities and its scoring function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sketchwalk.engine.method.select import ThresholdRule


@dataclass
class ScoreInputs:
    """Everything a method may read to score the key blocks of some query-block rows.

    a: the sketch's block transition rows [B, G, R, n]; w: walk scores (same shape, None when the
    walk did not run); exact: exact row-normalised block mass (only for methods that need it);
    q [B, H, Lq, d] and k [B, Hkv, Lk, d], valid [B, Lk] and scale: the raw attention inputs
    (only passed to methods that need them). shape: the [B, G, R, n] the scores must have.
    """

    shape: tuple[int, ...]
    device: torch.device
    q_blocks: torch.Tensor  # [R] absolute query-block ids of the rows
    block_size: int
    a: torch.Tensor | None = None
    w: torch.Tensor | None = None
    exact: torch.Tensor | None = None
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    scale: float | None = None


ScoreFn = Callable[[ScoreInputs], torch.Tensor]
PreviewFn = Callable[[dict[str, Any]], "np.ndarray | None"]


@dataclass(frozen=True)
class Method:
    """One way of scoring blocks (higher = keep). score None means dense attention.

    needs_exact: scores from the exact block mass (a dense softmax: an upper bound, not a method
    one would deploy). needs_qk: scores from the raw queries and keys. walks: whether the
    cross-layer walk runs (its scores are W_l). chunks: queries after a cache (chunked prefill,
    later turns) can be scored from the sketch state alone. preview: the scores from a stored
    layer record (keys "sketch", "walk", "exact", "n_blocks", "q_blocks"), for the app's density
    preview; None where the record cannot reproduce them. reads_sketch: the scores read the
    sketch's block estimate (a or w); a method that does not (streaming, quest, ...) gets the
    cheapest estimate (block means) in a pass nobody records, since nothing reads it there.
    rule: the method's own selection rule in place of the density budget (a ThresholdRule:
    the config's density, sink and window then do not apply); None: the budget.
    """

    name: str
    help: str
    score: ScoreFn | None
    needs_exact: bool = False
    needs_qk: bool = False
    walks: bool = False
    chunks: bool = False
    preview: PreviewFn | None = None
    reads_sketch: bool = True
    rule: ThresholdRule | None = None


def valid_or_all(valid: torch.Tensor | None, bsz: int, length: int, device) -> torch.Tensor:
    if valid is None:
        return torch.ones(bsz, length, dtype=torch.bool, device=device)
    return valid.bool()


def mean_heads(probs: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, gh, rows, nk] per-head distributions -> [B, groups, rows, nk] (groups 1 or Hkv)."""
    if groups == 1:
        return probs.mean(dim=(1, 2)).unsqueeze(1)
    return probs.mean(dim=2)
