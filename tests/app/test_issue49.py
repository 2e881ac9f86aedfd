"""AppTests of issue 49's defects and asks: each fails without its fix."""

from __future__ import annotations

import pytest
from run_helpers import new_app

from sketchwalk.app import prompts
from sketchwalk.store import open_store


def _page(at, page: str, run_id: str | None = None):
    if run_id is not None:
        at.session_state["run_id"] = run_id
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_compare_explains_a_token_of_the_run_switched_to(app_env):
    url, ids = app_env
    at = _page(new_app().run(), "compare", ids["sketchwalk"])
    at.selectbox(key="cmp_query").select_index(1).run()  # a token of the first run, picked
    stale = at.selectbox(key="cmp_query").options[1]
    at.selectbox(key="cmp_run").set_value(ids["injection"]).run()
    assert not at.exception, at.exception
    # the browser's box still shows, and sends, the first run's label: Streamlit hands an
    # unknown label to the page as the label string itself (SelectboxSerde.deserialize)
    box = at.selectbox(key="cmp_query")
    box.options.append(stale)
    box.set_value(stale)
    at.button(key="btn_cmp_explain").click().run()
    assert not at.exception, at.exception
    n = open_store(url).get_run(ids["injection"])["prompt_tokens"]
    box = at.selectbox(key="cmp_query")
    assert isinstance(box.value, int) and 0 < box.value < n
    assert box.options[0].startswith(f"t{box.value} ")  # the new run's worst token
    assert any(f"Token t{box.value}:" in i.value for i in at.info) or any(
        "nothing was dropped" in i.value for i in at.info
    )


def _timed(prefill: tuple[tuple[float, float], ...], attn_share: float = 0.5) -> dict:
    """Clean timings of passes given as (dense ms, sparse ms): the medians of the times and the
    median of the ratios differ on purpose."""
    from sketchwalk.engine.run.runner import median_timings

    runs = [
        {
            "clean_dense_prefill_ms": d,
            "clean_sparse_prefill_ms": s,
            "clean_dense_attention_ms": d * attn_share,
            "clean_sparse_attention_ms": 10.0,
            "clean_sparse_selection_ms": 1.0,
        }
        for d, s in prefill
    ]
    return median_timings(runs)


