"""The walk: block influence propagated across layers, like attention rollout on the block graph.

Convex combinations of row-stochastic lower-triangular matrices stay row-stochastic and lower
triangular, so walk scores are comparable across rows and layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# The damping a run without the walk is compared against (the published default): every recorded
# run shows what this walk would have scored and selected (engine/method/pipeline.py walk_alternative).
COUNTERFACTUAL_BETA = 0.25


def walk(a: torch.Tensor, prev: torch.Tensor | None, beta: float, degree: int) -> torch.Tensor:
    """W_l from A_l [..., n, n] and W_{l-1} (None at the first sparse layer).

    state <- (1 - beta) * A + beta * (state @ A), `degree` times. beta = 0 returns A (no walk).
    Every state is lower triangular, so the products skip the zero quarter (lower_matmul).
    """
    return walk_rows(a, a, prev, beta, degree, lower_matmul)


def lower_matmul(x: torch.Tensor, a: torch.Tensor, min_n: int = 384) -> torch.Tensor:
    """x @ a for lower-triangular square x, a [..., n, n], from the three nonzero quarters:
    [[X11, 0], [X21, X22]] @ [[A11, 0], [A21, A22]] is four half-size products, half the
    flops of one full one. From min_n blocks on (6k tokens at block 16) the walk is 1.13x /
    1.45x / 1.72x faster at 384 / 461 / 1024 blocks; below, the slicing costs more than it saves."""
    n = a.shape[-1]
    if n < min_n:
        return x @ a
    h = n // 2
    out = x.new_zeros(x.shape)
    x11, x21, x22 = x[..., :h, :h], x[..., h:, :h], x[..., h:, h:]
    a11, a21, a22 = a[..., :h, :h], a[..., h:, :h], a[..., h:, h:]
    out[..., :h, :h] = x11 @ a11
    out[..., h:, :h] = x21 @ a11 + x22 @ a21
    out[..., h:, h:] = x22 @ a22
    return out


def walk_rows(
    a_rows: torch.Tensor,
    a: torch.Tensor,
    prev: torch.Tensor | None,
    beta: float,
    degree: int,
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul,
) -> torch.Tensor:
    """Some rows of W_l: a_rows [..., R, n] are those rows of A_l [..., n, n], prev the same rows
    of W_{l-1}. Row i of W_l only reads row i of W_{l-1} and all of A_l, so a chunk of queries
    after a cache gets exactly the rows a full prefill would compute. product: state @ A (walk
    passes lower_matmul when the rows are all of A)."""
    if beta == 0.0:
        return a_rows
    state = a_rows if prev is None else prev
    for _ in range(degree):
        state = torch.lerp(a_rows, product(state, a), beta)
    return state


def walk_row(r: torch.Tensor, a: torch.Tensor, beta: float, degree: int) -> torch.Tensor:
    """Decode: walk one row estimate r [..., n] on A [..., n, n]: s <- (1-beta) r + beta s A."""
    if beta == 0.0:
        return r
    s = r
    for _ in range(degree):
        s = torch.lerp(r, (s.unsqueeze(-2) @ a).squeeze(-2), beta)
    return s
