"""Benchmarks: the `sketchwalk eval` results in the store, as table and quality-vs-density plots.

Filterable by model, task and method. By default each (model, task, source, length, method,
density) cell shows its latest eval only, so re-running a grid replaces its points instead of
drawing zigzags; a specific eval can be picked instead. The figures are the same functions the
CLI writes to HTML/PNG (sketchwalk.eval.report), so both always agree.
"""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st

from sketchwalk import settings
from sketchwalk.app import figures, widgets
from sketchwalk.app.live import wait_in_fragment
from sketchwalk.app.verdict import FAR_ABS, FAR_RATIO, density_floor
from sketchwalk.eval import job as eval_job
from sketchwalk.eval import report as eval_report
from sketchwalk.eval.frontier import distance_to_oracle, variant_label
from sketchwalk.store import jsonio
from sketchwalk.store.bulk import arrow_schema
from sketchwalk.store.schema import eval_results as eval_table

CELL = ["model_id", "task", "source", "length", "method", "density_target", "variant"]
LATEST = "Latest per cell"
HEADERS = {  # shown headers; the frames keep their column names (the CLI's and Parquet's)
    "model_id": "Model",
    "task": "Task",
    "source": "Source",
    "length": "Length",
    "variant": "Variant",
    "method": "Method",
    "density_target": "Target density",
    "density_achieved": "Achieved density",
    "density_decode": "Decode density",
    "n_items": "Items",
    "ppl_dense": "Perplexity, dense",
    "ppl_sparse": "Perplexity, sparse",
    "ppl_increase_pct": "Perplexity +%",
    "kl_mean": "KL",
    "kl_oracle": "KL, oracle",
    "kl_gap": "KL gap",
    "ppl_gap_pct": "Perplexity gap %",
    "top1_agreement": "Top-1",
    "acc_dense": "Accuracy, dense",
    "acc_sparse": "Accuracy, sparse",
    "selection_share": "Selection share",
    "eval_id": "Eval",
}


def headed(df: pd.DataFrame) -> dict:
    """Column labels in words for st.dataframe (the data keeps its names)."""
    return {k: st.column_config.Column(v) for k, v in HEADERS.items() if k in df.columns}


def off_target(rows: list[dict]) -> list[str]:
    """One line per cell whose achieved density is far from its target, saying why."""
    out = []
    for r in rows:
        target, got = r.get("density_target"), r.get("density_achieved")
        if not isinstance(got, int | float) or not isinstance(target, int | float):
            continue
        if got <= target * FAR_RATIO or got - target <= FAR_ABS:
            continue
        floor = density_floor(r.get("config") or {}, int(r.get("length") or 0))
        why = f"the forced blocks alone keep {floor:.2f} at this length" if floor else ""
        out.append(
            f"{r['method']} at target {target:g} ({r['task']}, {r['length']} tokens) ran at "
            f"{got:.2f}" + (f": {why}" if why else "")
        )
    return out


def latest_per_cell(df: pd.DataFrame) -> pd.DataFrame:
    """The newest row of each cell (rows arrive oldest first)."""
    return df.drop_duplicates(subset=CELL, keep="last").reset_index(drop=True)


def eval_label(df: pd.DataFrame, eval_id: str) -> str:
    rows = df[df["eval_id"] == eval_id]
    when = pd.Timestamp(rows["created_at"].min()).strftime("%Y-%m-%d %H:%M")
    tasks = ",".join(sorted(rows["task"].unique()))
    return f"{when} · {eval_id[:8]} · {widgets.short_model(rows['model_id'].iloc[0])} · {tasks}"


def table(df: pd.DataFrame) -> pd.DataFrame:
    rows = eval_report.with_derived(df.to_dict("records"))
    out = pd.DataFrame(rows)
    cols = [
        "model_id",
        "task",
        "source",
        "length",
        "method",
        "density_target",
        "density_achieved",
        "density_decode",
        "n_items",
        "ppl_dense",
        "ppl_sparse",
        "ppl_increase_pct",
        "kl_mean",
        "top1_agreement",
        "acc_dense",
        "acc_sparse",
        "selection_share",
        "eval_id",
    ]
    out = out[[c for c in cols if c in out.columns]].copy()
    out["model_id"] = out["model_id"].map(widgets.short_model)
    return out


def parquet_bytes(df: pd.DataFrame) -> bytes:
    flat = df.copy()
    for col in ("config", "extra"):
        flat[col] = [jsonio.dumps(v) for v in flat[col]]
    data = pa.Table.from_pandas(flat, schema=arrow_schema(eval_table), preserve_index=False)
    sink = io.BytesIO()
    pq.write_table(data, sink, compression="zstd")
    return sink.getvalue()


def oracle_gaps(rows: list[dict]) -> pd.DataFrame:
    """Each method's cell beside the exact-mass oracle's at the same block size, granularity and
    density (rows without an oracle cell are left out)."""
    paired = [r for r in distance_to_oracle(rows) if r["kl_oracle"] is not None]
    cols = ["length", "variant", "method", "density_target", "density_achieved", "kl_mean"]
    cols += ["kl_oracle", "kl_gap", "top1_agreement", "ppl_sparse", "ppl_gap_pct"]
    cols += ["selection_share"]
    return pd.DataFrame(paired, columns=cols)


store = widgets.setup("Benchmarks")
results = store.eval_results()
if not results.empty:
    results["variant"] = [variant_label(c or {}) for c in results["config"]]
EVAL_JOB = "bm_eval_job"


