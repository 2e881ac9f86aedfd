"""The verdict (app/verdict.py) on plain run dicts: density with why it is off target, mass
kept, KL and top-1, the needle found or lost, and clean-pass speed held against its ceiling."""

from __future__ import annotations

import statistics

import pandas as pd
import pytest

from sketchwalk.app import verdict as v
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.runner import decode_spread, median_timings

CONFIG = SketchWalkConfig(density=0.2).to_dict()  # what a run stores: every knob

NEEDLE = "Some text. The pass key is 52445. Remember it. 52445 is the pass key. More text."


def _run(**changes) -> dict:
    run = {
        "prompt": "plain prose",
        "prompt_tokens": 2048,
        "config": CONFIG,
        "metrics": {
            "density_target": 0.2,
            "density_achieved": 0.21,
            "kl_mean": 0.012,
            "top1_agreement": 0.97,
        },
        "timings": {},
        "dense_text": "",
        "sparse_text": "",
    }
    run.update(changes)
    return run


def _stats(recalls: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "phase": ["prefill"] * (len(recalls) + 1),
            "layer": list(range(len(recalls) + 1)),
            "dense": [True] + [False] * len(recalls),
            "mass_recall": [None, *recalls],
        }
    )


def test_on_target_density_has_no_warning_and_reports_quality():
    out = v.verdict(_run(), _stats([0.95, 0.85]))
    assert out.warnings == []
    assert out.item("density").value == "0.21" and out.item("density").level == "ok"
    mass = out.item("mass")
    assert mass.value == "90.0%" and "worst layer 2: 85.0%" in mass.note
    assert out.item("kl").value == "0.0120" and out.item("top1").value == "97.0%"
    assert out.item("needle") is None  # no pass key in the prompt


def test_short_prompt_far_above_target_says_forced_blocks():
    config = {**CONFIG, "block_size": 32}
    run = _run(
        prompt_tokens=188, config=config, metrics={"density_target": 0.2, "density_achieved": 0.81}
    )
    out = v.verdict(run)
    assert out.item("density").level == "warn"
    (warning,) = out.warnings
    assert "0.81 is far above the target 0.20" in warning
    assert "at 188 tokens (6 blocks of 32)" in warning and "forced blocks" in warning
    floor = v.density_floor(run["config"], 188)
    assert floor is not None and f"keep {floor:.2f}" in warning
    assert floor > 0.5  # sink, window and diagonal of 6 blocks: 15 of 21 causal pairs


def test_density_floor_falls_with_length():
    cfg = CONFIG
    assert v.density_floor(cfg, 188) > v.density_floor(cfg, 2048) > v.density_floor(cfg, 8192)


@pytest.mark.parametrize(
    "dense, sparse, value, level",
    [
        ("52445.", " 52445", "found", "ok"),
        ("52445", "a magical item", "lost", "bad"),
        ("a magical item", "a magical item", "dense misses it", "warn"),
    ],
)
def test_needle_found_lost_or_untellable(dense, sparse, value, level):
    item = v.verdict(_run(prompt=NEEDLE, dense_text=dense, sparse_text=sparse)).item("needle")
    assert (item.label, item.value, item.level) == ("Needle 52445", value, level)


def _timings(prefill=(1.1, 1.2, 1.3), decode=(1.05, 1.1, 1.2, 1.1), attn_share=0.5):
    """Three clean prefills at the given speed-ups; the first pass decodes a token per entry of
    `decode` (dense 20 ms each, sparse 20 / ratio)."""
    runs = []
    for i, p in enumerate(prefill):
        r = {
            "clean_dense_prefill_ms": 1000.0,
            "clean_sparse_prefill_ms": 1000.0 / p,
            "clean_dense_attention_ms": 1000.0 * attn_share,
            "clean_sparse_attention_ms": 100.0,
            "clean_sparse_selection_ms": 10.0,
        }
        if i == 0:
            r.update(
                clean_dense_decode_ms_per_token=20.0,
                clean_sparse_decode_ms_per_token=20.0 / statistics.mean(decode),
                clean_dense_decode_attention_ms=20.0 * attn_share,
                clean_sparse_decode_attention_ms=2.0,
                clean_sparse_decode_selection_ms=0.1,
            )
        runs.append(r)
    out = median_timings(runs)
    out.update(decode_spread([20.0] * len(decode), [20.0 / d for d in decode]))
    return out


