"""The knobs of one Sketch&Walk run, validated once so every later stage can trust them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from sketchwalk.errors import SketchWalkError

METHODS = ("sketchwalk", "nowalk", "oracle", "streaming", "quest", "xattention", "dense")
PHASES = ("prefill", "decode", "both")


class ConfigError(SketchWalkError):
    """A knob is out of range; the message is one line meant for the user."""


@dataclass(frozen=True)
class SketchWalkConfig:
    """Defaults are the published ones (shared/SKETCHWALK.md), with density 0.2.

    sink and window are fractions of the context length; dense_layers lists layer indices that
    always run dense attention; dense_tail_blocks is how many final query blocks stay dense in
    prefill. per_group selects blocks per KV-head group instead of once per layer.
    """

    block_size: int = 64
    sketch_dim: int = 128
    tau: float = 1.0
    beta: float = 0.25
    degree: int = 3
    density: float = 0.2
    sink: float = 0.025
    window: float = 0.05
    query_window: int = 32
    dense_layers: tuple[int, ...] = (0, 1)
    dense_tail_blocks: int = 4
    phases: str = "both"
    method: str = "sketchwalk"
    per_group: bool = False
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense_layers", tuple(int(x) for x in self.dense_layers))
        self.validate()

    def validate(self) -> None:
        b = self.block_size
        if not isinstance(b, int) or b < 1 or b & (b - 1):
            raise ConfigError(f"block size must be a positive power of two, got {b}")
        if self.sketch_dim < 1:
            raise ConfigError(f"sketch dim must be at least 1, got {self.sketch_dim}")
        if not (0.0 < self.density <= 1.0) or math.isnan(self.density):
            raise ConfigError(f"density must be in (0, 1], got {self.density}")
        if not (0.0 <= self.beta <= 1.0):
            raise ConfigError(f"beta (walk damping) must be in [0, 1], got {self.beta}")
        if self.degree < 1:
            raise ConfigError(f"walk degree must be at least 1, got {self.degree}")
        if not (self.tau > 0.0):
            raise ConfigError(f"tau (temperature) must be positive, got {self.tau}")
        for name in ("sink", "window"):
            v = getattr(self, name)
            if not (0.0 <= v <= 1.0):
                raise ConfigError(f"{name} must be a fraction of the context in [0, 1], got {v}")
        if self.query_window < 1:
            raise ConfigError(f"query window must be at least 1, got {self.query_window}")
        if self.dense_tail_blocks < 0:
            raise ConfigError(f"dense tail blocks must be >= 0, got {self.dense_tail_blocks}")
        if any(x < 0 for x in self.dense_layers):
            raise ConfigError(f"dense layers must be non-negative indices, got {self.dense_layers}")
        if self.phases not in PHASES:
            raise ConfigError(f"phase must be one of {', '.join(PHASES)}, got {self.phases!r}")
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def effective_beta(self) -> float:
        """nowalk is Sketch&Walk with the walk switched off (the per-layer baseline)."""
        return 0.0 if self.method == "nowalk" else self.beta

    def sparse_in(self, phase: str) -> bool:
        return self.method != "dense" and self.phases in (phase, "both")

    def is_dense_layer(self, layer: int) -> bool:
        return self.method == "dense" or layer in self.dense_layers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dense_layers"] = list(self.dense_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SketchWalkConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**d)

    def with_(self, **changes: Any) -> SketchWalkConfig:
        return replace(self, **changes)
