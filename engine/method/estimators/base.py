"""What a block estimator is: what its prefill keeps, and how it estimates A_l's rows.

An estimator turns a layer's sketch into per-head block distributions: `prefill` for the rows of
a prefill or a chunk (from the sketched block sums, and, for token-level estimators, the sampled
sketched queries), `decode` for the current row of a decode step (from the layer's decode state).
The pipeline pools the heads (sketch.aggregate_heads) into A_l either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sketchwalk.engine.method.sketch import SRHT, QueryTokens, SketchedBlocks, causal_block_softmax

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.decode import DecodeLayerState


@dataclass
class DecodeInputs:
    """What a decode step's estimate may read. keys: the layer's raw cached keys [B, Hkv, Lk, d]
    (None where not passed); cur: the current key block; all_valid: no padding (every block
    holds keys, the current row sees them all)."""

    st: DecodeLayerState
    srht: SRHT
    keys: torch.Tensor | None
    key_valid: torch.Tensor
    cfg: SketchWalkConfig
    dim: int
    cur: int
    all_valid: bool


PrefillFn = Callable[
    [SketchedBlocks, torch.Tensor, int, "SketchWalkConfig", QueryTokens | None], torch.Tensor
]
DecodeFn = Callable[[DecodeInputs], torch.Tensor]


@dataclass(frozen=True)
class Estimator:
    """name and help (the knob's choices and the docs); prefill(sk, q_blocks, dim, cfg, tokens)
    -> [B, Hkv, G, R, n] per-head block mass of the rows q_blocks; decode(x) -> [B, Hkv, G, 1, n]
    for the current row. keeps_tokens: the prefill keeps cfg.query_samples sketched queries per
    block and the sums of squared sketched keys (QueryTokens); needs_keys: it also hands every
    sketched key to `prefill`."""

    name: str
    help: str
    prefill: PrefillFn
    decode: DecodeFn
    keeps_tokens: bool = False
    needs_keys: bool = False


def window_mass(logits: torch.Tensor, x: DecodeInputs) -> torch.Tensor:
    """Block logits [B, Hkv, G, w, n] of the decode window's queries -> their block mass pooled
    over the window [B, Hkv, G, 1, n]: the window's queries stand for the current row, pooled
    like a block's scored queries (cfg.pool)."""
    if x.all_valid:  # the current row sees every block and every block holds keys
        probs = torch.softmax(logits, dim=-1)
    else:
        rows_cur = torch.full((logits.shape[3],), x.cur, device=logits.device)
        probs = causal_block_softmax(logits, x.st.sketched.k_count > 0, rows_cur)
    return probs.amax(3, keepdim=True) if x.cfg.pool == "max" else probs.sum(3, keepdim=True)
