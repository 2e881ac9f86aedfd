"""Dense attention (engine/hf/dense.py) against a brute-force softmax, for every query layout."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.engine.hf.dense import dense_attention


def _brute(q, k, v, scale, see):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~see, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("lq,lk", [(37, 37), (1, 90), (5, 90), (1, 1)])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_brute_force(lq, lk, padded):
    gen = torch.Generator().manual_seed(lq * 100 + lk + padded)
    q = torch.randn(2, 6, lq, 16, generator=gen)
    k, v = torch.randn(2, 3, lk, 16, generator=gen), torch.randn(2, 3, lk, 16, generator=gen)
    rows = torch.arange(lq)[:, None] + (lk - lq)
    see = torch.arange(lk)[None, :] <= rows  # [lq, lk], bottom-right causal
    see = see.expand(2, 1, lq, lk).clone()
    mask = None
    if padded:  # the second sequence is left-padded by 3 tokens
        see[1, :, :, : min(3, lk - 1)] = False
        mask = see
    got, want = dense_attention(q, k, v, mask, 0.25), _brute(q, k, v, 0.25, see)
    real = see.any(-1).expand(2, 6, lq)  # padding queries see nothing: no defined output
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
