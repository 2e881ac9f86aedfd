"""Explore's view in the URL: run, phase, layer, KV group, decode step and drill-down token.

The address bar always names the view shown (st.query_params), so a copied link opens the same
view in a new tab or for a colleague. A link is read once per session and run: after that the
person's own choices lead. Values that do not parse are ignored (the page's defaults stand).
"""

from __future__ import annotations

import streamlit as st

from sketchwalk.app import widgets

APPLIED = "ex_link_applied"  # the run whose link was read in this session


def _int(name: str) -> int | None:
    raw = st.query_params.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def apply(run_id: str) -> None:
    """Put the link's view into the widgets' state, once per session and run."""
    if st.session_state.get(APPLIED) == run_id:
        return
    st.session_state[APPLIED] = run_id  # read once: later the address bar follows the page
    if st.query_params.get("run") != run_id:
        return
    phase = st.query_params.get("phase")
    if phase in ("prefill", "decode"):
        st.session_state["ex_phase"] = phase
    step, layer, group, token = _int("step"), _int("layer"), _int("group"), _int("token")
    if step is not None and phase == "decode":
        st.session_state["ex_step"] = step
    if layer is not None:
        st.session_state["ex_layer_next"] = layer
    if group is not None:
        st.session_state["ex_group_next"] = group
    if token is not None and token > 0:
        st.session_state[widgets.QUERY_KEY] = {"run": run_id, "position": token}


def write(run_id: str, phase: str, layer: int, group: int | None, step: int) -> None:
    """Name the shown view in the address bar."""
    params = {"run": run_id, "phase": phase, "layer": str(layer)}
    if phase == "decode":
        params["step"] = str(step)
    if group is not None:
        params["group"] = str(group)
    query = st.session_state.get(widgets.QUERY_KEY)
    if isinstance(query, dict) and query.get("run") == run_id:
        params["token"] = str(query["position"])
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)
