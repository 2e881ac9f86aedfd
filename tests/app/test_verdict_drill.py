"""AppTests of the verdict panel, the drill-down from a bad token to its cause, and walk
wording that follows the run (issue 39), on real runs of the tiny model (tests/app/conftest.py)."""

from __future__ import annotations

import re

import numpy as np
from run_helpers import new_app, spec

from sketchwalk.app.verdict import FAR_ABS, FAR_RATIO
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import probe_queries
from sketchwalk.store import open_store


def _charts(at) -> dict[str, dict]:
    return {
        spec(c)["layout"].get("title", {}).get("text", ""): spec(c) for c in at.get("plotly_chart")
    }


def _page(at, page: str, run_id: str):
    at.session_state["run_id"] = run_id
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_explore_opens_with_the_runs_verdict(app_env):
    url, ids = app_env
    run = open_store(url).get_run(ids["sketchwalk"])
    stats = open_store(url).layer_stats(ids["sketchwalk"])
    at = _page(new_app().run(), "explore", ids["sketchwalk"])
    got = _metrics(at)
    m = run["metrics"]
    dens = next(
        v for k, v in got.items() if k.startswith("Achieved density ") or k == "Achieved density"
    )
    assert dens in (f"{m['density_achieved']:.2f}", f"{m['density_achieved']:.3f}")
    kl = next(v for k, v in got.items() if k.startswith("KL to dense"))
    assert kl == f"{m['kl_mean']:.4f}"
    top1 = next(v for k, v in got.items() if k.startswith("Top-1 agreement"))
    assert top1 == f"{m['top1_agreement']:.1%}"
    sparse = stats[(stats["phase"] == "prefill") & ~stats["dense"]]["mass_recall"]
    mass = next(v for k, v in got.items() if k.startswith("Mass kept"))
    assert mass == f"{sparse.mean():.1%}"
    prefill = next(m for m in at.metric if m.label.startswith("Prefill speed"))
    assert prefill.value == "noise" or (
        re.fullmatch(r"\d+\.\d\d×", prefill.value)
        and re.fullmatch(r"range \d+\.\d\d–\d+\.\d\d×", prefill.delta)
    )
    layer = at.select_slider(key="ex_layer").value  # the shown layer, warned when off target
    got = stats[(stats["phase"] == "prefill") & (stats["layer"] == layer)]["density_achieved"]
    far = float(got.iloc[0]) > 0.2 * FAR_RATIO and float(got.iloc[0]) - 0.2 > FAR_ABS
    warned = [c.value for c in at.caption if "This layer kept" in c.value]
    assert bool(warned) == far and (not far or f"kept {float(got.iloc[0]):.2f}" in warned[0])
    t = run["timings"]
    assert (
        t["clean_repeats"] == 3 and t["clean_prefill_speedup_lo"] <= t["clean_prefill_speedup_hi"]
    )


def test_a_run_without_the_walk_shows_the_walks_counterfactual_only(app_env):
    """Walk damping 0: the walk heatmap is the counterfactual walk's, titled as not used for
    selection, with what it would change; no depth view (it follows the walk's selection)."""
    url, ids = app_env
    at = _page(new_app().run(), "explore", ids["nowalk"])
    assert "Walk score W_l" not in _charts(at)
    assert any(t.endswith("not used for selection") for t in _charts(at))
    assert any("would keep +" in c.value for c in at.caption)
    assert "Depth view (the walk)" not in at.radio(key="ex_view").options
    at.radio(key="ex_view").set_value("Per-layer curves").run()
    names = {t["name"] for t in _charts(at)["Per layer"]["data"]}
    assert "walk error (TV vs exact)" in names and "mass recall" in names
    # a walking run keeps them
    at.selectbox(key="explore_run").set_value(ids["sketchwalk"]).run()
    assert "Walk score W_l" in _charts(at)
    assert "Depth view (the walk)" in at.radio(key="ex_view").options


def test_the_density_preview_starts_from_the_shown_runs_target(app_env):
    url, ids = app_env
    at = _page(new_app().run(), "explore", ids["sketchwalk"])
    at.select_slider(key="ex_preview_density").set_value(0.55).run()
    assert at.select_slider(key="ex_preview_density").value == 0.55
    at.selectbox(key="explore_run").set_value(ids["nowalk"]).run()  # a 0.3 run
    at.select_slider(key="ex_layer").set_value(2).run()
    assert at.select_slider(key="ex_preview_density").value == 0.3


