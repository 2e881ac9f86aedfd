"""Sketch -> walk -> select for one prefill layer: the block plan the kernels execute.

Pure functions of tensors and the config; the previous layer's walk is passed in and returned,
never kept here. The pieces decode shares (the estimate, the method's scores, the selection rule)
live here too; decode's per-sequence state and its steps are in engine/method/decode.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sketchwalk.engine.clock import Duration, StageTimer
from sketchwalk.engine.method.blockstats import exact_block_mass
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.methods import ScoreInputs
from sketchwalk.engine.method.select import ForcedRule, budget_masks, select_blocks
from sketchwalk.engine.method.sketch import (
    SRHT,
    QueryTokens,
    SketchedBlocks,
    aggregate_heads,
    block_pool,
)
from sketchwalk.engine.method.step import StepPlan
from sketchwalk.engine.method.walk import COUNTERFACTUAL_BETA, walk
from sketchwalk.kernels import BlockLists, block_sparse_attention


@dataclass
class LayerPlan:
    """What one layer decided: its estimate, walk scores and the kept blocks."""

    estimate: torch.Tensor | None  # [B, G, n, n] block transition estimate A_l
    walk_scores: torch.Tensor | None  # [B, G, n, n] W_l (None when the method uses none)
    selection: BlockLists | None
    sketched: SketchedBlocks | None
    timings: dict[str, Duration] = field(default_factory=dict)  # ms (engine/clock.py)
    alternative: WalkAlternative | None = None  # what the other choice of walk would select


@dataclass
class WalkAlternative:
    """The selection the layer would make with the walk switched the other way: for a run that
    walks, the per-layer estimate A_l alone; for one that does not, the walk at
    COUNTERFACTUAL_BETA (walk: its scores [B, G, n, n], carried to the next layer). Recorded
    runs only, so the explorer can say what the walk changes on this prompt."""

    walks: bool  # True: `selection` is the walk's (the run did not walk)
    selection: BlockLists
    walk: torch.Tensor | None = None


def sketch_blocks(
    q: torch.Tensor,
    k: torch.Tensor,
    srht: SRHT,
    block_size: int,
    valid: torch.Tensor,
    token_cfg: SketchWalkConfig | None = None,
    padded: bool = True,
) -> tuple[SketchedBlocks, QueryTokens | None]:
    """Pool q, k [B, H(kv), T, d] per block over real tokens, then sketch the sums (the sketch is
    linear). token_cfg: the config, where its estimator reads sketched query tokens (then
    also keep its sampled sketched queries and the sums of squared sketched keys). padded False: every token is real (the
    pooling then skips its validity checks, each a device read)."""
    pool_valid = valid if padded else None
    if token_cfg is None:
        q_sum, q_count = block_pool(q, block_size, pool_valid)
        k_sum, k_count = block_pool(k, block_size, pool_valid)
        return SketchedBlocks(srht(q_sum), q_count, srht(k_sum), k_count), None
    # queries: the sums are pooled then sketched (the sketch is linear) and only the scored
    # queries are sketched, not all of them (the [T x H, d] x [d, r] product was ~4 ms a layer
    # at 2k tokens); keys: every one, for the sums of their squares (not linear)
    ks, k_sum, k_sq = srht.pooled(k, block_size, pool_valid)
    q_sum, count = block_pool(q, block_size, pool_valid)
    q_sum = srht(q_sum)
    if token_cfg.estimator_spec.needs_keys and srht.rotation:
        # scores alone read them, and a rotation keeps every inner product: the raw queries
        # and keys score the same (sketching the kept queries was ~1.3 ms a layer at 2k)
        qt = QueryTokens.sampled(q, valid, 0, token_cfg)
        qt.qs, qt.keys, qt.key_valid = qt.qs.float(), k.float(), valid  # the kept ones only
        return SketchedBlocks(q_sum, count, k_sum, count.clone(), k_sq), qt
    qt = QueryTokens.sampled(q, valid, 0, token_cfg, srht)
    if token_cfg.estimator_spec.needs_keys:
        qt.keys, qt.key_valid = ks, valid
    return SketchedBlocks(q_sum, count, k_sum, count.clone(), k_sq), qt  # counts grow apart


def transition(
    sk: SketchedBlocks,
    q_blocks: torch.Tensor,
    dim: int,
    cfg: SketchWalkConfig,
    tokens: QueryTokens | None = None,
) -> torch.Tensor:
    """A [B, G, rows, n] for the query blocks q_blocks: the config's estimator
    (engine/method/estimators) over the sketched block sums (and the rows' scored queries, where the
    estimator keeps them), its heads pooled."""
    probs = cfg.estimator_spec.prefill(sk, q_blocks, dim, cfg, tokens)
    return aggregate_heads(probs, cfg.per_group, cfg.pool)


def method_scores(cfg: SketchWalkConfig, x: ScoreInputs) -> torch.Tensor:
    """The scores the config's method ranks blocks by (higher = keep), from the registry."""
    scores = cfg.method_spec.score(x)
    if tuple(scores.shape) != tuple(x.shape):
        raise ValueError(f"{cfg.method} scores have shape {tuple(scores.shape)}, not {x.shape}")
    return scores


