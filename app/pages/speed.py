"""Speed: the clean pass's dense/sparse ratios first (what a user's own code would see), the
run's own passes and the recording overhead beside them, stage timings per layer against dense
attention, and density sweeps of one prompt. Timings are read through engine/speed.py."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sketchwalk.app import figures, widgets
from sketchwalk.engine import speed
from sketchwalk.engine.request import stored_time_only
from sketchwalk.text import plain_markdown

SWEEP_DENSITIES = (0.05, 0.1, 0.2, 0.3, 0.5)
POINT_HEADERS = {
    "run": "Run",
    "target": "Target density",
    "density": "Achieved density",
    "speedup": "Attention speed-up (recorded) ×",
    "clean_speedup": "Clean prefill speed-up ×",
    "ceiling": "Ceiling ×",
    "kl": "KL",
    "top1": "Top-1",
}

store = widgets.setup("Speed")
url = widgets.db_url()
runs = widgets.done_runs(store)
run_id = widgets.pick_run(store, "speed", "Run", runs)
if run_id is None:
    st.info("No finished runs yet: start one on the New run page.")
    st.stop()

run = widgets.run_meta(url, run_id)
timings = run.get("timings") or {}
time_only = stored_time_only(run.get("request")) is True
stats = widgets.layer_stats(url, run_id)
pre = stats[stats["phase"] == "prefill"]


def _ms(x: float | None, unit: str = "ms") -> str:
    return "–" if x is None else f"{x:.1f} {unit}" if abs(x) < 10 else f"{x:.0f} {unit}"


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×" if ratio >= 0.1 else f"{ratio:.2g}×"


def _pair_metric(col, pair: speed.Pair, suffix: str = "") -> None:
    col.metric(
        pair.label + suffix,
        _x(pair.ratio),
        f"dense {_ms(pair.dense_ms, pair.unit)} → sparse {_ms(pair.sparse_ms, pair.unit)}",
        delta_color="off",
        delta_arrow="off",
        help="Dense time over sparse time: above 1× the sparse model is faster.",
    )


# ---- the headline: a clean pass, what the user's own code would see -------------------------
st.subheader("Clean pass (no recording): dense ÷ sparse time")
clean = speed.clean_pairs(timings)
if clean:
    for i in range(0, len(clean), 2):  # two a row: "dense 1234 ms → sparse 987 ms" fits at 1400 px
        for col, pair in zip(st.columns(2), clean[i : i + 2], strict=False):
            _pair_metric(col, pair)
    st.caption(
        "What your own code would see: one dense and one sparse pass with no recorder, "
        "last-token logits only. Attention alone compares the dense model's attention with "
        "the sparse path's whole cost (sketch, walk and select included), all layers. "
        + (
            f"Prefill: medians of {int(timings['clean_repeats'])} clean passes; decode: the "
            "first pass's mean per token (the verdict on Explore gives both spreads); "
            "`sketchwalk bench model` repeats more."
            if timings.get("clean_repeats", 1) > 1
            else "One pass each, so expect noise; `sketchwalk bench model` repeats and takes "
            "medians."
        )
    )
    density = speed.ceiling_density(
        (run.get("metrics") or {}).get("density_achieved"), (run.get("config") or {}).get("density")
    )
    ceiling = speed.ceiling_text(speed.ceilings(timings, density))
    if ceiling:
        st.caption(
            ceiling[0].upper() + ceiling[1:] + ". The rest of a step (projections, MLP, reading "
            "the weights) is the same in both models, so short prompts cannot gain much."
        )
else:
    st.info(
        "This run has no clean-pass timings (stored before they were measured, or with them "
        "switched off): the times below include the recorder's work."
    )
machine = speed.machine_text(run.get("versions"))
if machine:  # ratios differ between CPUs (e.g. with or without native bfloat16)
    st.caption(plain_markdown(machine) + ".")

# ---- beside it: the run's own passes and what recording cost -------------------------------
own = "Time-only pass (no recorder)" if time_only else "Recorded pass"
st.subheader(own)
own_pairs = speed.run_pairs(timings)
overhead = speed.recording_overhead(timings)
cols = [
    c
    for _ in range(2)  # two a row, as above
    for c in st.columns(2)
][: len(own_pairs) + (not pre.empty) + (len(overhead) > 0)]
for col, pair in zip(cols, own_pairs, strict=False):
    _pair_metric(col, pair, ", time-only pass" if time_only else ", recorded")
if not pre.empty:
    cols[len(own_pairs)].metric(
        "Attention, sparse layers (per-layer records)",
        _x(figures.overall_speedup(pre)),
        help="Dense attention over the sparse path, summed over the sparse layers' prefill "
        "records (the chart below).",
    )
if overhead:
    parts = [
        f"{phase} {overhead[f'{phase}_ms']:+.0f} {unit}"
        + (f" ({overhead[f'{phase}_fraction']:+.0%})" if f"{phase}_fraction" in overhead else "")
        for phase, unit in (("prefill", "ms"), ("decode", "ms/token"))
        if f"{phase}_ms" in overhead
    ]
    cols[-1].metric(
        "Recording overhead (sparse)",
        parts[0],
        " · ".join(parts[1:]) or None,
        delta_color="off",
        delta_arrow="off",
        help="The recorded sparse pass minus the clean one: copying every layer's estimates and "
        "timing dense attention a second time.",
    )
if time_only:
    st.caption(
        "A time-only run keeps no recorder, so it has no recording overhead; its own passes "
        "keep every prompt position's final hidden state for the quality metrics."
    )

st.subheader("Per layer: dense and sparse attention side by side")
if pre.empty:
    st.info(
        "This run is time-only: it has no per-layer records, so there is no per-layer chart."
        if time_only
        else "This run has no per-layer records, so there is no per-layer chart."
    )
elif pre["dense"].all():
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
        st_ = st_[st_["phase"] == "prefill"]
        timings_ = widgets.run_meta(url, r["id"]).get("timings") or {}
        clean_ = speed.clean_pairs(timings_)
        ceiling_ = [
            c.at_density
            for c in speed.ceilings(timings_, met.get("density_achieved"))
            if c.phase == "prefill"
        ]
        rows.append(
            {
                "run": r["id"][:8],
                "target": (r["config"] or {}).get("density"),
                "density": met.get("density_achieved"),
                "speedup": figures.overall_speedup(st_) if not st_.empty else None,
                "clean_speedup": timings_.get("clean_prefill_speedup")
                or (clean_[0].ratio if clean_ else None),
                "ceiling": ceiling_[0] if ceiling_ else None,
                "kl": met.get("kl_mean"),
                "top1": met.get("top1_agreement"),
            }
        )
    columns = ["run", "target", "density", "speedup", "clean_speedup", "ceiling", "kl", "top1"]
    df = pd.DataFrame(rows, columns=columns)
    return df.dropna(subset=["density"]).sort_values("density").reset_index(drop=True)


points = sweep_points(runs, run)
if len(points) >= 2:
    st.plotly_chart(figures.sweep_figure(points), key="speed_sweep")
else:
    st.caption("A sweep needs at least two finished runs of this prompt at different densities.")
st.dataframe(points.rename(columns=POINT_HEADERS), hide_index=True, key="speed_points")


def pending_densities(run: dict) -> set[float]:
    """Target densities of this prompt's queued or running jobs (same model and method): a
    sweep must not queue them again."""
    out = set()
    for status in ("queued", "running"):
        for job in store.list_jobs(status):
            req = job.request  # {} for a row that did not parse (store/jobs.py)
            cfg = req.get("config") if isinstance(req.get("config"), dict) else {}
            same = req.get("prompt") == run["prompt"] and cfg.get("method") == run.get("method")
            models = (None, run.get("model_id"), (run.get("request") or {}).get("model"))
            density = cfg.get("density")
            if same and (req.get("model") or None) in models and isinstance(density, int | float):
                out.add(round(float(density), 4))
    return out


chosen = st.multiselect(
    "Densities to queue", SWEEP_DENSITIES, default=list(SWEEP_DENSITIES), key="speed_densities"
)
have = {round(float(x), 4) for x in points["target"].dropna()} if len(points) else set()
pending = pending_densities(run)
todo = [d for d in chosen if round(d, 4) not in have | pending]
if pending:
    st.caption(
        f"Already queued or running: densities {', '.join(f'{d:g}' for d in sorted(pending))}."
    )
if st.button(
    f"Queue a sweep ({widgets.plural(len(todo), 'run')})", disabled=not todo, key="btn_sweep"
):
    for d in todo:
        widgets.submit(store, widgets.rerun_request(run, density=float(d)))
    st.session_state["speed_queued"] = [float(d) for d in todo]
    st.rerun()  # the button now counts what was queued (no second click queues duplicates)
if st.session_state.get("speed_queued"):
    done_now = st.session_state.pop("speed_queued")
    st.success(
        f"Queued {widgets.plural(len(done_now), 'run')} at densities "
        f"{', '.join(f'{d:g}' for d in done_now)}; follow them on the Runs page."
    )
