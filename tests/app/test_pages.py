"""Every page through Streamlit's AppTest: widgets set, figures, metrics and messages checked."""

from __future__ import annotations

import numpy as np
import pytest
from run_helpers import INJECTION, new_app, spec, tiny_config, z_array

from sketchwalk.app import figures, prompts
from sketchwalk.store import open_store
from sketchwalk.text import plain_markdown
from sketchwalk.worker.loop import Worker, make_request


def charts(at) -> dict[str, dict]:
    """Plotly charts of the page by figure title."""
    out = {}
    for el in at.get("plotly_chart"):
        fig = spec(el)
        out[fig["layout"].get("title", {}).get("text", "")] = fig
    return out


def texts(at) -> list[str]:
    return [t.value for t in at.text]


def on_page(at, page: str, run_id: str | None = None):
    if run_id is not None:
        at.session_state["run_id"] = run_id
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


# ---- New run ---------------------------------------------------------------------------------


@pytest.fixture
def fresh_db(monkeypatch, tmp_path):
    url = str(tmp_path / "fresh.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    return url


def test_new_run_validates_submits_and_shows_the_finished_job(fresh_db, tiny_model, models):
    at = new_app().run()
    assert not at.exception
    assert at.button(key="btn_run").disabled  # nothing typed yet
    assert "Type or paste a prompt" in at.info[0].value

    at.selectbox(key="nr_sample").select(list(prompts.SAMPLES)[0]).run()
    assert at.text_area(key="nr_prompt").value.startswith(prompts.license_text()[:40])
    assert at.caption[0].value.startswith("1982 tokens · limit 8192 tokens for smollm2 · ")

    at.text_input(key="nr_model").input("/no/such/model").run()
    assert any("cannot load model '/no/such/model'" in e.value for e in at.error)
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input("   ").run()
    assert any("The prompt is empty" in e.value for e in at.error)
    at.text_area(key="nr_prompt").input("hello there").run()  # shorter than a block: runs dense
    assert not at.error
    assert any("dense in effect" in w.value for w in at.warning)
    at.text_area(key="nr_prompt").input(prompts.license_text()[:900]).run()
    at.text_input(key="nr_dense_layers").input("0,x").run()
    assert any("Dense layers must be comma-separated integers" in e.value for e in at.error)
    at.text_input(key="nr_dense_layers").input("-1").run()
    assert any("dense layers must be non-negative" in e.value for e in at.error)
    assert at.button(key="btn_run").disabled
    at.text_input(key="nr_dense_layers").input("0").run()
    # every declared knob has a widget, the per-group switch and the query window included
    from sketchwalk.engine.method.config import knobs

    assert all(f"nr_{f.name}" in at.session_state for f, _ in knobs())
    assert at.checkbox(key="nr_per_group").value is True
    at.number_input(key="nr_query_window").set_value(16).run()
    at.selectbox(key="nr_preset").select("paper").run()  # a preset sets every knob at once
    assert at.selectbox(key="nr_block_size").value == 64
    assert at.checkbox(key="nr_per_group").value is False
    assert at.number_input(key="nr_dense_tail_blocks").value == 4
    at.selectbox(key="nr_preset").select("default").run()
    at.text_input(key="nr_dense_layers").input("0").run()
    at.number_input(key="nr_query_window").set_value(16).run()
    at.selectbox(key="nr_block_size").select(16).run()
    at.slider(key="nr_density").set_value(0.35).run()
    at.number_input(key="nr_max_new").set_value(3).run()
    assert not at.error and not at.button(key="btn_run").disabled
    assert at.checkbox(key="nr_clean_timing").value is True  # on unless switched off
    at.checkbox(key="nr_time_only").check().run()
    assert at.checkbox(key="nr_clean_timing").disabled  # a time-only run always times one
    at.checkbox(key="nr_time_only").uncheck().run()
    at.checkbox(key="nr_clean_timing").uncheck().run()

    at.button(key="btn_run").click().run()
    store = open_store(fresh_db)
    jobs = store.list_jobs()
    assert len(jobs) == 1 and jobs[0].status == "queued"
    req = jobs[0].request
    assert req["config"]["density"] == 0.35 and req["config"]["dense_layers"] == [0]
    assert req["model"] == tiny_model and req["max_new_tokens"] == 3
    assert req["config"]["query_window"] == 16 and req["config"]["per_group"] is True
    assert req["time_only"] is False and req["clean_timing"] is False
    assert "queued" in at.get("progress")[0].proto.text

    Worker(store, models=models).drain()
    at.run()
    assert at.success and "done" in at.success[0].value
    at.button(key=f"open_{jobs[0].id}").click().run()
    assert not at.exception
    assert at.session_state["run_id"] == store.get_job(jobs[0].id).run_id
    assert "Explore" in at.title[0].value
    assert "Sketch estimate A_l" in charts(at)


def test_new_run_refuses_prompts_over_the_configured_limit(fresh_db, tiny_model, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_MAX_PROMPT_TOKENS", "100")
    at = new_app()
    at.session_state["nr_model"] = tiny_model
    at.session_state["nr_prompt"] = prompts.license_text()[:2000]
    at.run()
    err = [e.value for e in at.error]
    assert any("exceeds the limit of 100 tokens" in e for e in err), err
    assert at.button(key="btn_run").disabled


# ---- Explore ---------------------------------------------------------------------------------


def test_explore_draws_the_layer_matrices_and_follows_the_slider(app_env):
    url, ids = app_env
    store = open_store(url)
    rid = ids["sketchwalk"]
    stats = store.layer_stats(rid, "prefill")
    at = on_page(new_app().run(), "explore", rid)

    layer = at.select_slider(key="ex_layer").value
    assert layer == 2  # first sparse layer by default (0 and 1 are dense)
    figs = charts(at)
    for title in ("Sketch estimate A_l", "Walk score W_l", "Exact block mass", "Selected blocks"):
        assert title in figs
    hm = store.heatmap(rid, "prefill", 0, layer)
    n = hm["n_blocks"]
    walk = z_array(figs["Walk score W_l"]["data"][0])
    assert walk.shape == (n, n)
    np.testing.assert_allclose(
        walk, np.log10(np.maximum(hm["walk"], 1e-6)), rtol=1e-5, equal_nan=True
    )  # log scale is on by default
    metrics = {m.label: m.value for m in at.metric}
    row = stats[stats["layer"] == layer].iloc[0]
    assert metrics["Achieved density"] == f"{row['density_achieved']:.3f}"
    assert metrics["Mass recall"] == f"{row['mass_recall']:.3f}"
    run = store.get_run(rid)  # a tiny model has no layer profile: the run's density everywhere
    target = figures.layer_target(run["config"], run["metrics"], layer)
    assert metrics["Target"] == f"{target:.3f}" == f"{run['config']['density']:.3f}"

    at.toggle(key="ex_log").set_value(False).run()
    at.select_slider(key="ex_layer").set_value(3).run()
    hm3 = store.heatmap(rid, "prefill", 0, 3)
    z = z_array(charts(at)["Walk score W_l"]["data"][0])
    np.testing.assert_allclose(z, hm3["walk"], rtol=1e-6, equal_nan=True)
    assert any("Layer 3" in c.value for c in at.caption)

    at.select_slider(key="ex_layer").set_value(0).run()
    assert "runs dense attention" in at.info[0].value
    assert "Walk score W_l" not in charts(at)


def test_explore_preview_rethresholds_and_queues_a_real_rerun(app_env):
    url, ids = app_env
    store = open_store(url)
    rid = ids["sketchwalk"]
    at = on_page(new_app().run(), "explore", rid)
    at.select_slider(key="ex_preview_density").set_value(0.5).run()
    figs = charts(at)
    title = next(t for t in figs if t.startswith("PREVIEW (not a run)"))
    assert "density 0.50" in title
    kept = z_array(figs[title]["data"][0])
    run = store.get_run(rid)
    from sketchwalk.app import figures

    layer = at.select_slider(key="ex_layer").value
    # a per-group run: each KV group selects from its own scores; the layer keeps any group's
    walks = np.stack([store.heatmap(rid, f"prefill:g{g}", 0, layer)["walk"] for g in (0, 1)])
    expected = figures.preview_selection(walks, run["prompt_tokens"], run["config"], (0.5, 0.5))
    np.testing.assert_array_equal(np.nan_to_num(kept) == 1, expected.any(0))
    _, forced = figures.selection_rule(kept.shape[0], run["prompt_tokens"], run["config"])
    assert (np.nansum(kept, axis=1) >= forced.sum(1)).all()
    metrics = {m.label: m.value for m in at.metric}
    causal = figures.causal_mask(kept.shape[0], kept.shape[0])
    per_group = [e[causal].sum() / causal.sum() for e in expected]
    assert metrics["Preview density"] == f"{np.mean(per_group):.3f}"

    before = {j.id for j in store.list_jobs()}
    at.button(key="btn_rerun_density").click().run()
    new = [j for j in store.list_jobs() if j.id not in before]
    assert len(new) == 1
    assert new[0].request["config"]["density"] == 0.5
    assert new[0].request["prompt"] == run["prompt"]
    assert "Queued job" in at.success[0].value


def test_explore_shows_each_layers_target_from_the_runs_layer_profile(
    app_env, tmp_path, monkeypatch, tiny_model, models
):
    """A run under a layer profile: the layer's target density is its profile share, not the
    run's density, and the per-layer curves draw the targets beside the achieved densities."""
    from transformers import AutoConfig

    from sketchwalk.engine.method.layer_profile import LayerProfile, fingerprint, save

    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path / "profiles"))
    url = str(tmp_path / "profiled.duckdb")
    monkeypatch.setenv("SKETCHWALK_DB", url)
    model_config = AutoConfig.from_pretrained(tiny_model)
    groups = model_config.num_key_value_heads
    layers = range(2, model_config.num_hidden_layers)  # tiny_config keeps layers 0 and 1 dense
    shares = {i: tuple((0.1 + 0.2 * (i % 2) + 0.05 * g,) for g in range(groups)) for i in layers}
    save(LayerProfile(fingerprint(model_config), (0.2,), shares, "test"))
    store = open_store(url)
    job = store.enqueue_job(
        make_request(prompts.license_text()[:1100], tiny_config(), tiny_model, 2)
    )
    Worker(store, models=models).drain()
    run = store.get_run(store.get_job(job).run_id)
    store.close()
    assert run["metrics"]["layer_densities"]["3"] == pytest.approx([s[0] for s in shares[3]])

    at = on_page(new_app().run(), "explore", run["id"])
    at.select_slider(key="ex_layer").set_value(3).run()
    want = sum(s[0] for s in shares[3]) / groups
    assert {m.label: m.value for m in at.metric}["Target"] == f"{want:.3f}"
    at.radio(key="ex_view").set_value("Per-layer curves").run()
    traces = {t["name"]: t for t in charts(at)["Per layer"]["data"]}
    target = traces["target density (layer profile)"]
    assert list(target["x"]) == list(layers)
    assert target["y"][1] == pytest.approx(want)


