"""The paper's estimator: block-mean queries against block-mean keys, sketched.

Cheapest (n x n x r per head a layer), and exact for blocks whose queries and keys look alike;
it washes out single queries or keys that stand out inside a block (docs/quality.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sketchwalk.engine.method.estimators.base import DecodeInputs, Estimator, window_mass
from sketchwalk.engine.method.estimators.window import key_estimates
from sketchwalk.engine.method.sketch import (
    QueryTokens,
    SketchedBlocks,
    block_logits,
    block_means,
    causal_block_softmax,
)

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig


def prefill(
    sk: SketchedBlocks,
    q_blocks: torch.Tensor,
    dim: int,
    cfg: SketchWalkConfig,
    tokens: QueryTokens | None = None,
) -> torch.Tensor:
    qm = block_means(sk.q_sum[:, :, q_blocks], sk.q_count[:, q_blocks])
    km = block_means(sk.k_sum, sk.k_count)
    logits = block_logits(qm, km, dim, cfg.tau)
    return causal_block_softmax(logits, sk.k_count > 0, q_blocks)


def decode(x: DecodeInputs) -> torch.Tensor:
    km, _ = key_estimates(x.st, x.dim, x.cfg, x.cur + 1)
    return window_mass(block_logits(x.st.window, km, x.dim, x.cfg.tau), x)


ESTIMATOR = Estimator(
    "mean",
    "block-mean queries against block-mean keys (the paper)",
    prefill,
    decode,
)
