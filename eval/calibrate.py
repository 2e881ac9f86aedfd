"""Calibrate a model's layer profile from the dense model's exact attention on a text.

One dense prefill; at every layer the config would run sparse, the exact block mass, pooled as
the config pools (`pool`), is turned into what that layer's budget could buy (engine/method/select.py
tile_offers, the items the selection ranks) and the items of all layers are ranked together
(engine/method/layer_profile.py allocate).
"""

from __future__ import annotations

import torch

from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.layer_profile import TARGETS, LayerProfile, allocate, fingerprint
from sketchwalk.engine.method.pipeline import layer_exact
from sketchwalk.engine.method.select import ForcedRule, Offers, Tiles, budget_masks, tile_offers
from sketchwalk.engine.method.sketch import key_span
from sketchwalk.engine.run.recorder import LayerStep, RecorderOptions
from sketchwalk.engine.run.timing import last_logits_only
from sketchwalk.errors import SketchWalkError


class OfferCollector:
    """Stands in for the recorder in a dense prefill: keeps each sparse layer's offers."""

    options = RecorderOptions(time_dense=False, decode=False, walk_max_blocks=0)

    def __init__(self, cfg: SketchWalkConfig):
        self.cfg = cfg
        self.offers: dict[int, Offers] = {}

    def observes(self, phase: str) -> bool:
        return phase == "prefill"

    def wants_exact(self, lk: int) -> bool:
        """No: the session's exact mass is the recorder's mean mass, and the offers need the
        mass pooled as the selection pools, so record() computes that once, sparse layers only."""
        return False

    def record(self, obs: LayerStep) -> None:
        cfg = self.cfg
        if cfg.is_dense_layer(obs.layer):
            return
        # rank what the selection will rank (max-pooled offers: KL -14 to -38%, docs/quality.md)
        exact = layer_exact(obs.q[:1], obs.k[:1], obs.key_valid[:1], obs.scale, cfg)
        rows = torch.arange(exact.shape[2], device=exact.device)
        start, end = key_span(obs.key_valid[:1])
        cand, forced, tiles, _ = budget_masks(
            exact.shape, rows, ForcedRule.of(cfg), start, end, row_group=cfg.rows_per_list
        )
        tiles = Tiles.rows(rows.numel(), rows.device) if tiles is None else tiles
        self.offers[obs.layer] = tile_offers(exact, cand, forced, tiles, cfg.pool)


@torch.no_grad()
def calibrate(
    model, ids: torch.Tensor, cfg: SketchWalkConfig | None = None, source: str = ""
) -> LayerProfile:
    """The layer profile of `model` from a dense prefill of ids [1, T] with cfg's selection
    knobs (block size, query tiles, sink, window, dense layers, groups)."""
    cfg = cfg or SketchWalkConfig()
    if cfg.method == "dense":
        raise SketchWalkError("calibrate a sparse config: method dense has no layer budget")
    if ids.shape[0] != 1 or ids.shape[1] < 4 * cfg.block_size:
        raise SketchWalkError(
            f"calibration needs one text of at least {4 * cfg.block_size} tokens, "
            f"got {ids.shape[1]}"
        )
    collector = OfferCollector(cfg)
    previous = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        with sketch_walk_session(cfg.with_(method="dense"), recorder=collector):
            model(ids, **last_logits_only(model))  # attention is all it reads
    finally:
        model.set_attn_implementation(previous)
    if not collector.offers:
        raise SketchWalkError("no sparse layer to calibrate (every layer is dense)")
    return LayerProfile(fingerprint(model.config), TARGETS, allocate(collector.offers), source)
