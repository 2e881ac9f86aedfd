"""Explore: one run's block-level attention, layer by layer, with a density preview.

Reads the store only (cached per layer), builds figures with the pure functions in figures/.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from sketchwalk.app import figures, prompts, view_link, widgets
from sketchwalk.app.verdict import FAR_ABS, FAR_RATIO
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.records import group_phase, split_phase
from sketchwalk.engine.run.request import stored_time_only
from sketchwalk.errors import ConfigError
from sketchwalk.settings import load as load_settings
from sketchwalk.store.limits import view_refusal
from sketchwalk.store.needle import (
    NeedleNotFound,
    NeedleTrace,
    needle_steps,
    strip_matrix,
)
from sketchwalk.text import plain_markdown

PLAY_INTERVAL_S = 0.8
NO_WALK = (
    "The walk is off in this run (walk damping 0): blocks were selected from each layer's own "
    "sketch estimate A_l, and this run recorded no walk scores."
)
PREVIEW_HINT = "The preview re-thresholds stored prefill scores of a sparse layer: pick one above."
ALL_GROUPS = -1  # the group picker's "all groups" (None would show as an empty choice)


def heads_note(per_group: bool, pool: str) -> str:
    """Why there is no per-head view: what the store keeps of the heads."""
    unit = "KV-head group" if per_group else "layer"
    return (
        f"No per-head view: the store keeps no per-head scores or masks. Selection is per {unit}: "
        f"the heads' block estimates are pooled ({pool}) into one before selecting, and every "
        f"head of a {unit} attends to the same kept blocks (so each head's mask is its "
        f"{unit}'s). One token's attention per head is computed on demand from Compare's "
        "drill-down."
    )


def _generated(url: str, run_id: str, stats: pd.DataFrame) -> list[str]:
    """The sparse model's generated tokens, in order: one per decode step recorded."""
    steps = stats.loc[stats["phase"] != "prefill", "step"]
    return widgets.generated(url, run_id, int(steps.max()) if len(steps) else 0)


def walk_counterfactual(metrics: dict, layer: int) -> tuple[str, str] | None:
    """For a run that selected without the walk but recorded what it would do (the runner's
    walk_effect): the walk heatmap's title and one caption line for this layer; None where the
    run has no such record."""
    eff = metrics.get("walk_effect")
    if not isinstance(eff, dict) or eff.get("used") or "layers" not in eff:
        return None
    beta = eff.get("beta")
    title = f"Walk score W_l at damping {beta:g}: not used for selection"
    mine = next((x for x in eff["layers"] if x.get("layer") == layer), None)
    if mine is None:
        return title, "The walk's scores are shown for comparison; this run selected on A_l."
    gain = mine.get("mass_gain")
    mass = "" if gain is None else f", exact mass {gain:+.4f} per query-block row"
    return title, (
        f"This run selected on A_l (walk damping 0). The walk at damping {beta:g}, not used "
        f"here, would keep +{mine['added']} / -{mine['dropped']} blocks in this layer{mass}."
    )


def walks(config: dict, method: str | None) -> bool:
    """Whether the run walked (beta > 0 with a method that walks): else no walk views. A config
    stored without beta (older or hand-made runs) cannot say: what was stored is shown."""
    if "beta" not in config:
        return True
    try:
        cfg = SketchWalkConfig.from_stored({**config, "method": method or config.get("method")})
    except (ConfigError, TypeError, ValueError):
        return True
    return cfg.effective_beta > 0


store = widgets.setup("Explore")
url = widgets.db_url()
run_id = widgets.pick_run(store, "explore", runs=widgets.explorable_runs(store))
if run_id is None:
    st.info("No finished runs yet: start one on the New run page.")
    st.stop()

run, stats = widgets.run_and_stats(url, run_id)  # a run still timing its speed half: fresh
view_link.apply(run_id)  # a shared link (?run=&phase=&layer=&group=&token=) opens its view
blocks = widgets.blocks(url, run_id)
prompt_tokens = int(run.get("prompt_tokens") or 0)
WALKS = walks(run.get("config") or {}, run.get("method"))