def choose_blocks(
    cfg: SketchWalkConfig,
    scores: torch.Tensor,
    rows: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    n_blocks: int,
    real_rows: torch.Tensor | None = None,
    tail: bool = True,
    step: StepPlan | None = None,
) -> BlockLists:
    """The config's selection rule over scores [B, G, R, n] for query-block rows `rows` (the
    density budget, or the method's own rule where it declares one). step:
    the forward step's shared values, where the budget masks are built once for all its layers
    (rows, start, end and real_rows are the same at every layer of a step)."""
    own = cfg.method_spec.rule  # a method's own rule (a threshold) in place of the budget
    rule = ForcedRule.of(cfg) if own is None else own.forced(cfg.block_size)
    dense_rows = rows >= n_blocks - cfg.dense_tail_blocks if tail else None

    def masks() -> tuple:
        return budget_masks(
            scores.shape, rows, rule, start, end, dense_rows, real_rows, cfg.rows_per_list
        )

    tail_rows = cfg.dense_tail_blocks if tail else None
    key = ("masks", tuple(scores.shape), rule, cfg.rows_per_list, tail_rows, real_rows is None)
    built = masks() if step is None else step.once(key, masks)
    if own is not None:
        return own.select(scores, built, cfg.block_size)
    return select_blocks(
        scores,
        rows,
        rule,
        cfg.rates,
        start,
        end,
        dense_rows,
        real_rows,
        cfg.budget,
        cfg.rows_per_list,
        cfg.pool,
        built,
    )


