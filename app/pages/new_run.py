"""New run: a prompt (pasted or a bundled sample), the knobs, Run, and live progress."""

from __future__ import annotations

import streamlit as st

from sketchwalk import access, settings
from sketchwalk.app import knob_widgets, prompts, widgets
from sketchwalk.app.live import wait_in_fragment
from sketchwalk.app.verdict import FAR_ABS, FAR_RATIO, density_floor
from sketchwalk.engine.method.config import PRESETS, presets_help
from sketchwalk.engine.run.request import Limits, RequestError, RunRequest
from sketchwalk.errors import ConfigError, SketchWalkError
from sketchwalk.store.errors import StoreError
from sketchwalk.text import plain_markdown
from sketchwalk.worker.loop import make_request

store = widgets.setup("New run")
WHAT_IT_IS = (
    "**Sketch&Walk** runs a language model with sparse attention (each block of queries reads "
    "only the key blocks a cheap sketch scores highest) beside the same model dense, and shows "
    "what was kept, what it cost in quality and what it saved in time."
)
FIRST_STEP = (
    "First time here? Load the needle demo (a 2k-token text hiding pass key "
    f"{prompts.NEEDLE_DEMO_KEY}), press Run, then open Explore to follow the key through the "
    "layers."
)
limits = settings.load()
INITIAL = {
    "nr_prompt": "",
    "nr_model": "smollm2",
    "nr_preset": "default",
    "nr_max_new": min(32, limits.max_new_tokens),
    "nr_time_only": False,
    "nr_clean_timing": True,
    **knob_widgets.initial_state("default"),
}
# Streamlit drops a widget's value once a run goes by without that widget (another page, or a
# fragment rerun there), so the form keeps a copy under a key no widget owns and restores it.
SAVED = "form_new_run"
for _key, _value in st.session_state.get(SAVED, {}).items():
    st.session_state.setdefault(_key, _value)
for _key, _value in INITIAL.items():  # defaults via session state: kept across page switches
    st.session_state.setdefault(_key, _value)


def _load_sample() -> None:
    name = st.session_state.get("nr_sample")
    if name in prompts.SAMPLES:
        st.session_state["nr_prompt"] = prompts.SAMPLES[name]()


def _load_demo() -> None:
    """The first step offered to a new visitor: the needle demo's prompt, ready to run."""
    st.session_state["nr_sample"] = prompts.NEEDLE_DEMO_LABEL
    _load_sample()


st.markdown(WHAT_IT_IS)
d1, d2 = st.columns([2, 1], vertical_alignment="center")
with d1:
    st.markdown(FIRST_STEP)
with d2:
    st.button("Try the needle demo", key="btn_nr_demo", on_click=_load_demo)
st.selectbox(
    "Start from a sample",
    ["(type or paste below)", *prompts.SAMPLES],
    key="nr_sample",
    on_change=_load_sample,
    help="Bundled texts: a license (prose), a code file, synthetic pass-key retrieval prompts.",
)
# no max_chars on the widget: the browser would cut a longer paste silently; it is refused below
prompt = st.text_area("Prompt", key="nr_prompt", height=150)
too_long = len(prompt) > limits.max_prompt_chars

left, right = st.columns([2, 1])
policy = access.load()
with left:
    if policy.restricted:  # a shared deployment: only the models its operator listed
        names = list(policy.models)
        choice = st.selectbox("Model", names, index=names.index(policy.default_model))
        model_id = policy.resolve(choice)
    else:
        model_id = st.text_input(
            "Model", key="nr_model", help="smollm2 (default), a Hugging Face id, or a local folder"
        )
with right:
    st.selectbox(
        "Preset",
        tuple(PRESETS),
        key="nr_preset",
        on_change=knob_widgets.apply_preset,
        help=presets_help(),
    )

errors: list[str] = []
notes: list[str] = []
info = None
try:
    info = widgets.model_info(model_id or "smollm2", check=not policy.restricted)
except SketchWalkError as exc:
    errors.append(str(exc))

