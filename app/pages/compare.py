"""Compare: dense vs sparse generations of a run, or the sparse generations of two runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from sketchwalk.app import figures, widgets
from sketchwalk.errors import SketchWalkError
from sketchwalk.text import plain_markdown

store = widgets.setup("Compare")
url = widgets.db_url()
runs = widgets.done_runs(store)
run_id = widgets.pick_run(store, "cmp", "Run", runs)
if run_id is None:
    st.info("No finished runs yet: start one on the New run page.")
    st.stop()

run = widgets.run_meta(url, run_id)
metrics = run.get("metrics") or {}
n = int(run.get("prompt_tokens") or 0)


def _fmt(x, spec: str = ".4f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


m = st.columns(3)
m[0].metric("Top-1 agreement (prompt)", _fmt(metrics.get("top1_agreement"), ".3f"))
m[1].metric("KL dense‖sparse (prompt)", _fmt(metrics.get("kl_mean")))
m[2].metric("KL of generation", _fmt(metrics.get("gen_kl_mean")))
m = st.columns(3)
m[0].metric("Perplexity, dense", _fmt(metrics.get("ppl_dense"), ".2f"))
m[1].metric("Perplexity, sparse", _fmt(metrics.get("ppl_sparse"), ".2f"))
m[2].metric("Common prefix (tokens)", _fmt(metrics.get("gen_common_prefix"), ".0f"))

other_ids = [i for i in runs["id"] if i != run_id]
labels = widgets.run_labels(runs)
mode = st.radio(
    "Compare with",
    ["its dense generation", "another run's sparse generation"],
    horizontal=True,
    key="cmp_mode",
    disabled=not other_ids,
)


def _generated(rid: str, variant: str | None = None) -> pd.DataFrame:
    """A run's generated tokens (from position n on), at most GENERATED_LABELS of each."""
    return widgets.token_window(url, rid, n, n + widgets.GENERATED_LABELS, variant)


if mode == "its dense generation" or not other_ids:
    left_title, right_title = "Dense", f"Sparse ({run.get('method')})"
    left_text, right_text = run.get("dense_text") or "", run.get("sparse_text") or ""
    left_cut, right_cut = widgets.cut_note(run, "dense_text"), widgets.cut_note(run, "sparse_text")
    gen = _generated(run_id)
    table = figures.token_table(gen, n)
    table = table.rename(columns={"dense": left_title, "sparse": right_title})
else:
    other = st.selectbox(
        "Other run", other_ids, format_func=lambda i: labels.get(i, i), key="cmp_other"
    )
    orun = widgets.run_meta(url, other)
    if not store.same_prompt(run_id, other):
        st.warning(
            "The two runs have different prompts: their generations are not comparable token by token."
        )
    left_title, right_title = f"A: {labels[run_id]}", f"B: {labels[other]}"
    left_text, right_text = run.get("sparse_text") or "", orun.get("sparse_text") or ""
    left_cut, right_cut = (
        widgets.cut_note(run, "sparse_text"),
        widgets.cut_note(orun, "sparse_text"),
    )
    gen = _generated(run_id, "sparse")
    a = gen.assign(variant="dense")
    b = _generated(other, "sparse")
    table = figures.token_table(pd.concat([a, b]), n)
    table = table.rename(columns={"dense": "A", "sparse": "B", "kl": "kl (B)"})
    if st.button("Diff the two runs' masks, layer by layer", key="btn_cmp_diff"):
        st.session_state["diff_pair"] = (run_id, other)
        st.switch_page("pages/mask_diff.py")

c1, c2 = st.columns(2)
for col, title, text, cut in (
    (c1, left_title, left_text, left_cut),
    (c2, right_title, right_text, right_cut),
):
    with col:
        st.caption(title)  # labels are ids and numbers, never prompt text
        st.text(text)
        if cut:
            st.caption(cut)

first = table.index[table["diverged"]].min() if table["diverged"].any() else None
st.caption(
    "Generations agree on every token."
    if first is None
    else f"Generations diverge at generated token {int(first)} (position {int(table['position'][first])}); "
    "diverged rows are highlighted."
)


def _highlight(row: pd.Series) -> list[str]:
    colour = "background-color: #FBE3D6" if row["diverged"] else ""
    return [colour] * len(row)


st.dataframe(table.style.apply(_highlight, axis=1), hide_index=True, key="cmp_table")
if len(gen) and left_title == "Dense":
    for variant, name in (("dense", "dense"), ("sparse", "sparse")):
        ids = gen[gen["variant"] == variant]
        if len(ids) < int((run.get("request") or {}).get("max_new_tokens", 0) or 0):
            st.caption(
                f"The {name} generation stopped after {len(ids)} tokens: the model wrote its "
                "end-of-text token."
            )

