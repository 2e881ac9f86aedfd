"""Presets survive the store: a run saved with a preset reads back as the same config."""

from __future__ import annotations

import pytest

from sketchwalk.engine.method.config import PRESETS, SketchWalkConfig, preset
from sketchwalk.store import open_store


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_configs_round_trip_through_the_store(name, tmp_path):
    cfg = preset(name, density=0.15)
    with open_store(str(tmp_path / "p.duckdb")) as store:
        run_id = store.create_run({"prompt": "x", "model": "m", "config": cfg.to_dict()})
        stored = store.get_run(run_id)["config"]
    assert SketchWalkConfig.from_stored(stored) == cfg