def test_explore_depth_and_decode_views(app_env):
    url, ids = app_env
    at = on_page(new_app().run(), "explore", ids["sketchwalk"])
    at.radio(key="ex_view").set_value("Depth view (the walk)").run()
    figs = charts(at)
    assert {"Direct estimate (rows of A_l)", "Walk score (rows of W_l)"} <= set(figs)
    depth = z_array(figs["Walk score (rows of W_l)"]["data"][0])
    assert depth.shape[0] == 2  # two sparse layers in the tiny model
    assert any("kept thanks to the walk" in c.value for c in at.caption)
    at.radio(key="ex_view").set_value("Decode tokens").run()
    title = next(t for t in charts(at) if t.startswith("Decode"))
    y = charts(at)[title]["data"][0]["y"]
    assert y[0].startswith("step 1 · «")
    at.radio(key="ex_phase").set_value("decode").run()
    assert not at.exception
    assert at.select_slider(key="ex_step").value == 1


def test_explore_play_advances_to_the_last_layer(app_env, monkeypatch):
    url, ids = app_env
    import sketchwalk.app.pages  # noqa: F401  (the page module reads PLAY_INTERVAL_S at run time)

    at = on_page(new_app().run(), "explore", ids["sketchwalk"])
    at.button(key="btn_play").click().run()
    assert at.select_slider(key="ex_layer").value == 3  # played through to the last layer
    assert not at.session_state["ex_playing"]


