"""Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference", mit-han-lab/Quest), restated from the paper: per key block, the elementwise min and
max of its keys bound q . k from above, sum_d max(q_d * kmin_d, q_d * kmax_d); the blocks with the
largest bound are kept. Scores are per-head softmax probabilities of the bounds averaged over the
heads of a selection group, so they compare across heads and rows like the sketch's A_l.
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.methods.base import Method, ScoreInputs, mean_heads, valid_or_all
from sketchwalk.engine.method.sketch import block_means, block_pool, causal_block_softmax


def key_block_bounds(
    k: torch.Tensor, valid: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elementwise min and max of the real keys of each block: [B, Hkv, nk, d] each, and [B, nk]
    bool saying which blocks hold any real key (empty blocks get min = max = 0)."""
    bsz, hkv, lk, d = k.shape
    nk = -(-lk // block_size)
    pad = nk * block_size - lk
    kf = torch.nn.functional.pad(k.float(), (0, 0, 0, pad))
    v = torch.nn.functional.pad(valid, (0, pad)).view(bsz, 1, nk, block_size, 1)
    kb = kf.view(bsz, hkv, nk, block_size, d)
    kmin = kb.masked_fill(~v, float("inf")).amin(dim=3)
    kmax = kb.masked_fill(~v, float("-inf")).amax(dim=3)
    has = v.view(bsz, nk, block_size).any(-1)
    empty = ~has[:, None, :, None]
    return kmin.masked_fill(empty, 0.0), kmax.masked_fill(empty, 0.0), has


def quest_bound(qg: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k over the keys of each block: [B, Hkv, gh, rows, nk].

    qg [B, Hkv, gh, rows, d] queries grouped by KV head; kmin/kmax [B, Hkv, nk, d].
    sum_d max(q_d kmin_d, q_d kmax_d) = q+ . kmax + q- . kmin (two matmuls, no [.., nk, d] temp).
    """
    pos, neg = qg.clamp(min=0.0), qg.clamp(max=0.0)
    return pos @ kmax.unsqueeze(2).transpose(-1, -2) + neg @ kmin.unsqueeze(2).transpose(-1, -2)


def quest_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    block_size: int,
    scale: float,
    groups: int,
) -> torch.Tensor:
    """Quest scores [B, G, rows, nk].

    Decode (one query, the method's home): the query's upper bound on q . k per key block.
    Prefill (our extension; Quest itself is decode-only): each query block is represented by the
    MEAN of its real queries, bounded against the key blocks' min/max box. A bound over all
    queries of the block (a box-box bound) is valid but so loose it barely ranks anything; the
    pooled query is what MInference-style and Sketch&Walk pooling use too, so the comparison
    isolates "min/max key box" against "mean key" (nowalk).
    """
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    valid = valid_or_all(valid, bsz, lk, q.device)
    kmin, kmax, has = key_block_bounds(k, valid, block_size)
    if lq == 1:
        qrep = q.float()  # [B, H, 1, d]
        rows = torch.tensor([(lk - 1) // block_size], device=q.device)
    else:
        sums, counts = block_pool(q, block_size, valid[:, lk - lq :], offset=lk - lq)
        rows = torch.arange(sums.shape[2], device=q.device)
        qrep = block_means(sums, counts)  # [B, H, nq, d]
    bound = quest_bound(qrep.view(bsz, hkv, h // hkv, qrep.shape[2], d), kmin, kmax)
    probs = causal_block_softmax(bound * scale, has, rows)  # [B, Hkv, gh, rows, nk]
    return mean_heads(probs, groups)


def score(x: ScoreInputs) -> torch.Tensor:
    scale = x.q.shape[-1] ** -0.5 if x.scale is None else x.scale
    return quest_scores(x.q, x.k, x.valid, x.block_size, scale, x.shape[1])


METHOD = Method(
    name="quest",
    help="Quest: per-block min/max key bound on q . k",
    score=score,
    needs_qk=True,
    reads_sketch=False,
)
