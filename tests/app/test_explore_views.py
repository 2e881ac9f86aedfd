"""Explore's newer controls through AppTest: the needle tracker (and, below, the other views)."""

from __future__ import annotations

import numpy as np
import pytest
from known_runs import save_known
from run_helpers import new_app, spec, z_array

from sketchwalk.store import open_store
from sketchwalk.store.needle import trace


def _charts(at) -> dict[str, dict]:
    return {
        spec(c)["layout"].get("title", {}).get("text", ""): spec(c) for c in at.get("plotly_chart")
    }


def _layer_caption(at) -> str:
    """The layer panel's caption ('Layer 3 · 266 blocks · ...'; the verdict's come first)."""
    return next(c.value for c in at.caption if c.value.startswith("Layer "))


def _explore(run_id):
    at = new_app().run()
    at.session_state["run_id"] = run_id
    at.switch_page("pages/explore.py").run()
    assert not at.exception, at.exception
    return at


NEEDLE = "Legal Entity"


def test_needle_outlines_blocks_draws_the_strip_and_says_where_it_was_dropped(app_env):
    url, ids = app_env
    rid = ids["sketchwalk"]
    expected = trace(open_store(url), rid, NEEDLE)
    at = _explore(rid)
    assert "Needle through the layers" not in " ".join(_charts(at))
    at.text_input(key="ex_needle").input(NEEDLE).run()
    assert not at.exception, at.exception
    assert at.info[0].value == expected.sentence()
    figs = _charts(at)
    strip = next(f for t, f in figs.items() if t.startswith("Needle through the layers"))
    layers = sorted({s.layer for s in expected.steps})
    assert strip["data"][0]["y"] == [f"layer {x}" for x in layers]
    assert strip["data"][0]["x"][0] == "prefill"
    b = expected.needle.blocks
    for title in ("Walk score W_l", "Selected blocks"):
        shapes = figs[title]["layout"].get("shapes", [])
        outlined = [s for s in shapes if s.get("name") == "needle"]
        assert outlined and outlined[0]["x0"] == b[0] - 0.5, title

    at.text_input(key="ex_needle").input("not in this prompt at all 123").run()
    assert any("does not occur" in w.value for w in at.warning)
    assert not any(t.startswith("Needle through") for t in _charts(at))


@pytest.fixture
def known_pair(monkeypatch, tmp_path):
    """A fresh store holding two runs of one prompt whose masks are known (tests/known_runs)."""
    url = str(tmp_path / "pair.duckdb")
    with open_store(url) as store:
        a = save_known(store)
        b = save_known(store, flip=True, method="nowalk")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url, a, b


def test_mask_diff_from_runs_and_compare_counts_each_side(known_pair):
    url, a, b = known_pair
    at = new_app().run()
    at.switch_page("pages/runs.py").run()
    assert at.button(key="btn_runs_diff").disabled
    at.multiselect(key="runs_picked").select(a).select(b).run()
    at.button(key="btn_runs_diff").click().run()
    assert not at.exception, at.exception
    assert at.selectbox(key="df_a").value == a and at.selectbox(key="df_b").value == b
    assert at.select_slider(key="df_layer").value == 1  # the first sparse layer
    # layer 1, last row: A keeps {0, 2}, B keeps {0, 1}; other rows keep block 0 in both
    got = {m.label: m.value for m in at.metric}
    assert (got["A only"], got["B only"], got["Both"]) == ("1", "1", "6")
    assert (got["KL A (prompt)"], got["KL B (prompt)"]) == ("0.0100", "0.0200")
    # causal exact mass 0.1 per block, 0.5 on block 2 of the last row; rows 0-4 keep block 0
    head = 1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5
    assert got["Mass recall A"] == f"{(head + 0.6) / 6:.3f}"  # last row keeps 0 and 2
    assert got["Mass recall B"] == f"{(head + 0.2) / 6:.3f}"  # last row keeps 0 and 1
    figs = _charts(at)
    assert "Kept by A only / B only / both: 1 A only, 1 B only, 6 both" in figs
    curve = figs["Mask diff per layer"]["data"][0]
    assert curve["name"] == "overlap (both / either)"
    y = z_array({"z": curve["y"]})
    assert [round(float(v), 4) for v in y] == [1.0, 0.75, 0.75]

    at.switch_page("pages/compare.py").run()
    at.selectbox(key="cmp_run").select(b).run()
    at.radio(key="cmp_mode").set_value("another run's sparse generation").run()
    at.selectbox(key="cmp_other").select(a).run()
    at.button(key="btn_cmp_diff").click().run()
    assert not at.exception, at.exception
    assert at.selectbox(key="df_a").value == b and at.selectbox(key="df_b").value == a


