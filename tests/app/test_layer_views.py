"""Tiling against a naive per-tile reference, and the bounded LRU of built layer views."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sketchwalk.app import figures
from sketchwalk.app.figures.tiles import count
from sketchwalk.app.layer_views import LRU, ViewKey


def _naive(z: np.ndarray, view: figures.View, how: str) -> np.ndarray:
    """One tile at a time with nanmax / nanmean: slow, obviously right."""
    t = view.tile
    sub = z[view.q0 : view.q1, view.k0 : view.k1]
    out = np.full((-(-sub.shape[0] // t), -(-sub.shape[1] // t)), np.nan)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            tile = sub[i * t : (i + 1) * t, j * t : (j + 1) * t]
            if not np.isnan(tile).all():
                out[i, j] = np.nanmax(tile) if how == "max" else np.nanmean(tile)
    return out


SHAPES = [  # (n, region or None, max_side): tiles of 1 to 7 blocks, ragged edges included
    (1, None, 4),
    (7, None, 3),
    (10, None, 4),
    (31, None, 8),
    (64, None, 8),
    (65, (3, 60, 0, 64), 8),
    (100, (0, 99, 17, 58), 16),
    (257, None, 256),
    (600, (100, 499, 0, 599), 128),
]


@pytest.mark.parametrize(("n", "region", "max_side"), SHAPES)
def test_tiles_match_a_naive_per_tile_max_and_mean(n, region, max_side):
    rng = np.random.default_rng(n)
    z = rng.random((n, n), dtype=np.float32)
    z[np.triu_indices(n, 1)] = np.nan  # causal: whole tiles above the diagonal are NaN
    z[rng.random((n, n)) < 0.1] = np.nan  # and scattered gaps
    view = figures.plan_view(n, region, max_side)
    for how in ("max", "mean"):
        got = figures.aggregate(z, view, how)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, _naive(z, view, how), rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize(("n", "region", "max_side"), SHAPES)
def test_kept_share_counts_kept_over_causal_blocks_per_tile(n, region, max_side):
    rng = np.random.default_rng(n + 1)
    selected = rng.random((n, n)) < 0.3
    view = figures.plan_view(n, region, max_side)
    causal = figures.causal_mask(n, n)
    assert np.array_equal(count(causal, view), _count_naive(causal, view))
    if not view.tiled:
        return
    fig = figures.mask_view_figure(selected, None, view, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = _naive(np.where(causal, selected, np.nan), view, "mean")
    np.testing.assert_allclose(np.asarray(fig.data[0].z, float), want, rtol=1e-6, equal_nan=True)


def _count_naive(mask: np.ndarray, view: figures.View) -> np.ndarray:
    t = view.tile
    sub = mask[view.q0 : view.q1, view.k0 : view.k1]
    rows, cols = -(-sub.shape[0] // t), -(-sub.shape[1] // t)
    return np.array(
        [
            [sub[i * t : (i + 1) * t, j * t : (j + 1) * t].sum() for j in range(cols)]
            for i in range(rows)
        ]
    ).reshape(rows, cols)


def _key(layer: int, zoom=None) -> ViewKey:
    return ViewKey("db", "run", "prefill", 0, layer, zoom)


def test_lru_keeps_at_most_its_bound_and_drops_the_least_recently_used():
    cache: LRU[str] = LRU(max_entries=3)
    built: list[int] = []

    def get(layer: int) -> str:
        return cache.get(_key(layer), lambda: built.append(layer) or f"layer {layer}")

    for layer in range(3):
        assert get(layer) == f"layer {layer}"
    assert get(0) == "layer 0" and built == [0, 1, 2]  # a hit builds nothing
    get(3)  # over the bound: 1 is the least recently used (0 was just read)
    assert len(cache) == 3
    assert _key(1) not in cache and all(_key(i) in cache for i in (0, 2, 3))
    for layer in range(10, 30):
        get(layer)
        assert len(cache) <= 3
    get(1)
    assert built[-1] == 1  # dropped earlier, so built again


def test_lru_keys_tell_zooms_and_phases_apart_and_refuse_no_room():
    cache: LRU[int] = LRU(max_entries=4)
    assert cache.get(_key(1), lambda: 1) == 1
    assert cache.get(_key(1, (0, 9, 0, 9)), lambda: 2) == 2
    assert cache.get(ViewKey("db", "run", "prefill:g1", 0, 1, None), lambda: 3) == 3
    assert cache.get(_key(1), lambda: 4) == 1
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError):
        LRU(max_entries=0)