def _save(store, timings: dict, **config) -> str:
    from known_runs import known_result

    res = known_result()
    res.config = {**res.config, **config}
    res.timings = timings
    res.metrics = {**res.metrics, "density_achieved": res.config["density"]}
    rid = store.create_run({"prompt": res.prompt, "config": res.config}, status="running")
    store.save_result(rid, res)
    return rid


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    url = str(tmp_path / "fresh.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url


def test_one_speed_number_per_run_on_every_page(fresh):
    # ratios 1.0, 1.5, 1.25 -> median 1.25, range 1.00-1.50; medians of the times 1000/800 = 1.25
    # would agree by chance, so the times are skewed: median dense 1000, median sparse 900
    t = _timed(((1000.0, 1000.0), (3000.0, 2000.0), (1125.0, 900.0)))
    from sketchwalk.app import speed_numbers

    m = speed_numbers.clean_speedup(t, "prefill")
    assert m.text() == "1.25× (1.00–1.50)"
    assert round(1000.0 / 900.0, 2) != 1.25  # the old headline's ratio of medians
    with open_store(fresh) as store:
        rid = _save(store, t, density=0.2)
        _save(store, t, density=0.3)
        other = _save(store, t, density=0.4, block_size=8)  # another setting: not on the line
        _save(store, {}, density=0.5)  # no clean pass: not on the line either
    at = _page(new_app().run(), "explore", rid)
    verdict = next(x for x in at.metric if x.label.startswith("Prefill speed"))
    _page(at, "speed", rid)
    head = next(x.value for x in at.metric if x.label == "Prefill, whole model")
    assert head == "1.25× (1.00–1.50)"  # the verdict: the median, its range on the line under it
    assert (verdict.value, verdict.delta) == ("1.25×", "range 1.00–1.50×")
    table = next(d.value for d in at.dataframe if "Clean prefill range ×" in d.value.columns)
    assert list(table["Target density"]) == ["0.2", "0.3"]  # the comparable runs only
    assert set(table["Clean prefill speed-up ×"]) == {"1.25"}
    assert set(table["Clean prefill range ×"]) == {"1.00–1.50×"}
    assert "None" not in table.to_string() and "nan" not in table.to_string()
    left = " ".join(c.value for c in at.caption if c.value.startswith("Left out"))
    assert other[:8] in left and "block_size 8" in left and "no clean pass" in left


def test_a_speed_headline_above_its_ceiling_gets_a_noise_note(fresh):
    # attention is 10% of the dense prefill: at density 0.2 at most 1/(1-0.1*0.8) = 1.09x
    t = _timed(((1000.0, 500.0), (1000.0, 480.0), (1000.0, 520.0)), attn_share=0.1)
    with open_store(fresh) as store:
        rid = _save(store, t, density=0.2)
    at = _page(new_app().run(), "speed", rid)
    assert any("Prefill measured 2.00×" in w.value and "noise" in w.value for w in at.warning)


def test_the_new_run_form_survives_explores_slider_and_play(app_env, tiny_model):
    url, ids = app_env
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.selectbox(key="nr_sample").select(list(prompts.SAMPLES)[1]).run()
    at.text_area(key="nr_prompt").input("my own pasted prompt " * 20).run()
    at.slider(key="nr_density").set_value(0.35).run()
    _page(at, "explore", ids["sketchwalk"])
    layers = at.select_slider(key="ex_layer").options
    at.select_slider(key="ex_layer").set_value(int(layers[-2])).run()
    at.button(key="btn_play").click().run()
    assert not at.exception, at.exception
    _page(at, "new_run")
    assert at.text_area(key="nr_prompt").value == "my own pasted prompt " * 20
    assert at.selectbox(key="nr_sample").value == list(prompts.SAMPLES)[1]
    assert at.slider(key="nr_density").value == 0.35
    assert at.text_input(key="nr_model").value == tiny_model


def test_play_ends_on_the_last_layer_offering_play_again(app_env):
    url, ids = app_env
    at = _page(new_app().run(), "explore", ids["sketchwalk"])
    layers = at.select_slider(key="ex_layer").options
    at.select_slider(key="ex_layer").set_value(int(layers[-2])).run()
    at.button(key="btn_play").click().run()
    assert not at.exception, at.exception
    assert str(at.select_slider(key="ex_layer").value) == str(layers[-1])
    assert at.button(key="btn_play").label == "▶ Play"
    assert at.session_state["ex_playing"] is False


class _Upload:
    """What st.file_uploader hands a page: the file's bytes (AppTest cannot upload a file)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def getvalue(self) -> bytes:
        return self.data


def test_import_counts_the_new_run_at_once_and_names_a_duplicate(fresh, tmp_path, monkeypatch):
    import streamlit
    from known_runs import save_known

    with open_store(fresh) as store:
        save_known(store)
    with open_store(str(tmp_path / "other.duckdb")) as other:
        new_id = save_known(other, flip=True)
        data = other.export_zip([new_id])
    monkeypatch.setattr(streamlit, "file_uploader", lambda *a, **k: _Upload(data))
    at = _page(new_app().run(), "runs")
    assert any(c.value.startswith("1 of 1 run;") for c in at.caption)
    at.button(key="btn_import").click().run()
    assert not at.exception, at.exception
    assert [s.value for s in at.success] == ["Imported 1 run."]
    assert any(c.value.startswith("2 of 2 runs;") for c in at.caption)  # the table, now
    at.button(key="btn_import").click().run()  # the same file again: a duplicate, skipped
    assert [s.value for s in at.success] == [
        f"Imported 0 runs. Skipped 1 run already in the store (a duplicate: {new_id[:8]})."
    ]


def test_the_pre_run_density_warning_counts_the_floor_as_the_engine_does(fresh, tiny_model):
    from sketchwalk.app import verdict

    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input(prompts.license_text()).run()  # ~2k tokens
    at.slider(key="nr_density").set_value(0.01).run()
    warned = " ".join(w.value for w in at.warning)
    floor = verdict.density_floor(knob_config(at), 1982)
    assert 0.05 < floor < 0.1  # query tiles keep every row's forced blocks
    assert f"it will run at about {floor:.2f}" in warned and "target density 0.01" in warned
    at.text_area(key="nr_prompt").input("word " * 19).run()
    warned = " ".join(w.value for w in at.warning)
    assert "dense in effect (density 1.00)" in warned and "or more" not in warned
    at.text_area(key="nr_prompt").input("word").run()
    assert any(c.value.startswith("1 token · limit") for c in at.caption)


def knob_config(at) -> dict:
    from sketchwalk.engine.method.config import SketchWalkConfig

    return SketchWalkConfig(density=at.slider(key="nr_density").value).to_dict()


def test_a_density_a_little_above_a_small_target_is_not_a_green_check():
    from sketchwalk.app import verdict

    item, warning = verdict.density_item(
        {"metrics": {"density_achieved": 0.07, "density_target": 0.05}, "prompt_tokens": 2048,
         "config": {"density": 0.05, "block_size": 16}}
    )  # fmt: skip
    assert item.level == "warn" and "far above the target 0.05" in warning


def test_a_threshold_methods_density_is_its_own_not_far_from_a_target():
    from sketchwalk.app import verdict

    item, warning = verdict.density_item(
        {"metrics": {"density_achieved": 0.49, "density_target": 0.2}, "prompt_tokens": 2048,
         "config": {"density": 0.2, "block_size": 128, "method": "xattention-threshold"}}
    )  # fmt: skip
    assert item.level == "ok" and warning is None and item.note == "its own (no target)"


def test_bad_knob_values_disable_run_with_one_line(fresh, tiny_model):
    from transformers import AutoConfig

    layers = AutoConfig.from_pretrained(tiny_model).num_hidden_layers
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input(prompts.license_text()[:900]).run()
    assert not at.button(key="btn_run").disabled
    at.text_input(key="nr_dense_layers").input(f"0,{layers + 90}").run()
    assert any(f"there is no layer {layers + 90}" in e.value for e in at.error)
    assert at.button(key="btn_run").disabled
    at.text_input(key="nr_dense_layers").input("0").run()
    assert not at.button(key="btn_run").disabled
    box = at.number_input(key="nr_beta")
    assert box.min is None  # the browser hands every entry to the page, which checks it
    box.set_value(-1.0).run()
    assert any("beta" in e.value and "-1" in e.value for e in at.error)
    assert at.button(key="btn_run").disabled


def test_a_link_opens_the_same_explore_view_in_a_new_session(app_env):
    url, ids = app_env
    at = _page(new_app().run(), "explore", ids["sketchwalk"])
    layers = at.select_slider(key="ex_layer").options
    at.select_slider(key="ex_layer").set_value(int(layers[-1])).run()
    link = {k: (v[-1] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert link["run"] == ids["sketchwalk"] and link["layer"] == str(layers[-1])
    fresh = new_app()  # a new tab: no session state, only the link
    for k, v in link.items():
        fresh.query_params[k] = v
    fresh.run()
    fresh.switch_page("pages/explore.py").run()
    assert not fresh.exception, fresh.exception
    assert fresh.selectbox(key="explore_run").value == ids["sketchwalk"]
    assert str(fresh.select_slider(key="ex_layer").value) == str(layers[-1])


def test_small_words_three_clean_passes_no_backticks_block_size_in_labels(fresh, tiny_model):
    from sketchwalk.app import widgets

    at = new_app().run()
    assert "three dense and three sparse" in at.checkbox(key="nr_clean_timing").help
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input("a" * 204_800).run()
    assert at.error and not any("`" in e.value for e in at.error)
    row = {"id": "0123456789", "method": "sketchwalk", "config": {"density": 0.2}}
    assert widgets.run_label({**row, "config": {"density": 0.2, "block_size": 16}}) != (
        widgets.run_label({**row, "config": {"density": 0.2, "block_size": 64}})
    )


def _quality_half_job(fresh):
    """A job whose run has its quality half stored (the run still 'running'), and New run
    opened on it: (the AppTest, the run id, the job's fence)."""
    import dataclasses

    from known_runs import known_result

    from sketchwalk.app.widgets import JOBS_KEY

    res = known_result()
    res.metrics = {"kl_mean": 0.01, "top1_agreement": 0.97, "density_achieved": 0.25}
    res.layers = [dataclasses.replace(r, mass_recall=0.9) for r in res.layers]
    with open_store(fresh) as store:
        job_id = store.enqueue_job({"prompt": res.prompt})
        fence = (job_id, store.claim_job("w").claim)
        rid = store.create_run({"prompt": res.prompt, "config": res.config}, "running", fence)
        store.save_quality(rid, res, job=fence, progress=0.4)
    at = new_app()
    at.session_state[JOBS_KEY] = [job_id]
    _page(at.run(), "new_run")
    return at, rid, fence


def test_new_run_shows_the_quality_half_while_the_clean_passes_run(fresh):
    """A job whose run has its quality half stored (still running): New run shows the verdict's
    quality items and "timing clean passes…" for speed; once the speed half is written, the
    clean speed-up takes its place."""
    at, rid, fence = _quality_half_job(fresh)
    shown = {m.label.split(" :")[0]: m.value for m in at.metric}
    assert shown["KL to dense"] == "0.0100" and shown["Top-1 agreement"] == "97.0%"
    assert shown["Achieved density"] == "0.25" and shown["Mass kept"] == "90.0%"
    assert shown["Prefill speed"] == shown["Decode speed"] == "…"
    notes = [c.value for c in at.caption]
    assert notes.count("timing clean passes…") == 2
    assert not any("timed no clean pass" in n for n in notes)
    assert any("quality saved; timing clean passes" in p.proto.text for p in at.get("progress"))

    t = _timed(((1000.0, 800.0), (1000.0, 800.0), (1000.0, 800.0)))
    with open_store(fresh) as store:
        store.save_speed(rid, t, job=fence)
    at.run()
    assert not at.exception, at.exception
    shown = {m.label.split(" :")[0]: m.value for m in at.metric}
    assert shown["KL to dense"] == "0.0100" and shown["Prefill speed"].startswith("1.25×")
    assert not any("timing clean passes" in c.value for c in at.caption)


def test_explore_opens_a_run_whose_speed_half_is_still_timed(fresh):
    """A run whose quality half is stored (its clean passes still running) opens in Explore
    with its heatmaps, and New run offers to open it there; once its speed half is written,
    the same session shows the speed-up (nothing read while it ran stays cached)."""
    at, rid, fence = _quality_half_job(fresh)
    with open_store(fresh) as store:
        queued = store.create_run({"prompt": "not run yet"}, "running")  # no quality half
    assert any(b.label == "Open in Explore" for b in at.button)
    _page(at, "explore", rid)
    assert at.selectbox(key="explore_run").value == rid
    assert queued not in at.selectbox(key="explore_run").options
    assert at.get("plotly_chart"), "no heatmap for the run"
    shown = {m.label.split(" :")[0]: m.value for m in at.metric}
    assert shown["KL to dense"] == "0.0100" and shown["Prefill speed"] == "…"

    t = _timed(((1000.0, 800.0), (1000.0, 800.0), (1000.0, 800.0)))
    with open_store(fresh) as store:
        store.save_speed(rid, t, job=fence)
    at.run()
    assert not at.exception, at.exception
    shown = {m.label.split(" :")[0]: m.value for m in at.metric}
    assert shown["Prefill speed"].startswith("1.25×")
