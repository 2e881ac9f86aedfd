"""A prefill's sketch of many rows in C (kernels/hadamard.py) against its torch reference."""

import pytest
import torch

from sketchwalk.engine.method.sketch import make_srht
from sketchwalk.kernels import hadamard
from sketchwalk.kernels.hadamard import srht_rows, srht_rows_reference


def _args(srht):
    """srht_rows' sketch arguments for an engine SRHT (keep None when every coordinate is)."""
    m, r = srht.padded_dim, srht.keep.shape[0]
    return srht.signs, None if r == m else srht.keep, srht.scale / m**0.5


@pytest.mark.parametrize("seed", range(16))
def test_c_equals_the_product_on_random_shapes(seed, monkeypatch):
    gen = torch.Generator().manual_seed(seed)
    d, r = [(64, 128), (64, 32), (80, 64), (128, 128), (8, 8), (12, 4), (256, 96), (33, 16)][
        seed % 8
    ]
    bsz, h = [(1, 3), (2, 2), (3, 1)][seed % 3]
    length = [1, 31, 32, 95, 300][seed % 5]
    b = [0, 16, 32, 7][seed % 4]
    if seed % 2:  # as the model hands queries: a transposed [B, L, H, d] view
        x = torch.randn(bsz, length, h, d, generator=gen).transpose(1, 2)
    else:
        x = torch.randn(bsz, h, length, d, generator=gen)
    weights = (torch.rand(bsz, length, generator=gen) > 0.3).float() if seed % 3 == 0 else None
    if seed % 4 == 1:  # several threads, each its own blocks
        monkeypatch.setattr(hadamard, "_PART_ROWS", 1)
        monkeypatch.setattr(hadamard, "workers", lambda: 3)
    srht = make_srht(d, r, seed, 2)
    got = srht_rows(x, *_args(srht), b, weights)
    want = srht_rows_reference(x, srht.matrix, b, weights)
    assert got is not None
    for a, w in zip(got, want, strict=True):
        if w is None:
            assert a is None
            continue
        assert a.shape == w.shape
        assert torch.allclose(a, w, atol=1e-4, rtol=1e-4), float((a - w).abs().max())


def test_the_reference_pools_what_block_pool_pools():
    from sketchwalk.engine.method.sketch import block_pool

    gen = torch.Generator().manual_seed(3)
    x, valid = torch.randn(2, 3, 70, 16, generator=gen), torch.rand(2, 70, generator=gen) > 0.4
    matrix = torch.randn(16, 8, generator=gen)
    y, sums, squares = srht_rows_reference(x, matrix, 32, valid)
    assert torch.allclose(sums, block_pool(x @ matrix, 32, valid)[0], atol=1e-5)
    assert torch.allclose(squares, block_pool((x @ matrix) ** 2, 32, valid)[0], atol=1e-5)


def test_where_c_does_not_apply_it_says_none(monkeypatch):
    srht = make_srht(16, 16, 0, 0)
    x = torch.randn(1, 2, 40, 16)
    assert srht_rows(x.bfloat16(), *_args(srht)) is None
    strided = torch.randn(1, 2, 16, 40).transpose(-1, -2)  # coordinates not contiguous
    assert srht_rows(strided, *_args(srht)) is None
    with pytest.raises(ValueError, match="24 coordinates"):
        srht_rows(torch.randn(1, 1, 3, 24), *_args(srht))
    small = make_srht(4, 4, 0, 0)  # padded to 4 < 8 coordinates
    assert srht_rows(torch.randn(1, 1, 40, 4), *_args(small)) is None
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert srht_rows(x, *_args(srht)) is None
