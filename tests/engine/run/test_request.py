"""RunRequest: the time-only and clean-timing options, checked once and carried through JSON."""

from __future__ import annotations

import pytest

from sketchwalk.engine.run.request import RequestError, RunRequest

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


@pytest.mark.parametrize("block", [1, 4, 8])
def test_blocks_the_triton_kernels_cannot_take_are_refused_for_cuda_in_one_line(block, monkeypatch):
    """On CUDA the Triton kernels need power-of-two blocks >= 16: said when the run is asked for
    (no GPU needed to say so), while the CPU kernels take the same request."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.run.request import check_device

    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    req = RunRequest(prompt=TEXT, config=SketchWalkConfig(block_size=block), dtype="bfloat16")
    assert check_device("cpu", req) == "cpu"
    for device in ("cuda", "cuda:1"):
        with pytest.raises(RequestError) as err:
            check_device(device, req)
        msg = str(err.value)
        assert "\n" not in msg and "triton" in msg and ">= 16" in msg and str(block) in msg
    ok = RunRequest(prompt=TEXT, config=SketchWalkConfig(block_size=16), dtype="bfloat16")
    assert check_device("cuda", ok) == "cuda"


def test_backend_limits_cover_every_backend_and_dtype():
    from sketchwalk.engine.run.request import DTYPE_NAMES
    from sketchwalk.kernels import REGISTRY, BackendLimits

    for backend in REGISTRY.values():
        assert all(backend.limits.why_not(64, d) is None for d in DTYPE_NAMES)
    strict = BackendLimits(min_block=16, power_of_two=True, dtypes=("float16",))
    assert strict.why_not(48, "float16") and strict.why_not(16, "float32")
    assert strict.why_not(16, "float16") is None
