"""RunRequest: the time-only and clean-timing options, checked once and carried through JSON."""

from __future__ import annotations

import pytest

from sketchwalk.engine.request import RequestError, RunRequest

TEXT = "Blocks of tokens, layer after layer. " * 8


def test_a_recorded_run_times_a_clean_pass_unless_asked_not_to():
    req = RunRequest(prompt=TEXT)
    assert req.record and not req.time_only and req.clean_timing is True
    opts = req.run_options()
    assert opts.record and opts.clean_timing
    off = RunRequest(prompt=TEXT, clean_timing=False)
    assert off.record and off.run_options().clean_timing is False


def test_a_time_only_run_records_nothing_and_always_times_a_clean_pass():
    req = RunRequest(prompt=TEXT, time_only=True)
    assert not req.record and req.clean_timing is True
    opts = req.run_options()
    assert not opts.record and opts.clean_timing
    with pytest.raises(RequestError, match="time-only run always times a clean pass"):
        RunRequest(prompt=TEXT, time_only=True, clean_timing=False)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"time_only": "yes"}, "time only must be true or false"),
        ({"time_only": 1}, "time only must be true or false"),
        ({"clean_timing": "off"}, "clean timing must be true or false"),
    ],
)
def test_non_boolean_options_are_refused(kw, words):
    with pytest.raises(RequestError, match=words):
        RunRequest(prompt=TEXT, **kw)


def test_the_options_round_trip_through_the_job_json():
    for req in (
        RunRequest(prompt=TEXT),
        RunRequest(prompt=TEXT, time_only=True),
        RunRequest(prompt=TEXT, clean_timing=False),
    ):
        data = req.to_dict()
        assert data["record"] is req.record  # what workers before time_only read
        back = RunRequest.from_dict(data)
        assert back == req and back.extra == {}


def test_requests_from_before_time_only_read_the_same():
    old = {"prompt": TEXT, "config": {}, "record": False}
    assert RunRequest.from_dict(old).time_only is True
    assert RunRequest.from_dict({"prompt": TEXT, "config": {}}).time_only is False
    assert RunRequest.from_dict({"prompt": TEXT, "config": {}}).clean_timing is True
    with pytest.raises(RequestError, match="time only must be true or false"):
        RunRequest.from_dict({"prompt": TEXT, "config": {}, "time_only": "no"})
