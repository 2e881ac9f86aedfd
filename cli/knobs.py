"""Command-line flags generated from the knob declarations (engine/method/config.py).

Every flag defaults to "not given", so a preset (`--preset paper`) supplies the base and only the
flags a person typed change it. A new knob in SketchWalkConfig shows up here by itself.
"""

from __future__ import annotations

import argparse
from typing import Any

from sketchwalk.cli import flags

INT_KNOB = (-(1 << 31), (1 << 31) - 1)  # any int knob's parse range; its own range is the config's


def flag_name(name: str, flag: str = "") -> str:
    return "--" + (flag or name).replace("_", "-")


def add_config_args(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """--preset and one flag per declared knob (except `exclude`), grouped like the app."""
    from sketchwalk.engine.method.config import PRESETS, default_of, knobs, presets_help

    p.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=None,
        help=f"start from a preset (not given: gpu on a CUDA --device, else default; "
        f"{presets_help()})".replace("%", "%%"),  # argparse formats help
    )
    groups = {
        "basic": p.add_argument_group("method"),
        "advanced": p.add_argument_group("advanced method knobs (defaults: the preset's)"),
    }
    for f, k in knobs():
        if f.name in exclude:
            continue
        g = groups[k.group]
        flag = flag_name(f.name, k.flag)
        t = str(f.type)
        help_text = f"{k.help} (default: {_show(default_of(f))})"
        if t == "bool":
            g.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                help=help_text,
            )  # fmt: skip
        elif t == "str":
            g.add_argument(flag, dest=f.name, choices=k.allowed(), default=None, help=help_text)
        elif t.startswith("tuple"):
            g.add_argument(
                flag, dest=f.name, type=flags.text_list(flag), default=None, metavar="IDS",
                help=help_text,
            )  # fmt: skip
        else:
            kind = flags.count(flag, *INT_KNOB) if t == "int" else flags.number(flag)
            g.add_argument(flag, dest=f.name, type=kind, default=None, help=help_text)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def parse_ids(text: str, what: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1); '' -> (); layer indices only (cli/flags.py), else a one-line error."""
    return flags.layer_ids(text, what)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs a person gave on the command line (not the preset's)."""
    from sketchwalk.engine.method.config import knobs

    out: dict[str, Any] = {}
    for f, k in knobs():
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if str(f.type).startswith("tuple"):
            value = parse_ids(value, flag_name(f.name, k.flag))
        out[f.name] = value
    return out


def config_from_args(args: argparse.Namespace, **fixed: Any):
    """The validated config: the preset (not given: the one for the run's --device), then the
    flags given, then `fixed` (one-line errors)."""
    from sketchwalk.engine.method.config import device_preset, preset

    name = getattr(args, "preset", None) or device_preset(getattr(args, "device", None))
    return preset(name, **{**config_overrides(args), **fixed})