def _eval_job_panel() -> None:
    """The queued eval's progress; one full rerun when it ends, so its rows show, and then a
    "done" line that stays (outside the expander, which closes once there are rows)."""
    job_id = st.session_state[EVAL_JOB]
    wait_in_fragment(store.changes, lambda: store.get_job(job_id).status, settings.load().poll_s)
    job = store.get_job(job_id)
    if job.status == "done":
        secs = widgets.elapsed(job)
        took = f" in {secs:.0f} s" if secs is not None else ""
        st.success(f"Eval job {job.id[:8]} done{took}: its rows are in the charts and table below.")
    else:
        widgets.show_job(job)
    active = job.status in ("queued", "running")
    if not active and st.session_state.get("bm__was_active"):
        st.session_state["bm__was_active"] = False
        st.rerun()
    st.session_state["bm__was_active"] = active


with st.expander("Queue a small eval", expanded=results.empty):
    small = eval_job.SMALL_EVAL
    st.caption(
        f"Pass-key retrieval at {small['lengths'][0]} tokens (depths "
        f"{', '.join(str(d) for d in small['depths'])}) on the default model: "
        f"{' and '.join(small['methods'])} at densities "
        f"{', '.join(str(d) for d in small['densities'])} against dense. A job for the worker "
        "(a few minutes on two CPU cores); its rows appear below when it is done. Larger grids: "
        "`sketchwalk eval --tasks lm,retrieval --lengths 2048`."
    )
    if st.button("Queue a small eval", key="btn_bm_eval"):
        st.session_state[EVAL_JOB] = store.enqueue_job(eval_job.eval_request())
        worker = widgets.ensure_worker()
        if worker is not None:
            worker.wake()
if EVAL_JOB in st.session_state:
    job_now = store.get_job(st.session_state[EVAL_JOB])
    polling = job_now.status in ("queued", "running")
    st.fragment(_eval_job_panel, run_every=settings.load().poll_s if polling else None)()

if results.empty:
    st.info(
        "No eval results yet: queue the small eval above, or run a grid from the command line "
        "with `sketchwalk eval --tasks lm,retrieval --lengths 2048`."
    )
    st.stop()

f1, f2, f3, f4 = st.columns(4)
with f1:
    models = sorted(results["model_id"].unique())
    chosen_models = st.multiselect("Model", models, default=models[-1:], key="bm_model")
with f2:
    tasks = sorted(results["task"].unique())
    chosen_tasks = st.multiselect("Task", tasks, default=tasks, key="bm_task")
with f3:
    methods = sorted(
        results["method"].unique(),
        key=lambda m: eval_report._sort_key({"method": m, "density_target": 0}),
    )
    chosen_methods = st.multiselect("Method", methods, default=methods, key="bm_method")
with f4:
    evals = list(dict.fromkeys(results["eval_id"][::-1]))  # newest first
    labels = {e: eval_label(results, e) for e in evals}
    chosen_eval = st.selectbox(
        "Eval", [LATEST, *evals], format_func=lambda e: labels.get(e, e), key="bm_eval"
    )

view = results[
    results["model_id"].isin(chosen_models)
    & results["task"].isin(chosen_tasks)
    & results["method"].isin(chosen_methods)
]
view = latest_per_cell(view) if chosen_eval == LATEST else view[view["eval_id"] == chosen_eval]
if view.empty:
    st.warning("No eval rows match these filters.")
    st.stop()

x_axis = st.radio(
    "Density axis",
    ["achieved", "target"],
    horizontal=True,
    key="bm_x",
    help="Achieved = kept causal block pairs / all, over sparse prefill layers (what was paid).",
)
rows = view.to_dict("records")
reach = eval_report.within(rows, "sketchwalk")
for (task, source, length), d in reach.items():
    where = f"density {d:g}" if d is not None else "no density in this grid"
    st.caption(
        f"Sketch&Walk within 1% of dense perplexity on {task} · {source} · {length}: {where}"
    )

for i, fig in enumerate(eval_report.figures(rows, x=x_axis)):
    fig.update_layout(colorway=figures.HOUSE_COLOURWAY)  # the house palette (colour-blind safe)
    st.plotly_chart(fig, key=f"bm_fig_{i}")
far = off_target(rows)
if far:
    st.warning(
        "Achieved density far from its target, so these cells compare other densities than "
        "their labels say: " + "; ".join(far) + ". Longer prompts or smaller blocks reach them."
    )

gaps = oracle_gaps(rows)
if not gaps.empty and (gaps["method"] != "oracle").any():
    st.subheader("Distance to the oracle")
    st.caption(
        "The oracle keeps the blocks with the most exact attention mass (a dense softmax): at a "
        "block size (b16, b32, ...), granularity (one selection per layer or per KV-head group) "
        "and density it is the best block selection there is. KL gap = a method's KL minus the "
        "oracle's in the same cell; selection share = the time of the sketch (with the block "
        "estimate), walk and select stages over the dense model's attention time on the same "
        "prompts (methods that do not rank by the sketch's estimate compute only block means "
        "there). One pass each, so as noisy as the machine; empty for cells stored before it "
        "was kept. `sketchwalk frontier` fills these cells."
    )
    st.dataframe(gaps, hide_index=True, key="bm_frontier", column_config=headed(gaps))

st.subheader("Table")
shown = table(view)
st.dataframe(shown, hide_index=True, key="bm_table", column_config=headed(shown))
st.caption(
    "Perplexity +% = perplexity increase over dense; KL = mean KL(dense || sparse) per token; "
    "Top-1 = agreement of greedy next tokens; Accuracy = exact-match retrieval accuracy after greedy "
    "decoding (dense and sparse, with sparse prefill and decode when the phase is both)."
)
st.download_button(
    "Download these rows as Parquet",
    parquet_bytes(view),
    file_name="sketchwalk-eval.parquet",
    mime="application/octet-stream",
    key="bm_download",
)
