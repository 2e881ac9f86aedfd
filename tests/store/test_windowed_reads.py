"""Reads that take bounds (issue 50): a window of tokens, a few tokens' texts, the worst KL
tokens, decode rows, and a run opened without its long texts give what the whole reads give."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from store_fixtures import saved_run

from sketchwalk.app import figures
from sketchwalk.store import reads


def test_a_window_of_tokens_is_the_whole_read_narrowed(store):
    run_id, _ = saved_run(store)
    whole = store.tokens(run_id)
    got = store.tokens(run_id, 2, 5, "sparse", text_chars=1)
    want = whole[(whole["variant"] == "sparse") & whole["position"].between(2, 4)]
    want = want.assign(text=want["text"].str[:1]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert store.tokens(run_id, 0, 0).empty


def test_token_texts_and_worst_tokens_agree_with_the_figures(store):
    run_id, _ = saved_run(store)
    whole = store.tokens(run_id)
    n = int(store.get_run(run_id)["prompt_tokens"])
    sparse = whole[whole["variant"] == "sparse"].set_index("position")["text"]
    assert store.token_texts(run_id, [0, 3, 3, 10_000]) == {0: sparse[0], 3: sparse[3]}
    want = figures.worst_tokens(whole, n, k=3)
    got = store.worst_tokens(run_id, k=3)
    assert got["position"].tolist() == want["position"].tolist()
    assert np.allclose(got["kl"], want["kl"])


def test_top_k_keeps_the_highest_finite_ties_by_position():
    pos, kl = reads.top_k(np.array([5, 1, 2, 3]), np.array([0.5, np.nan, 0.9, 0.5]), 2)
    assert pos.tolist() == [2, 3] and kl.tolist() == [0.9, 0.5]


def test_open_run_cuts_long_texts_and_leaves_out_long_json(store, monkeypatch):
    run_id, _ = saved_run(store)
    whole = store.get_run(run_id)
    opened = store.open_run(run_id)
    assert {k: opened[k] for k in whole} == whole and opened["left_out"] == []
    assert opened["prompt_chars"] == len(whole["prompt"])
    monkeypatch.setattr(reads, "RUN_TEXT_CHARS", 3)
    cut = store.open_run(run_id)
    assert cut["prompt"] == whole["prompt"][:3] and cut["request"] is None
    assert "request" in cut["left_out"] and cut["prompt_chars"] == len(whole["prompt"])
    assert store.run_text(run_id, "prompt") == whole["prompt"]
    with pytest.raises(ValueError):
        store.run_text(run_id, "config")


def test_same_prompt_is_asked_of_the_database(store):
    a, _ = saved_run(store)
    b, _ = saved_run(store)
    assert store.same_prompt(a, b) and store.same_prompt(a, a)
    assert not store.same_prompt(a, "nope")