widgets.verdict_panel(run, stats, "ex")

with st.expander("Prompt (as text)"):
    st.text(run["prompt"])
    if widgets.cut_note(run, "prompt"):
        st.caption(widgets.cut_note(run, "prompt"))

if stats.empty:  # nothing below can be drawn without per-layer records
    st.warning(
        (
            "This run is time-only: it has no per-layer records, so there is nothing to "
            "explore layer by layer."
            if stored_time_only(run.get("request")) is True
            else "This run has no per-layer records (it was run without recording)."
        )
        + " Compare shows its generations and quality, Speed its timings."
    )
    st.stop()

too_wide = view_refusal(stats, load_settings().view_max_blocks)  # heatmaps allocate n x n
if too_wide:
    st.error(plain_markdown(too_wide))
    st.stop()

# ---- needle: a text in the prompt, followed through every layer and step -------------------
if st.session_state.get("ex_needle_run") != run_id:  # a pass-key run: follow its key at once
    st.session_state["ex_needle_run"] = run_id
    st.session_state["ex_needle"] = prompts.find_pass_key(run.get("prompt") or "") or ""
needle_text = st.text_input(
    "Needle: text in the prompt to follow (e.g. a pass key)",
    key="ex_needle",
    max_chars=200,
    help="Its blocks are outlined on every heatmap; the strip shows, per layer and step, "
    "whether they were kept, their rank in the selecting scores and their exact mass.",
)
needle_blocks: list[int] = []
if needle_text:
    try:
        needle = widgets.needle(url, run_id, needle_text)
    except NeedleNotFound:
        st.warning("That text does not occur in this run's prompt.")
    else:
        needle_blocks = needle.blocks
        trace = NeedleTrace(run_id, needle, needle_steps(widgets.last_rows(url, run_id), needle))
        st.info(trace.sentence())
        if trace.steps:
            st.plotly_chart(
                figures.needle_strip(strip_matrix(trace.steps), _generated(url, run_id, stats)),
                key="needle_strip",
                config={"displaylogo": False},
            )
            st.caption(
                "Each cell: colour = share of the needle's blocks kept; **#rank** = the best rank "
                "of a needle block among the row's selection scores (#1 = the block the "
                f"{'walk' if WALKS else 'sketch estimate'} scored highest; blocks ranked below "
                "the row's budget are dropped); the number after it = the needle's share of the "
                "row's exact attention mass (where recorded)."
            )

# ---- where: phase, step, layer ------------------------------------------------------------
phases = [p for p in ("prefill", "decode") if (stats["phase"] == p).any()]
c1, c2, c3, c4 = st.columns([1, 1, 1, 1])
with c1:
    phase = st.radio("Phase", phases, horizontal=True, key="ex_phase")
steps = sorted(stats.loc[stats["phase"] == phase, "step"].unique().tolist())
with c2:
    step = (
        st.select_slider("Decode step", steps, key="ex_step")
        if phase == "decode" and len(steps) > 1
        else steps[0]
    )
with c3:
    palette = st.selectbox(
        "Palette", figures.PALETTES, key="ex_palette", help="All four are colour-blind safe."
    )
with c4:
    log = st.toggle("Log colour", value=True, key="ex_log", help="A log colour scale.")
    miss_threshold = st.number_input(
        "Miss threshold",
        0.0,
        1.0,
        0.05,
        0.01,
        key="ex_miss_threshold",
        help="Blocks with at least this exact attention mass that were not selected are marked "
        "as misses.",
    )