def test_long_layer_is_tiled_and_the_zoom_shows_full_detail(monkeypatch, tmp_path):
    from sketchwalk.benchmarks.long_run import make_long_result

    url = str(tmp_path / "long.duckdb")
    res = make_long_result(17_000, layers=3, decode=1)  # 266 blocks of 64: over 256 a side
    with open_store(url) as store:
        rid = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
        store.save_result(rid, res)
        walk = store.heatmap(rid, "prefill", 0, 1)["walk"]
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = _explore(rid)
    assert at.select_slider(key="ex_layer").value == 1
    assert "tiles of 2×2 blocks" in _layer_caption(at)
    figs = _charts(at)
    tiled = next(f for t, f in figs.items() if t.startswith("Walk score W_l · tiles of 2×2"))
    assert z_array(tiled["data"][0]).shape == (133, 133)
    assert len(tiled["data"][0]["x"]) == 133  # one label per tile, not per block
    at.slider(key="ex_zoom_q").set_value((200, 265)).run()
    at.slider(key="ex_zoom_k").set_value((0, 99)).run()
    assert not at.exception, at.exception
    assert "tiles" not in _layer_caption(at)
    detail = _charts(at)["Walk score W_l"]["data"][0]
    z = z_array(detail)
    assert z.shape == (66, 100)
    np.testing.assert_allclose(10**z, np.maximum(walk[200:266, :100], 1e-6), rtol=1e-4)


def test_pass_key_samples_name_their_key():
    from sketchwalk.app import prompts

    prompt, key = prompts.needle_prompt(50, depth=0.1, seed=7)
    assert prompts.find_pass_key(prompt) == key
    assert prompts.find_pass_key("no key here. The pass key is 12.") is None
    label = next(k for k in prompts.SAMPLES if k.startswith("Needle found at 0.1, lost at 0.05"))
    assert prompts.find_pass_key(prompts.SAMPLES[label]()) == prompts.NEEDLE_DEMO_KEY


def test_per_group_run_lets_explore_pick_a_group_or_show_all(
    monkeypatch, tmp_path, tiny_model, models
):
    from run_helpers import tiny_config

    from sketchwalk.app import prompts
    from sketchwalk.worker.loop import Worker, make_request

    url = str(tmp_path / "groups.duckdb")
    with open_store(url) as store:
        cfg = tiny_config(per_group=True)
        job = store.enqueue_job(make_request(prompts.license_text()[:900], cfg, tiny_model, 2))
        Worker(store, models=models).drain()
        rid = store.get_job(job).run_id
        g1 = store.heatmap(rid, "prefill:g1", 0, 2)
        stats = store.layer_stats(rid, "prefill:g1")
        run_metrics = store.get_run(rid)["metrics"]
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = _explore(rid)
    assert at.selectbox(key="ex_group").options == [
        "all groups (kept by any)",
        "group 0",
        "group 1",
    ]
    assert any("all KV-head groups" in c.value for c in at.caption)
    at.selectbox(key="ex_group").set_value(1).run()
    assert not at.exception, at.exception
    assert any(c.value == "Matrices and metrics describe KV-head group 1." for c in at.caption)
    # walk damping 0: the walk did not select; its counterfactual scores are shown, labelled
    walk_title = "Walk score W_l at damping 0.25: not used for selection"
    walk = z_array(_charts(at)[walk_title]["data"][0])
    np.testing.assert_allclose(walk, np.log10(np.maximum(g1["walk"], 1e-6)), rtol=1e-5)
    assert not np.allclose(g1["walk"], g1["sketch"], equal_nan=True)  # not A_l again
    effect = next(x for x in run_metrics["walk_effect"]["layers"] if x["layer"] == 2)
    assert any(
        f"would keep +{effect['added']} / -{effect['dropped']} blocks" in c.value
        for c in at.caption
    )
    sketch = z_array(_charts(at)["Sketch estimate A_l"]["data"][0])
    np.testing.assert_allclose(sketch, np.log10(np.maximum(g1["sketch"], 1e-6)), rtol=1e-5)
    recall = stats[stats["layer"] == 2]["mass_recall"].iloc[0]
    assert {m.label: m.value for m in at.metric}["Mass recall"] == f"{recall:.3f}"
    at.toggle(key="ex_group_multiples").set_value(True).run()
    titles = set(_charts(at))
    assert {"Group 0: kept blocks", "Group 1: kept blocks"} <= titles