n_tokens = None
if too_long:  # refused before tokenizing (a huge paste would take seconds to count)
    errors.append(
        f"The prompt has {len(prompt):,} characters; the limit is {limits.max_prompt_chars:,}. "
        "Nothing was cut: shorten it or use sketchwalk run --prompt-file for longer texts."
    )
elif info is not None:
    n_tokens = widgets.count_tokens(info, prompt) if prompt else 0
    limit = min(info.max_context, limits.max_prompt_tokens)
    st.caption(
        f"{widgets.plural(n_tokens, 'token')} · limit {limit} tokens for {widgets.short_model(info.model_id)} · "
        f"{len(prompt):,} of at most {limits.max_prompt_chars:,} characters"
    )

# Run, its messages and the job panel sit here, above the knobs, so Run shows without
# scrolling; they are drawn at the end, once every knob has been read.
run_slot = st.container()

values = knob_widgets.render("basic", columns=3)
t1, t2 = st.columns(2)
with t1:
    time_only = st.checkbox(
        "Time only (no per-layer records)",
        key="nr_time_only",
        help="Faster: keeps the generations, quality metrics, density and timings, but not the "
        "per-layer records Explore and Mask diff draw. Always times the clean passes.",
    )
with t2:
    clean_timing = st.checkbox(
        "Also time a clean pass",
        key="nr_clean_timing",
        disabled=time_only,
        help="After the recorded run, three dense and three sparse prefills without the "
        "recorder (the first of each also decodes the new tokens): the speed your own code "
        "would see, as a median with its range, and what recording cost. A time-only run "
        "always times them.",
    )
clean_timing = True if time_only else clean_timing
with st.expander("Advanced"):
    values.update(knob_widgets.render("advanced", columns=3))
    max_new = st.number_input(
        f"Max new tokens (limit {limits.max_new_tokens})",
        0,
        limits.max_new_tokens,
        key="nr_max_new",
    )

st.session_state[SAVED] = {
    k: st.session_state[k]
    for k in (*INITIAL, "nr_sample")
    if k in st.session_state and not k.startswith("nr__")
}

cfg = None
try:
    cfg = knob_widgets.to_config(values)
except ConfigError as exc:
    errors.append(str(exc))
if cfg is not None and info is not None and info.n_layers:
    missing = sorted(x for x in cfg.dense_layers if x >= info.n_layers)
    if missing:  # the worker would load the model and fail on it: refused here
        errors.append(
            f"Dense layers: {widgets.short_model(info.model_id)} has {info.n_layers} layers "
            f"(0–{info.n_layers - 1}), so there is no layer {', '.join(map(str, missing))}."
        )

if n_tokens is not None and info is not None:
    limit = min(info.max_context, limits.max_prompt_tokens)
    if not prompt:
        notes.append("Type or paste a prompt, or pick a sample.")
    elif not prompt.strip():
        errors.append("The prompt is empty (only whitespace): type one or pick a sample.")
    elif n_tokens + int(max_new) > limit:
        errors.append(
            f"The prompt has {n_tokens} tokens; with {int(max_new)} new tokens that exceeds the limit of {limit} tokens."
        )
    elif cfg is not None:
        try:  # what the worker will check too (engine/run/request.py), before anything is queued
            RunRequest(
                prompt=prompt,
                config=cfg,
                model=model_id.strip() or None,
                max_new_tokens=int(max_new),
                time_only=bool(time_only),
                clean_timing=bool(clean_timing),
                limits=Limits.from_settings(limits),
            )
        except RequestError as exc:
            errors.append(str(exc))

