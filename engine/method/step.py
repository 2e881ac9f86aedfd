"""The step plan: what every layer of one forward step shares, decided once at its first layer.

The layers of a forward call see the same tokens, padding and selection budget. The session
(engine/hf/session.py) builds a `StepPlan` at layer 0 (phase, validity, sequence starts, key
span, backend) and hands it to every layer's plan, as vLLM builds its attention metadata once
per batch; layers then read it instead of deriving it again from their tensors (each derivation
a device read on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from sketchwalk.engine.method.sketch import key_span

T = TypeVar("T")


@dataclass
class StepPlan:
    """One forward step's shared values.

    phase: "prefill", "decode" or "chunk"; step: the decode step's index (0 in a prefill);
    key_valid [B, Lk]: the real keys; padded: some key is masked out, read once on the host (an
    all-valid step skips every per-layer validity check); backend: the kernel backend every
    layer runs (None: the device's default). once(): a value built at the first layer that asks
    for it, keyed by everything that can differ between the step's layers (the budget masks)."""

    phase: str
    step: int
    key_valid: torch.Tensor
    padded: bool
    backend: str | None = None
    _built: dict[Hashable, object] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        valid: torch.Tensor,
        phase: str = "prefill",
        step: int = 0,
        may_pad: bool = True,
        backend: str | None = None,
    ) -> StepPlan:
        """From the step's key validity; may_pad False: the caller knows every key is real (no
        mask), so nothing is read from the device."""
        return cls(phase, step, valid, may_pad and not bool(valid.all()), backend)

    def starts(self, valid: torch.Tensor | None = None) -> torch.Tensor | None:
        """Each sequence's first real key [B] (the kernels' seq_start) where the step is padded,
        else None; valid: a layer's own validity (default the step's), once per step."""
        if not self.padded:
            return None
        v = self.key_valid if valid is None else valid
        return self.once(("starts", id(v)), lambda: v.float().argmax(dim=1))

    def span(self, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """First and one-past-last real key per sequence (key_span), once per step."""
        v = self.key_valid if valid is None else valid
        return self.once(("span", id(v)), lambda: key_span(v))

    def once(self, key: Hashable, build: Callable[[], T]) -> T:
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]  # type: ignore[return-value]