# ---- from a bad token to its cause ---------------------------------------------------------
st.subheader("From a bad token to its cause")
worst = widgets.worst_tokens(url, run_id)
centre = int(worst["position"].iloc[0]) if len(worst) else 0
strip = st.plotly_chart(
    figures.kl_strip(widgets.token_window(url, run_id, *figures.strip_span(centre), "sparse"), n),
    key="cmp_kl",
    on_select="rerun",
    selection_mode="points",
)
if worst.empty:
    st.caption("No prompt token has a KL to explain in this run.")
    st.stop()
clicked = [int(p["x"]) for p in (strip.selection.points if strip else []) if "x" in p]
if st.session_state.get("cmp_query_run") != run_id:
    # another run: its own tokens to pick from (the box's old value named the last run's token)
    st.session_state["cmp_query_run"] = run_id
    for _key in ("cmp_query", "cmp_click"):
        st.session_state.pop(_key, None)
explain = st.session_state.get("cmp_explained")  # (run, token) whose cause is shown
# a click on a prompt token's bar explains it; the selection stays in the chart's state, so a
# click counts once (a later pick in the box below must not be undone by an old click)
if clicked and 0 < clicked[0] < n and (run_id, clicked[0]) != st.session_state.get("cmp_click"):
    st.session_state["cmp_click"] = (run_id, clicked[0])
    st.session_state["cmp_query"] = clicked[0]
    explain = (run_id, clicked[0])
asked = st.session_state.get("cmp_query")
asked = int(asked) if isinstance(asked, int | np.integer) else -1  # a stale label is no token
choices = list(dict.fromkeys([*(int(p) for p in worst["position"]), asked]))
choices = [c for c in choices if 0 < c < n]
shown = [worst] + (
    []
    if asked in worst["position"].tolist() or not 0 < asked < n
    else [widgets.token_window(url, run_id, asked, asked + 1, "sparse")]
)
labels_q = figures.token_choice_labels(pd.concat(shown), choices)
if st.session_state.get("cmp_query") not in choices:
    st.session_state["cmp_query"] = choices[0]
q1, q2 = st.columns([2, 1], vertical_alignment="bottom")
with q1:
    position = st.selectbox(
        "Token to explain (the prompt tokens with the highest KL; or click a bar above)",
        choices,
        format_func=lambda p: labels_q.get(p, str(p)),
        key="cmp_query",
    )
with q2:
    if st.button("Explain this token", key="btn_cmp_explain"):
        explain = (run_id, int(position))
st.session_state["cmp_explained"] = explain
if explain != (run_id, int(position)):
    st.caption(
        "Click a token's bar or press Explain: the page re-runs this run's sparse prefill to "
        "read that token's attention (about as long as the run's own sparse prefill)."
    )
    st.stop()
doing = f"Re-running this run's sparse prefill to read token t{position}'s attention"
bar = st.progress(0.0, text=f"{doing}: loading the model…")
try:
    layers = widgets.query_layers(
        url, run_id, int(position), lambda f, msg: bar.progress(min(f, 1.0), text=f"{doing}: {msg}")
    )
except SketchWalkError as exc:
    bar.empty()
    st.error(plain_markdown(f"Cannot re-run this run's prefill: {exc}"))
    st.stop()
bar.empty()
dropped = figures.dropped_table(layers)
st.caption(
    "Per sparse layer and KV-head group: the exact attention mass of this token (softmax over "
    "every key, averaged over the group's heads) that fell on key blocks its row did not keep. "
    "Not stored with the run: computed on demand by re-running its sparse prefill with the same "
    "prompt, config and model (memory: one row of scores per head)."
)
if dropped.empty:
    st.info("Every layer of this run is dense for this token: nothing was dropped.")
    st.stop()
top = dropped.iloc[0]
st.info(
    f"Token t{position}: the most attention lost is in layer {int(top['Layer'])}, KV group "
    f"{int(top['KV group'])}: {top['Dropped attention']:.1%} of its attention fell on blocks "
    "that row did not keep."
)
d1, d2 = st.columns([3, 2])
with d1:
    st.plotly_chart(figures.dropped_figure(layers, int(position)), key="cmp_dropped")
with d2:
    st.dataframe(dropped.head(8), hide_index=True, key="cmp_dropped_table")
    for i, r in dropped.head(3).iterrows():
        layer_, group_ = int(r["Layer"]), int(r["KV group"])
        if st.button(
            f"Open layer {layer_}, group {group_} in Explore (row of t{position} outlined)",
            key=f"btn_cmp_open_{i}",
        ):
            widgets.open_query_in_explore(run_id, int(position), layer_, group_)
