"""The FlexAttention peer of `bench attention --flex` computes what our lists describe."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.benchmarks.flex import block_mask
from sketchwalk.kernels import block_sparse_attention_reference
from sketchwalk.kernels.testing import random_block_index, random_qkv


@pytest.mark.parametrize(
    "heads,kv,groups,t,block",
    [(4, 2, 1, 96, 16), (6, 2, 2, 128, 32), (4, 4, 4, 200, 16), (2, 1, 1, 64, 64)],
)
def test_block_mask_from_lists_matches_reference(heads, kv, groups, t, block):
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(t + block)
    q, k, v = random_qkv(1, heads, kv, t, t, 16, torch.float32, gen)
    idx, cnt = random_block_index(1, groups, t, t, block, 0.4, gen)
    mask = block_mask(idx, cnt, block, heads, t, t)
    got = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)  # eager: no compile in tests
    want = block_sparse_attention_reference(q, k, v, idx, cnt, block)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