def _strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def chart_strings(at) -> str:
    """Every string inside the page's plotly figures (parsed, so JSON escapes cannot hide '<')."""
    return "\n".join(s for el in at.get("plotly_chart") for s in _strings(spec(el)))


def test_prompt_html_renders_as_text_everywhere(app_env):
    url, ids = app_env
    at = on_page(new_app().run(), "explore", ids["injection"])
    assert any(t.startswith(INJECTION) for t in texts(at))  # st.text: shown literally
    labels = chart_strings(at)
    assert "«&lt;script&gt;alert(1)&lt;/script&gt;" in labels  # hover labels: escaped
    assert "<script" not in labels and "<img" not in labels
    for md in at.markdown:
        assert "<script>" not in md.value and "onerror" not in md.value
    at.radio(key="ex_view").set_value("Decode tokens").run()  # block labels on its axis
    labels = chart_strings(at)
    assert "&lt;script&gt;" in labels and "<script" not in labels
    at = on_page(at, "compare", ids["injection"])
    tokens = charts(at)["Per-token KL"]["data"][0]["customdata"]  # one hover text per token
    assert "&lt;" in tokens and "&gt;&lt;" in tokens
    assert not any("<" in t or ">" in t for t in tokens)


# ---- Compare, Speed, Runs --------------------------------------------------------------------


