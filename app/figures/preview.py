"""Density preview: the blocks a layer would keep at another density, from stored scores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def selection_rule(
    n: int, prompt_tokens: int, config: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(candidates [n, n], forced [n, n]) of prefill rows, from the engine's own rule
    (engine/method/select.py): causal candidates; sink, window and dense-tail rows forced."""
    import torch

    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.select import ForcedRule, candidate_mask, forced_mask

    cfg = SketchWalkConfig.from_stored(config)
    rows = torch.arange(n)
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([max(int(prompt_tokens), 1)])
    cand = candidate_mask(rows, n, start // cfg.block_size)[0]
    forced = cand & forced_mask(rows, n, ForcedRule.of(cfg), start, end)[0]
    tail = rows >= n - cfg.dense_tail_blocks
    return cand.numpy(), (forced | (cand & tail[:, None])).numpy()


def preview_selection(
    scores: np.ndarray,
    prompt_tokens: int,
    config: dict[str, Any],
    density: float | Sequence[float],
) -> np.ndarray:
    """The blocks a prefill layer would keep at `density`, from stored scores: [n, n] bool for
    scores [n, n], or [G, n, n] for scores [G, n, n] (one selection per KV-head group, each at
    its own density where `density` gives one per group, as a layer profile does).

    Calls the engine's own selection (engine.pipeline.choose_blocks with the run's config: its
    budget, query tiles and forced blocks), so a preview cannot drift from what a run at that
    density would select from the same scores; tests check it reproduces stored selections.
    """
    import torch

    from sketchwalk.engine.method.pipeline import choose_blocks
    from sketchwalk.engine.method.select import selection_mask

    cfg = _config_at(config, density)
    scores = np.asarray(scores, dtype=np.float32)
    grouped = scores.ndim == 3
    s = torch.from_numpy(np.nan_to_num(scores, nan=-np.inf).copy())
    s = s[None] if grouped else s[None, None]
    n = scores.shape[-1]
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([int(prompt_tokens)])
    sel = choose_blocks(cfg, s, torch.arange(n), start, end, n)
    kept = selection_mask(sel, n)[0].numpy()
    return kept if grouped else kept[0]


def _config_at(config: dict[str, Any], density: float | Sequence[float]) -> Any:
    """The run's config at one density, or at one per group (their mean as `density`, as the
    session configures a layer of a profile: engine/hf/session.py cfg_for)."""
    from sketchwalk.engine.method.config import SketchWalkConfig

    per = [float(density)] if isinstance(density, int | float) else [float(d) for d in density]
    mean = min(sum(per) / len(per), 1.0)
    cfg = SketchWalkConfig.from_stored({**config, "density": mean})
    return cfg.with_(group_density=tuple(per)) if len(per) > 1 else cfg


@dataclass(frozen=True)
class PreviewBasis:
    """What a layer's preview re-selects from: the scores each selection group ranked
    ([G, n, n]) and each group's density in the run (`densities`, one per group). `why` is
    empty when re-selecting at those densities reproduces the stored selection, else the
    reason it cannot (the page shows it)."""

    scores: np.ndarray
    densities: tuple[float, ...]
    why: str = ""

    def target(self, group: int | None = None) -> float:
        """The run's density for one group, or the layer's (the groups' mean)."""
        if group is not None and 0 <= group < len(self.densities):
            return self.densities[group]
        return sum(self.densities) / len(self.densities)

    def densities_at(self, density: float, group: int | None = None) -> tuple[float, ...]:
        """Every group's density when the shown one (a group's, or the layer's mean) is
        `density`: the stored ones at the run's own target, else scaled in proportion (the
        profile's spread kept; a real re-run reads its profile at the new target instead)."""
        base = self.target(group)
        if density == base:
            return self.densities
        return tuple(min(max(d * density / base, 1e-6), 1.0) for d in self.densities)


GROUPS_NOT_STORED = (
    "This run selected per KV-head group, but per-group scores are stored only up to {limit} "
    "blocks a side (this layer has {n}): the preview ranks the groups' averaged scores once, "
    "so even at the run's own density it can differ from the stored selection."
)


def preview_basis(
    layer_record: dict[str, Any],
    group_records: Sequence[dict[str, Any]],
    method: str,
    config: dict[str, Any],
    metrics: dict[str, Any] | None,
    layer: int,
    group_limit: int = 128,
) -> PreviewBasis | None:
    """The scores and densities a layer's preview selects with (None: the method's scores
    cannot be read from a stored record). A per-group run's records of each group
    (`group_records`, in group order) give the scores each group ranked; its stored group
    densities (the run's metrics `layer_densities`) the budgets."""
    from sketchwalk.engine.method.config import SketchWalkConfig

    cfg = SketchWalkConfig.from_stored({**config, "method": method})
    per_group, walked = cfg.per_group, cfg.effective_beta > 0
    stored = _stored_densities(config, metrics, layer)
    if per_group and group_records:
        scores = [method_scores(r, method, walked) for r in group_records]
        if any(s is None for s in scores):
            return None
        g = len(scores)
        dens = stored if len(stored) == g else (sum(stored) / len(stored),) * g
        return PreviewBasis(np.stack([np.asarray(s, np.float32) for s in scores]), dens)
    scores = method_scores(layer_record, method, walked)
    if scores is None:
        return None
    why = ""
    if per_group:
        why = GROUPS_NOT_STORED.format(limit=group_limit, n=int(layer_record["n_blocks"]))
    mean = sum(stored) / len(stored)
    return PreviewBasis(np.asarray(scores, np.float32)[None], (mean,), why)


def _stored_densities(
    config: dict[str, Any], metrics: dict[str, Any] | None, layer: int
) -> tuple[float, ...]:
    """A layer's densities per group as the run stored them (its layer profile's), else the
    run's density; values that do not parse give the latter (as layer_target)."""
    per = ((metrics or {}).get("layer_densities") or {}) if isinstance(metrics, dict) else {}
    try:
        values = tuple(float(v) for v in per.get(str(layer)) or ())
    except (AttributeError, TypeError, ValueError):
        values = ()
    if values and all(0.0 < v <= 1.0 for v in values):
        return values
    return (float(config.get("density", 0.2)),)


def layer_target(
    config: dict[str, Any], metrics: dict[str, Any] | None, layer: int, group: int | None = None
) -> float:
    """The density a run's selection aimed at in `layer`: its layer profile's (the run's metrics
    `layer_densities`, one per KV-head group; their mean for the whole layer, as the groups are
    equal), else the run's density. Stored or imported metrics that do not parse give the latter."""
    values = _stored_densities(config, metrics, layer)
    if group is not None and 0 <= group < len(values):
        return values[group]
    return sum(values) / len(values)


def method_scores(hm: dict[str, Any], method: str, walked: bool = True) -> np.ndarray | None:
    """The stored scores a method ranks blocks by (the registry's preview), None where a stored
    record cannot reproduce them (methods scoring raw queries and keys). walked False: the run
    selected with the walk off, so a walking method ranked A_l (the sketch estimate); a stored
    walk is then the counterfactual's, shown but never selected on."""
    from sketchwalk.engine.method.methods import REGISTRY

    spec = REGISTRY.get(method)
    if spec is None or spec.preview is None:
        return None
    return hm.get("sketch") if spec.walks and not walked else spec.preview(hm)
