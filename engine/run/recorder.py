"""Recorder: an observer that copies what each layer decided (small n x n block tensors) to CPU
records; it only reads what the session hands it (a LayerStep), so recording cannot change a run.

Off in pure inference. The exact block mass needs the full softmax (dense cost), so the session
only computes it for the recorder up to `exact_max_tokens` of context; past that, exact, sketch
error and recall are None.

A layer's record describes all KV-head groups (estimates averaged, kept = kept by any group).
When selection is per group, each group also gets its own record in `group_layers` (phase
'prefill:g1', see
records.group_phase) up to `group_max_blocks` blocks (8k tokens at blocks of 64: the rows
grow with groups x blocks^2), so the explorer can show one group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from sketchwalk.engine.method.pipeline import LayerPlan
from sketchwalk.engine.method.select import selection_mask
from sketchwalk.engine.run.records import LayerRecord, group_phase
from sketchwalk.kernels import BlockLists


@dataclass
class RecorderOptions:
    exact_max_tokens: int = 8192  # about 2 s per layer-set at 2k tokens on 2 CPU cores, 30 s at 8k
    time_dense: bool = True  # also time dense SDPA on the same inputs, for per-layer speedups
    decode: bool = True  # record decode steps too
    group_max_blocks: int = 128  # per-group records (per-group selection) up to this many blocks
    # the walk's counterfactual (or A_l's selection beside a walking run) up to this many blocks:
    # the walk costs degree x n^3 per group, small at 2k tokens, seconds a layer past 8k
    walk_max_blocks: int = 512


@dataclass(frozen=True)
class LayerStep:
    """What one layer did in one prefill or decode step, as the session hands it to the recorder.

    exact: the exact block mass [B', G, rows, n], computed when called (B' may be just batch
    element 0, which is all the recorder reads; None: not offered at this context length); the
    recorder may call it on its second stream, after the session moved on (q and k stay as
    they were: a cache only ever writes after them). timings in ms by stage.
    """

    phase: str
    step: int
    layer: int
    plan: LayerPlan | None
    exact: Callable[[], torch.Tensor] | None
    q: torch.Tensor
    k: torch.Tensor
    key_valid: torch.Tensor
    scale: float
    block_size: int
    density_target: float | None
    timings: dict[str, float]


@dataclass
class _Staged:
    """A record as staged from its layer step, waiting for its exact mass."""

    rec: LayerRecord
    real: np.ndarray
    a_g: np.ndarray | None
    w_g: np.ndarray | None
    sel_g: np.ndarray | None
    change: WalkChange | None


def _own(x: torch.Tensor | None) -> torch.Tensor | None:
    """Batch element 0 of a tensor, as a copy of its own."""
    return None if x is None else x[:1].clone()


def _own_lists(sel: BlockLists | None) -> BlockLists | None:
    if sel is None:
        return None
    start = None if sel.seq_start is None else sel.seq_start.clone()
    return replace(sel, index=sel.index.clone(), count=sel.count.clone(), seq_start=start)


def _frozen(obs: LayerStep) -> LayerStep:
    """The layer step with copies of the plan's tensors a record reads: the decode state goes
    on writing into its estimate and walk buffers, and a kept selection's lists, after the
    session moves on. q and k are left as they are (a cache only ever writes after them)."""
    plan = obs.plan
    if plan is not None:
        alt = plan.alternative
        if alt is not None:
            alt = replace(alt, selection=_own_lists(alt.selection), walk=_own(alt.walk))
        plan = replace(
            plan,
            estimate=_own(plan.estimate),
            walk_scores=_own(plan.walk_scores),
            selection=_own_lists(plan.selection),
            sketched=None,
            alternative=alt,
        )
    return replace(obs, plan=plan, key_valid=obs.key_valid[:1].clone())


def _np(x: torch.Tensor | None) -> np.ndarray | None:
    """A record's own copy: a view (one group of the plan's [B, G, n, n] scores, say) would keep
    the whole tensor alive for the rest of the run."""
    if x is None:
        return None
    t = x.detach().cpu()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size() or not t.is_contiguous():
        t = t.clone(memory_format=torch.contiguous_format)
    return t.numpy()


@dataclass
class Recorder:
    options: RecorderOptions = field(default_factory=RecorderOptions)
    layers: list[LayerRecord] = field(default_factory=list)
    group_layers: list[LayerRecord] = field(
        default_factory=list
    )  # per KV-head group (phase 'prefill:g1')
    walk_effect: list[dict] = field(default_factory=list)  # per prefill layer (walk_gain)
    # where a record's exact mass and metrics are computed: None, at once; else handed to this
    # (a second stream's `put`, engine/run/alongside.py), which runs them in order
    later: Callable[[Callable[[], None]], None] | None = None

    def observes(self, phase: str) -> bool:
        """Which layer steps it records: prefill, and decode unless switched off (not chunks)."""
        return phase == "prefill" or (phase == "decode" and self.options.decode)

    def wants_exact(self, lk: int) -> bool:
        return lk <= self.options.exact_max_tokens

    def record(self, obs: LayerStep) -> None:
        """One record for batch element 0; group dimensions are averaged (selected: any group).

        The layer's block tensors are copied to the host once, and the metrics are computed on
        those copies in numpy: a decode step's rows are one query block by n, where each torch
        op would cost more in dispatch than in arithmetic. With `later` set, all of it is done
        there, from copies of what the session goes on updating (_frozen)."""
        if not self.observes(obs.phase):
            return
        if self.later is None:
            self._finish(self._stage(obs), obs.exact)
        else:
            step = _frozen(obs)
            self.later(lambda: self._finish(self._stage(step), step.exact))

    def _stage(self, obs: LayerStep) -> _Staged:
        """What a record reads of the layer step, as host copies: all but the exact mass."""
        plan, q, block_size, timings = obs.plan, obs.q, obs.block_size, obs.timings
        n = -(-obs.k.shape[2] // block_size)
        rows = -(-q.shape[2] // block_size)
        real = _np(self._real_rows(obs.key_valid[:1], q.shape[2], block_size, rows))
        a_g = w_g = sel_g = a = w = sel = change = None
        if plan is not None:
            a_g, a = _group_and_mean(
                plan.estimate[:1].float() if plan.estimate is not None else None
            )
            w_all = _walk_scores(plan)
            w_g, w = _group_and_mean(w_all[:1].float() if w_all is not None else None)
            if plan.selection is not None:
                sel_g = _np(selection_mask(plan.selection, n)[0])  # [G, rows, n]
                sel = sel_g.any(0)
            if plan.alternative is not None and plan.selection is not None:
                change = walk_change(plan, n)
        rec = LayerRecord(
            phase=obs.phase,
            step=obs.step,
            layer=obs.layer,
            dense=plan is None or plan.selection is None,
            n_blocks=n,
            q_blocks=np.arange(n - rows, n),
            sketch=a,
            walk=w,
            exact=None,
            selected=sel,
            density_target=obs.density_target,
            density_achieved=plan.selection.density
            if plan is not None and plan.selection is not None
            else None,
            t_sketch_ms=timings.get("sketch"),
            t_walk_ms=timings.get("walk"),
            t_select_ms=timings.get("select"),
            t_attention_ms=timings.get("attention"),
            t_dense_ms=timings.get("dense"),
        )
        return _Staged(rec, real, a_g, w_g, sel_g, change)

    def _finish(self, st: _Staged, exact_of: Callable[[], torch.Tensor] | None) -> None:
        """The record's exact mass (where the session offers it) and its errors against it."""
        rec, real, sel_g = st.rec, st.real, st.sel_g
        exact_t = None if exact_of is None else exact_of()[:1].float()  # [1, G, rows, n]
        exact_g, rec.exact = _group_and_mean(exact_t)
        if st.change is not None:
            self.walk_effect.append({"layer": rec.layer, **walk_gain(st.change, exact_g, real)})
        _score_against(rec, rec.exact, rec.sketch, rec.walk, rec.selected, real)
        self.layers.append(rec)
        if (
            sel_g is not None
            and sel_g.shape[0] > 1
            and rec.n_blocks <= self.options.group_max_blocks
        ):
            if exact_g is not None and exact_g.shape[0] != sel_g.shape[0]:
                exact_g = None  # pooled otherwise than the groups selected
            self._group_records(rec, sel_g, st.a_g, st.w_g, exact_g, real)

    def _group_records(
        self,
        rec: LayerRecord,
        sel_g: np.ndarray,
        a_g: np.ndarray | None,
        w_g: np.ndarray | None,
        exact_g: np.ndarray | None,
        real: np.ndarray,
    ) -> None:
        """One record per KV-head group of a layer that selected per group ([G, rows, n] each)."""
        n = rec.n_blocks
        causal = np.arange(n)[None, :] <= np.asarray(rec.q_blocks)[:, None]
        achieved = (sel_g & causal).sum((1, 2)) / max(int(causal.sum()), 1)
        for g in range(sel_g.shape[0]):
            grec = LayerRecord(
                phase=group_phase(rec.phase, g),
                step=rec.step,
                layer=rec.layer,
                dense=False,
                n_blocks=n,
                q_blocks=rec.q_blocks,
                sketch=None if a_g is None else a_g[g],
                walk=None if w_g is None else w_g[g],
                exact=None if exact_g is None else exact_g[g],
                selected=sel_g[g],
                density_target=rec.density_target,
                density_achieved=float(achieved[g]),
            )
            _score_against(grec, grec.exact, grec.sketch, grec.walk, sel_g[g], real)
            self.group_layers.append(grec)

    @staticmethod
    def _real_rows(key_valid: torch.Tensor, lq: int, block_size: int, rows: int) -> torch.Tensor:
        if lq == 1:
            return torch.ones(1, dtype=torch.bool, device=key_valid.device)
        qv = torch.nn.functional.pad(key_valid[0, -lq:].float(), (0, rows * block_size - lq))
        return qv.view(rows, block_size).sum(-1) > 0


