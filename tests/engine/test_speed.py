"""engine/speed.py: one reading of a run's timings for the CLI summary and the Speed page."""

from __future__ import annotations

import pytest

from sketchwalk.engine import speed

RECORDED = {
    "dense_prefill_ms": 120.0,
    "sparse_prefill_ms": 100.0,
    "dense_decode_ms_per_token": 10.0,
    "sparse_decode_ms_per_token": 12.0,
}
CLEAN = {
    "clean_dense_prefill_ms": 90.0,
    "clean_sparse_prefill_ms": 60.0,
    "clean_dense_attention_ms": 40.0,
    "clean_sparse_attention_ms": 10.0,
    "clean_sparse_selection_ms": 10.0,
    "clean_dense_decode_ms_per_token": 8.0,
    "clean_sparse_decode_ms_per_token": 10.0,
    "clean_dense_decode_attention_ms": 2.0,
    "clean_sparse_decode_attention_ms": 1.0,
    "clean_sparse_decode_selection_ms": 3.0,
    "recording_overhead_prefill_ms": 40.0,
    "recording_overhead_decode_ms_per_token": 2.0,
}


def test_clean_pairs_compare_attention_with_the_whole_sparse_path():
    pairs = speed.clean_pairs({**RECORDED, **CLEAN})
    assert [p.label for p in pairs] == [
        "Prefill, whole model",
        "Prefill, attention alone",
        "Decode, whole model",
        "Decode, attention alone",
    ]
    assert [p.ratio for p in pairs] == pytest.approx([1.5, 2.0, 0.8, 0.5])
    assert pairs[1].sparse_ms == 20.0  # selection included
    assert [p.unit for p in pairs] == ["ms", "ms", "ms/token", "ms/token"]


def test_overhead_in_ms_and_as_a_fraction_of_the_clean_pass():
    over = speed.recording_overhead({**RECORDED, **CLEAN})
    assert over == pytest.approx(
        {"prefill_ms": 40.0, "prefill_fraction": 40 / 60, "decode_ms": 2.0, "decode_fraction": 0.2}
    )


def test_an_old_run_without_clean_timings_reads_without_them():
    assert not speed.has_clean(RECORDED) and speed.clean_pairs(RECORDED) == []
    assert speed.recording_overhead(RECORDED) == {}
    assert [p.ratio for p in speed.run_pairs(RECORDED)] == pytest.approx([1.2, 10 / 12])
    out = speed.summary(RECORDED)
    assert out["clean"] is None and out["recording_overhead"] is None
    assert "no clean-pass timings" in speed.lines(RECORDED)[0]
    assert speed.run_pairs({})[0].ratio is None  # nothing at all: no ratio, no error


def test_summary_and_lines_of_a_time_only_run():
    t = {k: v for k, v in {**RECORDED, **CLEAN}.items() if "overhead" not in k}
    out = speed.summary(t, time_only=True)
    assert out["clean"]["prefill_attention_alone"]["ratio"] == pytest.approx(2.0)
    assert out["run_passes_recorded"] is False and out["recording_overhead"] is None
    text = speed.lines(t, time_only=True)
    assert text[0].startswith("speed, clean pass") and "(1.50x)" in text[0]
    assert text[1].startswith("speed, time-only pass") and len(text) == 2
