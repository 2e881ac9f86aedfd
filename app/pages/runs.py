"""Runs: the table of runs and jobs; filter, sort, delete, export as Parquet, import an export."""

from __future__ import annotations

import io
import json
import zipfile

import pandas as pd
import streamlit as st

from sketchwalk import access
from sketchwalk.app import widgets
from sketchwalk.app.run_names import preset_of
from sketchwalk.errors import SketchWalkError
from sketchwalk.store.export import MANIFEST
from sketchwalk.text import plain_markdown

store = widgets.setup("Runs")
runs = store.list_runs()


def _table(runs: pd.DataFrame) -> pd.DataFrame:
    met = runs["metrics"].map(lambda m: m or {})
    cfg = runs["config"].map(lambda c: c or {})
    return pd.DataFrame(
        {
            "id": runs["id"],
            "Created": runs["created_at"],
            "Status": runs["status"],
            "Method": runs["method"],
            "Model": runs["model_id"].map(widgets.short_model),
            "Tokens": runs["prompt_tokens"],
            "Preset": cfg.map(preset_of),
            "Target density": cfg.map(lambda c: c.get("density")),
            "Achieved density": met.map(lambda m: m.get("density_achieved")),
            "KL": met.map(lambda m: m.get("kl_mean")),
            "Top-1": met.map(lambda m: m.get("top1_agreement")),
            "Prompt": runs["prompt"].map(lambda p: p[:80]),
            "Error": runs["error"],
        }
    )


def export_run_ids(data: bytes) -> list[str]:
    """The run ids an export zip names (its manifest), [] where it names none readably: the
    import itself then says what is wrong."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            ids = json.loads(zf.read(MANIFEST)).get("run_ids")
    except (zipfile.BadZipFile, KeyError, ValueError, AttributeError):
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


def import_line(imported: list[str], named: list[str], present: set[str]) -> str:
    """What an import did, in one line: how many runs came in, how many were duplicates."""
    skipped = [i for i in named if i in present and i not in imported]
    line = f"Imported {widgets.plural(len(imported), 'run')}."
    if skipped:
        line += (
            f" Skipped {widgets.plural(len(skipped), 'run')} already in the store (a duplicate: "
            f"{', '.join(i[:8] for i in skipped[:5])}{', …' if len(skipped) > 5 else ''})."
        )
    return line


def upload_help() -> str:
    """The upload cap in force (the server's, which `sketchwalk app` sets to the import's
    per-file cap) and what to do past it."""
    from sketchwalk import settings

    server = int(st.get_option("server.maxUploadSize"))
    allowed = settings.load().import_max_member_mb
    line = f"Up to {min(server, allowed):,} MB per upload."
    if server < allowed:
        line += (
            f" Imports allow {allowed:,} MB per file, but this server caps uploads at {server:,} "
            "MB: start it with `sketchwalk app` (or --server.maxUploadSize), or use "
            "`sketchwalk import`."
        )
    return line


f1, f2, f3 = st.columns(3)
with f1:
    status = st.multiselect("Status", ["done", "running", "queued", "failed"], key="runs_status")
with f2:
    methods = sorted(x for x in runs["method"].dropna().unique())
    method = st.multiselect("Method", methods, key="runs_method")
with f3:
    text = st.text_input("Prompt contains", key="runs_text")

view = _table(runs) if len(runs) else _table(runs.head(0))
if status:
    view = view[view["Status"].isin(status)]
if method:
    view = view[view["Method"].isin(method)]
if text:
    view = view[runs.loc[view.index, "id"].isin(store.runs_containing(text))]
st.caption(f"{len(view)} of {widgets.plural(len(runs), 'run')}; click a column header to sort.")
st.dataframe(view, hide_index=True, key="runs_table")

labels = widgets.run_labels(runs)
picked = st.multiselect(
    "Selected runs", list(view["id"]), format_func=lambda i: labels.get(i, i), key="runs_picked"
)
if st.session_state.get("runs_confirm_for") != tuple(picked):
    # a confirmation is for the runs it was given for: another selection asks again
    st.session_state["runs_confirm_for"] = tuple(picked)
    st.session_state["runs_confirm"] = False
if st.button(
    "Diff the masks of the two selected runs", disabled=len(picked) != 2, key="btn_runs_diff"
):
    st.session_state["diff_pair"] = tuple(picked)
    st.switch_page("pages/mask_diff.py")
c1, c2 = st.columns(2)
with c1:
    st.download_button(
        f"Export {widgets.plural(len(picked), 'run') if picked else 'all shown runs'} "
        "(Parquet zip)",
        data=lambda ids=tuple(picked or view["id"]): store.export_zip(list(ids)),
        file_name="sketchwalk-runs.zip",
        mime="application/zip",
        on_click="ignore",
        disabled=view.empty,
        key="btn_export",
    )
with c2:
    can_delete = access.load().allow_delete  # a shared deployment may switch deleting off
    confirm = can_delete and st.checkbox("Yes, delete the selected runs", key="runs_confirm")
    if can_delete and st.button(
        f"Delete {widgets.plural(len(picked), 'run')}",
        disabled=not (picked and confirm),
        key="btn_delete",
    ):
        store.delete_runs(picked)  # one transaction: all of them or none
        widgets.clear_caches()
        st.session_state.pop(widgets.RUN_KEY, None)
        st.session_state.pop("runs_picked", None)
        st.session_state.pop("runs_confirm", None)
        st.session_state.pop("runs_confirm_for", None)
        st.rerun()

can_import = access.load().allow_import  # a shared deployment may switch importing off
if can_import:
    st.subheader("Import")
upload = can_import and st.file_uploader(
    "A Parquet zip made by Export or `sketchwalk export`",
    type=["zip"],
    key="runs_upload",
    help=upload_help(),
)
skip = can_import and st.checkbox("Skip runs already in the store", value=True, key="runs_skip")
IMPORTED = "runs_imported"  # the last import's line, shown after the rerun that redraws the table
if can_import and upload and st.button("Import", key="btn_import"):
    data = upload.getvalue()
    present = set(runs["id"])
    try:
        ids = store.import_parquet(data, skip_existing=skip)
    except SketchWalkError as exc:
        st.error(plain_markdown(f"Import failed: {exc}"))
    else:
        widgets.clear_caches()
        st.session_state[IMPORTED] = import_line(ids, export_run_ids(data), present)
        st.rerun()  # the table above must count the imported runs now
if IMPORTED in st.session_state:
    st.success(st.session_state.pop(IMPORTED))

st.subheader("Jobs")
jobs = store.list_jobs()
if jobs:
    st.dataframe(
        pd.DataFrame(
            {
                "Job": [j.id[:8] for j in jobs],
                "Status": [j.status for j in jobs],
                "Progress": [j.progress for j in jobs],
                "Message": [j.message for j in jobs],
                "Run": [(j.run_id or "")[:8] for j in jobs],
                "Error": [j.error for j in jobs],
                "Created": [j.created_at for j in jobs],
            }
        ),
        hide_index=True,
        key="runs_jobs",
    )
else:
    st.caption("No jobs yet.")