def test_compare_shows_metrics_generations_and_kl(app_env):
    url, ids = app_env
    store = open_store(url)
    rid = ids["sketchwalk"]
    run = store.get_run(rid)
    at = on_page(new_app().run(), "compare", rid)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Top-1 agreement (prompt)"] == f"{run['metrics']['top1_agreement']:.3f}"
    assert metrics["KL dense‖sparse (prompt)"] == f"{run['metrics']['kl_mean']:.4f}"
    shown = [t.strip() for t in texts(at)]  # st.text dedents
    assert run["dense_text"].strip() in shown and run["sparse_text"].strip() in shown
    table = at.dataframe[0].value
    assert len(table) == 4 and {"position", "diverged", "kl"} <= set(table.columns)
    kl = charts(at)["Per-token KL"]["data"][0]
    assert len(z_array({"z": kl["x"]}).ravel()) == run["prompt_tokens"] + 4

    at.radio(key="cmp_mode").set_value("another run's sparse generation").run()
    at.selectbox(key="cmp_other").set_value(ids["nowalk"]).run()
    assert not at.exception
    assert store.get_run(ids["nowalk"])["sparse_text"].strip() in [t.strip() for t in texts(at)]
    assert {"A", "B"} <= set(at.dataframe[0].value.columns)


CLEAN_LABELS = [
    "Prefill, whole model",
    "Prefill, attention alone",
    "Decode, whole model",
    "Decode, attention alone",
]


