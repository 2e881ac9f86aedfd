"""A run written to the store reads back exactly: run row, layer stats, heatmaps, decode rows,
tokens and blocks; failures mid-write leave no rows and a failed status."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from store_fixtures import REQUEST, count_rows, make_result, saved_run

from sketchwalk.engine.run.records import LayerRecord
from sketchwalk.store import InvalidResultError, UnknownRunError
from sketchwalk.store.frames import LAYER_SCALARS
from sketchwalk.store.reads import LABEL_CHARS

MATRICES = ("sketch", "walk", "exact", "selected")


def _expected_dense(rec: LayerRecord, name: str) -> np.ndarray:
    """What heatmap() must return for one matrix: values on causal pairs, NaN/False elsewhere."""
    n = rec.n_blocks
    causal = np.arange(n)[None, :] <= np.asarray(rec.q_blocks)[:, None]
    src = getattr(rec, name)
    if name == "selected":
        out = np.zeros((n, n), dtype=bool)
        if src is not None:
            out[np.asarray(rec.q_blocks)] = np.where(causal, src, False)
        return out
    out = np.full((n, n), np.nan, dtype=np.float32)
    if src is not None:
        out[np.asarray(rec.q_blocks)] = np.where(causal, src, np.nan)
    return out


def test_create_run_starts_queued_and_keeps_request(store):
    run_id = store.create_run(dict(REQUEST))
    run = store.get_run(run_id)
    assert run["status"] == "queued"
    assert run["prompt"] == REQUEST["prompt"]
    assert run["model_id"] == REQUEST["model"]
    assert run["config"] == {"density": 0.2}
    assert run["request"] == REQUEST
    assert run["finished_at"] is None


def test_create_run_rejects_bad_requests(store):
    with pytest.raises(InvalidResultError, match="prompt"):
        store.create_run({"model": "x"})
    with pytest.raises(InvalidResultError, match="queued"):
        store.create_run(dict(REQUEST), status="done")
    assert store.list_runs().empty


def test_save_result_round_trip(store):
    run_id, result = saved_run(store)
    run = store.get_run(run_id)
    assert run["status"] == "done" and run["error"] is None
    assert run["finished_at"] is not None
    assert run["prompt"] == result.prompt
    assert run["prompt_tokens"] == result.prompt_tokens
    assert run["model_hash"] == "abc123"
    assert run["dense_text"] == " Paris." and run["sparse_text"] == " Paris!"
    assert run["config"] == {"density": 0.2, "beta": 0.25, "dense_layers": [0, 1]}
    assert run["versions"] == result.versions
    assert run["timings"] == result.timings
    assert run["metrics"]["kl"] == 0.01 and math.isnan(run["metrics"]["ppl_dense"])

    stats = store.layer_stats(run_id)
    assert len(stats) == len(result.layers)
    assert list(stats["phase"].unique()) == ["prefill", "decode"]  # prefill first
    by_key = {(r.phase, r.step, r.layer): r for r in result.layers}
    for row in stats.itertuples():
        rec = by_key[(row.phase, row.step, row.layer)]
        assert row.dense == rec.dense and row.n_blocks == rec.n_blocks
        assert row.q_blocks == list(rec.q_blocks)
        for name in LAYER_SCALARS:
            want, got = getattr(rec, name), getattr(row, name)
            assert (want is None and np.isnan(got)) or got == pytest.approx(want), name
    assert len(store.layer_stats(run_id, phase="decode")) == 3 * 4

    for rec in result.layers:
        if rec.phase != "prefill":
            continue
        hm = store.heatmap(run_id, "prefill", 0, rec.layer)
        assert hm["n_blocks"] == rec.n_blocks
        np.testing.assert_array_equal(hm["q_blocks"], rec.q_blocks)
        for name in MATRICES:
            assert hm[name].shape == (rec.n_blocks, rec.n_blocks)
            np.testing.assert_array_equal(hm[name], _expected_dense(rec, name), err_msg=name)
    # non-causal pairs are never stored
    hm = store.heatmap(run_id, "prefill", 0, 1)
    assert np.isnan(hm["sketch"][np.triu_indices(12, 1)]).all()
    assert not np.isnan(np.tril(hm["sketch"])[np.tril_indices(12)]).any()


def test_decode_rows_stack_steps(store):
    run_id, result = saved_run(store, n_blocks=6, decode_steps=4)
    rows = store.decode_rows(run_id, layer=2)
    np.testing.assert_array_equal(rows["steps"], [1, 2, 3, 4])
    np.testing.assert_array_equal(rows["n_blocks"], [6, 6, 6, 7])
    np.testing.assert_array_equal(rows["q_blocks"], [5, 5, 5, 6])
    recs = [r for r in result.layers if r.phase == "decode" and r.layer == 2]
    for name in MATRICES:
        assert rows[name].shape == (4, 7)
        for s, rec in enumerate(recs):
            got = rows[name][s, : rec.n_blocks]
            np.testing.assert_array_equal(got, getattr(rec, name)[0], err_msg=name)
    assert np.isnan(rows["sketch"][:3, 6]).all() and not rows["selected"][:3, 6].any()
    empty = store.decode_rows(run_id, layer=99)
    assert empty["sketch"].shape == (0, 0)


def test_steps_tokens_blocks(store):
    run_id, result = saved_run(store)
    steps = store.steps(run_id)
    assert list(steps.columns) == ["phase", "step", "layer", "n_blocks", "dense"]
    assert len(steps) == len(result.layers)
    assert set(steps.loc[steps.phase == "decode", "step"]) == {1, 2, 3}

    toks = store.tokens(run_id)
    want = pd.DataFrame([t.__dict__ for t in result.tokens]).sort_values(["variant", "position"])
    assert len(toks) == len(want)
    np.testing.assert_array_equal(toks["token_id"], want["token_id"])
    assert list(toks["text"]) == list(want["text"])
    np.testing.assert_allclose(toks["logprob"], want["logprob"].astype(float))
    assert toks.loc[toks.variant == "dense", "kl"].isna().all()

    blocks = store.blocks(run_id)
    assert list(blocks["block"]) == list(range(12))
    assert list(blocks["token_start"]) == [b.start for b in result.blocks]
    assert list(blocks["token_end"]) == [b.end for b in result.blocks]
    assert blocks["text"].iloc[3] == "block 3"


def test_list_runs_filters_and_order(store):
    first, _ = saved_run(store)
    queued = store.create_run({**REQUEST, "model": "other", "method": "nowalk"})
    store.mark_failed(first, "boom")
    df = store.list_runs()
    assert list(df["id"]) == [queued, first]  # newest first
    assert list(store.list_runs(status="failed")["id"]) == [first]
    assert list(store.list_runs(model="other")["id"]) == [queued]
    assert list(store.list_runs(method="nowalk")["id"]) == [queued]
    assert store.list_runs(status="running").empty
    assert df.loc[df.id == first, "error"].item() == "boom"
    assert df.loc[df.id == first, "config"].item()["density"] == 0.2


def test_list_runs_cuts_prompts_and_the_database_compares_them_whole(store):
    """A list reads each prompt's first LABEL_CHARS; equality and search see the whole text."""
    head = "x" * LABEL_CHARS
    a = store.create_run({**REQUEST, "prompt": head + "tail 50%_A"})
    b = store.create_run({**REQUEST, "prompt": head + "tail 50%_B"})
    c = store.create_run({**REQUEST, "prompt": head + "tail 50%_A"})
    listed = store.list_runs().set_index("id")
    assert set(listed["prompt"]) == {head}  # cut: the three look alike in the list
    assert listed.loc[a, "prompt_chars"] == LABEL_CHARS + 10
    assert store.same_prompt_runs(a) == {a, c} and store.same_prompt_runs(b) == {b}
    assert store.runs_containing("50%_b") == {b}  # case ignored; % and _ are literal
    assert store.runs_containing("0%") == {a, b, c} and store.runs_containing("5_%") == set()