def test_compare_drills_from_a_high_kl_token_to_the_layer_that_dropped_its_attention(
    app_env, tiny_model
):
    url, ids = app_env
    rid = ids["sketchwalk"]
    store = open_store(url)
    run, toks = store.get_run(rid), store.tokens(rid)
    n = run["prompt_tokens"]
    prompt_kl = toks[(toks["variant"] == "sparse") & (toks["position"] < n)].dropna(subset=["kl"])
    worst = int(prompt_kl.sort_values("kl", ascending=False)["position"].iloc[0])

    at = _page(new_app().run(), "compare", rid)
    assert at.selectbox(key="cmp_query").value == worst  # the highest-KL token by default
    assert not [d for d in at.dataframe if "Dropped attention" in d.value.columns]  # on request
    at.button(key="btn_cmp_explain").click().run()
    expected = probe_queries(
        load_model(tiny_model), run["prompt"], SketchWalkConfig.from_stored(run["config"]), [worst]
    )
    want = sorted(
        (
            (m, q.layer, g)
            for q in expected
            if not q.dense
            for g, m in enumerate(q.dropped_by_group)
        ),
        reverse=True,
    )
    table = next(d.value for d in at.dataframe if "Dropped attention" in d.value.columns)
    assert list(table["Layer"])[0] == want[0][1] and list(table["KV group"])[0] == want[0][2]
    np.testing.assert_allclose(table["Dropped attention"].iloc[0], want[0][0], rtol=1e-5)
    assert f"layer {want[0][1]}" in at.info[0].value
    fig = next(f for t, f in _charts(at).items() if t.startswith(f"Token t{worst}: its attention"))
    assert fig["data"][0]["type"] == "heatmap"

    at.button(key="btn_cmp_open_0").click().run()  # -> Explore at that layer, row outlined
    assert not at.exception, at.exception
    assert at.select_slider(key="ex_layer").value == want[0][1]
    block = worst // run["config"]["block_size"]
    figs = _charts(at)
    rows = [
        s
        for s in figs["Selected blocks"]["layout"].get("shapes", [])
        if s.get("name") == "query row"
    ]
    assert rows and rows[0]["y0"] == block - 0.5
    top = next(
        f
        for t, f in figs.items()
        if t.startswith(f"Layer {want[0][1]}: top source tokens of t{worst}")
    )
    heads = len(next(q for q in expected if q.layer == want[0][1]).top)
    assert len(top["data"][0]["y"]) == heads
    at.switch_page("pages/explore.py").run()  # AppTest's next runs stay on Explore
    at.button(key="btn_ex_clear_query").click().run()
    assert "ex_query" not in at.session_state
    assert not [
        s
        for s in _charts(at)["Selected blocks"]["layout"].get("shapes", [])
        if s.get("name") == "query row"
    ]


def test_probe_reads_the_same_selection_the_run_recorded(app_env, tiny_model):
    """The on-demand probe re-runs the prefill: its kept row must equal the stored one."""
    url, ids = app_env
    store = open_store(url)
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    pos = [5, run["prompt_tokens"] - 1]
    heard = []
    lm = load_model(tiny_model)
    layers = probe_queries(
        lm, run["prompt"], SketchWalkConfig.from_stored(run["config"]), pos,
        progress=lambda f, msg: heard.append((f, msg)),
    )  # fmt: skip
    n = lm.model.config.num_hidden_layers  # progress: each layer as it starts, in order
    assert heard == [(i / n, f"layer {i + 1} of {n}") for i in range(n)]
    checked = 0
    for q in layers:
        if q.dense:
            continue
        hm = store.heatmap(rid, "prefill", 0, q.layer)
        row = hm["selected"][q.block] & (np.arange(hm["n_blocks"]) <= q.block)
        assert np.array_equal(row, q.kept), (q.layer, q.position)
        assert all(0 <= m <= 1 for m in q.dropped_by_group)
        weights = [w for _, w, _ in q.top[0]]
        assert weights == sorted(weights, reverse=True)
        checked += 1
    assert checked >= 2
