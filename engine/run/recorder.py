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

from dataclasses import dataclass, field

import numpy as np
import torch

from sketchwalk.engine.method.blockstats import mass_recall, row_mean, tv_distance
from sketchwalk.engine.method.pipeline import LayerPlan
from sketchwalk.engine.method.select import selection_mask
from sketchwalk.engine.run.records import LayerRecord, group_phase


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

    exact: the exact block mass [B', G, rows, n] when the session computed it (B' may be just
    batch element 0, which is all the recorder reads); timings in ms by stage.
    """

    phase: str
    step: int
    layer: int
    plan: LayerPlan | None
    exact: torch.Tensor | None
    q: torch.Tensor
    k: torch.Tensor
    key_valid: torch.Tensor
    scale: float
    block_size: int
    density_target: float | None
    timings: dict[str, float]


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
    walk_effect: list[dict] = field(default_factory=list)  # per prefill layer (walk_effect_of)

    def observes(self, phase: str) -> bool:
        """Which layer steps it records: prefill, and decode unless switched off (not chunks)."""
        return phase == "prefill" or (phase == "decode" and self.options.decode)

    def wants_exact(self, lk: int) -> bool:
        return lk <= self.options.exact_max_tokens

    def record(self, obs: LayerStep) -> None:
        """One record for batch element 0; group dimensions are averaged (selected: any group)."""
        if not self.observes(obs.phase):
            return
        plan, q, block_size, timings = obs.plan, obs.q, obs.block_size, obs.timings
        n = -(-obs.k.shape[2] // block_size)
        kv0 = obs.key_valid[:1]
        exact = None if obs.exact is None else obs.exact[:1]
        groups = self._groups(plan, n)
        exact_g = exact.float()[0] if exact is not None else None  # [G, rows, n]
        exact = None if exact is None else exact.float().mean(1)[0]  # [rows, n]
        rows = exact.shape[0] if exact is not None else -(-q.shape[2] // block_size)
        q_blocks = np.arange(n - rows, n)
        real = self._real_rows(kv0, q.shape[2], block_size, rows)
        a = w = sel = None
        if plan is not None:
            a = plan.estimate[:1].float().mean(1)[0] if plan.estimate is not None else None
            w_all = _walk_scores(plan)
            w = w_all[:1].float().mean(1)[0] if w_all is not None else None
            if plan.selection is not None:
                sel = selection_mask(plan.selection, n)[:1].any(1)[0]
            if plan.alternative is not None and plan.selection is not None:
                self.walk_effect.append(
                    {"layer": obs.layer, **walk_effect_of(plan, n, exact_g, real)}
                )
        rec = LayerRecord(
            phase=obs.phase,
            step=obs.step,
            layer=obs.layer,
            dense=plan is None or plan.selection is None,
            n_blocks=n,
            q_blocks=q_blocks,
            sketch=_np(a),
            walk=_np(w),
            exact=_np(exact),
            selected=_np(sel),
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
        if exact is not None:
            if a is not None:
                rec.sketch_error = row_mean(tv_distance(a, exact), real)
            if w is not None:
                rec.walk_error = row_mean(
                    tv_distance(w / w.sum(-1, keepdim=True).clamp(min=1e-30), exact), real
                )
            if sel is not None:
                rec.mass_recall = row_mean(mass_recall(exact, sel), real)
        self.layers.append(rec)
        if groups > 1:
            self._group_records(rec, plan, exact_g, real)

    def _groups(self, plan: LayerPlan | None, n: int) -> int:
        """How many per-group records this layer gets (0: none)."""
        if plan is None or plan.selection is None:
            return 0
        g = int(selection_mask(plan.selection, n).shape[1])
        return g if g > 1 and n <= self.options.group_max_blocks else 0

    def _group_records(
        self, rec: LayerRecord, plan: LayerPlan, exact_g: torch.Tensor | None, real: torch.Tensor
    ) -> None:
        n = rec.n_blocks
        sel = selection_mask(plan.selection, n)[0]  # [G, rows, n]
        causal = torch.as_tensor(
            np.arange(n)[None, :] <= np.asarray(rec.q_blocks)[:, None], device=sel.device
        )
        w_all = _walk_scores(plan)
        for g in range(sel.shape[0]):
            a = plan.estimate[0, g].float() if plan.estimate is not None else None
            w = w_all[0, g].float() if w_all is not None else None
            ex = None
            if exact_g is not None and exact_g.shape[0] == sel.shape[0]:
                ex = exact_g[g]
            kept = sel[g] & causal
            grec = LayerRecord(
                phase=group_phase(rec.phase, g),
                step=rec.step,
                layer=rec.layer,
                dense=False,
                n_blocks=n,
                q_blocks=rec.q_blocks,
                sketch=_np(a),
                walk=_np(w),
                exact=_np(ex),
                selected=_np(sel[g]),
                density_target=rec.density_target,
                density_achieved=float(kept.sum() / causal.sum().clamp(min=1)),
            )
            if ex is not None:
                grec.mass_recall = row_mean(mass_recall(ex, sel[g]), real)
                if w is not None:
                    w_norm = w / w.sum(-1, keepdim=True).clamp(min=1e-30)
                    grec.walk_error = row_mean(tv_distance(w_norm, ex), real)
                if a is not None:
                    grec.sketch_error = row_mean(tv_distance(a, ex), real)
            self.group_layers.append(grec)

    @staticmethod
    def _real_rows(key_valid: torch.Tensor, lq: int, block_size: int, rows: int) -> torch.Tensor:
        if lq == 1:
            return torch.ones(1, dtype=torch.bool, device=key_valid.device)
        qv = torch.nn.functional.pad(key_valid[0, -lq:].float(), (0, rows * block_size - lq))
        return qv.view(rows, block_size).sum(-1) > 0


def _walk_scores(plan: LayerPlan) -> torch.Tensor | None:
    """The walk scores a record shows: the run's own, or, where it did not walk, the
    counterfactual walk's (engine/method/pipeline.py WalkAlternative): every recorded run has them."""
    if plan.alternative is not None and plan.alternative.walk is not None:
        return plan.alternative.walk
    return plan.walk_scores


def walk_effect_of(
    plan: LayerPlan, n: int, exact_g: torch.Tensor | None, real: torch.Tensor
) -> dict[str, float | int | bool | None]:
    """What the walk changes in one layer's selection (batch element 0, summed over groups):
    blocks the walk's selection keeps that A_l's alone would not (added) and the reverse
    (dropped), and, where the exact mass was recorded, the mass it gains per real query block
    row (added minus dropped, averaged over the groups). used: the run selected with the walk."""
    alt = plan.alternative
    mine = selection_mask(plan.selection, n)[0]  # [G, rows, n]
    other = selection_mask(alt.selection, n)[0]
    with_walk, without = (other, mine) if alt.walks else (mine, other)
    rows = mine.shape[1]
    causal = torch.ones(rows, n, dtype=torch.bool, device=mine.device).tril(n - rows)
    added = with_walk & ~without & causal
    dropped = without & ~with_walk & causal
    gain = None
    if exact_g is not None and exact_g.shape[0] == mine.shape[0]:
        ex = exact_g.to(mine.device)
        per_row = (ex * added).sum(-1) - (ex * dropped).sum(-1)  # [G, rows]
        gain = float(per_row[:, real.to(mine.device)].mean()) if bool(real.any()) else 0.0
    return {
        "used": not alt.walks,
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