def test_set_status_validates(store):
    run_id = store.create_run(dict(REQUEST))
    store.set_status(run_id, "running")
    assert store.get_run(run_id)["status"] == "running"
    with pytest.raises(InvalidResultError, match="unknown run status"):
        store.set_status(run_id, "exploded")


def test_failure_mid_write_leaves_no_rows_and_failed_status(store, monkeypatch):
    run_id = store.create_run(dict(REQUEST), status="running")
    calls = []
    original = type(store)._insert

    def flaky(self, conn, table, data, key):
        calls.append(table.name)
        if table.name == "tokens":  # the last insert: everything before it was written
            raise RuntimeError("disk on fire")
        original(self, conn, table, data, key)

    monkeypatch.setattr(type(store), "_insert", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        store.save_result(run_id, make_result())
    assert calls == ["layer_stats", "block_scores", "blocks", "tokens"]
    counts = count_rows(store, run_id)
    assert counts.pop("runs") == 1
    assert set(counts.values()) == {0}, counts
    run = store.get_run(run_id)
    assert run["status"] == "failed"
    assert "disk on fire" in run["error"] and "\n" not in run["error"]
    assert run["dense_text"] is None  # the run row was not updated either


def test_invalid_result_fails_the_run(store):
    run_id = store.create_run(dict(REQUEST), status="running")
    result = make_result()
    result.layers[3].walk = np.zeros((5, 5), dtype=np.float32)
    with pytest.raises(InvalidResultError, match=r"walk has shape \(5, 5\)"):
        store.save_result(run_id, result)
    assert store.get_run(run_id)["status"] == "failed"
    assert "walk has shape" in store.get_run(run_id)["error"]
    assert count_rows(store, run_id)["block_scores"] == 0


def test_duplicate_layer_record_is_refused(store):
    run_id = store.create_run(dict(REQUEST))
    result = make_result()
    result.layers.append(result.layers[0])
    with pytest.raises(InvalidResultError, match="appears twice"):
        store.save_result(run_id, result)


def test_saving_again_replaces_rows(store):
    run_id, first = saved_run(store)
    before = count_rows(store, run_id)
    second = make_result(seed=7)
    store.save_result(run_id, second)
    assert count_rows(store, run_id) == before
    hm = store.heatmap(run_id, "prefill", 0, 1)
    np.testing.assert_array_equal(hm["walk"], _expected_dense(second.layers[1], "walk"))


def test_delete_run_removes_every_row(store):
    run_id, _ = saved_run(store)
    other, _ = saved_run(store, seed=3)
    job = store.enqueue_job(dict(REQUEST))
    store.finish_job(job, run_id=run_id)
    before_other = count_rows(store, other)
    assert all(v > 0 for k, v in count_rows(store, run_id).items()), count_rows(store, run_id)
    store.delete_run(run_id)
    assert set(count_rows(store, run_id).values()) == {0}
    assert count_rows(store, other) == before_other
    with pytest.raises(UnknownRunError):
        store.get_run(run_id)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, r: s.get_run(r),
        lambda s, r: s.layer_stats(r),
        lambda s, r: s.heatmap(r, "prefill", 0, 0),
        lambda s, r: s.steps(r),
        lambda s, r: s.decode_rows(r, 0),
        lambda s, r: s.tokens(r),
        lambda s, r: s.blocks(r),
        lambda s, r: s.delete_run(r),
        lambda s, r: s.set_status(r, "done"),
        lambda s, r: s.save_result(r, make_result()),
        lambda s, r: s.export_zip([r]),
    ],
)
def test_unknown_run_id_is_a_clear_error(store, call):
    saved_run(store)
    with pytest.raises(UnknownRunError, match="no run with id 'nope'") as info:
        call(store, "nope")
    assert "\n" not in str(info.value)