@st.fragment
def layer_panel(
    run: dict,
    stats: pd.DataFrame,
    blocks: pd.DataFrame,
    phase: str,
    step: int,
    palette: str,
    log: bool,
    miss_threshold: float,
    needle_blocks: list[int],
) -> None:
    """Everything that depends on the layer: a slider move (or Play) reruns only this, not the
    run picker, the prompt, the needle trace or the controls above."""
    run_id, cfg = run["id"], run.get("config") or {}
    here = (stats["phase"] == phase) & (stats["step"] == step)
    layers = sorted(stats.loc[here, "layer"].tolist())
    if "ex_layer_next" in st.session_state:
        st.session_state["ex_layer"] = st.session_state.pop("ex_layer_next")
    if st.session_state.get("ex_layer") not in layers:
        st.session_state["ex_layer"] = next(
            (
                x
                for x in layers
                if not stats.loc[(stats["phase"] == phase) & (stats["layer"] == x), "dense"].all()
            ),
            layers[0],
        )
    s1, s2 = st.columns([5, 1])
    with s1:
        layer = st.select_slider("Layer", layers, key="ex_layer")
    with s2:
        playing = st.session_state.get("ex_playing", False)
        if st.button(
            "⏸ Pause" if playing else "▶ Play", key="btn_play", help="Step through the layers"
        ):
            playing = not playing
            st.session_state["ex_playing"] = playing

    # ---- KV-head group (runs with per-group selection) ---------------------------------------
    group_ids = sorted(
        {
            g
            for ph in stats["phase"].unique()
            for base, g in [split_phase(ph)]
            if base == phase and g is not None
        }
    )
    data_phase = phase
    if group_ids:
        if "ex_group_next" in st.session_state:  # from Compare's drill-down
            wanted = st.session_state.pop("ex_group_next")
            st.session_state["ex_group"] = wanted if wanted in group_ids else ALL_GROUPS
        g1, g2 = st.columns([3, 2])
        with g1:
            group = st.selectbox(
                "KV-head group (selection is per group in this run)",
                [ALL_GROUPS, *group_ids],
                format_func=lambda g: (
                    "all groups (kept by any)" if g == ALL_GROUPS else f"group {g}"
                ),
                key="ex_group",
            )
        with g2:
            multiples = st.toggle(
                "Small multiples",
                key="ex_group_multiples",
                help="Every group's kept blocks side by side.",
            )
        has = (stats["phase"] == group_phase(phase, max(group, 0))) & (stats["step"] == step)
        if group != ALL_GROUPS and (has & (stats["layer"] == layer)).any():
            data_phase = group_phase(phase, group)

    view_link.write(run_id, phase, int(layer), split_phase(data_phase)[1], step)

    # ---- the layer's four matrices ---------------------------------------------------------
    t0 = time.perf_counter()
    row = stats[
        (stats["phase"] == data_phase) & (stats["step"] == step) & (stats["layer"] == layer)
    ].iloc[0]
    n_hm = int(row["n_blocks"])
    region = None
    if n_hm > figures.MAX_SIDE:  # long context: tiles when zoomed out, full detail in a region
        z1, z2 = st.columns(2)
        for key in ("ex_zoom_q", "ex_zoom_k"):
            lo_hi = st.session_state.get(key)
            if not (isinstance(lo_hi, tuple | list) and 0 <= lo_hi[0] <= lo_hi[1] < n_hm):
                st.session_state[key] = (0, n_hm - 1)
        with z1:
            zq = st.slider("Zoom: query blocks", 0, n_hm - 1, key="ex_zoom_q")
        with z2:
            zk = st.slider("Zoom: key blocks", 0, n_hm - 1, key="ex_zoom_k")
        region = (int(zq[0]), int(zq[1]), int(zk[0]), int(zk[1]))
    view = figures.plan_view(n_hm, region)
    url = widgets.db_url()
    data = widgets.layer_view(url, run_id, data_phase, step, int(layer), region)
    figs = figures.data_figures(data, log, palette, miss_threshold)
    counterfactual = None if WALKS else walk_counterfactual(run.get("metrics") or {}, int(layer))
    if counterfactual is not None and "walk" in figs:
        figs["walk"].update_layout(title={"text": counterfactual[0]})
    elif not WALKS:
        figs.pop("walk", None)  # an older run stored A_l as its walk: nothing to show
    query = st.session_state.get(widgets.QUERY_KEY)
    query_row = None
    if isinstance(query, dict) and query.get("run") == run_id and phase == "prefill":
        query_row = int(query["position"]) // int(cfg.get("block_size") or 1)
    for fig in figs.values():
        figures.outline_blocks(fig, needle_blocks, n_hm, view)
        if query_row is not None:
            figures.outline_row(fig, query_row, n_hm, view)
    build_ms = widgets.ms(t0)

    m = st.columns(5)
    m[0].metric("Achieved density", "dense" if row["dense"] else f"{row['density_achieved']:.3f}")
    group_shown = split_phase(data_phase)[1]
    target = figures.layer_target(cfg, run.get("metrics"), int(layer), group_shown)
    m[1].metric(
        "Target",
        f"{target:.3f}",
        help="This layer's share of the run's density (its layer profile; the run's density "
        "when the profile is uniform).",
    )
    m[2].metric(
        "Sketch error",
        "–" if np.isnan(row["sketch_error"]) else f"{row['sketch_error']:.3f}",
        help="Total-variation (TV) distance between the block estimate and the exact mean block "
        "mass, per row. With max pooling (the default) the estimate ranks each block by the "
        "query or head that needs it most, so it differs from the mean mass by design: compare "
        "runs of one pooling.",
    )
    m[3].metric("Mass recall", "–" if np.isnan(row["mass_recall"]) else f"{row['mass_recall']:.3f}")
    n_miss = (
        0
        if row["dense"] or data.exact_full is None
        else len(figures.find_misses(data.exact_full, data.kept_full, miss_threshold)[0])
    )
    m[4].metric("Misses", n_miss)
    detail = (
        f" · zoomed out: tiles of {view.tile}×{view.tile} blocks (colour = max, hover = max and"
        f" mean); narrow the zoom sliders to {figures.MAX_SIDE} blocks or fewer for full detail"
        if view.tiled
        else ""
    )
    st.caption(f"Layer {layer} · {n_hm} blocks · data + figures {build_ms:.0f} ms{detail}")
    got = row["density_achieved"]
    if not row["dense"] and got == got and got > target * FAR_RATIO and got - target > FAR_ABS:
        st.caption(
            f":material/warning: This layer kept {got:.2f} of its causal block pairs against a "
            f"target of {target:.2f}: the forced blocks (sink, local window) take that much at "
            "this length (the verdict above says how much)."
        )
    if phase == "prefill" and not row["dense"]:
        try:
            run_cfg = SketchWalkConfig.from_stored(cfg)
            st.caption(heads_note(run_cfg.per_group, run_cfg.pool))
        except (ConfigError, TypeError, ValueError):
            pass  # a config that does not parse: nothing to say about its heads
    if group_ids:
        _, which = split_phase(data_phase)
        st.caption(
            f"Matrices and metrics describe KV-head group {which}."
            if which is not None
            else "Matrices and metrics describe all KV-head groups (estimates averaged, kept = "
            "kept by any group)."
        )
        if multiples:
            cols = st.columns(len(group_ids))
            for col, g in zip(cols, group_ids, strict=True):
                gphase = group_phase(phase, g)
                if not ((stats["phase"] == gphase) & (stats["layer"] == layer)).any():
                    continue
                gdata = widgets.layer_view(url, run_id, gphase, step, int(layer), region)
                gfig = figures.data_figures(gdata, miss_threshold=miss_threshold).get("mask")
                if gfig is not None:
                    gfig.update_layout(title={"text": f"Group {g}: kept blocks"}, height=320)
                    with col:
                        st.plotly_chart(gfig, key=f"group_mask_{g}", config={"displaylogo": False})

    order = [k for k in ("sketch", "walk", "exact", "mask") if k in figs]
    if row["dense"]:
        st.info(
            "This layer runs dense attention (no walk, no selection); its sketch estimate is shown."
        )
    elif counterfactual is not None:
        st.caption(counterfactual[1])
    elif not WALKS:
        st.caption(NO_WALK)
    for i in range(0, len(order), 2):
        cols = st.columns(2)
        for col, name in zip(cols, order[i : i + 2], strict=False):
            with col:
                st.plotly_chart(figs[name], key=f"hm_{name}", config={"displaylogo": False})
    if "exact" not in figs and not row["dense"]:
        st.caption("Exact block mass was not recorded (context longer than the recorder's limit).")

    if query_row is not None:
        query_panel(run, int(query["position"]), int(layer), query_row)
    where = (data_phase, step, int(layer))
    dense = bool(row["dense"])
    stored_groups = tuple(  # the layer's per-group prefill records, all of them or none
        g
        for g in group_ids
        if ((stats["phase"] == group_phase("prefill", g)) & (stats["layer"] == layer)).any()
    )
    stored_groups = stored_groups if stored_groups == tuple(range(len(group_ids))) else ()
    density_preview(
        run,
        where,
        dense,
        n_hm,
        view,
        region,
        blocks,
        miss_threshold,
        needle_blocks,
        stored_groups,
    )
    more_views(
        run, stats, blocks, phase, step, int(layer), layers, n_hm, log, palette, needle_blocks
    )

    if st.session_state.get("ex_playing"):
        i = layers.index(layer)
        ctx = get_script_run_ctx()  # a fragment-scoped rerun is refused during a full run
        scope = "fragment" if ctx and ctx.fragment_ids_this_run else "app"
        if i + 1 < len(layers):
            time.sleep(PLAY_INTERVAL_S)
            st.session_state["ex_layer_next"] = layers[i + 1]
        else:  # the last layer: stop, and draw the button again so it offers Play
            st.session_state["ex_playing"] = False
        st.rerun(scope=scope)


