"""Re-running a stored run keeps its behaviour even when knobs were added since."""

from __future__ import annotations

from sketchwalk.app.widgets import rerun_request
from sketchwalk.engine.config import LEGACY, SketchWalkConfig, preset


def test_rerun_of_an_old_run_keeps_its_rules_and_changes_only_what_was_asked():
    old = preset("paper").to_dict()
    for name in LEGACY:
        old.pop(name)  # a run stored before these knobs existed
    run = {"prompt": "p", "config": old, "request": {"model": "m", "max_new_tokens": 4}}
    req = rerun_request(run, density=0.3)
    cfg = SketchWalkConfig.from_dict(req["config"])
    assert cfg == preset("paper", density=0.3)
    assert req["model"] == "m" and req["max_new_tokens"] == 4