def test_heatmap_of_missing_layer_names_it(store):
    run_id, _ = saved_run(store)
    with pytest.raises(Exception, match="no record for phase='prefill' step=0 layer=42"):
        store.heatmap(run_id, "prefill", 0, 42)


def test_user_text_is_bound_not_formatted(store):
    run_id, _ = saved_run(store)
    evil = "x' OR '1'='1"
    assert store.list_runs(model=evil).empty
    with pytest.raises(UnknownRunError):
        store.get_run(evil)
    assert store.get_run(run_id)["prompt"].endswith("DROP TABLE runs; --")


def test_a_token_text_past_the_stores_limit_is_not_saved(store):
    """What an import would refuse is not saved either (store/limits.py LONGEST)."""
    import dataclasses

    result = make_result()
    result.tokens[0] = dataclasses.replace(result.tokens[0], text="x" * 1025)
    run_id = store.create_run(dict(REQUEST), status="running")
    with pytest.raises(InvalidResultError, match="longer than the store's limit of 1024"):
        store.save_result(run_id, result)
    assert count_rows(store, run_id)["tokens"] == 0


def test_a_prompt_past_the_stores_limit_is_not_saved(store):
    """A run row whose text an import would refuse (store/limits.py RUN_LONGEST) is refused
    before anything is written, in one line."""
    from sketchwalk.store.limits import MAX_RUN_TEXT

    request = {**REQUEST, "prompt": "x" * (MAX_RUN_TEXT + 1)}
    with pytest.raises(InvalidResultError) as refused:
        store.create_run(request)
    assert "prompt longer than the store's limit of 2097152" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert store.run_ids() == []


def test_generations_past_the_stores_limit_are_not_saved(store):
    from sketchwalk.store.limits import MAX_RUN_TEXT

    result = make_result()
    result.dense_text = "x" * (MAX_RUN_TEXT + 1)
    run_id = store.create_run(dict(REQUEST), status="running")
    with pytest.raises(InvalidResultError, match="dense_text longer than the store's limit"):
        store.save_result(run_id, result)
    assert count_rows(store, run_id)["layer_stats"] == 0


def test_an_error_text_is_kept_within_the_stores_limit(store):
    from sketchwalk.store.limits import MAX_RUN_NOTE

    run_id = store.create_run(dict(REQUEST))
    store.mark_failed(run_id, "e" * (MAX_RUN_NOTE + 5))
    assert len(store.get_run(run_id)["error"]) == MAX_RUN_NOTE
