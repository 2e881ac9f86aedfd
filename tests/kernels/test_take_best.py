"""A layer's budget spent best value first in C (kernels/take_best.c) against its torch reference."""

import pytest
import torch

from sketchwalk.kernels.native import library
from sketchwalk.kernels.take_best import take_best, take_best_reference


@pytest.mark.parametrize("seed", range(40))
def test_c_equals_the_reference(seed):
    """Random layers: values with many ties (whole numbers, 0.0 against -0.0) or spread widely
    (the radix levels below the top byte decide), -inf items that cost nothing, costs 1-4,
    budgets from nothing to more than everything, one to three groups, one or two sequences."""
    gen = torch.Generator().manual_seed(seed)
    bsz, groups = 1 + seed % 2, 1 + seed % 3
    n = int(torch.randint(1, 3000, (1,), generator=gen))
    if seed % 4 == 0:  # heavy ties
        value = torch.randint(-3, 4, (bsz, groups, n), generator=gen).float()
        value[value == 0] = torch.where(torch.rand(int((value == 0).sum()), generator=gen) < 0.5,
                                        0.0, -0.0)  # fmt: skip
    elif seed % 4 == 1:  # close values: the cut falls in the low bytes
        value = 1.0 + torch.randint(0, 50, (bsz, groups, n), generator=gen).float() * 1e-7
    else:
        value = torch.randn(bsz, groups, n, generator=gen) * 10.0 ** float(seed % 5 - 2)
    cost = torch.randint(1, 5, (bsz, n), generator=gen).float()
    dead = torch.rand(bsz, n, generator=gen) < 0.2  # tiles that see nothing: no value, no cost
    cost[dead] = 0.0
    value = value.masked_fill(dead[:, None], float("-inf"))
    total = int(cost.sum(-1).max())
    budget = torch.randint(0, total + 20, (bsz, groups), generator=gen)
    if seed % 7 == 0:
        budget[0, 0] = 0
    want = take_best_reference(value, cost, budget)
    got = take_best(value, cost, budget)
    assert library() is not None, "the C kernels need a compiler (CI installs gcc)"
    assert got.dtype == torch.bool and torch.equal(got, want)
    assert not got[value == float("-inf")].any()
    spent = (got.float() * cost[:, None]).sum(-1)
    assert (spent <= budget).all()