def sparse_attention(
    cfg: SketchWalkConfig,
    sel: BlockLists,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    seq_start: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """The block-sparse kernel on a selection. A full prefill (queries == keys) with query tiles
    passes one list per tile, the union of its rows' lists: the same attention (causality trims
    each row), in longer kernel calls."""
    b, tile = cfg.block_size, cfg.rows_per_list
    lists = sel.starting_at(seq_start)
    if tile > 1 and q.shape[2] == k.shape[2]:
        nk = -(-k.shape[2] // b)
        # a tile's union holds at most tile x the longest row list: a width known on the host
        lists = lists.tiled(tile, nk, width=tile * lists.index.shape[-1])
    return block_sparse_attention(q, k, v, lists, True, scale, backend)


def prefill_plan(  # many parameters: a prefill layer's inputs, the optional ones defaulted
    q: torch.Tensor,
    k: torch.Tensor,
    cfg: SketchWalkConfig,
    srht: SRHT,
    prev_walk: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    scale: float | None = None,
    select: bool = True,
    exact: torch.Tensor | None = None,
    step: StepPlan | None = None,
    alternative: bool = False,
    prev_alt: torch.Tensor | None = None,
) -> LayerPlan:
    """Sketch, walk and select for a prefill layer (queries == keys positions).

    select=False only estimates (dense layers that still feed decode or the recorder). exact:
    the layer's exact block mass (layer_exact), for methods that select on it. step: what the
    forward step's layers share (engine/method/step.py); None builds it here (no padding unless valid
    says so). alternative: also the selection with the walk switched the other way (a recorded
    run; methods that select on A_l or W_l only), prev_alt the counterfactual walk's state.
    """
    bsz, h, t, d = q.shape
    b = cfg.block_size
    n = -(-t // b)
    if valid is None:
        valid = torch.ones(bsz, t, dtype=torch.bool, device=q.device)
        step = step or StepPlan.of(valid, may_pad=False)
    step = step or StepPlan.of(valid)
    scale = d**-0.5 if scale is None else scale
    timer = StageTimer(q.device)
    rows = torch.arange(n, device=q.device)
    token_cfg = cfg if cfg.estimator_spec.keeps_tokens else None
    sk, qt = timer.run(
        "sketch", lambda: sketch_blocks(q, k, srht, b, valid, token_cfg, padded=step.padded)
    )
    a = timer.run("sketch", lambda: transition(sk, rows, d, cfg, qt))
    if not select:
        return LayerPlan(a, None, None, sk, timer.ms)
    w = timer.run("walk", lambda: walk(a, prev_walk, cfg.effective_beta, cfg.degree))
    start, end = step.span(valid)
    real_rows = sk.q_count > 0

    def choose() -> BlockLists:
        x = ScoreInputs(a.shape, q.device, rows, b, a, w, exact, q, k, valid, scale)
        scores = method_scores(cfg, x)
        return choose_blocks(cfg, scores, rows, start, end, n, real_rows, step=step)

    sel = timer.run("select", choose)
    alt = None
    if alternative and cfg.method in WALK_METHODS:
        alt = walk_alternative(cfg, a, prev_alt, lambda scores: choose_blocks(
            cfg, scores, rows, start, end, n, real_rows, step=step))  # fmt: skip
    return LayerPlan(a, w, sel, sk, timer.ms, alt)


# methods whose scores are the walk's W_l or the estimate A_l: the walk's effect is defined
WALK_METHODS = ("sketchwalk", "nowalk")


def walk_alternative(
    cfg: SketchWalkConfig,
    a: torch.Tensor,
    prev_alt: torch.Tensor | None,
    choose: Callable[[torch.Tensor], BlockLists],
) -> WalkAlternative:
    """The other side of the walk for one layer: A_l's selection when the run walks, else the
    walk's at COUNTERFACTUAL_BETA (its state continuing from prev_alt). choose: the layer's
    selection rule on scores [B, G, n, n]. Cost: at 2k tokens and 16-token blocks, three
    128 x 128 products and one more selection per layer."""
    if cfg.effective_beta > 0:
        return WalkAlternative(walks=False, selection=choose(a))
    w = walk(a, prev_alt, COUNTERFACTUAL_BETA, cfg.degree)
    return WalkAlternative(walks=True, selection=choose(w), walk=w)


def prefill_selection(
    q: torch.Tensor, k: torch.Tensor, cfg: SketchWalkConfig, layer: int, state: object = None
) -> BlockLists:
    """Block index lists for one prefill layer (the benchmark's entry: no padding, fresh walk,
    nothing recorded)."""
    from sketchwalk.engine.method.sketch import make_srht

    cfg = cfg.for_estimate(recorded=False)
    srht = make_srht(q.shape[-1], cfg.sketch_dim, cfg.seed, layer).to(q.device)
    exact = layer_exact(q, k, None, None, cfg) if cfg.method_spec.needs_exact else None
    return prefill_plan(q, k, cfg, srht, prev_walk=state, exact=exact).selection


def layer_exact(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    scale: float | None,
    cfg: SketchWalkConfig,
    pool: str | None = None,
) -> torch.Tensor:
    """The one place a layer's exact block mass [B, G, rows, n] is computed (a dense softmax):
    per selection group, pooled as the config pools for the oracle's selection, and averaged
    (pool "mean") for the recorder's ground truth."""
    if valid is None:
        valid = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = cfg.groups(k.shape[1])
    return exact_block_mass(
        q, k, scale, cfg.block_size, valid, groups, pool=cfg.pool if pool is None else pool
    )