def query_panel(run: dict, position: int, layer: int, row: int) -> None:
    """The token picked in Compare's drill-down: its row is outlined above; here its top source
    tokens per head in this layer, computed on demand (widgets.query_layers)."""
    run_id = run["id"]
    url = widgets.db_url()
    c1, c2 = st.columns([5, 1])
    with c1:
        st.caption(
            f"Outlined row: query block B{row}, which holds token t{position} (picked in "
            "Compare). Below, that token's top source tokens per head in this layer."
        )
    with c2:
        if st.button("Clear the token", key="btn_ex_clear_query"):
            st.session_state.pop(widgets.QUERY_KEY, None)
            st.rerun()
    with st.spinner(f"Re-running the sparse prefill to read token t{position}'s attention…"):
        layers = widgets.query_layers(url, run_id, position)
    ql = next((q for q in layers if q.layer == layer), None)
    if ql is None:
        st.caption(f"No prefill record of layer {layer} for token t{position}.")
        return
    texts = widgets.token_texts(url, run_id, tuple(p for row in ql.top for p, _, _ in row))
    dropped = (
        "a dense layer: nothing dropped"
        if ql.dense
        else ", ".join(f"group {g}: {m:.1%}" for g, m in enumerate(ql.dropped_by_group))
    )
    st.caption(f"Attention of t{position} on dropped blocks in layer {layer}: {dropped}.")
    st.plotly_chart(figures.top_sources_figure(ql, texts), key="ex_top_sources")


