"""Speed: the clean pass's dense/sparse ratios first (what a user's own code would see), the
run's own passes and the recording overhead beside them, stage timings per layer against dense
attention, and density sweeps of one prompt. Timings are read through engine/run/speed.py."""

from __future__ import annotations

import streamlit as st

from sketchwalk.app import figures, speed_numbers, sweep, widgets
from sketchwalk.engine.run import speed
from sketchwalk.engine.run.request import stored_time_only
from sketchwalk.text import plain_markdown

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
time_only = stored_time_only(run.get("request")) is True
stats = widgets.layer_stats(url, run_id)
pre = stats[stats["phase"] == "prefill"]


def _ms(x: float | None, unit: str = "ms") -> str:
    return "–" if x is None else f"{x:.1f} {unit}" if abs(x) < 10 else f"{x:.0f} {unit}"


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×" if ratio >= 0.1 else f"{ratio:.2g}×"


def _pair_metric(col, pair: speed.Pair, suffix: str = "", shown: str | None = None) -> None:
    """A dense-vs-sparse metric; `shown` replaces the plain ratio (the clean whole-model
    speed-up, app/speed_numbers.py, with its range)."""
    col.metric(
        pair.label + suffix,
        shown or _x(pair.ratio),
        f"dense {_ms(pair.dense_ms, pair.unit)} → sparse {_ms(pair.sparse_ms, pair.unit)}",
        delta_color="off",
        delta_arrow="off",
        help="Dense time over sparse time: above 1× the sparse model is faster. The whole-model "
        "speed-up is the median of the clean passes' ratios with their range in brackets (the "
        "verdict and the density sweep show the same number).",
    )


# ---- the headline: a clean pass, what the user's own code would see -------------------------
st.subheader("Clean pass (no recording): dense ÷ sparse time")
clean = speed.clean_pairs(timings)
if clean:
    measures = {p: speed_numbers.clean_speedup(timings, p) for p in ("prefill", "decode")}
    for i in range(0, len(clean), 2):  # two a row: "dense 1234 ms → sparse 987 ms" fits at 1400 px
        for col, pair in zip(st.columns(2), clean[i : i + 2], strict=False):
            m = measures.get(pair.phase) if pair.scope == "whole model" else None
            _pair_metric(col, pair, shown=m.text() if m else None)
            if m is not None:
                col.caption(speed_numbers.words(m).capitalize() + ".")
    for m in measures.values():
        noise = m and speed_numbers.noise_note(m, speed_numbers.ceiling(timings, run, m.phase))
        if noise:
            st.warning(noise)
    st.caption(
        "What your own code would see: one dense and one sparse pass with no recorder, "
        "last-token logits only. Attention alone compares the dense model's attention with "
        "the sparse path's whole cost (sketch, walk and select included), all layers. "
        + (
            f"Whole model, prefill: the median of {int(timings['clean_repeats'])} clean passes' "
            "dense/sparse ratios, their range in brackets; decode: the median of the first "
            "pass's per-token ratios, their middle half in brackets (the times under each are "
            "medians); `sketchwalk bench model` repeats more."
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
    head, _, share = parts[0].partition(" (")  # the share on the smaller line: it fits at 1024 px
    under = ([f"({share}"] if share else []) + parts[1:]
    cols[-1].metric(
        "Recording overhead (sparse)",
        head,
        " · ".join(under) or None,
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
        "dense attention is timed on the same inputs right after the sparse path, or, in a run "
        "that showed its quality first, by its clean dense passes (the median per layer)."
    )

st.subheader("Density sweep")


def _recorded(rid: str) -> float | None:
    st_ = widgets.layer_stats(url, rid)
    st_ = st_[st_["phase"] == "prefill"]
    return figures.overall_speedup(st_) if not st_.empty else None


points, left_out = sweep.sweep(
    runs,
    run,
    store.same_prompt_runs(run["id"]),
    lambda rid: widgets.run_meta(url, rid).get("timings") or {},
    _recorded,
)
if len(points) >= 2:
    st.plotly_chart(figures.sweep_figure(points), key="speed_sweep")
else:
    st.caption(
        "A sweep needs at least two finished runs of this prompt with this run's settings at "
        "different densities."
    )
st.dataframe(sweep.shown(points), hide_index=True, key="speed_points")
if left_out:
    st.caption(
        f"Left out: {widgets.plural(len(left_out), 'run')} of this prompt with other settings "
        "(a sweep line joins runs that differ only in density): "
        + "; ".join(left_out[:6])
        + ("; …" if len(left_out) > 6 else "")
        + "."
    )


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