def test_median_timings_medians_and_ratio_range():
    t = _timings(prefill=(1.1, 1.5, 1.2))
    assert t["clean_repeats"] == 3
    assert t["clean_prefill_speedup"] == pytest.approx(1.2)
    assert (t["clean_prefill_speedup_lo"], t["clean_prefill_speedup_hi"]) == pytest.approx(
        (1.1, 1.5)
    )
    assert t["clean_sparse_prefill_ms"] == pytest.approx(1000 / 1.2)  # the median pass


def test_speed_is_median_with_spread_under_the_ceiling():
    out = v.verdict(_run(timings=_timings()))
    pre = out.item("prefill")
    assert (
        pre.value == "1.20× (1.10–1.30)"
        and "median of 3 clean passes, range 1.10–1.30×" in pre.note
    )
    assert "ceiling" in pre.note and out.warnings == []


def test_speed_above_the_ceiling_is_called_noise():
    # attention is 10% of the dense prefill: at density 0.21 at most 1/(1-0.1*0.79) = 1.09x
    out = v.verdict(_run(timings=_timings(prefill=(2.2, 2.3, 2.4), attn_share=0.1)))
    assert out.item("prefill").value == "noise"
    assert any("measurement is noise" in w and "2.30×" in w for w in out.warnings)
    assert "2.30×" not in " ".join(i.value for i in out.items)  # never shown as a speed-up


def test_speed_range_spanning_one_is_no_clear_difference():
    out = v.verdict(_run(timings=_timings(decode=(0.8, 0.9, 1.1, 1.2))))
    assert "no clear difference" in out.item("decode").note


def test_decode_spread_is_the_middle_half_of_per_token_ratios():
    t = decode_spread([10.0, 10.0, 10.0, 10.0, 10.0], [10.0, 5.0, 8.0, 12.5, 10.0])
    assert t["clean_decode_tokens"] == 5
    assert t["clean_decode_speedup"] == pytest.approx(1.0)  # ratios 1, 2, 1.25, 0.8, 1
    assert (t["clean_decode_speedup_lo"], t["clean_decode_speedup_hi"]) == pytest.approx(
        (1.0, 1.25)
    )
    out = v.verdict(_run(timings=_timings(decode=(1.1, 1.2, 1.3, 1.2))))
    assert "median of 4 clean tokens' ratios, middle half" in out.item("decode").note


def test_run_without_clean_pass_or_records():
    out = v.verdict(_run(metrics={}, timings={}))
    assert out.item("density").value == "–" and out.item("mass").value == "–"
    assert out.item("prefill").value == "–" and "no clean pass" in out.item("prefill").note


def test_the_walk_item_says_what_the_walk_changes_and_whether_it_selected():
    """The runner's walk_effect in words: counterfactual (not used) or used, blocks added and
    dropped, the mass gain's sign as the level; no item for runs without a walk effect."""
    off = {"used": False, "beta": 0.25, "added": 12, "dropped": 10, "mass_gain": 0.031}
    item = v.walk_item({"walk_effect": off})
    assert item.value == "+12 −10" and item.level == "ok"
    assert "not used for selection" in item.note and "damping 0.25" in item.note
    assert "+0.031" in item.note
    on = v.walk_item({"walk_effect": {**off, "used": True, "mass_gain": -0.02}})
    assert "selected" in on.note and "not used" not in on.note and on.level == "warn"
    same = v.walk_item({"walk_effect": {**off, "added": 0, "dropped": 0, "mass_gain": 0.0}})
    assert same.value == "same" and "same blocks" in same.note
    assert v.walk_item({}) is None and v.walk_item({"walk_effect": None}) is None
    run = {"metrics": {"walk_effect": off}, "config": {}, "prompt": "x"}
    assert v.verdict(run).item("walk") is not None


@pytest.mark.parametrize(
    ("changes", "value", "note", "level"),
    [
        ({"status": "running"}, "…", "timing clean passes…", "info"),
        ({"status": "done"}, "–", "this run timed no clean pass", "info"),
        (
            {"status": "done", "timings": {"clean_failed": "the clean timing passes failed: X"}},
            "–",
            "the clean timing passes failed: X",
            "warn",
        ),
    ],
)
def test_speed_items_without_clean_passes_say_why(changes, value, note, level):
    out = v.verdict(_run(**changes))
    for key in ("prefill", "decode"):
        item = out.item(key)
        assert (item.value, item.note, item.level) == (value, note, level)
    assert out.item("kl").value == "0.0120"  # the quality half is there either way