@st.cache_data(show_spinner=False, max_entries=32)
def _basis(
    url: str, run_id: str, layer: int, groups: tuple[int, ...]
) -> figures.PreviewBasis | None:
    """What the layer's preview selects from (figures.preview_basis), read once per layer."""
    meta = widgets.run_meta(url, run_id)
    conf = meta.get("config") or {}
    return figures.preview_basis(
        widgets.heatmap(url, run_id, "prefill", 0, layer),
        [widgets.heatmap(url, run_id, group_phase("prefill", g), 0, layer) for g in groups],
        meta.get("method") or conf.get("method", "sketchwalk"),
        conf,
        meta.get("metrics"),
        layer,
    )


@st.cache_data(show_spinner=False, max_entries=32)
def _preview(
    url: str, run_id: str, layer: int, groups: tuple[int, ...], densities: tuple[float, ...]
) -> np.ndarray:
    """[G, n, n]: each selection group's kept blocks at `densities`, cached: moving another
    control must not recompute it."""
    meta = widgets.run_meta(url, run_id)
    basis = _basis(url, run_id, layer, groups)
    conf = meta.get("config") or {}
    return figures.preview_selection(
        basis.scores, int(meta.get("prompt_tokens") or 0), conf, densities
    )


def density_stops(target: float) -> list[float]:
    """The preview slider's stops: every 0.01, and the run's own density exactly (a profile's
    share such as 0.2347 rounded to 0.23 would select something else)."""
    return sorted({round(i / 100, 2) for i in range(1, 101)} | {float(target)})


