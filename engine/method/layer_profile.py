"""Layer profiles: how a model's density budget is spread over its sparse layers and KV heads.

Why: one density everywhere spends the same on heads whose attention sits on a few blocks as on
heads that spread it wide. Ranking the exact block masses of *all* layers and selection groups
together (one budget for the model instead of one per layer) gives some of them ten times the
share of others, and selection with that spread lowered KL at density 0.2 on every text
measured (docs/quality.md). A profile is calibrated once per model on a text with the dense
model's exact attention (`sketchwalk calibrate`), stored as the densities per layer and group at
a grid of targets, and read at run time for any target, always keeping the mean at the target,
so the achieved density does not move (except where a small share is below what a short
context's forced blocks take: that group keeps them, a little over its share).

Profiles are found by the model's architecture fingerprint, first in the user's directory
($SKETCHWALK_PROFILES, default ~/.cache/sketchwalk/profiles), then among the ones shipped here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sketchwalk.engine.method.select import Offers
from sketchwalk.errors import SketchWalkError

FORMAT = 1
TARGETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
SHIPPED = Path(__file__).with_name("profiles")


class ProfileError(SketchWalkError):
    """A profile file is unreadable or inconsistent; one line for the user."""


@dataclass(frozen=True)
class LayerProfile:
    """Per sparse layer and selection group (KV head), the density it gets at each target in
    `targets` (ascending). The mean over all of them is the target at every grid point (to
    within the last item that did not fit), except where a text's forced blocks alone are more."""

    fingerprint: str
    targets: tuple[float, ...]
    densities: dict[int, tuple[tuple[float, ...], ...]]  # layer -> per group, density per target
    source: str = ""  # what it was calibrated on (model, text, tokens)

    def at(self, target: float) -> dict[int, tuple[float, ...]]:
        """Each layer's densities per group for `target` in (0, 1]; their mean follows the
        grid's means (the target itself, see the class docstring).

        Between grid targets the densities are interpolated linearly (a mean-preserving mix);
        below the grid they scale down from its first target, above it they move linearly from
        its last target to all-dense at 1."""
        return {
            layer: tuple(_read(self.targets, d, target) for d in groups)
            for layer, groups in self.densities.items()
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "source": self.source,
            "targets": list(self.targets),
            "densities": {str(k): [list(g) for g in v] for k, v in sorted(self.densities.items())},
        }

    @classmethod
    def from_json(cls, d: Any) -> LayerProfile:
        """Checked field by field: profile files may come from anywhere."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ProfileError(f"not a layer profile of format {FORMAT}")
        fp, src, targets, dens = (
            d.get(k) for k in ("fingerprint", "source", "targets", "densities")
        )
        if not isinstance(fp, str) or not isinstance(src, str):
            raise ProfileError("a layer profile needs a fingerprint and a source (strings)")
        if not _numbers(targets) or not targets or list(targets) != sorted(set(targets)):
            raise ProfileError("layer profile targets must be ascending distinct numbers")
        if not all(0.0 < x < 1.0 for x in targets):
            raise ProfileError("layer profile targets must lie in (0, 1)")
        if not isinstance(dens, dict) or not dens:
            raise ProfileError("a layer profile needs densities for at least one layer")
        out: dict[int, tuple[tuple[float, ...], ...]] = {}
        for key, groups in dens.items():
            if not (isinstance(key, str) and key.isdigit() and len(key) < 6):
                raise ProfileError(f"layer profile: bad layer id {key!r}")
            if not isinstance(groups, list) or not 0 < len(groups) <= 1024:
                raise ProfileError(f"layer profile: layer {key} needs a list of groups")
            for row in groups:
                if not _numbers(row) or len(row) != len(targets):
                    raise ProfileError(f"layer profile: layer {key} needs one density per target")
                if not all(0.0 < x <= 1.0 for x in row):
                    raise ProfileError(f"layer profile: layer {key} has a density outside (0, 1]")
            out[int(key)] = tuple(tuple(float(x) for x in row) for row in groups)
        return cls(fp, tuple(float(x) for x in targets), out, src)


def _read(t: tuple[float, ...], d: tuple[float, ...], target: float) -> float:
    """One group's density at target from its densities d at the grid targets t."""
    if target in t:
        v = d[t.index(target)]
    elif target < t[0]:
        v = d[0] * target / t[0]
    elif target >= t[-1]:
        v = d[-1] + (target - t[-1]) / (1.0 - t[-1]) * (1.0 - d[-1])
    else:
        i = next(i for i in range(1, len(t)) if target <= t[i])
        w = (target - t[i - 1]) / (t[i] - t[i - 1])
        v = d[i - 1] + w * (d[i] - d[i - 1])
    return min(max(v, 1e-6), 1.0)


def _numbers(x: Any) -> bool:
    return isinstance(x, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x
    )


