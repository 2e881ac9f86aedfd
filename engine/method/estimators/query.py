"""The token-query estimator: every scored query against each key block's mean and variance.

A block's attention mass is a log-sum-exp over its token pairs, dominated by its largest scores;
pooling the queries of a block washes out the queries that each look somewhere else (copying
and induction heads). This estimator keeps the sampled sketched queries and summarises each key
block by its mean and per-coordinate variance: for scores s = c q.k with k ~ N(mean, var),
log sum_k exp(s) ~ log count + c q.mean + c^2/2 sum_d q_d^2 var_d. Each query's softmax over key
blocks is averaged over the queries of its block. Cost: L x n x r per head, 1/b of QK^T.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sketchwalk.engine.method.estimators import mean
from sketchwalk.engine.method.estimators.base import DecodeInputs, Estimator, window_mass
from sketchwalk.engine.method.estimators.gaussian import token_block_logits
from sketchwalk.engine.method.estimators.window import key_estimates, window_logits
from sketchwalk.engine.method.sketch import QueryTokens, SketchedBlocks, key_summary
from sketchwalk.kernels.pooling import mean_per_row, pool_into

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig


def token_block_mass(  # many parameters: sampled_block_mass's, with keys as block statistics
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    km: torch.Tensor,
    kvar: torch.Tensor | None,
    k_count: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    chunk_elems: int = 1 << 20,
    pool: str = "mean",
) -> torch.Tensor:
    """Estimated block mass [B, Hkv, G, R, n] for the query blocks from pos[0] // b to
    pos[-1] // b, from sketched queries qs [B, H, L, r] at ascending positions pos [L]
    (q_valid [B, L] real queries); a block's estimate is the mean over its scored queries, or
    with pool "max" each key block's largest mass among them.

    Each query sees the key blocks before its own and, in its own block, only the keys up to
    itself (the log-count of the diagonal block is that of the visible keys). Query chunks keep
    the logits bounded and only score the key blocks their last query can see."""
    bsz, h, length, r = qs.shape
    b = block_size
    n = km.shape[2]
    blk_host = pos.cpu() // b  # positions are host values: their blocks sized without a sync
    pos = pos.to(qs.device)
    blk_all = pos // b
    j0 = int(blk_host[0])
    rows = int(blk_host[-1]) - j0 + 1
    out = torch.zeros(bsz, km.shape[1], h // km.shape[1], rows, n, device=qs.device)
    has = k_count > 0
    cols = torch.arange(n, device=qs.device)
    step = max(1, chunk_elems // max(h * n * bsz, 1))
    for s in range(0, length, step):  # sums per block, so chunks need not align to blocks
        e = min(length, s + step)
        blk = blk_all[s:e]
        nk = int(blk_host[e - 1]) + 1  # no query of this chunk sees past its last block
        logits = token_block_logits(
            qs[:, :, s:e], km[:, :, :nk], None if kvar is None else kvar[:, :, :nk],
            k_count[:, :nk], dim, tau,
        )  # fmt: skip
        # own block: only the keys up to the query are visible
        seen = (pos[s:e] % b + 1).float()[None, :].minimum(k_count[:, blk])  # [B, c]
        fix = seen.clamp(min=1.0).log() - k_count[:, blk].clamp(min=1.0).log()
        idx = blk.view(1, 1, 1, -1, 1).expand(*logits.shape[:4], 1)
        logits.scatter_add_(-1, idx, fix.view(bsz, 1, 1, -1, 1).expand_as(idx))
        hidden = (cols[None, :nk] > blk[:, None])[None] | ~has[:, None, :nk]  # [B, c, nk]
        logits.masked_fill_(hidden[:, None, None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        # rows that see no block (padding queries) are NaN: they, and every padding query, add 0
        probs.masked_fill_(~q_valid[:, None, None, s:e, None], 0.0)
        pool_into(out[..., :nk], 3, blk_host[s:e] - j0, probs, pool)
    return out if pool == "max" else mean_per_row(out, blk_all - j0, q_valid)


def prefill(
    sk: SketchedBlocks,
    q_blocks: torch.Tensor,
    dim: int,
    cfg: SketchWalkConfig,
    tokens: QueryTokens | None = None,
) -> torch.Tensor:
    if tokens is None:  # no scored queries were kept: the block means are what there is
        return mean.prefill(sk, q_blocks, dim, cfg)
    km, kvar = key_summary(sk.k_sum, sk.k_sq, sk.k_count)
    return token_block_mass(
        tokens.qs, tokens.valid, tokens.pos, km, kvar, sk.k_count, cfg.block_size, dim, cfg.tau,
        pool=cfg.pool,
    )  # fmt: skip


def decode(x: DecodeInputs) -> torch.Tensor:
    _, key_side = key_estimates(x.st, x.dim, x.cfg, x.cur + 1)
    return window_mass(window_logits(x.st, key_side, x.st.sketched.k_sq is not None), x)


ESTIMATOR = Estimator(
    "query",
    "every scored query against each key block's mean and variance, averaged per query block",
    prefill,
    decode,
    keeps_tokens=True,
)
