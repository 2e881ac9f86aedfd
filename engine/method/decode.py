"""Decode and queries after a cache: one layer's sketch state, grown token by token.

A prefill (engine/method/pipeline.py) leaves each layer its block transition estimate A_l, the sketched
block sums and the last queries; here a decode token or a chunk of queries joins those sums,
refreshes the rows of A_l it changes, walks the new rows and selects again, or keeps the last
selection on the config's re-selection cadence (`reusable`). The state belongs to one sequence
and is mutated in place; everything else is a function of it and the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sketchwalk.engine.clock import StageTimer
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.estimators import DecodeInputs
from sketchwalk.engine.method.estimators.window import key_estimates
from sketchwalk.engine.method.methods import ScoreInputs
from sketchwalk.engine.method.pipeline import (
    LayerPlan,
    choose_blocks,
    method_scores,
    transition,
)
from sketchwalk.engine.method.select import (
    ForcedRule,
    decode_row_selection,
    extend_selection,
)
from sketchwalk.engine.method.sketch import (
    SRHT,
    QueryTokens,
    SketchedBlocks,
    aggregate_heads,
    block_logits,
    block_means,
    block_pool,
    causal_block_softmax,
    key_span,
)
from sketchwalk.engine.method.step import StepPlan
from sketchwalk.engine.method.walk import walk_row, walk_rows
from sketchwalk.kernels import BlockLists, kernel
from sketchwalk.kernels.block_softmax import PackedKeys


@dataclass
class DecodeLayerState:
    """Per-layer decode state: A_l grown token by token, sketched block sums, the query window.

    Rows of A_l are a function of the block sums, so a decode step only adds the token to the
    sums (decode_absorb) and marks its row stale; whatever reads A_l next (the walk, a chunk)
    recomputes the stale rows first (refresh_rows), so it sees the state an every-step update
    gives. Without the walk nothing reads A_l during decode.
    """

    a: torch.Tensor  # [B, G, n, n]
    sketched: SketchedBlocks
    window: torch.Tensor  # [B, H, w, r] sketched recent queries
    stale_from: int | None = None  # first row of a not yet recomputed from the sums
    selection: BlockLists | None = None  # the last decode selection ...
    selected_block: int = -1  # ... made while this key block was the current one ...
    steps_since: int = 0  # ... this many tokens ago
    phase: float = 0.0  # where in its re-selection cadence the layer re-selects (decode_stagger)
    extended_from: BlockLists | None = None  # `selection` is this one plus its newest block
    gathered: object | None = None  # the backend keeps it (kernels/backends.py DecodeKeeper)
    # the cached keys as the sampled estimator's fused call reads them, grown with the cache
    packed_keys: PackedKeys = field(default_factory=PackedKeys)
    # per key block, what the estimators read from the sums (see key_estimates), in buffers with
    # room to grow; blocks from est_valid on changed since and are recomputed when next read
    est_km: torch.Tensor | None = None  # [B, Hkv, cap, r] block-mean keys
    est_keys: torch.Tensor | None = None  # [B, Hkv, cap, f] token estimator's key side
    est_valid: int = 0
    window_buf: torch.Tensor | None = None  # [B, H, 2w, r]: `window` is a view of its live part
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # of A_l and sums, see _grow
    window_end: int = 0
    window_block: list[int] = field(default_factory=list)  # per slot: its query's own block
    # token estimator: the window's logits against every key block, per slot (window_logits)
    logits_buf: torch.Tensor | None = None  # [B, Hkv, H/Hkv, 2w, cap]
    logit_rows: int = 0  # slots below this hold their row (the blocks before their own)


def start_decode(
    plan: LayerPlan, q: torch.Tensor, srht: SRHT, cfg: SketchWalkConfig, layer: int = 0
) -> DecodeLayerState:
    """Decode state from a prefill layer: its A_l, sums, and the last W sketched queries."""
    st = DecodeLayerState(plan.estimate, plan.sketched, srht(q[:, :, -cfg.query_window :]))
    st.phase = stagger_phase(layer)
    return st


def stagger_phase(layer: int) -> float:
    """Layer's offset in its re-selection cadence, as a fraction: multiples of the golden ratio
    spread evenly whatever the number of layers and the cadence (which grows with T)."""
    return (layer * 0.6180339887498949) % 1.0


def _window_slot(st: DecodeLayerState, like: torch.Tensor, w: int, lk: int, b: int) -> torch.Tensor:
    """The slot [B, H, r] of the window of the last w sketched queries that the query at position
    lk - 1 goes to (like: [B, H, *, r], the window's shape), the window already spanning it: a
    buffer of 2w slots that moves its last w - 1 queries to the front once every w + 1 tokens
    (a cat would copy the whole window every token), so the window is the same values in the
    same order. The window's logit rows (window_logits) move with their slots. The caller fills
    the slot (the absorb writes the query's sketch there directly)."""
    buf, end = st.window_buf, st.window_end
    if buf is None:  # first token after a prefill or chunk: take the window over
        have = st.window.shape[2]
        buf = like.new_empty(like.shape[0], like.shape[1], 2 * max(w, 1), like.shape[3])
        buf[:, :, :have] = st.window
        st.window_buf, end = buf, have
        st.window_block = [(lk - 1 - have + i) // b for i in range(have)] + [0] * (2 * w - have)
        st.logits_buf, st.logit_rows = None, 0
    if end == buf.shape[2]:
        keep = min(w - 1, st.window.shape[2])
        buf[:, :, :keep] = buf[:, :, end - keep : end]
        st.window_block[:keep] = st.window_block[end - keep : end]
        if st.logits_buf is not None:
            st.logits_buf[:, :, :, :keep] = st.logits_buf[:, :, :, end - keep : end]
        st.logit_rows = max(st.logit_rows - (end - keep), 0)
        end = keep
    st.window_block[end] = (lk - 1) // b
    st.window_end = end + 1
    st.window = buf[:, :, max(end + 1 - w, 0) : end + 1]
    return buf[:, :, end]


def _grow(
    st: DecodeLayerState, name: str, x: torch.Tensor, dims: tuple[int, ...], n: int
) -> torch.Tensor:
    """x with `dims` grown to n (new entries zero), as a view of a zero buffer with room to spare
    (kept in st.buffers): a key block forms every b tokens, and copying A_l [n, n] each time cost
    ~1 ms a layer at 7k tokens. A buffer is reused only while x is still its leading view."""
    buf = st.buffers.get(name)
    if buf is None or buf.shape[dims[0]] < n or buf.data_ptr() != x.data_ptr():
        cap = n + max(64, n // 4)
        buf = x.new_zeros([cap if d in dims else s for d, s in enumerate(x.shape)])
        buf[tuple(slice(0, s) for s in x.shape)] = x
        st.buffers[name] = buf
    return buf[tuple(slice(0, n) if d in dims else slice(None) for d in range(x.dim()))]


def _grow_state(st: DecodeLayerState, n: int, estimate: bool = True) -> None:
    """New key blocks formed: grow the block sums, and A_l unless `estimate` is False, to n blocks
    (zeros, filled by callers). Decode without the walk passes False: nothing reads A_l there,
    and its first growth after a prefill copied A_l into a buffer (~1.5 ms a layer at 7k tokens)
    on the decode path; `refresh_rows` grows it when something reads it."""
    sk = st.sketched
    if sk.k_count.shape[1] < n:
        st.sketched = SketchedBlocks(
            _grow(st, "q_sum", sk.q_sum, (2,), n),
            _grow(st, "q_count", sk.q_count, (1,), n),
            _grow(st, "k_sum", sk.k_sum, (2,), n),
            _grow(st, "k_count", sk.k_count, (1,), n),
            None if sk.k_sq is None else _grow(st, "k_sq", sk.k_sq, (2,), n),
        )
    if estimate and st.a.shape[-1] < n:
        st.a = _grow(st, "a", st.a, (st.a.dim() - 2, st.a.dim() - 1), n)


def blocks_of(st: DecodeLayerState) -> int:
    """Key blocks the state's sums hold (A_l may hold fewer: `_grow_state`)."""
    return st.sketched.k_count.shape[1]


def chunk_step(  # ten parameters: the layer's chunk inputs, each passed by the session's chunk path
    st: DecodeLayerState,
    q: torch.Tensor,
    k_new: torch.Tensor,
    lk: int,
    cfg: SketchWalkConfig,
    srht: SRHT,
    key_valid: torch.Tensor,
    prev_walk: torch.Tensor | None,
    select: bool = True,
    step: StepPlan | None = None,
) -> LayerPlan:
    """Queries after a cache (a chunked prefill, a later turn) for one layer.

    q [B, H, Lq, d] and k_new [B, Hkv, Lq, d] hold positions lk - Lq .. lk - 1. The sketched block
    sums take the new tokens (like decode, token by token but all at once); the rows of A_l from
    the block of the chunk's first token on are recomputed; the walk runs on those rows only
    (prev_walk: the same rows of the previous layer), exactly the rows a full prefill would get.
    Rows, selection and the returned plan are in whole blocks from block (lk - Lq) // b: the
    caller aligns the queries to that block (see Session._chunk). step: what the forward step's
    layers share (engine/method/step.py).
    """
    b = cfg.block_size
    n = -(-lk // b)
    rows = torch.arange((lk - q.shape[2]) // b, n, device=q.device)
    timer = StageTimer(q.device)

    def update() -> tuple[torch.Tensor, torch.Tensor]:
        return _absorb_chunk(st, q, k_new, lk, rows, cfg, srht, key_valid)

    a_rows, real_rows = timer.run("sketch", update)
    if not select:
        return LayerPlan(a_rows, None, None, None, timer.ms)
    beta = cfg.effective_beta
    w_rows = timer.run("walk", lambda: walk_rows(a_rows, st.a, prev_walk, beta, cfg.degree))
    start, end = key_span(key_valid) if step is None else step.span(key_valid)

    def choose() -> BlockLists:
        x = ScoreInputs(a_rows.shape, q.device, rows, b, a_rows, w_rows)
        scores = method_scores(cfg, x)
        return choose_blocks(cfg, scores, rows, start, end, n, real_rows, step=step)

    sel = timer.run("select", choose)
    return LayerPlan(a_rows, w_rows, sel, None, timer.ms)


def _absorb_chunk(
    st: DecodeLayerState,
    q: torch.Tensor,
    k_new: torch.Tensor,
    lk: int,
    rows: torch.Tensor,
    cfg: SketchWalkConfig,
    srht: SRHT,
    key_valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's tokens into st's block sums and query window, and A_l's rows from the chunk's
    first block on (rows) recomputed; returns those rows and which of them hold the chunk's real
    queries."""
    d = q.shape[-1]
    b = cfg.block_size
    t0 = lk - q.shape[2]
    j0 = t0 // b
    new_valid = key_valid[:, t0:]
    refresh_rows(st, d, cfg, blocks_of(st) - 1)  # rows left stale by reused decode steps
    st.selection = None  # the next decode step selects afresh
    _grow_state(st, -(-lk // b))
    sk = st.sketched
    qs = srht(q)  # sketch then pool: the sketch is linear
    q_sum, q_count = block_pool(qs, b, new_valid, offset=t0 % b)  # blocks j0 .. n-1
    ks = srht(k_new)
    k_sum, k_count = block_pool(ks, b, new_valid, offset=t0 % b)
    st.est_valid = min(st.est_valid, j0)  # these blocks' sums change
    sk.q_sum[:, :, j0:] += q_sum
    sk.k_sum[:, :, j0:] += k_sum
    sk.q_count[:, j0:] += q_count
    sk.k_count[:, j0:] += k_count
    if sk.k_sq is not None:
        sk.k_sq[:, :, j0:] += block_pool(ks * ks, b, new_valid, offset=t0 % b)[0]
    # the token estimator also needs the queries of the chunk's first block that came
    # before it: the decode window holds them when it is at least a block long
    token = cfg.estimator_spec.keeps_tokens
    pre = t0 % b if token and t0 % b <= st.window.shape[2] else 0
    q_tok = torch.cat([st.window[:, :, st.window.shape[2] - pre :], qs], dim=2)
    v_tok = torch.cat([key_valid[:, t0 - pre : t0], new_valid], dim=1)
    a_rows = transition(sk, rows, d, cfg, QueryTokens.sampled(q_tok, v_tok, t0 - pre, cfg))
    st.a[:, :, rows] = a_rows
    st.window = torch.cat([st.window, qs], dim=2)[:, :, -cfg.query_window :]
    st.window_buf = None  # the next decode token starts a new buffer from this window
    return a_rows, q_count > 0  # rows holding the chunk's real queries


def decode_absorb(
    st: DecodeLayerState,
    q: torch.Tensor,
    k_new: torch.Tensor,
    lk: int,
    cfg: SketchWalkConfig,
    srht: SRHT,
    key_valid: torch.Tensor | None,
) -> torch.Tensor:
    """Add one decode token to the sketched sums and the query window; its A_l row goes stale.

    Mutates st in place (it belongs to this sequence); returns the sketched query [B, H, 1, r]
    (a view of its window slot, which later tokens reuse: read it before the next token).
    key_valid None: every key is real (no padding), so the token is added without weighting
    (x * 1.0 == x: the same sums, fewer ops).
    """
    b = cfg.block_size
    cur = (lk - 1) // b
    walks = bool(cfg.effective_beta)
    if cur >= blocks_of(st) and walks:
        # a key block starts: finish the stale rows at their final width for the walk (without
        # it nothing reads them before a chunk, which refreshes them all in one pass)
        refresh_rows(st, q.shape[-1], cfg, blocks_of(st) - 1)
    _grow_state(st, cur + 1, estimate=walks)
    sk = st.sketched
    slot = _window_slot(st, sk.q_sum, cfg.query_window, lk, b)
    if key_valid is None:  # in place on views of the token's block: one C call where it can
        views = (sk.q_sum.select(2, cur), sk.k_sum.select(2, cur))
        views += (None if sk.k_sq is None else sk.k_sq.select(2, cur),)
        views += (sk.q_count.select(1, cur), sk.k_count.select(1, cur))
        q_tok, k_tok = q.select(2, 0), k_new.select(2, 0)
        kernel("absorb_token", q.device)(q_tok, k_tok, srht.matrix, *views, out=slot)
    else:
        qs, ks = srht(q), srht(k_new)  # [B,H,1,r], [B,Hkv,1,r]
        slot.copy_(qs[:, :, 0])
        new_valid = key_valid[:, -1:].float()  # [B, 1]
        sk.q_sum[:, :, cur] += qs[:, :, 0] * new_valid[:, :, None]
        sk.k_sum[:, :, cur] += ks[:, :, 0] * new_valid[:, :, None]
        sk.q_count[:, cur] += new_valid[:, 0]
        sk.k_count[:, cur] += new_valid[:, 0]
        if sk.k_sq is not None:
            sk.k_sq[:, :, cur] += ks[:, :, 0] ** 2 * new_valid[:, :, None]
    st.est_valid = min(st.est_valid, cur)
    st.stale_from = cur if st.stale_from is None else min(st.stale_from, cur)
    return slot[:, :, None]


def refresh_rows(
    st: DecodeLayerState, d: int, cfg: SketchWalkConfig, cur: int, all_valid: bool = False
) -> None:
    """Recompute the stale rows of A_l (up to the current block) from the block sums: the mean
    estimator's rows (transition without tokens), all in one pass (after a long decode without
    the walk, a chunk finds one stale row per key block the decode formed). all_valid: every
    key is real, so a last row alone sees every block and needs no mask."""
    if st.stale_from is None:
        return
    n = blocks_of(st)
    _grow_state(st, n)  # A_l to the sums' blocks (decode without the walk leaves it short)
    sk = st.sketched
    lo = st.stale_from
    km, _ = key_estimates(st, d, cfg, n)
    qm = block_means(sk.q_sum[:, :, lo : cur + 1], sk.q_count[:, lo : cur + 1])
    logits = block_logits(qm, km, d, cfg.tau)
    if all_valid and lo == cur == n - 1:
        probs = torch.softmax(logits, dim=-1)  # nothing to mask: the same values
    else:
        rows = torch.arange(lo, cur + 1, device=st.a.device)
        probs = causal_block_softmax(logits, sk.k_count > 0, rows)
    st.a[:, :, lo : cur + 1] = aggregate_heads(probs, cfg.per_group, cfg.pool)
    st.stale_from = None


def decode_step(  # many parameters: a decode layer's inputs, the optional ones defaulted
    st: DecodeLayerState,
    q: torch.Tensor,
    k_new: torch.Tensor,
    lk: int,
    cfg: SketchWalkConfig,
    srht: SRHT,
    key_valid: torch.Tensor,
    exact: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    scale: float | None = None,
    all_valid: bool = False,
    step: StepPlan | None = None,
) -> LayerPlan:
    """One decode token for one layer: update A_l's current row, estimate, walk, select.

    q [B, H, 1, d] is the new query; k_new [B, Hkv, 1, d] its key at position lk - 1; keys
    [B, Hkv, lk, d] all keys (only the baselines that score raw keys read them). all_valid: the
    caller knows every key is real (no padding mask), so the sums skip the weighting and the
    selection takes the one-row fast path (the same lists, fewer ops).
    """
    d = q.shape[-1]
    b = cfg.block_size
    timer = StageTimer(q.device)
    cur = (lk - 1) // b
    n = cur + 1

    def update() -> torch.Tensor:
        """Mutates st in place (it belongs to this sequence) and returns the row estimate r."""
        decode_absorb(st, q, k_new, lk, cfg, srht, None if all_valid else key_valid)
        if cfg.effective_beta:  # only the walk reads A_l in decode; else its rows stay stale
            refresh_rows(st, d, cfg, cur, all_valid)  # until a chunk reads them
        x = DecodeInputs(st, srht, keys, key_valid, cfg, d, cur, all_valid)
        probs = cfg.estimator_spec.decode(x)  # [B, Hkv, G, 1, n]
        return aggregate_heads(probs, cfg.per_group, cfg.pool)  # [B,G,1,n]

    r = timer.run("sketch", update)
    s = timer.run("walk", lambda: walk_row(r[:, :, 0], st.a, cfg.effective_beta, cfg.degree))
    s = s.unsqueeze(2)

    def choose() -> BlockLists:
        rows = torch.tensor([cur], device=q.device)
        x = ScoreInputs(s.shape, q.device, rows, b, r, s, exact, q, keys, key_valid, scale)
        scores = method_scores(cfg, x)
        if all_valid and cfg.method_spec.rule is None:  # the budget's fast path
            sel = decode_row_selection(scores, cur, ForcedRule.of(cfg), cfg.rates)
            if sel is not None:
                return sel
        start, end = key_span(key_valid) if step is None else step.span(key_valid)
        return choose_blocks(cfg, scores, rows, start, end, n, tail=False, step=step)

    sel = timer.run("select", choose)
    st.selection, st.selected_block, st.steps_since = sel, cur, 0
    st.extended_from = None
    return LayerPlan(r, s, sel, None, timer.ms)


def reusable(st: DecodeLayerState, lk: int, cfg: SketchWalkConfig, every: int) -> bool:
    """May this step reuse the layer's last selection? every: re-select every that many tokens
    (1: every token, the exact rule; 0: when a new key block starts). With every > 1 a kept
    selection may cross into new key blocks: each joins the lists as it starts (decode_reuse).
    cfg.decode_reselect_span caps the reuse at max(1, lk // span) tokens (with every 0: that
    cadence replaces the key-block rule where it is shorter). Only methods that score from the
    sketch state alone keep selections. With cfg.decode_stagger a layer re-selects where its own
    window of that cadence, shifted by st.phase, starts, so the layers take turns; the key-block
    rule then crosses key blocks too. A kept selection never outlives the cadence."""
    if every == 1 or st.selection is None or not cfg.method_spec.chunks:
        return False
    if cfg.decode_reselect_span:  # short contexts: at most every lk // span tokens
        cap = max(1, lk // cfg.decode_reselect_span)
        if every == 0 and cap < cfg.block_size:
            every = cap  # then on that cadence, across key blocks
        elif every > 1:
            every = min(every, cap)
    if every == 0:
        if not cfg.decode_stagger:
            return (lk - 1) // cfg.block_size == st.selected_block
        every = cfg.block_size
    since = st.steps_since + 1  # tokens since the selection
    if since >= every:
        return False
    if not cfg.decode_stagger:
        return True
    shift = int(st.phase * every)
    return (lk - 1 + shift) // every == (lk - 1 - since + shift) // every


def decode_reuse(
    st: DecodeLayerState,
    q: torch.Tensor,
    k_new: torch.Tensor,
    lk: int,
    cfg: SketchWalkConfig,
    srht: SRHT,
    key_valid: torch.Tensor,
) -> LayerPlan:
    """A decode step that keeps the layer's last selection: the token only joins the sums, and a
    key block that starts with it joins the lists (it is the local window, always kept)."""
    timer = StageTimer(q.device)
    timer.run("sketch", lambda: decode_absorb(st, q, k_new, lk, cfg, srht, key_valid))
    cur = (lk - 1) // cfg.block_size
    if cur != st.selected_block:
        st.extended_from = st.selection
        st.selection = timer.run("select", lambda: extend_selection(st.extended_from, cur))
        st.selected_block = cur
    st.steps_since += 1
    return LayerPlan(None, None, st.selection, None, timer.ms)
