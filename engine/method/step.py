"""What every layer of one forward step shares, built at its first layer and handed down.

The layers of a forward call see the same tokens, padding and selection masks. The session builds
a StepMeta at layer 0 and passes it to each layer's plan, replacing a module-level cache keyed by
tensor contents (a host copy per layer on a GPU, and state shared across runs).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass
class StepMeta:
    """padded: some key of this step is masked out, read once on the host (an all-valid step
    skips every per-layer validity check). once(): a value built at the first layer that asks
    for it; callers key it by everything that can differ between the step's layers."""

    padded: bool
    _built: dict[Hashable, object] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, mask: torch.Tensor | None, key_valid: torch.Tensor) -> StepMeta:
        """From the model's mask (None: no padding, no device read) and the key validity."""
        return cls(padded=mask is not None and not bool(key_valid.all()))

    def once(self, key: Hashable, build: Callable[[], T]) -> T:
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]  # type: ignore[return-value]