def fingerprint(model_config: Any) -> str:
    """The architecture a profile belongs to: type, layers, width, heads, KV heads, vocabulary
    (a base model and its instruct tune share it, and their attention alike)."""
    c = model_config
    heads = getattr(c, "num_attention_heads", 0)
    kv = getattr(c, "num_key_value_heads", None) or heads
    return (
        f"{getattr(c, 'model_type', 'model')}-{getattr(c, 'num_hidden_layers', 0)}L-"
        f"{getattr(c, 'hidden_size', 0)}d-{heads}h{kv}kv-{getattr(c, 'vocab_size', 0)}v"
    )


def user_dir() -> Path:
    return Path(os.environ.get("SKETCHWALK_PROFILES") or Path.home() / ".cache/sketchwalk/profiles")


def load(path: str | Path) -> LayerProfile:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read layer profile {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"layer profile {path} is not JSON: {exc.msg}") from None
    return LayerProfile.from_json(data)


def save(profile: LayerProfile, path: str | Path | None = None) -> Path:
    """Write the profile (default: the user directory, named by its fingerprint), atomically."""
    path = Path(path) if path is not None else user_dir() / f"{profile.fingerprint}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    d = profile.to_json()
    rows = [
        f"  {json.dumps(k)}: {json.dumps([[round(x, 6) for x in g] for g in v])}"
        for k, v in d.pop("densities").items()
    ]
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in d.items()]
    text = "{\n" + "\n".join(head) + '\n "densities": {\n' + ",\n".join(rows) + "\n }\n}\n"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def find(fp: str) -> LayerProfile | None:
    """The profile for an architecture fingerprint: the user's, else a shipped one, else None."""
    for d in (user_dir(), SHIPPED):
        path = d / f"{fp}.json"
        if path.is_file():
            return load(path)
    return None


def layer_densities(cfg: Any, model_config: Any) -> dict[int, tuple[float, ...]]:
    """Per-layer densities for a run of config cfg ({}: every sparse layer at cfg.density): with
    layer_profile "auto", the model's profile where one exists, one density per selection group
    (their mean where the run selects once per layer or the groups do not match). Layers the run
    keeps dense drop out (a profile calibrated with other dense layers then averages a little
    off the target; the achieved density is measured either way)."""
    if cfg.layer_profile != "auto" or cfg.method == "dense" or model_config is None:
        return {}
    profile = find(fingerprint(model_config))
    if profile is None:
        return {}
    heads = getattr(model_config, "num_attention_heads", 0)
    groups = cfg.groups(getattr(model_config, "num_key_value_heads", None) or heads)
    out = {}
    for layer, d in profile.at(cfg.density).items():
        if not cfg.is_dense_layer(layer):
            out[layer] = d if len(d) == groups else (sum(d) / len(d),)
    return out


# ---- calibration: one budget for all layers --------------------------------------------------


def allocate(
    offers: dict[int, Offers], targets: tuple[float, ...] = TARGETS
) -> dict[int, tuple[tuple[float, ...], ...]]:
    """Densities per layer, group and target from every sparse layer's offers (tile_offers of
    its exact block mass, batch element 0): the items of all layers and groups ranked together
    by value and bought while the whole model's budget (target x candidates - forced, summed over
    layers and groups) lasts; a group's share is its forced and bought pairs over its candidates
    (the full spread: moved halfway back to the target, it did worse once groups had their own
    shares, docs/quality.md). Forced pairs are always in a share: where they alone exceed the
    budget, nothing else is bought."""
    layers = sorted(offers)
    owners = [(li, g) for li in layers for g in range(offers[li].value.shape[1])]
    # ranked on the host, one copy each: a calibration on a GPU hands over device tensors, and
    # the owners and shares below are host tensors (mixed, they failed on CUDA)
    value = torch.cat([offers[li].value[0, g] for li, g in owners]).double().cpu()
    cost = torch.cat([offers[li].cost[0] for li, g in owners]).double().cpu()
    owner = torch.cat(
        [torch.full((offers[li].cost.shape[1],), i) for i, (li, g) in enumerate(owners)]
    )
    cand = torch.stack([offers[li].candidates[0] for li, _ in owners]).double().cpu()
    forced = torch.stack([offers[li].forced[0] for li, _ in owners]).double().cpu()
    order = value.argsort(descending=True, stable=True)
    order = order[value[order] > -math.inf]
    paid = cost[order].cumsum(0)
    shares: list[list[float]] = [[] for _ in owners]
    for t in targets:
        kept = order[paid <= float((t * cand - forced).sum())]
        bought = torch.zeros(len(owners), dtype=torch.float64).index_add_(
            0, owner[kept], cost[kept]
        )
        dens = (forced + bought) / cand.clamp(min=1.0)
        for i, d in enumerate(dens.clamp(1e-6, 1.0).tolist()):
            shares[i].append(d)
    return {
        li: tuple(tuple(shares[i]) for i, (lj, _) in enumerate(owners) if lj == li) for li in layers
    }
