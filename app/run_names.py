"""What names a run in pickers and the Runs table: its preset, read back from its config.

The store keeps a run's config, not the preset it started from, so the preset is the one whose
knobs the config matches (the density aside, which every run sets); a config no preset matches
is "custom".
"""

from __future__ import annotations

from typing import Any

CUSTOM = "custom"
IGNORED = ("density", "extra")  # every run sets its density; extra holds no knob


def preset_of(config: dict[str, Any] | None) -> str:
    """The preset a stored config matches (knobs added since it was stored read as LEGACY)."""
    from sketchwalk.engine.method.config import PRESETS, SketchWalkConfig, preset
    from sketchwalk.errors import ConfigError

    try:
        stored = SketchWalkConfig.from_stored(dict(config or {})).to_dict()
    except (ConfigError, TypeError, ValueError):
        return CUSTOM
    for name in PRESETS:
        mine = preset(name).to_dict()
        if all(stored.get(k) == v for k, v in mine.items() if k not in IGNORED):
            return name
    return CUSTOM
