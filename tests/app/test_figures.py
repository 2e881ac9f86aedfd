"""app/figures/: pure functions from store data to plotly figures, checked on real stored runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sketchwalk.app import figures
from sketchwalk.store import open_store


@pytest.fixture(scope="module")
def stored(seeded):
    url, ids = seeded
    store = open_store(url)
    yield store, ids
    store.close()


def _sparse_layer(store, run_id) -> int:
    steps = store.steps(run_id)
    return int(steps[(steps["phase"] == "prefill") & ~steps["dense"]]["layer"].iloc[0])


def test_escape_text_blocks_html_and_keeps_it_visible():
    out = figures.escape_text("<script>alert(1)</script>\n&<img src=x onerror=alert(2)>")
    assert "<" not in out and ">" not in out
    assert out.startswith("&lt;script&gt;alert(1)&lt;/script&gt;⏎&amp;&lt;img")
    assert figures.escape_text("abcdef", 4) == "abc…"


def test_block_labels_are_unique_escaped_and_name_the_span():
    blocks = pd.DataFrame(
        {"block": [0, 1], "token_start": [0, 16], "token_end": [16, 20], "text": ["<b>x</b>", "y"]}
    )
    labels = figures.block_labels(blocks, 3)
    assert labels[0] == "B0 · t0-15 · «&lt;b&gt;x&lt;/b&gt;»"
    assert labels[1].startswith("B1 · t16-19")
    assert labels[2] == "B2" and len(set(labels)) == 3


def test_layer_figures_have_the_stored_matrices(stored):
    store, ids = stored
    rid = ids["sketchwalk"]
    layer = _sparse_layer(store, rid)
    hm = store.heatmap(rid, "prefill", 0, layer)
    n = hm["n_blocks"]
    figs = figures.layer_figures(hm, store.blocks(rid), log=False)
    assert set(figs) == {"sketch", "walk", "exact", "mask"}
    for name in ("sketch", "walk", "exact"):
        z = np.asarray(figs[name].data[0].z, dtype=np.float32)
        assert z.shape == (n, n)
        np.testing.assert_allclose(z, hm[name], equal_nan=True)
        assert np.isnan(z[0, 1])  # non-causal cells are blank
    mask = np.asarray(figs["mask"].data[0].z, dtype=np.float32)
    assert np.nansum(mask) == hm["selected"].sum()
    assert figs["sketch"].data[0].x[0].startswith("B0 · t0-15")
    log = figures.layer_figures(hm, None, log=True)["exact"].data[0].z
    assert np.nanmin(log) >= np.log10(figures.LOG_FLOOR) - 1e-6


def test_dense_layer_has_no_walk_or_mask(stored):
    store, ids = stored
    hm = store.heatmap(ids["sketchwalk"], "prefill", 0, 0)
    figs = figures.layer_figures(hm, None)
    assert "walk" not in figs and "mask" not in figs and "sketch" in figs


def test_misses_are_unselected_blocks_with_large_exact_mass():
    exact = np.array([[1.0, np.nan], [0.3, 0.7]])
    selected = np.array([[True, False], [False, True]])
    rows, cols = figures.find_misses(exact, selected, 0.25)
    assert rows.tolist() == [1] and cols.tolist() == [0]
    fig = figures.mask_figure(
        selected, figures.causal_mask(2, 2), ["a", "b"], ["a", "b"], misses=(rows, cols)
    )
    assert len(fig.data[1].x) == 1 and "misses (1)" in fig.data[1].name


@pytest.mark.parametrize("density", [0.05, 0.2, 0.37, 0.6, 1.0])
def test_preview_keeps_exactly_the_budget(stored, density):
    store, ids = stored
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    hm = store.heatmap(rid, "prefill", 0, _sparse_layer(store, rid))
    n = hm["n_blocks"]
    config = {**run["config"], "budget": "row"}  # the per-row rule (the layer rule: below)
    kept = figures.preview_selection(hm["walk"], run["prompt_tokens"], config, density)
    cand, forced = figures.selection_rule(n, run["prompt_tokens"], config)
    assert not (kept & ~cand).any() and not (forced & ~kept).any()
    counts = kept.sum(1)
    i = np.arange(n)
    # the budget: max(forced, ceil(rate * (i + 1))) for one rate <= density (the engine lowers the
    # rate so forced blocks are paid for by the other rows) ...
    plain = np.maximum(forced.sum(1), np.ceil(density * (i + 1) - 1e-9))
    assert (counts <= plain).all()
    free = counts > forced.sum(1)
    rates = np.ceil(np.linspace(0, density, 2001)[:, None] * (i + 1) - 1e-9)
    fits = (np.maximum(forced.sum(1), rates) == counts).all(1)
    assert fits.any(), "per-row counts do not follow one rate"
    # ... and the whole selection lands on the target density unless forced blocks exceed it
    assert kept.sum() <= max(np.ceil(density * cand.sum()), forced.sum())
    if density == 1.0:
        assert (kept == cand).all()
    # the non-forced kept blocks are the top walk scores of their row
    for r in np.nonzero(free)[0]:
        loose = cand[r] & ~forced[r]
        if (loose & ~kept[r]).any():
            assert hm["walk"][r][loose & kept[r]].min() >= hm["walk"][r][loose & ~kept[r]].max()


@pytest.mark.parametrize("density", [0.05, 0.2, 0.37, 0.6, 1.0])
def test_layer_budget_preview_keeps_the_top_scores_of_the_layer(stored, density):
    store, ids = stored
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    hm = store.heatmap(rid, "prefill", 0, _sparse_layer(store, rid))
    config = {**run["config"], "budget": "layer", "query_block": 0}  # one list per block row
    kept = figures.preview_selection(hm["walk"], run["prompt_tokens"], config, density)
    cand, forced = figures.selection_rule(hm["n_blocks"], run["prompt_tokens"], config)
    assert not (kept & ~cand).any() and not (forced & ~kept).any()
    assert kept.sum() == max(int(np.floor(density * cand.sum() + 1e-9)), forced.sum())
    loose = cand & ~forced
    walk = np.nan_to_num(np.asarray(hm["walk"]), nan=-np.inf)
    if (loose & kept).any() and (loose & ~kept).any():
        assert walk[loose & kept].min() >= walk[loose & ~kept].max()


def test_preview_at_the_run_density_reproduces_the_engine_selection(stored):
    store, ids = stored
    for name in ("sketchwalk", "nowalk"):
        rid = ids[name]
        run = store.get_run(rid)
        steps = store.steps(rid)
        sparse = steps[(steps["phase"] == "prefill") & ~steps["dense"]]["layer"]
        for layer in sparse:
            hm = store.heatmap(rid, "prefill", 0, int(layer))
            kept = figures.preview_selection(
                figures.method_scores(hm, run["method"]),
                run["prompt_tokens"],
                run["config"],
                run["config"]["density"],
            )
            np.testing.assert_array_equal(kept, hm["selected"])


def test_layer_curves_and_depth_view(stored):
    store, ids = stored
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    stats = store.layer_stats(rid, "prefill")
    fig = figures.layer_curves(stats, 2)
    names = {t.name for t in fig.data}
    assert {"achieved density", "mass recall"} <= names
    assert len(fig.data[0].x) == len(stats)
    targets = {3: 0.3, 2: 0.1}
    dashed = figures.layer_curves(stats, 2, targets)
    line = next(t for t in dashed.data if t.name == "target density (layer profile)")
    assert list(line.x) == [2, 3] and list(line.y) == [0.1, 0.3]
    layers = [(int(x), store.heatmap(rid, "prefill", 0, int(x))) for x in stats["layer"]]
    n = layers[0][1]["n_blocks"]
    depth = figures.depth_matrices(layers, n - 1, run["prompt_tokens"], run["config"])
    sparse = stats[~stats["dense"]]["layer"].tolist()
    assert depth["layers"] == sparse
    assert depth["walk"].shape == (len(sparse), n)
    assert not (depth["rescued"] & ~depth["selected"]).any()
    dfigs = figures.depth_figures(depth, store.blocks(rid))
    assert set(dfigs) == {"sketch", "walk", "exact"}
    assert np.asarray(dfigs["walk"].data[0].z).shape == (len(sparse), n)


def test_layer_target_reads_the_run_layer_profile():
    config = {"density": 0.2}
    metrics = {"layer_densities": {"3": [0.1, 0.2, 0.45]}}
    assert figures.layer_target(config, metrics, 3) == pytest.approx(0.25)
    assert figures.layer_target(config, metrics, 3, group=2) == pytest.approx(0.45)
    assert figures.layer_target(config, metrics, 3, group=7) == pytest.approx(0.25)
    assert figures.layer_target(config, metrics, 4) == 0.2  # a layer the profile leaves out
    assert figures.layer_target(config, {"layer_densities": None}, 3) == 0.2  # uniform run
    for bad in ({"3": "x"}, {"3": [0.0]}, {"3": [2.0]}, {"3": 5}, [1, 2]):
        assert figures.layer_target(config, {"layer_densities": bad}, 3) == 0.2


def test_depth_view_previews_each_layer_at_its_profile_density(stored):
    """At a profile density of 1 the per-layer estimate alone keeps every candidate, so the
    walk rescues nothing there; at the run's own density it matches the engine's choice."""
    store, ids = stored
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    stats = store.layer_stats(rid, "prefill")
    layers = [(int(x), store.heatmap(rid, "prefill", 0, int(x))) for x in stats["layer"]]
    n = layers[0][1]["n_blocks"]
    sparse = stats[~stats["dense"]]["layer"].tolist()
    full = {"layer_densities": {str(x): [1.0] for x in sparse}}
    depth = figures.depth_matrices(layers, n - 1, run["prompt_tokens"], run["config"], full)
    assert not depth["rescued"].any()
    low = {"layer_densities": {str(x): [0.05] for x in sparse}}
    sparse_depth = figures.depth_matrices(layers, n - 1, run["prompt_tokens"], run["config"], low)
    plain = figures.depth_matrices(layers, n - 1, run["prompt_tokens"], run["config"])
    # a lower per-layer density keeps fewer blocks alone, so at least as many are rescued
    assert sparse_depth["rescued"].sum() >= plain["rescued"].sum()


def test_decode_figure_rows_are_generated_tokens(stored):
    store, ids = stored
    rid = ids["sketchwalk"]
    layer = _sparse_layer(store, rid)
    rows = store.decode_rows(rid, layer)
    fig = figures.decode_figure(rows, ["<a>", "b", "c", "d"], store.blocks(rid))
    assert fig is not None
    z = np.asarray(fig.data[0].z, dtype=np.float32)
    assert z.shape == rows["selected"].shape
    assert "&lt;a&gt;" in fig.data[0].y[0]
    assert figures.decode_figure({"steps": []}, [], None) is None


def test_token_table_flags_divergence_and_kl_strip():
    toks = pd.DataFrame(
        {
            "variant": ["dense"] * 4 + ["sparse"] * 4,
            "position": [0, 1, 2, 3] * 2,
            "token_id": [5, 6, 7, 8, 5, 6, 9, 8],
            "text": ["a", "b", "c", "d", "a", "b", "<x>", "d"],
            "logprob": [None, -1, -1, -1] * 2,
            "kl": [None] * 4 + [None, 0.1, 0.2, 0.3],
        }
    )
    table = figures.token_table(toks, 1)
    assert table["position"].tolist() == [1, 2, 3]
    assert table["same"].tolist() == [True, False, True]
    assert table["diverged"].tolist() == [False, True, True]
    strip = figures.kl_strip(toks, 2)
    assert list(strip.data[0].x) == [0, 1, 2, 3]
    assert strip.data[0].customdata[2] == "&lt;x&gt;"


def test_speedups_and_sweep():
    stats = pd.DataFrame(
        {
            "layer": [0, 1, 2],
            "dense": [True, False, False],
            "t_sketch_ms": [None, 1.0, 1.0],
            "t_walk_ms": [None, 0.5, 0.5],
            "t_select_ms": [None, 0.5, 0.5],
            "t_attention_ms": [5.0, 2.0, 3.0],
            "t_dense_ms": [None, 8.0, 10.0],
        }
    )
    np.testing.assert_allclose(figures.speedups(stats[~stats["dense"]]), [2.0, 2.0])
    assert figures.overall_speedup(stats) == pytest.approx(18 / 9)
    fig = figures.stage_figure(stats)
    assert [t.name for t in fig.data][:4] == ["sketch", "walk", "select", "sparse attention"]
    assert list(fig.data[0].x) == [1, 2]
    points = pd.DataFrame({"density": [0.3, 0.1], "speedup": [1.5, 3.0], "kl": [0.01, 0.05]})
    sweep = figures.sweep_figure(points)
    assert list(sweep.data[0].x) == [0.1, 0.3] and list(sweep.data[1].y) == [0.05, 0.01]
    assert len(sweep.data) == 2  # no clean timings, no ceiling
    points["clean_speedup"], points["ceiling"] = [1.1, 1.2], [1.2, 1.3]
    names = [t.name for t in figures.sweep_figure(points).data]
    assert names[2:] == [
        "clean prefill speedup × (whole model)",
        "whole-model ceiling × (free selection)",
    ]
    assert list(figures.sweep_figure(points).data[3].y) == [1.3, 1.2]  # sorted by density


def test_tiles_keep_max_and_mean_and_label_each_tile():
    z = np.arange(36, dtype=np.float32).reshape(6, 6)
    z[0, 1] = np.nan
    view = figures.plan_view(6, max_side=3)
    assert (view.tile, view.q1, view.k1) == (2, 6, 6) and view.tiled
    mx, mean = figures.aggregate(z, view, "max"), figures.aggregate(z, view, "mean")
    assert mx.shape == (3, 3) and mx[0, 0] == 7 and mx[2, 2] == 35
    assert mean[0, 0] == np.float32((0 + 6 + 7) / 3)  # the NaN cell is left out
    assert figures.view_labels(view, None, 6, "k") == ["B0–B1", "B2–B3", "B4–B5"]
    detail = figures.plan_view(600, (10, 19, 100, 149))
    assert (detail.tile, detail.q0, detail.q1, detail.k0, detail.k1) == (1, 10, 20, 100, 150)


def test_layer_figures_tile_a_wide_layer_and_show_a_region_in_full():
    n = 10
    rng = np.random.default_rng(0)
    tri = np.tri(n, dtype=bool)
    walk = np.where(tri, rng.random((n, n)), np.nan).astype(np.float32)
    hm = {"n_blocks": n, "q_blocks": np.arange(n), "sketch": walk, "walk": walk, "exact": None}
    hm["selected"] = tri & (walk > 0.5)
    figs = figures.layer_figures(hm, None, max_side=4)
    t = figs["walk"].data[0]
    assert np.asarray(t.z).shape == (4, 4) and "tiles of 3×3" in figs["walk"].layout.title.text
    np.testing.assert_allclose(t.z[0][0], np.nanmax(walk[:3, :3]))
    np.testing.assert_allclose(t.customdata[0][0], np.nanmean(walk[:3, :3]), rtol=1e-6)
    share = np.asarray(figs["mask"].data[0].z)
    np.testing.assert_allclose(share[1, 0], hm["selected"][3:6, :3][tri[3:6, :3]].mean())
    region = figures.layer_figures(hm, None, region=(2, 5, 0, 3), max_side=4)
    assert np.asarray(region["walk"].data[0].z).shape == (4, 4)
    np.testing.assert_allclose(region["walk"].data[0].z, walk[2:6, 0:4])
    assert list(region["mask"].data[0].x) == ["B0", "B1", "B2", "B3"]
    fig = figures.outline_blocks(region["walk"], [2, 3, 9], n, figures.plan_view(n, (2, 5, 0, 3)))
    assert [(s.x0, s.x1) for s in fig.layout.shapes] == [(1.5, 3.5)]


def test_ticks_name_blocks_in_tiled_and_zoomed_views():
    n = 600
    walk = np.where(np.tri(n, dtype=bool), 0.5, np.nan).astype(np.float32)
    hm = {"n_blocks": n, "q_blocks": np.arange(n), "sketch": walk, "walk": walk, "exact": None}
    hm["selected"] = np.tri(n, dtype=bool)
    tiled = figures.layer_figures(hm, None)["walk"].layout.xaxis.ticktext
    assert tiled[:3] == ("0", "150", "300")  # tiles of 3 blocks, every 50th of 200 tiles labelled
    zoomed = figures.layer_figures(hm, None, region=(100, 199, 300, 399))["walk"]
    assert zoomed.layout.xaxis.ticktext[:2] == ("300", "320")  # 100 blocks: every 20th
    assert zoomed.layout.yaxis.ticktext[0] == "100"


def test_wide_layers_are_drawn_at_half_the_cells_a_side():
    """Up to 4 x MAX_SIDE blocks a view keeps MAX_SIDE cells a side; wider ones (128k tokens at
    64-token blocks) get half, and a zoomed region of such a layer is judged by its own width."""
    from sketchwalk.app.figures.tiles import MAX_SIDE, WIDE_FACTOR, plan_view

    assert plan_view(MAX_SIDE).tile == 1
    assert plan_view(2 * MAX_SIDE).tile == 2
    assert plan_view(WIDE_FACTOR * MAX_SIDE).tile == WIDE_FACTOR
    wide = plan_view(2 * WIDE_FACTOR * MAX_SIDE)
    assert wide.tile == 4 * WIDE_FACTOR  # 2048 blocks -> 128 cells a side
    assert -(-(wide.q1 - wide.q0) // wide.tile) == MAX_SIDE // 2
    region = plan_view(2 * WIDE_FACTOR * MAX_SIDE, (0, 2 * MAX_SIDE - 1, 0, 2 * MAX_SIDE - 1))
    assert region.tile == 2
