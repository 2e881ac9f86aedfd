"""Clean-pass timings (engine/run/timing.py): present, consistent, and the pass is a real one."""

from __future__ import annotations

import pytest

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import RunOptions, run
from sketchwalk.engine.run.timing import recording_overhead, run_variant

PROMPT = "The quick brown fox jumps over the lazy dog. " * 30


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def test_run_reports_clean_timings_and_recording_overhead(tiny):
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=4, clean_timing=True))
    t = res.timings
    for key in (
        "clean_dense_prefill_ms", "clean_sparse_prefill_ms", "clean_dense_attention_ms",
        "clean_sparse_attention_ms", "clean_dense_decode_ms_per_token",
        "clean_sparse_decode_ms_per_token", "recording_overhead_prefill_ms",
    ):  # fmt: skip
        assert key in t, key
    assert 0 < t["clean_dense_attention_ms"] < t["clean_dense_prefill_ms"]
    assert 0 < t["clean_sparse_attention_ms"] < t["clean_sparse_prefill_ms"]
    assert t["recording_overhead_prefill_ms"] == pytest.approx(
        t["sparse_prefill_ms"] - t["clean_sparse_prefill_ms"]
    )
    plain = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=4, record=False))
    assert not any(k.startswith("clean_") for k in plain.timings)


def test_clean_sparse_pass_predicts_what_the_recorded_run_predicts(tiny):
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    ids = tiny.tokenizer(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=1))
    clean = run_variant(tiny.model, ids, 0, cfg, all_logits=False)
    dense = run_variant(tiny.model, ids, 0, None, all_logits=False)
    first = tiny.tokenizer.decode([clean.first_token])
    assert res.sparse_text == first  # same first token as the recorded sparse pass
    assert dense.stages["prefill_attention"] > 0 and "decode_attention" not in dense.stages


def test_recording_overhead_needs_both_sides():
    assert recording_overhead({"sparse_prefill_ms": 5.0}) == {}
    out = recording_overhead({"sparse_prefill_ms": 5.0, "clean_sparse_prefill_ms": 3.0})
    assert out == {"recording_overhead_prefill_ms": 2.0}


def test_a_clean_run_generates_what_a_recorded_run_generates_bit_for_bit(tiny):
    """The recorder only watches: with it and without it (a time-only run) the sparse pass
    writes the same tokens with the same log-probabilities, to the last bit."""
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    recorded = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=4))
    clean = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=4, record=False, clean_timing=True))
    assert recorded.layers and not clean.layers
    t = clean.timings  # timed, but with no recorder there is no recording overhead
    assert "clean_sparse_prefill_ms" in t and "clean_sparse_decode_selection_ms" in t
    assert not any(k.startswith("recording_overhead") for k in t)

    def sparse(res):
        return [
            (t.position, t.token_id, t.logprob, t.kl) for t in res.tokens if t.variant == "sparse"
        ]

    assert sparse(recorded) == sparse(clean)
    assert recorded.sparse_text == clean.sparse_text
    for key in ("kl_mean", "ppl_sparse", "density_achieved", "density_decode"):
        assert recorded.metrics[key] == clean.metrics[key], key


def test_timed_dense_counts_from_entry_and_always_restores_plain_sdpa(tiny):
    """The timed SDPA gives the dense model's own outputs, counts only what ran inside its block
    (earlier timed passes do not leak in), and leaves the model on plain SDPA even on error."""
    import torch

    from sketchwalk.engine.run.timing import timed_dense

    ids = tiny.tokenizer(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    model = tiny.model
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        plain = model(ids).logits
        with timed_dense(model) as attention_ms:
            timed = model(ids).logits
            one = attention_ms()
            model(ids)
            two = attention_ms()
        with timed_dense(model) as again:
            assert again() == 0.0
            model(ids)
            assert again() > 0
    assert torch.equal(plain, timed) and 0 < one < two
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), timed_dense(model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
