"""Speed: stage timings per layer against dense attention, and density sweeps of one prompt."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sketchwalk.app import figures, widgets

SWEEP_DENSITIES = (0.05, 0.1, 0.2, 0.3, 0.5)

store = widgets.setup("Speed")
url = widgets.db_url()
runs = widgets.done_runs(store)
run_id = widgets.pick_run(store, "speed", "Run", runs)
if run_id is None:
    st.info("No finished runs yet: start one on the New run page.")
    st.stop()

run = widgets.run_meta(url, run_id)
timings = run.get("timings") or {}
stats = widgets.layer_stats(url, run_id)
pre = stats[stats["phase"] == "prefill"]
overall = figures.overall_speedup(pre)


def _ms(key: str) -> str:
    v = timings.get(key)
    return "–" if v is None else f"{v:.0f} ms"


m = st.columns(4)
m[0].metric("Dense prefill", _ms("dense_prefill_ms"))
m[1].metric("Sparse prefill", _ms("sparse_prefill_ms"))
m[2].metric("Attention speedup (sparse layers)", "–" if overall is None else f"{overall:.2f}×")
dd, sd = timings.get("dense_decode_ms_per_token"), timings.get("sparse_decode_ms_per_token")
m[3].metric(
    "Decode ms/token dense → sparse", "–" if dd is None or sd is None else f"{dd:.0f} → {sd:.0f}"
)


def _ratio(dense_key: str, sparse_key: str) -> str:
    d, s_ = timings.get(dense_key), timings.get(sparse_key)
    return "–" if not d or not s_ else f"{d / s_:.2f}×"


st.subheader("Clean pass (no recording)")
if "clean_sparse_prefill_ms" in timings:
    c = st.columns(4)
    c[0].metric(
        "Prefill dense → sparse",
        f"{_ms('clean_dense_prefill_ms')} → {_ms('clean_sparse_prefill_ms')}",
        _ratio("clean_dense_prefill_ms", "clean_sparse_prefill_ms"),
        delta_color="off",
    )
    c[1].metric(
        "Attention alone, prefill",
        f"{_ms('clean_dense_attention_ms')} → {_ms('clean_sparse_attention_ms')}",
        _ratio("clean_dense_attention_ms", "clean_sparse_attention_ms"),
        delta_color="off",
    )
    c[2].metric(
        "Decode ms/token dense → sparse",
        f"{_ms('clean_dense_decode_ms_per_token')} → {_ms('clean_sparse_decode_ms_per_token')}",
        _ratio("clean_dense_decode_ms_per_token", "clean_sparse_decode_ms_per_token"),
        delta_color="off",
    )
    c[3].metric("Recording overhead, prefill", _ms("recording_overhead_prefill_ms"))
    st.caption(
        "A clean pass is what your own code would see: no recorder, last-token logits only, one "
        "pass each (so expect noise; `sketchwalk bench model` takes medians). The recorded times "
        "above include copying every layer's estimate and timing dense attention a second time."
    )
else:
    st.caption(
        "This run has no clean-pass timings: the numbers above include the recorder's work. "
        "Runs made with clean timing on (RunOptions.clean_timing) show the ratio without it."
    )

if pre.empty or pre["dense"].all():
    st.caption("No sparse prefill layers in this run: nothing to time against dense.")
else:
    st.plotly_chart(figures.stage_figure(pre), key="speed_stages")
    st.caption(
        "Per-layer times are measured by the recorder on this machine (one run, so expect noise); "
        "dense attention is timed on the same inputs right after the sparse path."
    )

st.subheader("Density sweep")


def sweep_points(runs: pd.DataFrame, run: dict) -> pd.DataFrame:
    """Finished runs with this run's prompt, model and method: density, speedup, KL."""
    same = runs[
        (runs["prompt"] == run["prompt"])
        & (runs["model_id"] == run.get("model_id"))
        & (runs["method"] == run.get("method"))
    ]
    rows = []
    for _, r in same.iterrows():
        met = r["metrics"] or {}
        st_ = widgets.layer_stats(url, r["id"])
        rows.append(
            {
                "run": r["id"][:8],
                "target": (r["config"] or {}).get("density"),
                "density": met.get("density_achieved"),
                "speedup": figures.overall_speedup(st_[st_["phase"] == "prefill"]),
                "kl": met.get("kl_mean"),
                "top1": met.get("top1_agreement"),
            }
        )
    df = pd.DataFrame(rows, columns=["run", "target", "density", "speedup", "kl", "top1"])
    return df.dropna(subset=["density"]).sort_values("density").reset_index(drop=True)


points = sweep_points(runs, run)
if len(points) >= 2:
    st.plotly_chart(figures.sweep_figure(points), key="speed_sweep")
else:
    st.caption("A sweep needs at least two finished runs of this prompt at different densities.")
st.dataframe(points, hide_index=True, key="speed_points")

chosen = st.multiselect(
    "Densities to queue", SWEEP_DENSITIES, default=list(SWEEP_DENSITIES), key="speed_densities"
)
have = {round(float(x), 4) for x in points["target"].dropna()} if len(points) else set()
todo = [d for d in chosen if round(d, 4) not in have]
if st.button(f"Queue a sweep ({len(todo)} runs)", disabled=not todo, key="btn_sweep"):
    for d in todo:
        widgets.submit(store, widgets.rerun_request(run, density=float(d)))
    st.success(f"Queued {len(todo)} runs at densities {', '.join(f'{d:g}' for d in todo)}.")
