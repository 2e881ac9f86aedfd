"""Re-running a stored run keeps its behaviour even when knobs were added since."""

from __future__ import annotations

from sketchwalk.app.widgets import rerun_request
from sketchwalk.engine.method.config import LEGACY, SketchWalkConfig, preset


def test_rerun_of_an_old_run_keeps_its_rules_and_changes_only_what_was_asked():
    old = preset("paper").to_dict()
    for name in LEGACY:
        old.pop(name)  # a run stored before these knobs existed
    run = {"prompt": "p", "config": old, "request": {"model": "m", "max_new_tokens": 4}}
    req = rerun_request(run, density=0.3)
    cfg = SketchWalkConfig.from_dict(req["config"])
    assert cfg == preset("paper", density=0.3)
    assert req["model"] == "m" and req["max_new_tokens"] == 4


def test_rerun_keeps_time_only_and_clean_timing_of_any_version():
    from sketchwalk.engine.run.request import RunRequest

    cfg = preset("default").to_dict()
    for stored, time_only, clean in (
        ({"record": False}, True, True),  # before time_only: --no-record
        ({"time_only": True, "clean_timing": True, "record": False}, True, True),
        ({"time_only": False, "clean_timing": False, "record": True}, False, False),
        ({}, False, True),
    ):
        run = {"prompt": "p", "config": cfg, "request": {"model": "m", **stored}}
        req = RunRequest.from_dict(rerun_request(run, density=0.3))
        assert (req.time_only, req.clean_timing) == (time_only, clean), stored
