"""Density preview: the blocks a layer would keep at another density, from stored scores."""

from __future__ import annotations

from typing import Any

import numpy as np


def selection_rule(
    n: int, prompt_tokens: int, config: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(candidates [n, n], forced [n, n]) of prefill rows, from the engine's own rule
    (engine/select.py): causal candidates; sink, window and dense-tail rows forced."""
    import torch

    from sketchwalk.engine.config import SketchWalkConfig
    from sketchwalk.engine.select import ForcedRule, candidate_mask, forced_mask

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
    density: float,
) -> np.ndarray:
    """[n, n] bool: the blocks a prefill layer would keep at `density`, from stored scores.

    Calls the engine's own selection (engine.pipeline.choose_blocks with the run's config), so
    a preview can never drift from what a real run at that density would select from the same
    scores; tests check it reproduces stored selections. Stored scores are averaged over KV-head
    groups, so for per-group runs the preview is one selection for the layer.
    """
    import torch

    from sketchwalk.engine.config import SketchWalkConfig
    from sketchwalk.engine.pipeline import choose_blocks
    from sketchwalk.engine.select import selection_mask

    cfg = SketchWalkConfig.from_stored({**config, "density": float(density)})
    scores = np.asarray(scores, dtype=np.float32)
    n = scores.shape[-1]
    s = torch.from_numpy(np.nan_to_num(scores, nan=-np.inf).copy())
    start, end = torch.zeros(1, dtype=torch.long), torch.tensor([int(prompt_tokens)])
    sel = choose_blocks(cfg, s[None, None], torch.arange(n), start, end, n)
    return selection_mask(sel, n)[0, 0].numpy()


def layer_target(
    config: dict[str, Any], metrics: dict[str, Any] | None, layer: int, group: int | None = None
) -> float:
    """The density a run's selection aimed at in `layer`: its layer profile's (the run's metrics
    `layer_densities`, one per KV-head group; their mean for the whole layer, as the groups are
    equal), else the run's density. Stored or imported metrics that do not parse give the latter."""
    fallback = float(config.get("density", 0.2))
    per = (metrics or {}).get("layer_densities") or {}
    try:
        values = [float(v) for v in per.get(str(layer)) or ()]
    except (AttributeError, TypeError, ValueError):
        return fallback
    if not values or not all(0.0 < v <= 1.0 for v in values):
        return fallback
    if group is not None and 0 <= group < len(values):
        return values[group]
    return sum(values) / len(values)


def method_scores(hm: dict[str, Any], method: str) -> np.ndarray | None:
    """The stored scores a method ranks blocks by (the registry's preview), None where a stored
    record cannot reproduce them (methods scoring raw queries and keys)."""
    from sketchwalk.engine.methods import REGISTRY

    spec = REGISTRY.get(method)
    return None if spec is None or spec.preview is None else spec.preview(hm)