def density_preview(
    run: dict,
    where: tuple[str, int, int],
    dense: bool,
    n: int,
    view: figures.View,
    region: tuple[int, int, int, int] | None,
    blocks: pd.DataFrame,
    miss_threshold: float,
    needle_blocks: list[int],
    groups: tuple[int, ...],
) -> None:
    """What a sparse prefill layer (where = data phase, step, layer) would keep at another
    density: the engine's selection over the scores each KV-head group ranked, at the group
    densities the run stored, so at the run's own density it is the stored selection. Reads
    the layer's full matrices, so past MAX_SIDE blocks only when asked."""
    st.subheader("Density preview")
    url, run_id = widgets.db_url(), run["id"]
    data_phase, step, layer = where
    if split_phase(data_phase)[0] != "prefill" or dense:
        st.caption(PREVIEW_HINT)
        return
    if n > figures.MAX_SIDE and not st.toggle(  # the engine's selection takes seconds there
        f"Compute the preview ({n} blocks: several seconds per density)",
        value=False,
        key="ex_preview_on",
    ):
        return
    hm = widgets.heatmap(url, run_id, data_phase, step, layer)
    basis = _basis(url, run_id, layer, groups)
    if basis is None:
        st.caption(PREVIEW_HINT)
        return
    group = split_phase(data_phase)[1]
    own = basis.target(group)
    stops = density_stops(own)
    if st.session_state.get("ex_preview_for") != (run_id, data_phase, layer) or (
        st.session_state.get("ex_preview_density") not in stops
    ):  # another run, layer or group: start from its own density, not the last position
        st.session_state["ex_preview_for"] = (run_id, data_phase, layer)
        st.session_state["ex_preview_density"] = own
    p1, p2 = st.columns([3, 1])
    with p1:
        rho = st.select_slider(
            "What would be kept at this density?",
            stops,
            format_func=lambda x: f"{x:.3f} (this run)" if x == own else f"{x:.2f}",
            key="ex_preview_density",
            help="Starts at this layer's own density in the run: the preview is then the "
            "stored selection. Other densities keep the groups' spread in proportion.",
        )
    kept_g = _preview(url, run_id, layer, groups, basis.densities_at(float(rho), group))
    causal = figures.causal_mask(n, n)
    if group is not None and group < len(kept_g):
        kept = kept_g[group]
        density = figures.kept_density(kept, causal)
    else:  # the layer: kept by any group; density as the engine counts it (mean over groups)
        kept = kept_g.any(0)
        density = float(np.mean([figures.kept_density(k, causal) for k in kept_g]))
    recall = figures.mass_recall(hm.get("exact"), kept)
    with p2:
        st.metric("Preview density", f"{density:.3f}")
        st.metric("Preview mass recall", "–" if recall is None else f"{recall:.3f}")
    if basis.why:
        st.caption(f":material/info: {basis.why}")
    elif rho == own:
        differ = int((kept != np.asarray(hm["selected"], bool)).sum())
        st.caption(
            "At this run's own density the preview is the stored selection (the same scores per "
            "KV-head group, group densities, query tiles and forced blocks)."
            if differ == 0
            else f"At this run's own density the preview differs from the stored selection in "
            f"{widgets.plural(differ, 'block')}: the stored scores do not reproduce it."
        )
    ptitle = f"PREVIEW (not a run): blocks kept at density {rho:.2f}, layer {layer}"
    if region is None:
        labels = figures.block_labels(blocks, n)
        misses = figures.find_misses(hm.get("exact"), kept, miss_threshold)
        pfig = figures.mask_figure(kept, causal, labels, labels, title=ptitle, misses=misses)
    else:
        pfig = figures.mask_view_figure(
            kept, hm.get("exact"), view, blocks, miss_threshold, title=ptitle
        )
    figures.outline_blocks(pfig, needle_blocks, n, None if region is None else view)
    st.plotly_chart(pfig, key="preview", config={"displaylogo": False})
    if st.button(f"Re-run at density {rho:.2f} for real", key="btn_rerun_density"):
        job_id = widgets.submit(widgets.get_store(), widgets.rerun_request(run, density=float(rho)))
        st.success(f"Queued job {job_id[:8]} at density {rho:.2f}; follow it on the New run page.")


