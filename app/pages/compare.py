"""Compare: dense vs sparse generations of a run, or the sparse generations of two runs."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from sketchwalk.app import figures, widgets

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


m = st.columns(5)
m[0].metric("Top-1 agreement (prompt)", _fmt(metrics.get("top1_agreement"), ".3f"))
m[1].metric("KL dense‖sparse (prompt)", _fmt(metrics.get("kl_mean")))
m[2].metric(
    "Perplexity dense → sparse",
    f"{_fmt(metrics.get('ppl_dense'), '.2f')} → {_fmt(metrics.get('ppl_sparse'), '.2f')}",
)
m[3].metric("KL of generation", _fmt(metrics.get("gen_kl_mean")))
m[4].metric("Common prefix (tokens)", _fmt(metrics.get("gen_common_prefix"), ".0f"))

other_ids = [i for i in runs["id"] if i != run_id]
labels = {r["id"]: widgets.run_label(r) for _, r in runs.iterrows()}
mode = st.radio(
    "Compare with",
    ["its dense generation", "another run's sparse generation"],
    horizontal=True,
    key="cmp_mode",
    disabled=not other_ids,
)


def _tokens(rid: str) -> pd.DataFrame:
    return widgets.tokens(url, rid)


toks = _tokens(run_id)
if mode == "its dense generation" or not other_ids:
    left_title, right_title = "Dense", f"Sparse ({run.get('method')})"
    left_text, right_text = run.get("dense_text") or "", run.get("sparse_text") or ""
    table = figures.token_table(toks, n)
    table = table.rename(columns={"dense": left_title, "sparse": right_title})
else:
    other = st.selectbox(
        "Other run", other_ids, format_func=lambda i: labels.get(i, i), key="cmp_other"
    )
    orun = widgets.run_meta(url, other)
    if orun.get("prompt") != run.get("prompt"):
        st.warning(
            "The two runs have different prompts: their generations are not comparable token by token."
        )
    left_title, right_title = f"A: {labels[run_id]}", f"B: {labels[other]}"
    left_text, right_text = run.get("sparse_text") or "", orun.get("sparse_text") or ""
    a = toks[toks["variant"] == "sparse"].assign(variant="dense")
    b = _tokens(other)
    b = b[b["variant"] == "sparse"]
    table = figures.token_table(pd.concat([a, b]), n)
    table = table.rename(columns={"dense": "A", "sparse": "B", "kl": "kl (B)"})
    if st.button("Diff the two runs' masks, layer by layer", key="btn_cmp_diff"):
        st.session_state["diff_pair"] = (run_id, other)
        st.switch_page("pages/mask_diff.py")

c1, c2 = st.columns(2)
with c1:
    st.caption(left_title)  # labels are ids and numbers, never prompt text
    st.text(left_text)
with c2:
    st.caption(right_title)
    st.text(right_text)

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
st.plotly_chart(figures.kl_strip(toks, n), key="cmp_kl")
