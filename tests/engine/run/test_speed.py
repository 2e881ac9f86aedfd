"""engine/run/speed.py: one reading of a run's timings for the CLI summary and the Speed page."""

from __future__ import annotations

import pytest

from sketchwalk.engine.run import speed

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


def test_ceilings_follow_amdahl_from_the_dense_attention_share():
    """Attention 40 of 90 ms in prefill, 2 of 8 ms per token in decode: at density 0.2 with free
    selection the whole model is at most 1 / (1 - share * 0.8) faster, 1 / (1 - share) with
    free attention; no clean pass or no density: no ceiling."""
    t = {**RECORDED, **CLEAN}
    pre, dec = speed.ceilings(t, 0.2)
    assert (pre.phase, dec.phase) == ("prefill", "decode")
    assert pre.attention_share == pytest.approx(40 / 90)
    assert pre.at_density == pytest.approx(1 / (1 - 40 / 90 * 0.8))
    assert pre.free == pytest.approx(1.8)
    assert dec.at_density == pytest.approx(1.25) and dec.free == pytest.approx(4 / 3)
    assert speed.ceilings(t, 1.0)[0].at_density == pytest.approx(1.0)  # dense: no gain
    assert speed.ceilings(RECORDED, 0.2) == [] and speed.ceilings(t, None) == []
    assert speed.ceilings({**t, "clean_dense_attention_ms": 95.0}, 0.2)[0].phase == "decode"
    out = speed.summary(t, density=0.2)["ceiling"]
    assert out["prefill"]["at_density"] == pytest.approx(pre.at_density)
    assert speed.summary(t)["ceiling"] is None
    last = speed.lines(t, density=0.2)[-1]
    assert last.startswith("ceiling at this length") and "prefill 1.55x" in last
    assert "44% of the dense prefill" in last and "decode 1.33x" in last
    assert not speed.lines(t)[-1].startswith("ceiling")


def test_machine_text_names_where_a_run_was_timed():
    versions = {"torch": "2.13.0", "transformers": "5.25.0", "sketchwalk": "0.1.0",
                "cpu": "AMD EPYC", "isa": "AVX2", "threads": "1"}  # fmt: skip
    assert speed.machine_text(versions) == (
        "Timed on AMD EPYC (AVX2, 1 thread), torch 2.13.0, transformers 5.25.0"
    )
    assert speed.machine_text({"cpu": "X"}) == "Timed on X"
    gpu = {"cpu": "X", "gpu": "NVIDIA H200", "threads": "8"}
    assert speed.machine_text(gpu) == "Timed on NVIDIA H200 on X (8 threads)"
    assert speed.machine_text({**versions, "c_kernels": "on"}) == speed.machine_text(versions)
    off = "Timed on X (C kernels off)"  # no C compiler where it ran: a slower selection
    assert speed.machine_text({"cpu": "X", "c_kernels": "off"}) == off
    assert speed.machine_text({"cpu": "X", "block_softmax": "torch"}) == off  # stored 2026-12-03


@pytest.mark.parametrize(
    "versions",
    [None, {}, {"torch": "2.13.0"}, {"cpu": 3, "isa": "AVX2"}, {"cpu": ""}, ["cpu"], "cpu"],
)
def test_machine_text_of_older_or_odd_versions_is_none(versions):
    assert speed.machine_text(versions) is None  # stored before the machine was kept, or junk


def test_machine_text_uses_strings_only_and_caps_them():
    text = speed.machine_text({"cpu": "C" * 500, "isa": ["AVX2"], "threads": 2})
    assert text == "Timed on " + "C" * 120