def more_views(
    run: dict,
    stats: pd.DataFrame,
    blocks: pd.DataFrame,
    phase: str,
    step: int,
    layer: int,
    layers: list[int],
    n: int,
    log: bool,
    palette: str,
    needle_blocks: list[int],
) -> None:
    """Per-layer curves, the depth view of the walk, or the decode tokens of this layer."""
    url, run_id, cfg = widgets.db_url(), run["id"], run.get("config") or {}
    prompt_tokens = int(run.get("prompt_tokens") or 0)
    options = ["Per-layer curves", "Depth view (the walk)", "Decode tokens"]
    if not WALKS:
        options.remove("Depth view (the walk)")
        if st.session_state.get("ex_view") not in options:
            st.session_state["ex_view"] = options[0]
    view = st.radio("More", options, horizontal=True, key="ex_view")
    if view == "Per-layer curves":
        cur = stats[(stats["phase"] == phase) & (stats["step"] == step)]
        if not WALKS and walk_counterfactual(run.get("metrics") or {}, layer) is None:
            cur = cur.drop(columns=["walk_error"], errors="ignore")
        metrics = run.get("metrics") or {}
        targets = (
            {
                int(x): figures.layer_target(cfg, metrics, int(x))
                for x in cur.loc[~cur["dense"], "layer"]
            }
            if metrics.get("layer_densities")
            else None
        )
        st.plotly_chart(figures.layer_curves(cur, layer, targets), key="curves")
    elif view == "Depth view (the walk)":
        q_block = st.number_input("Query block", 0, n - 1, n - 1, key="ex_depth_q")
        if phase != "prefill":
            st.caption("The depth view reads prefill layers; switch the phase to prefill.")
            return
        mats = [(x, widgets.heatmap(url, run_id, "prefill", 0, int(x))) for x in layers]
        depth = figures.depth_matrices(mats, int(q_block), prompt_tokens, cfg, run.get("metrics"))
        if not depth["layers"]:
            st.caption("No sparse layers with walk scores in this run.")
            return
        st.caption(
            f"Orange circles: blocks kept thanks to the walk (the per-layer estimate alone would "
            f"have dropped them): {int(depth['rescued'].sum())} block-layers carrying on average "
            f"{depth['rescued_mass']:.3f} of the exact mass per layer."
        )
        dfigs = figures.depth_figures(depth, blocks, log=log, palette=palette)
        for name, fig in dfigs.items():
            figures.outline_blocks(fig, needle_blocks, int(depth["n_blocks"]))
            st.plotly_chart(fig, key=f"depth_{name}")
    else:
        rows = widgets.decode_rows(url, run_id, layer)
        asked = int((run.get("request") or {}).get("max_new_tokens", 0) or 0)
        gen = widgets.generated(url, run_id, max(asked, len(rows["steps"])))
        fig = figures.decode_figure(rows, gen, blocks)
        if fig is None:
            st.caption("No decode records for this layer (dense decode, or no tokens generated).")
        else:
            figures.outline_blocks(fig, needle_blocks, int(np.max(rows["n_blocks"])))
            st.plotly_chart(fig, key="decode")
            if len(gen) < asked:
                st.caption(
                    f"The sparse model wrote its end-of-text token after {len(gen)} of the "
                    f"{asked} new tokens asked for, so the strip ends there."
                )


layer_panel(
    run, stats, blocks, phase, int(step), palette, log, float(miss_threshold), needle_blocks
)

st.download_button(
    "Download this run (Parquet zip)",
    data=lambda: store.export_zip([run_id]),
    file_name=f"sketchwalk-run-{run_id[:8]}.zip",
    mime="application/zip",
    on_click="ignore",
    key="btn_download_run",
)
