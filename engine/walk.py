"""The walk: block influence propagated across layers, like attention rollout on the block graph.

Convex combinations of row-stochastic lower-triangular matrices stay row-stochastic and lower
triangular, so walk scores are comparable across rows and layers.
"""

from __future__ import annotations

import torch


def walk(a: torch.Tensor, prev: torch.Tensor | None, beta: float, degree: int) -> torch.Tensor:
    """W_l from A_l [..., n, n] and W_{l-1} (None at the first sparse layer).

    state <- (1 - beta) * A + beta * (state @ A), `degree` times. beta = 0 returns A (no walk).
    """
    if beta == 0.0:
        return a
    state = a if prev is None else prev
    for _ in range(degree):
        state = torch.lerp(a, state @ a, beta)
    return state


def walk_row(r: torch.Tensor, a: torch.Tensor, beta: float, degree: int) -> torch.Tensor:
    """Decode: walk one row estimate r [..., n] on A [..., n, n]: s <- (1-beta) r + beta s A."""
    if beta == 0.0:
        return r
    s = r
    for _ in range(degree):
        s = torch.lerp(r, (s.unsqueeze(-2) @ a).squeeze(-2), beta)
    return s
