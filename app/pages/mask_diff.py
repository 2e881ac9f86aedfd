"""Mask diff: two runs of the same prompt side by side per layer (A only / B only / both).

Reached from Compare (its two runs) and from Runs (two selected runs); both put the pair in
session state under DIFF_KEY. Reads the store only.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from sketchwalk.app import figures, widgets
from sketchwalk.engine.run.request import stored_time_only

DIFF_KEY = "diff_pair"

store = widgets.setup("Mask diff")
url = widgets.db_url()
runs = widgets.done_runs(store)
if len(runs) < 2:
    st.info("The mask diff needs two finished runs of the same prompt.")
    st.stop()
ids = list(runs["id"])
labels = widgets.run_labels(runs)
pair = st.session_state.pop(DIFF_KEY, None)
if pair and all(p in ids for p in pair):
    st.session_state["df_a"], st.session_state["df_b"] = pair
c1, c2 = st.columns(2)
with c1:
    a_id = st.selectbox("Run A", ids, key="df_a", format_func=lambda i: labels.get(i, i))
with c2:
    rest = [i for i in ids if i != a_id]
    if st.session_state.get("df_b") not in rest:
        st.session_state["df_b"] = rest[0]
    b_id = st.selectbox("Run B", rest, key="df_b", format_func=lambda i: labels.get(i, i))

ra, rb = widgets.run_meta(url, a_id), widgets.run_meta(url, b_id)
if ra.get("prompt") != rb.get("prompt"):
    st.warning(
        "The two runs have different prompts: their masks cannot be compared block by block."
    )
    st.stop()
sa, sb = widgets.layer_stats(url, a_id), widgets.layer_stats(url, b_id)
keys = ["phase", "step", "layer"]
common = sa[keys].merge(sb[keys], on=keys)
common = common[common["phase"] == "prefill"]
if common.empty:
    timed = [x for x, r in (("A", ra), ("B", rb)) if stored_time_only(r.get("request")) is True]
    st.warning(
        f"Run {' and '.join(timed)} {'is' if len(timed) == 1 else 'are'} time-only: no per-layer "
        "records, so no masks to compare."
        if timed
        else "The two runs have no prefill layer records in common (were both recorded?)."
    )
    st.stop()
layers = sorted(common["layer"].tolist())
dense_a = set(sa.loc[(sa["phase"] == "prefill") & sa["dense"], "layer"])
first_sparse = next((x for x in layers if x not in dense_a), layers[0])
if st.session_state.get("df_layer") not in layers:
    st.session_state["df_layer"] = first_sparse
layer = st.select_slider("Layer", layers, key="df_layer")

ha = widgets.heatmap(url, a_id, "prefill", 0, int(layer))
hb = widgets.heatmap(url, b_id, "prefill", 0, int(layer))
if int(ha["n_blocks"]) != int(hb["n_blocks"]):
    st.warning("The runs split the prompt into different blocks (block size differs).")
    st.stop()
d = figures.mask_diff(ha, hb)


def _f(x, spec: str = ".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


ma, mb = ra.get("metrics") or {}, rb.get("metrics") or {}
m = st.columns(4)
m[0].metric("A only", d.a_only)
m[1].metric("B only", d.b_only)
m[2].metric("Both", d.both)
m[3].metric("Overlap (both / either)", _f(d.jaccard))
q = st.columns(4)
q[0].metric("Mass recall A", _f(d.recall_a))
q[1].metric("Mass recall B", _f(d.recall_b))
q[2].metric("KL A (prompt)", _f(ma.get("kl_mean"), ".4f"))
q[3].metric("KL B (prompt)", _f(mb.get("kl_mean"), ".4f"))
st.caption(
    f"A = {labels[a_id]} · B = {labels[b_id]} · layer {layer} · {int(ha['n_blocks'])} blocks"
)

blocks = widgets.blocks(url, a_id)
x = figures.block_labels(blocks, int(ha["n_blocks"]))
st.plotly_chart(figures.diff_figure(d, x), key="df_fig", config={"displaylogo": False})


@st.cache_data(show_spinner=False, max_entries=16)
def per_layer(url: str, a_id: str, b_id: str, layers: tuple[int, ...]) -> pd.DataFrame:
    rows = []
    for x in layers:
        dx = figures.mask_diff(
            widgets.heatmap(url, a_id, "prefill", 0, x), widgets.heatmap(url, b_id, "prefill", 0, x)
        )
        rows.append(
            {"layer": x, "jaccard": dx.jaccard, "recall_a": dx.recall_a, "recall_b": dx.recall_b}
        )
    return pd.DataFrame(rows)


curve = per_layer(url, a_id, b_id, tuple(int(x) for x in layers))
st.plotly_chart(figures.diff_curves(curve), key="df_curves", config={"displaylogo": False})