def test_speed_shows_stage_times_and_queues_a_sweep(app_env):
    url, ids = app_env
    store = open_store(url)
    rid = ids["sketchwalk"]
    at = on_page(new_app().run(), "speed", rid)
    metrics = [(m.label, m.value) for m in at.metric]
    assert [label for label, _ in metrics[:4]] == CLEAN_LABELS  # the clean pass leads
    assert all("×" in value for _, value in metrics[:4])  # whole model: "1.02× (0.98–1.05)"
    values = dict(metrics)
    assert values["Prefill, whole model, recorded"].endswith("×")
    assert values["Attention, sparse layers (per-layer records)"].endswith("×")
    assert "Recording overhead (sparse)" in values
    ceiling = [c.value for c in at.caption if c.value.startswith("Ceiling at this length")]
    assert len(ceiling) == 1 and "at density" in ceiling[0]  # what the length allows at all
    machine = store.get_run(rid)["versions"]  # where it was timed, under the headline
    timed = [c.value for c in at.caption if c.value.startswith("Timed on")]
    assert timed == [f"Timed on {plain_markdown(machine['cpu'])} ({machine['isa']}, "
                     f"{machine['threads']} threads), torch {machine['torch']}, "
                     f"transformers {machine['transformers']}."]  # fmt: skip
    fig = charts(at)["Stage time per layer (ms) and speedup over dense"]
    assert [t["name"] for t in fig["data"]][:5] == [
        "sketch",
        "walk",
        "select",
        "sparse attention",
        "dense attention",
    ]
    assert z_array({"z": fig["data"][0]["x"]}).ravel().tolist() == [2, 3]
    assert len(at.dataframe[0].value) == 1  # one run of this prompt with this method so far
    assert float(at.dataframe[0].value["Ceiling ×"].iloc[0]) >= 1.0  # its whole-model ceiling
    before = {j.id for j in store.list_jobs()}
    prompt = store.get_run(rid)["prompt"]
    pending = {  # queued earlier (Explore's "re-run for real"): a sweep does not repeat them
        j.request["config"]["density"] for j in store.list_jobs("queued")
        if j.request["prompt"] == prompt and j.request["config"]["method"] == "sketchwalk"
    }  # fmt: skip
    want = [d for d in (0.05, 0.1, 0.3, 0.5) if d not in pending]
    assert at.button(key="btn_sweep").label == f"Queue a sweep ({len(want)} runs)"
    at.button(key="btn_sweep").click().run()
    new = [j for j in store.list_jobs() if j.id not in before]
    assert sorted(j.request["config"]["density"] for j in new) == want
    assert f"Queued {len(want)} runs at densities" in at.success[0].value
    button = at.button(key="btn_sweep")  # what is queued counts: no duplicates on a 2nd click
    assert button.disabled and button.label == "Queue a sweep (0 runs)"
    at = on_page(new_app().run(), "speed", rid)  # a fresh session sees the queued jobs too
    assert at.button(key="btn_sweep").disabled


def test_speed_and_explore_of_a_time_only_run(fresh_db, tiny_model, models):
    with open_store(fresh_db) as store:
        text = prompts.license_text()[:900]
        job = store.enqueue_job(make_request(text, tiny_config(), tiny_model, 2, time_only=True))
        Worker(store, models=models).drain()
        run_id = store.get_job(job).run_id
        assert run_id is not None and store.layer_stats(run_id).empty
    at = on_page(new_app().run(), "speed", run_id)
    metrics = [(m.label, m.value) for m in at.metric]
    assert [label for label, _ in metrics[:4]] == CLEAN_LABELS
    labels = [label for label, _ in metrics]
    assert "Prefill, whole model, time-only pass" in labels
    assert "Recording overhead (sparse)" not in labels  # nothing was recorded
    assert "Stage time per layer (ms) and speedup over dense" not in charts(at)
    assert any("time-only: it has no per-layer records" in i.value for i in at.info)
    at = on_page(at, "explore", run_id)
    assert any("time-only: it has no per-layer records" in w.value for w in at.warning)
    assert not at.get("plotly_chart")
    at = on_page(at, "compare", run_id)  # its generations and metrics are all there
    assert at.metric and at.dataframe


