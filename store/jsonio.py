"""JSON columns: configs, metrics and requests hold numpy scalars, tuples and NaN.

Kept as text in the database (portable, and NaN survives where a JSON column type would reject
it); numpy values are turned into plain Python ones on the way in.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def dumps(value: Any) -> str:
    """Serialise for a text column; raises TypeError on values JSON cannot hold."""
    return json.dumps(value, default=_plain, sort_keys=True)


def loads(text: str | None) -> Any:
    """Parse a text column written by `dumps` (None stays None)."""
    return None if text is None else json.loads(text)


def lenient(text: object) -> Any:
    """Parse for display: a value that is not valid JSON (a row damaged before imports were
    checked, or nested too deep to parse) reads as None, so listing and deleting such runs
    still works."""
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