def _group_and_mean(x: torch.Tensor | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Batch element 0 of a [1, G, rows, n] tensor on the host: per group, and averaged over
    the groups (the average taken by torch, as the layer's own record always had it)."""
    if x is None:
        return None, None
    # a copy always: the per-group records keep slices of it, and x may be the plan's own
    # tensor, which the walk goes on updating
    return x[0].detach().to("cpu", copy=True).numpy(), _np(x.mean(1)[0])


def _tv(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Total-variation distance between distributions along the last axis."""
    return 0.5 * np.abs(p - q).sum(-1)


def _row_mean(values: np.ndarray, rows: np.ndarray) -> float:
    """Mean of per-row values over the rows that hold real queries."""
    w = rows.astype(values.dtype)
    return float((values * w).sum() / max(float(w.sum()), 1.0))


def _score_against(
    rec: LayerRecord,
    exact: np.ndarray | None,
    a: np.ndarray | None,
    w: np.ndarray | None,
    sel: np.ndarray | None,
    real: np.ndarray,
) -> None:
    """A record's errors against the exact block mass: the estimate's and the (normalised)
    walk's total-variation distance, and the mass the kept blocks hold, per real row."""
    if exact is None:
        return
    if a is not None:
        rec.sketch_error = _row_mean(_tv(a, exact), real)
    if w is not None:
        rec.walk_error = _row_mean(
            _tv(w / np.maximum(w.sum(-1, keepdims=True), 1e-30), exact), real
        )
    if sel is not None:
        rec.mass_recall = _row_mean((exact * sel).sum(-1), real)


def _walk_scores(plan: LayerPlan) -> torch.Tensor | None:
    """The walk scores a record shows: the run's own, or, where it did not walk, the
    counterfactual walk's (engine/method/pipeline.py WalkAlternative): every recorded run has them."""
    if plan.alternative is not None and plan.alternative.walk is not None:
        return plan.alternative.walk
    return plan.walk_scores


@dataclass(frozen=True)
class WalkChange:
    """The blocks the walk's selection keeps that A_l's alone would not (added) and the reverse
    (dropped), batch element 0, per group [G, rows, n]. used: the run selected with the walk."""

    used: bool
    added: np.ndarray
    dropped: np.ndarray


def walk_change(plan: LayerPlan, n: int) -> WalkChange:
    alt = plan.alternative
    mine = _np(selection_mask(plan.selection, n)[0])  # [G, rows, n]
    other = _np(selection_mask(alt.selection, n)[0])
    with_walk, without = (other, mine) if alt.walks else (mine, other)
    rows = mine.shape[1]
    causal = np.tril(np.ones((rows, n), dtype=bool), n - rows)
    return WalkChange(not alt.walks, with_walk & ~without & causal, without & ~with_walk & causal)


def walk_gain(
    change: WalkChange, exact_g: np.ndarray | None, real: np.ndarray
) -> dict[str, float | int | bool | None]:
    """What the walk changes in one layer's selection (summed over groups), and, where the
    exact mass was recorded, the mass it gains per real query block row (added minus dropped,
    averaged over the groups)."""
    added, dropped = change.added, change.dropped
    gain = None
    if exact_g is not None and exact_g.shape[0] == added.shape[0]:
        per_row = (exact_g * added).sum(-1) - (exact_g * dropped).sum(-1)  # [G, rows]
        gain = float(per_row[:, real].mean()) if bool(real.any()) else 0.0
    return {
        "used": change.used,
        "added": int(added.sum()),
        "dropped": int(dropped.sum()),
        "mass_gain": gain,
    }


# ---- a query's own attention, on demand ---------------------------------------------------------


@dataclass
class QueryLayer:
    """What one prefill layer did for one query token (position `position`, in query block
    `block`): per selection group, the exact softmax mass (mean over the group's heads) on the
    key blocks the selection dropped for that block's row; per head, the same and the top
    source tokens (position, weight, whether its block was kept). `kept` is the row's kept
    blocks, any group (dense layers: every causal block)."""

    layer: int
    position: int
    block: int
    dense: bool
    dropped_by_group: list[float]
    dropped_by_head: list[float]
    top: list[list[tuple[int, float, bool]]]  # per head: (source position, weight, kept)
    kept: np.ndarray  # [n] bool


@dataclass
class QueryProbe:
    """A recorder that keeps, for a few query positions of a prefill, their attention rows per
    head and layer reduced to what the drill-down shows (QueryLayer). Memory is bounded by
    heads x keys per probed query (one row of scores at a time), never a T x T matrix; the run
    itself is untouched (the session hands it the same read-only LayerStep as the recorder)."""

    positions: list[int]
    top_k: int = 8
    options: RecorderOptions = field(
        default_factory=lambda: RecorderOptions(
            exact_max_tokens=0, time_dense=False, decode=False, walk_max_blocks=0
        )
    )
    layers: list[QueryLayer] = field(default_factory=list)

    def observes(self, phase: str) -> bool:
        return phase == "prefill"

    def wants_exact(self, lk: int) -> bool:
        return False

    def record(self, obs: LayerStep) -> None:
        if obs.phase != "prefill":
            return
        q, k, b = obs.q[0], obs.k[0].float(), obs.block_size  # [H, L, d], [Hkv, L, d]
        h, hkv, lk = q.shape[0], k.shape[0], k.shape[1]
        n = -(-lk // b)
        offset = lk - q.shape[1]
        plan = obs.plan
        sel = None
        if plan is not None and plan.selection is not None:
            sel = selection_mask(plan.selection, n)[0]  # [G, nq, n]
        valid = obs.key_valid[0]
        for pos in self.positions:
            row = pos - offset
            if not 0 <= row < q.shape[1]:
                continue
            scores = q[:, row].float().view(hkv, h // hkv, 1, -1) @ k.transpose(-1, -2)[:, None]
            scores = scores.view(h, lk) * obs.scale
            scores[:, pos + 1 :] = float("-inf")  # causal: keys after the query
            scores[:, ~valid] = float("-inf")
            probs = torch.softmax(scores, dim=-1)  # [H, Lk]
            mass = torch.nn.functional.pad(probs, (0, n * b - lk)).view(h, n, b).sum(-1)
            blk = pos // b
            causal = torch.arange(n) <= blk
            if sel is None:
                kept_g = causal[None].expand(1, n)
            else:
                kept_g = sel[:, blk - (n - sel.shape[1])] & causal  # the query block's row
            groups = kept_g.shape[0]
            head_group = torch.arange(h) // (h // groups) if groups <= h else torch.zeros(h)
            kept_h = kept_g[head_group.long()]  # [H, n]
            dropped_h = (mass * (~kept_h & causal)).sum(-1)  # [H]
            dropped_g = [float(dropped_h[head_group == g].mean()) for g in range(groups)]
            kk = min(self.top_k, pos + 1)
            w, idx = probs.topk(kk, dim=-1)
            kept_top = kept_h.gather(1, idx // b)  # [H, k]: the source token's block kept
            top = [
                list(zip(idx[hd].tolist(), w[hd].tolist(), kept_top[hd].tolist(), strict=True))
                for hd in range(h)
            ]
            self.layers.append(
                QueryLayer(
                    obs.layer,
                    pos,
                    blk,
                    sel is None,
                    dropped_g,
                    dropped_h.tolist(),
                    top,
                    kept_g.any(0).numpy().copy(),
                )
            )