def test_speed_of_a_run_stored_before_clean_timings(fresh_db, seeded):
    """An older run: recorded timings only, a request with no time_only key."""
    import sqlalchemy as sa

    from sketchwalk.store import jsonio, schema

    src_url, ids = seeded
    with open_store(src_url) as src:
        data = src.export_zip([ids["sketchwalk"]])
    with open_store(fresh_db) as store:
        (run_id,) = store.import_parquet(data)
        run = store.get_run(run_id)
        old_timings = {k: v for k, v in run["timings"].items() if "clean" not in k}
        old_timings = {k: v for k, v in old_timings.items() if "overhead" not in k}
        old_request = {
            k: v for k, v in run["request"].items() if k not in ("time_only", "clean_timing")
        }
        odd = {**run["versions"], "cpu": "[x](javascript:alert(1)) **y**", "isa": 7}  # untrusted
        with store.engine.begin() as conn:
            conn.execute(
                sa.update(schema.runs)
                .where(schema.runs.c.id == run_id)
                .values(
                    timings=jsonio.dumps(old_timings),
                    request=jsonio.dumps(old_request),
                    versions=jsonio.dumps(odd),
                )
            )
    at = on_page(new_app().run(), "speed", run_id)
    info = [i.value for i in at.info]
    assert len(info) == 1 and "no clean-pass timings" in info[0]
    assert not any(c.value.startswith("Ceiling") for c in at.caption)  # no clean dense pass
    timed = [c.value for c in at.caption if c.value.startswith("Timed on")]
    assert "\\[x\\]" in timed[0] and "\\*\\*y" in timed[0]  # shown literally, no link
    assert timed == [  # the number where text belongs (isa) is left out
        f"Timed on {plain_markdown(odd['cpu'])} ({odd['threads']} threads), "
        f"torch {odd['torch']}, transformers {odd['transformers']}."
    ]
    labels = [m.label for m in at.metric]
    assert (
        labels[0] == "Prefill, whole model, recorded"
        and "Recording overhead (sparse)" not in labels
    )
    assert "Stage time per layer (ms) and speedup over dense" in charts(at)


def test_runs_table_filters_and_deletes(fresh_db, monkeypatch, seeded):
    src_url, ids = seeded
    with open_store(src_url) as src:
        data = src.export_zip([ids["sketchwalk"], ids["nowalk"]])
    with open_store(fresh_db) as dst:
        dst.import_parquet(data)
    at = new_app().run()
    at = on_page(at, "runs")
    assert len(at.dataframe[0].value) == 2
    at.multiselect(key="runs_method").set_value(["nowalk"]).run()
    view = at.dataframe[0].value
    assert view["Method"].tolist() == ["nowalk"]  # headers read as words, not snake_case
    assert "2 runs; click a column header" in at.caption[0].value
    at.multiselect(key="runs_picked").set_value([ids["nowalk"]]).run()
    assert at.button(key="btn_delete").disabled  # needs the confirmation tick
    assert at.button(key="btn_delete").label == "Delete 1 run"  # not "1 runs"
    at.checkbox(key="runs_confirm").check().run()
    at.multiselect(key="runs_picked").set_value([ids["sketchwalk"]]).run()
    assert not at.checkbox(key="runs_confirm").value  # a tick is for the runs it was given for
    assert at.button(key="btn_delete").disabled
    at.multiselect(key="runs_picked").set_value([ids["nowalk"]]).run()
    at.checkbox(key="runs_confirm").check().run()
    at.button(key="btn_delete").click().run()
    assert not at.exception
    with open_store(fresh_db) as s:
        assert s.list_runs()["id"].tolist() == [ids["sketchwalk"]]
