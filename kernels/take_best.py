"""A layer's budget spent best value first (take_best.c), beside its torch reference.

Why: the layer budget (engine/method/select.py group_budget_keep) buys (tile, key block) items
best value first until the budget is spent. In torch that is a topk over every item, then a
gather, a cumulative sum and a scatter of its order: ~7 ms a layer at 7k tokens and ~20 ms at
16k, a tenth of the selection there. The C kernel finds the cut by a radix select weighted by
cost, without ordering the items. `take_best` runs it on CPU where the library is built, the
reference elsewhere.
"""

from __future__ import annotations

import math

import torch

from .native import library


def best_first(value: torch.Tensor, k: int) -> torch.Tensor:
    """The first k of value.argsort(-1, descending=True, stable=True) for float32 value [..., N]
    (ties in index order), as one topk over int64 keys (the value's bits made monotone, then the
    index): the full stable sort of a layer's ~27k offers per group took ~5 ms at 7k tokens,
    the topk of the ~20% a budget can buy ~1.5 ms."""
    n = value.shape[-1]
    bits = (value + 0.0).view(torch.int32).long()  # + 0.0: -0.0 becomes 0.0, a tie as in sort
    order = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: reversed
    idx = torch.arange(n - 1, -1, -1, device=value.device)  # earlier index, larger key
    return ((order << 32) | idx).topk(min(k, n), dim=-1).indices


def take_best_reference(
    value: torch.Tensor, cost: torch.Tensor, budget: torch.Tensor
) -> torch.Tensor:
    """value [B, G, N] float32, cost [B, N] whole numbers >= 1 where the value is above -inf,
    budget [B, G] integers -> kept [B, G, N] bool: items in best_first order taken while the
    running cost stays within the group's budget (never over), at most budget.max() of them, none
    whose value is -inf."""
    bsz, groups, n = value.shape
    order = best_first(value, int(budget.max()) if budget.numel() else 0)
    paid = cost[:, None].expand(bsz, groups, -1).gather(-1, order).cumsum(-1)
    live = (paid <= budget[:, :, None].double()) & (value.gather(-1, order) > -math.inf)
    keep = torch.zeros(bsz, groups, n, dtype=torch.bool, device=value.device)
    return keep.scatter_(-1, order, live)


def take_best(value: torch.Tensor, cost: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """take_best_reference, in C on CPU where it can be."""
    lib = library() if value.device.type == "cpu" else None
    if lib is None or value.dtype != torch.float32 or cost.dtype != torch.float32:
        return take_best_reference(value, cost, budget)
    bsz, groups, n = value.shape
    v, c = value.contiguous(), cost.contiguous()
    b = budget.to(torch.int64).contiguous()
    cap = int(b.max()) if b.numel() else 0
    keep = torch.empty(bsz, groups, n, dtype=torch.bool)
    if lib.take_best_f32(v.data_ptr(), c.data_ptr(), bsz * groups, groups, n, b.data_ptr(), cap,
                         keep.data_ptr()) != 0:  # fmt: skip
        raise MemoryError(f"take_best: no memory for the keys of {n} items")
    return keep