with run_slot:  # Run first: messages under it never push it below the fold
    if st.button("Run", type="primary", disabled=bool(errors or notes), key="btn_run"):
        request = make_request(
            prompt,
            cfg.to_dict(),
            model=(model_id.strip() or None),
            max_new_tokens=int(max_new),
            time_only=bool(time_only),
            clean_timing=bool(clean_timing),
        )
        job_id = widgets.submit(store, request)
        st.toast(f"Queued job {job_id[:8]}")
    for message in errors:
        st.error(plain_markdown(message))
    for message in notes:
        st.info(message)
    if not errors and not notes and cfg is not None and n_tokens and cfg.method != "dense":
        floor = density_floor(cfg.to_dict(), n_tokens)  # the engine's selection at this length
        blocks = f"{widgets.plural(-(-n_tokens // cfg.block_size), 'block')} of {cfg.block_size}"
        if floor is not None and floor >= 0.995:
            st.warning(
                f"At {widgets.plural(n_tokens, 'token')} ({blocks}) the forced blocks (sink, local "
                "window, diagonal) are every causal block pair: this run will be dense in effect "
                f"(density 1.00), whatever the target {cfg.density:g}. A longer prompt or smaller "
                "blocks leave something to select.",
                icon="⚠️",
            )
        elif (
            floor is not None and floor > cfg.density * FAR_RATIO and floor - cfg.density > FAR_ABS
        ):
            st.warning(
                f"At {widgets.plural(n_tokens, 'token')} ({blocks}) the forced blocks alone (sink, "
                f"local window, diagonal{', of every row of a query tile' if cfg.rows_per_list > 1 else ''}) "
                f"keep {floor:.2f} of the causal block pairs, so this run cannot get near the target "
                f"density {cfg.density:g}: it will run at about {floor:.2f}. A longer prompt or "
                "smaller blocks let the density reach the target.",
                icon="⚠️",
            )

my_jobs = st.session_state.get(widgets.JOBS_KEY, [])


def _active(jobs) -> bool:
    return any(j.status in ("queued", "running") for j in jobs)


def _quality_half(job) -> dict | None:
    """The run of a running job once its quality half is stored (the clean passes still
    running), read fresh on every poll: its speed half is yet to come. None before that."""
    if job.status != "running" or not job.run_id:
        return None
    try:
        run = store.get_run(job.run_id)
    except StoreError:  # recovered and dropped meanwhile
        return None
    return run if run.get("status") == "running" and run.get("metrics") else None


def _newest_verdict(jobs) -> tuple[str | None, dict | None]:
    """The newest job with a verdict to show: a done run, or a running one whose quality half is
    stored (returned with it, fresh)."""
    for job in jobs:
        if job.status == "done" and job.run_id:
            return job.id, None
        live = _quality_half(job)
        if live is not None:
            return job.id, live
    return None, None


def _panel_signature() -> tuple:
    """What makes the panel worth redrawing at once: each job's status and whether its quality
    half is stored (progress lines wait for the next poll)."""
    return tuple(
        (job.status, _quality_half(job) is not None) for job in (store.get_job(j) for j in my_jobs)
    )


def _jobs_panel() -> None:
    wait_in_fragment(store.changes, _panel_signature, limits.poll_s)  # a poll's rerun only
    jobs = [store.get_job(j) for j in reversed(my_jobs)]
    queued = [j.id for j in reversed(store.list_jobs("queued"))]  # oldest first
    shown, live = _newest_verdict(jobs)
    for job in jobs[:5]:
        pos = queued.index(job.id) if job.id in queued else None
        widgets.show_job(job, pos)
        if job.id == shown and live is not None:  # quality first, speed items still timing
            widgets.verdict_panel(live, store.layer_stats(job.run_id), "nr")
        elif job.id == shown:  # the run summary: its verdict, where Run leads
            meta, stats = widgets.run_and_stats(widgets.db_url(), job.run_id)
            widgets.verdict_panel(meta, stats, "nr")
        if (
            job.run_id
            and (job.status == "done" or (job.id == shown and live is not None))
            and st.button("Open in Explore", key=f"open_{job.id}")
        ):
            st.session_state[widgets.RUN_KEY] = job.run_id
            st.switch_page("pages/explore.py")
    if not _active(jobs) and st.session_state.get("nr__was_active"):
        st.session_state["nr__was_active"] = False
        st.rerun()  # stop polling
    st.session_state["nr__was_active"] = _active(jobs)


with run_slot:
    if my_jobs:
        st.subheader("Your runs")
        polling = _active([store.get_job(j) for j in my_jobs])
        st.fragment(_jobs_panel, run_every=limits.poll_s if polling else None)()
