"""New run widgets generated from the knob declarations (engine/method/config.py).

One widget per declared knob, its kind chosen from the field's type (choices -> select box,
bool -> checkbox, numbers -> number inputs within the declared range, layer lists -> text),
its label and help from the declaration. Values live in st.session_state under "nr_<field>".
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from sketchwalk.engine.method.config import knobs, preset
from sketchwalk.errors import ConfigError

PREFIX = "nr_"


def _state_value(f, value: Any) -> Any:
    return ",".join(map(str, value)) if str(f.type).startswith("tuple") else value


def initial_state(name: str) -> dict[str, Any]:
    """Session-state defaults for every knob widget, from a preset."""
    cfg = preset(name)
    return {PREFIX + f.name: _state_value(f, getattr(cfg, f.name)) for f, _ in knobs()}


def apply_preset() -> None:
    """on_change of the preset box: every knob widget takes the preset's value."""
    for key, value in initial_state(st.session_state.get(PREFIX + "preset", "default")).items():
        st.session_state[key] = value


def _widget(f, k) -> Any:
    key = PREFIX + f.name
    label = k.label or f.name
    t = str(f.type)
    if t == "bool":
        return st.checkbox(label, key=key, help=k.help)
    if t == "str":
        return st.selectbox(label, k.allowed(), key=key, help=k.help)
    if t.startswith("tuple"):
        return st.text_input(label, key=key, help=k.help)
    if k.power_of_two:
        options = sorted({8, 16, 32, 64, 128, 256, 512, int(st.session_state.get(key, 64))})
        return st.selectbox(label, options, key=key, help=k.help)
    if f.name == "density":
        return st.slider(label, 0.01, 1.0, step=0.01, key=key, help=k.help)
    # no min/max on number boxes: the browser would refuse an out-of-range entry itself and keep
    # the old value behind Run; the page gets every entry and the config check refuses it in one
    # line (with Run disabled)
    if t == "int":
        return st.number_input(label, step=1, key=key, help=_range_help(k))
    return st.number_input(label, step=0.01, format="%.3f", key=key, help=_range_help(k))


def _range_help(k) -> str:
    """The knob's help with its allowed range, which the box itself does not enforce."""
    if k.lo is None and k.hi is None:
        return k.help
    lo = "" if k.lo is None else f"{k.lo:g}"
    hi = "" if k.hi is None else f"{k.hi:g}"
    span = f"at least {lo}" if not hi else f"at most {hi}" if not lo else f"{lo} to {hi}"
    return f"{k.help} ({span})"


def render(group: str, columns: int = 3) -> dict[str, Any]:
    """Draw the knobs of one group ("basic" or "advanced") in columns; returns their values."""
    chosen = [(f, k) for f, k in knobs() if k.group == group]
    cols = st.columns(columns)
    values = {}
    for i, (f, k) in enumerate(chosen):
        with cols[i % columns]:
            values[f.name] = _widget(f, k)
    return values


def to_config(values: dict[str, Any]):
    """The validated config from widget values (layer lists parsed; one-line ConfigError)."""
    out = dict(values)
    for f, k in knobs():
        if str(f.type).startswith("tuple") and isinstance(out.get(f.name), str):
            text = out[f.name].replace(" ", "")
            try:
                out[f.name] = tuple(int(x) for x in text.split(",") if x)
            except ValueError:
                raise ConfigError(
                    f"{k.label or f.name} must be comma-separated integers, got {text!r}"
                ) from None
        elif str(f.type) == "int" and f.name in out:
            out[f.name] = int(out[f.name])
        elif str(f.type) == "float" and f.name in out:
            out[f.name] = float(out[f.name])
    return preset(st.session_state.get(PREFIX + "preset", "default"), **out)
