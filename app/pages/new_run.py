"""New run: a prompt (pasted or a bundled sample), the knobs, Run, and live progress."""

from __future__ import annotations

import streamlit as st

from sketchwalk import settings
from sketchwalk.app import prompts, widgets
from sketchwalk.engine.config import METHODS, PHASES, ConfigError, SketchWalkConfig
from sketchwalk.errors import SketchWalkError
from sketchwalk.worker.loop import make_request

store = widgets.setup("New run")
limits = settings.load()
defaults = SketchWalkConfig()
INITIAL = {
    "nr_prompt": "",
    "nr_model": "smollm2",
    "nr_method": defaults.method,
    "nr_phase": defaults.phases,
    "nr_density": defaults.density,
    "nr_block_size": defaults.block_size,
    "nr_sketch_dim": defaults.sketch_dim,
    "nr_tau": defaults.tau,
    "nr_beta": defaults.beta,
    "nr_degree": defaults.degree,
    "nr_seed": defaults.seed,
    "nr_sink": defaults.sink,
    "nr_window": defaults.window,
    "nr_dense_layers": ",".join(map(str, defaults.dense_layers)),
    "nr_dense_tail": defaults.dense_tail_blocks,
    "nr_max_new": min(32, limits.max_new_tokens),
}
for _key, _value in INITIAL.items():  # defaults via session state: kept across page switches
    st.session_state.setdefault(_key, _value)


def _load_sample() -> None:
    name = st.session_state.get("nr_sample")
    if name in prompts.SAMPLES:
        st.session_state["nr_prompt"] = prompts.SAMPLES[name]()


st.selectbox(
    "Start from a sample",
    ["(type or paste below)", *prompts.SAMPLES],
    key="nr_sample",
    on_change=_load_sample,
    help="Bundled texts: a license (prose), a code file, synthetic pass-key retrieval prompts.",
)
prompt = st.text_area("Prompt", key="nr_prompt", height=220, max_chars=limits.max_prompt_chars)

left, right = st.columns([2, 1])
with left:
    model_id = st.text_input(
        "Model", key="nr_model", help="smollm2 (default), a Hugging Face id, or a local folder"
    )
with right:
    method = st.selectbox("Method", METHODS, key="nr_method")

errors: list[str] = []
notes: list[str] = []
info = None
try:
    info = widgets.model_info(model_id or "smollm2")
except SketchWalkError as exc:
    errors.append(str(exc))

n_tokens = None
if info is not None:
    n_tokens = widgets.count_tokens(info, prompt) if prompt else 0
    limit = min(info.max_context, limits.max_prompt_tokens)
    st.caption(f"{n_tokens} tokens · limit {limit} tokens for {widgets.short_model(info.model_id)}")

c1, c2 = st.columns(2)
with c1:
    phase = st.radio("Sparse in", PHASES, horizontal=True, key="nr_phase")
with c2:
    density = st.slider("Target density", 0.01, 1.0, step=0.01, key="nr_density")

with st.expander("Advanced"):
    a1, a2, a3 = st.columns(3)
    with a1:
        block_size = st.selectbox("Block size", [16, 32, 64, 128, 256], key="nr_block_size")
        sketch_dim = st.number_input("Sketch dim r", 1, 4096, key="nr_sketch_dim")
        tau = st.number_input("Temperature τ", 0.0, 100.0, step=0.1, key="nr_tau")
    with a2:
        beta = st.number_input("Walk damping β (0 = no walk)", 0.0, 1.0, step=0.05, key="nr_beta")
        degree = st.number_input("Walk degree", 1, 64, key="nr_degree")
        seed = st.number_input("Seed", 0, 2**31 - 1, key="nr_seed")
    with a3:
        sink = st.number_input(
            "Sink (fraction of context)", 0.0, 1.0, step=0.005, format="%.3f", key="nr_sink"
        )
        window = st.number_input(
            "Window (fraction of context)", 0.0, 1.0, step=0.01, key="nr_window"
        )
        dense_layers = st.text_input("Dense layers", key="nr_dense_layers")
        dense_tail = st.number_input("Dense tail blocks", 0, 1024, key="nr_dense_tail")
    max_new = st.number_input(
        f"Max new tokens (limit {limits.max_new_tokens})",
        0,
        limits.max_new_tokens,
        key="nr_max_new",
    )

cfg = None
try:
    layers = tuple(int(x) for x in dense_layers.replace(" ", "").split(",") if x)
except ValueError:
    errors.append(f"Dense layers must be comma-separated integers, got {dense_layers!r}")
    layers = None
if layers is not None:
    try:
        cfg = SketchWalkConfig(
            block_size=int(block_size),
            sketch_dim=int(sketch_dim),
            tau=float(tau),
            beta=float(beta),
            degree=int(degree),
            density=float(density),
            sink=float(sink),
            window=float(window),
            dense_layers=layers,
            dense_tail_blocks=int(dense_tail),
            phases=phase,
            method=method,
            seed=int(seed),
        )
    except ConfigError as exc:
        errors.append(str(exc))

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
    elif cfg is not None and cfg.block_size > n_tokens:
        errors.append(f"Block size {cfg.block_size} is larger than the prompt ({n_tokens} tokens).")

for message in errors:
    st.error(message)
for message in notes:
    st.info(message)

if st.button("Run", type="primary", disabled=bool(errors or notes), key="btn_run"):
    request = make_request(
        prompt, cfg.to_dict(), model=(model_id.strip() or None), max_new_tokens=int(max_new)
    )
    job_id = widgets.submit(store, request)
    st.toast(f"Queued job {job_id[:8]}")

my_jobs = st.session_state.get(widgets.JOBS_KEY, [])


def _active(jobs) -> bool:
    return any(j.status in ("queued", "running") for j in jobs)


def _jobs_panel() -> None:
    jobs = [store.get_job(j) for j in reversed(my_jobs)]
    queued = [j.id for j in reversed(store.list_jobs("queued"))]  # oldest first
    for job in jobs[:5]:
        pos = queued.index(job.id) if job.id in queued else None
        widgets.show_job(job, pos)
        if (
            job.status == "done"
            and job.run_id
            and st.button("Open in Explore", key=f"open_{job.id}")
        ):
            st.session_state[widgets.RUN_KEY] = job.run_id
            st.switch_page("pages/explore.py")
    if not _active(jobs) and st.session_state.get("nr__was_active"):
        st.session_state["nr__was_active"] = False
        st.rerun()  # stop polling
    st.session_state["nr__was_active"] = _active(jobs)


if my_jobs:
    st.subheader("Your runs")
    polling = _active([store.get_job(j) for j in my_jobs])
    st.fragment(_jobs_panel, run_every=limits.poll_s if polling else None)()
