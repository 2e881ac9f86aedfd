"""XAttention at its own operating point (Xu et al. 2025, "XAttention: Block Sparse Attention
with Antidiagonal Scoring", mit-han-lab/x-attention): the `xattention` method's antidiagonal
block scores, at stride 16, selected by XAttention's cumulative threshold instead of the
project's density budget.

Restated from the paper and the authors' code: each query block keeps the fewest key blocks,
the largest estimated mass first, whose estimated mass together reaches a threshold tau of the
row's, its first key block and its diagonal block always among them
(engine/method/select.py ThresholdRule). tau = 0.9: the default of the authors' estimator and
the value their README names with stride 16 (their RULER runs instead read thresholds
calibrated per layer and head for Llama-3.1-8B, which do not carry over to another model).
Their kernel takes 128-token blocks: run this method with --block-size 128 (`sketchwalk
frontier --blocks 128`) for their operating point. The authors select per head; here one set
per selection group (per KV-head group, or the layer), on the mean of its heads' estimated
masses, as every method's lists are. The config's density, sink and window do not apply: the
density it achieves is its own, reported as every run's is. In decode the one query's strided
key samples are scored (xattention_decode_scores) and thresholded the same way.
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.methods.base import Method, ScoreInputs
from sketchwalk.engine.method.methods.xattention import (
    xattention_decode_scores,
    xattention_prefill_scores,
)
from sketchwalk.engine.method.select import ThresholdRule

STRIDE = 16
"""The antidiagonal stride S of this operating point (`xattention` scores at 8)."""

THRESHOLD = 0.9
"""tau: the share of a row's estimated block mass its kept blocks reach."""


def score(x: ScoreInputs) -> torch.Tensor:
    scale = x.q.shape[-1] ** -0.5 if x.scale is None else x.scale
    fn = xattention_decode_scores if x.q.shape[2] == 1 else xattention_prefill_scores
    return fn(x.q, x.k, x.valid, x.block_size, scale, x.shape[1], stride=STRIDE)


METHOD = Method(
    name="xattention-threshold",
    help=(
        "XAttention's own selection: antidiagonal scores at stride 16, each row keeps the "
        "fewest blocks reaching 0.9 of its estimated mass (density is its own; its blocks: 128)"
    ),
    score=score,
    needs_qk=True,
    reads_sketch=False,
    rule=ThresholdRule(THRESHOLD),
)
