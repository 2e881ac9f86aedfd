"""The flags every model command shares (run, eval, bench attention/model, frontier, calibrate),
checked once, here, as argparse types: a bad value is the parser's one line and exit 2, before
any model, store or file is touched, in every command alike.

Counts have a range each (a 20-digit `--seq-len` or `--repeats` is refused, not run until
killed); a device must be one torch names; a model id must not be empty; layer lists hold
layer indices the store can hold.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

MAX_LAYERS = 1024  # layers a stored run may have (store/limits.py)
MAX_TOKENS = 1 << 21  # prompt lengths: twice the store's 1,048,576 tokens
MAX_TEXT = 4096  # characters in a model id, a device name or a list flag
_DEVICE = re.compile(r"(cpu|mps|meta|cuda|xpu)(:\d{1,3})?")


def shown(text: str) -> str:
    """A value for a message: short, and without control characters."""
    from sketchwalk.text import terminal_safe

    return terminal_safe(repr(text[:60] + ("..." if len(text) > 60 else "")))


def count(what: str, lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {shown(text)}")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} must be in {lo}..{hi}, got {value}")
        return value

    parse.__name__ = what
    return parse


def number(what: str) -> Callable[[str], float]:
    """An argparse type: a finite number (its range is the knob's or the command's check)."""

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {shown(text)}")
        return value

    parse.__name__ = what
    return parse


def device(text: str) -> str:
    """An argparse type: cpu, cuda, cuda:N or another device torch names (availability is the
    command's check: it needs torch's runtime)."""
    if _DEVICE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"unknown device {shown(text)}; use cpu, cuda or cuda:N (cuda needs a GPU)"
        )
    return text


def model(text: str) -> str:
    """An argparse type: a model id or folder, never empty (leave --model out for the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "--model is empty; give a model id or folder, or leave --model out for the default"
        )
    if len(text) > MAX_TEXT or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(
            f"--model {shown(text)} is not a model id or folder (control characters or too long)"
        )
    return text


def text_list(what: str) -> Callable[[str], str]:
    """An argparse type for a comma-separated list parsed later: bounded length, no NUL."""

    def parse(text: str) -> str:
        if len(text) > MAX_TEXT or "\x00" in text:
            raise argparse.ArgumentTypeError(
                f"{what} must be a short comma-separated list, got {shown(text)}"
            )
        return text

    parse.__name__ = what
    return parse


def layer_ids(text: str, what: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1); '' -> (); each a layer index in 0..MAX_LAYERS-1 (one-line error)."""
    from sketchwalk.errors import ConfigError

    parts = [x.strip() for x in text.split(",") if x.strip()]
    if len(text) > MAX_TEXT or any(len(p) > 8 for p in parts):
        raise ConfigError(f"{what} must be layer indices 0..{MAX_LAYERS - 1}, got {shown(text)}")
    try:
        ids = tuple(int(x) for x in parts)
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {shown(text)}") from None
    bad = [i for i in ids if not 0 <= i < MAX_LAYERS]
    if bad:
        raise ConfigError(f"{what} must be layer indices 0..{MAX_LAYERS - 1}, got {bad[0]}")
    return ids


def add_device(p: argparse.ArgumentParser, **kwargs) -> None:
    """--device, checked by `device`."""
    p.add_argument("--device", type=device, default="cpu", **kwargs)


def add_model(p: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """--model, checked by `model`."""
    p.add_argument("--model", type=model, default=default, help=help)
