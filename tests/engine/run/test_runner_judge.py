"""The dense judge of the sparse continuation from the dense pass's kept cache equals a whole
forward (engine/run/runner.py judge_logits), and a run's clean passes carry medians and spreads."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.app.prompts import license_text
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import LMParts, RunOptions, greedy, judge_logits, run, tokenize


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(tiny_model)


def test_judge_from_the_kept_cache_equals_a_whole_forward(tiny):
    ids = tokenize(tiny, license_text()[:900])
    tiny.model.set_attn_implementation("sdpa")
    dense = greedy(tiny.model, ids, 6, None, keep_cache=True)
    assert dense.cache is not None
    new = [5, 17, 300, 42, 7, 9]  # any continuation, not the dense one
    parts = LMParts.of(tiny.model)
    from_cache = judge_logits(parts, ids, dense, new)
    assert dense.cache.get_seq_length() == ids.shape[1]  # back to the prompt: reusable
    again = judge_logits(parts, ids, dense, new[::-1])  # another continuation, the same cache
    cache, dense.cache = dense.cache, None
    whole = judge_logits(parts, ids, dense, new)
    assert from_cache.shape == whole.shape == (6, whole.shape[-1])
    torch.testing.assert_close(from_cache, whole, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        again, judge_logits(parts, ids, dense, new[::-1]), rtol=1e-4, atol=1e-4
    )
    assert cache.get_seq_length() == ids.shape[1]


def test_a_second_density_on_the_same_prompt_reuses_the_dense_side(tiny):
    """The dense side of a prompt is computed once per model: a run at another density reuses
    it (dense_reused) with metrics equal to a run that computes it afresh; another prompt or
    another number of new tokens does not reuse it."""
    prompt = license_text()[:900]
    opts = RunOptions(max_new_tokens=5)
    tiny.dense_memo = None
    first = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.5), opts)
    assert first.metrics["dense_reused"] is False
    second = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), opts)
    assert second.metrics["dense_reused"] is True
    tiny.dense_memo = None
    fresh = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), opts)
    assert fresh.metrics["dense_reused"] is False
    assert second.dense_text == fresh.dense_text == first.dense_text
    for key in ("kl_mean", "top1_agreement", "ppl_dense", "ppl_sparse", "gen_kl_mean"):
        assert second.metrics[key] == pytest.approx(fresh.metrics[key], rel=1e-5, abs=1e-7), key
    other = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), RunOptions(4))
    assert other.metrics["dense_reused"] is False
    shorter = run(tiny, prompt[:700], SketchWalkConfig(block_size=16), RunOptions(4))
    assert shorter.metrics["dense_reused"] is False


def test_a_run_reports_clean_medians_and_their_spread(tiny):
    cfg = SketchWalkConfig(block_size=16)
    res = run(tiny, license_text()[:900], cfg, RunOptions(max_new_tokens=4, clean_timing=True))
    t = res.timings
    assert t["clean_repeats"] == 3
    assert (
        t["clean_prefill_speedup_lo"] <= t["clean_prefill_speedup"] <= t["clean_prefill_speedup_hi"]
    )
    assert t["clean_decode_tokens"] >= 1
    assert t["clean_decode_speedup_lo"] <= t["clean_decode_speedup"] <= t["clean_decode_speedup_hi"]
    assert res.metrics["gen_kl_mean"] is not None and res.metrics["gen_kl_mean"] >= 0


def test_quality_first_then_speed(tiny):
    """run(speed=False) is the quality half (no clean pass even when asked); speed_timings then
    adds the clean passes' medians, spreads and what recording cost."""
    from sketchwalk.engine.run.runner import speed_timings

    prompt = license_text()[:700]
    opts = RunOptions(max_new_tokens=3, clean_timing=True, clean_repeats=2)
    cfg = SketchWalkConfig(block_size=16)
    res = run(tiny, prompt, cfg, opts, speed=False)
    assert res.metrics["kl_mean"] is not None
    assert not any(k.startswith("clean_") for k in res.timings)
    seen = []
    more = speed_timings(tiny, prompt, cfg, opts, res.timings, lambda f, m: seen.append(m))
    assert more["clean_repeats"] == 2
    assert more["clean_prefill_speedup_lo"] <= more["clean_prefill_speedup"]
    assert "recording_overhead_prefill_ms" in more
    assert seen == ["timing clean pass 1/2", "timing clean pass 2/2"]
    assert speed_timings(tiny, prompt, cfg, RunOptions(clean_timing=False), res.timings) == {}