def test_runs_without_groups_show_no_group_picker(known_pair):
    url, a, _ = known_pair
    at = _explore(a)
    assert not [s for s in at.selectbox if s.key == "ex_group"]


def test_layer_slider_shows_each_layer_and_a_revisit_comes_from_the_view_cache(
    monkeypatch, tmp_path
):
    from sketchwalk.benchmarks.long_run import make_long_result
    from sketchwalk.store.core import Store

    url = str(tmp_path / "steps.duckdb")
    res = make_long_result(17_000, layers=4, decode=0)  # 266 blocks: tiles of 2x2
    with open_store(url) as store:
        rid = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
        store.save_result(rid, res)
        walks = {x: store.heatmap(rid, "prefill", 0, x)["walk"] for x in (1, 2, 3)}
    reads: list[int] = []
    real = Store.heatmap
    monkeypatch.setattr(
        Store, "heatmap", lambda self, *a: reads.append(a[-1]) or real(self, *a), raising=True
    )
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = _explore(rid)
    shown = {}
    for layer in (1, 2, 3):
        if layer != 1:
            at.select_slider(key="ex_layer").set_value(layer).run()
            assert not at.exception, at.exception
        assert _layer_caption(at).startswith(f"Layer {layer} · 266 blocks")
        walk = next(f for t, f in _charts(at).items() if t.startswith("Walk score W_l"))
        z = z_array(walk["data"][0])
        tile_max = np.fmax.reduce(np.fmax.reduce(walks[layer].reshape(133, 2, 133, 2), 3), 1)
        np.testing.assert_allclose(10**z, np.maximum(tile_max, 1e-6), rtol=1e-4, equal_nan=True)
        shown[layer] = _charts(at)
    assert reads == [1, 2, 3]  # each layer read from the store once
    assert not np.allclose(
        z_array(next(iter(shown[2].values()))["data"][0]),
        z_array(next(iter(shown[3].values()))["data"][0]),
        equal_nan=True,
    )  # the layers differ, so the comparison below can tell them apart

    at.select_slider(key="ex_layer").set_value(2).run()
    assert reads == [1, 2, 3]  # the revisit is a cache hit: no store read, no tiling
    assert _charts(at) == shown[2]


def test_a_run_too_wide_to_draw_is_refused_in_one_line(known_pair, monkeypatch):
    _, a, _ = known_pair
    monkeypatch.setenv("SKETCHWALK_VIEW_MAX_BLOCKS", "2")  # the known runs' layers are wider
    at = _explore(a)
    (error,) = at.error
    assert "too large to draw" in error.value and "SKETCHWALK\\_VIEW\\_MAX\\_BLOCKS" in error.value
    assert "\n" not in error.value and not at.get("plotly_chart")
