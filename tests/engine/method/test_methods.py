"""The method registry and the peer methods' scoring (Quest, XAttention): the math, the density
budget, causality, lossless at density 1."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.engine.method.config import SketchWalkConfig, preset
from sketchwalk.engine.method.methods import REGISTRY, ScoreInputs, get, names
from sketchwalk.engine.method.methods.quest import key_block_bounds, quest_bound
from sketchwalk.engine.method.methods.xattention import (
    xattention_decode_scores,
    xattention_prefill_scores,
)
from sketchwalk.engine.method.pipeline import prefill_plan
from sketchwalk.engine.method.select import selection_mask
from sketchwalk.engine.method.sketch import make_srht
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import RunOptions, run

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def baseline_scores(method, q, k, valid, scale, block_size, shape):
    """A method's scores through the registry, as the pipeline asks for them."""
    rows = torch.arange(shape[2]) + (k.shape[2] - 1) // block_size + 1 - shape[2]
    x = ScoreInputs(shape, q.device, rows, block_size, q=q, k=k, valid=valid, scale=scale)
    return get(method).score(x)


def qk(t: int = 512, h: int = 4, hkv: int = 2, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, h, t, d, generator=g), torch.randn(1, hkv, t, d, generator=g)


def test_quest_bound_is_an_upper_bound_of_every_key_in_the_block():
    q, k = qk(t=100)
    valid = torch.ones(1, 100, dtype=torch.bool)
    valid[0, 90:] = False  # padding inside the last block must not widen the box
    k[:, :, 90:] = 1e3
    kmin, kmax, has = key_block_bounds(k, valid, 16)
    assert has.tolist() == [[True] * 6 + [False]]
    qg = q[:, :, -1:].view(1, 2, 2, 1, 16)
    bound = quest_bound(qg, kmin, kmax)[..., 0, :]  # [1, 2, 2, nk]
    dots = (qg[..., 0, :] @ k.unsqueeze(2).transpose(-1, -2))[..., :90]  # [1, 2, 2, 90]
    for j in range(6):
        true_max = dots[..., j * 16 : min(90, (j + 1) * 16)].amax(-1)
        assert torch.all(bound[..., j] >= true_max - 1e-5)
    assert bound[..., 5].abs().max() < 100  # the padded 1e3 keys stayed out


def test_xattention_cell_scores_sum_one_antidiagonal():
    """With block size = stride, one head, the block logits are the antidiagonal sums."""
    s, t, d = 4, 16, 8
    q, k = qk(t=t, h=1, hkv=1, d=d, seed=3)
    got = xattention_prefill_scores(q, k, None, s, 1.0, 1, stride=s)[0, 0]  # [4, 4]
    logits = torch.full((4, 4), float("-inf"))
    for a in range(4):
        for c in range(a + 1):
            diag = sum(float(q[0, 0, a * s + s - 1 - i] @ k[0, 0, c * s + i]) for i in range(s))
            logits[a, c] = diag / s
    assert torch.allclose(got, torch.softmax(logits, -1), atol=1e-5)


def test_xattention_decode_samples_the_antidiagonal_column_of_the_last_row():
    q, k = qk(t=37, h=2, hkv=1, d=8, seed=5)
    scores = xattention_decode_scores(q[:, :, -1:], k, None, 16, 1.0, 1, stride=4)
    # position 36: row 36 % 4 = 0 of its tile meets the antidiagonal at column 3: keys 3, 7, ...
    sampled = list(range(3, 37, 4))
    logits = q[0, :, -1] @ k[0, 0, sampled].T  # [2, samples]
    probs = torch.softmax(logits, -1).mean(0)
    want = torch.zeros(3).index_add_(0, torch.tensor(sampled) // 16, probs)
    assert torch.allclose(scores[0, 0, 0], want, atol=1e-5)


@pytest.mark.parametrize("method", ["quest", "xattention"])
@pytest.mark.parametrize("groups", [1, 2])
def test_scores_are_causal_row_distributions(method, groups):
    q, k = qk(t=200)
    n = 13
    pre = baseline_scores(method, q, k, None, None, 16, (1, groups, n, n))
    assert torch.all(pre.triu(1) == 0)
    assert torch.allclose(pre.sum(-1), torch.ones(1, groups, n), atol=1e-5)
    dec = baseline_scores(method, q[:, :, -1:], k, None, None, 16, (1, groups, 1, n))
    assert torch.allclose(dec.sum(-1), torch.ones(1, groups, 1), atol=1e-5)


@pytest.mark.parametrize("method", ["quest", "xattention"])
def test_scores_find_a_far_block_that_matches_the_queries(method):
    """A block whose keys align with the queries must outrank the noise around it."""
    q, k = qk(t=1024, h=4, hkv=2, d=16, seed=1)
    u = torch.nn.functional.normalize(
        torch.randn(16, generator=torch.Generator().manual_seed(9)), dim=0
    )
    q = 0.5 * q + 3.0 * u  # queries share a direction; one key block points along it
    k[0, :, 5 * 64 : 6 * 64] = 16.0 * u
    cfg = preset("paper", method=method, density=0.2, sink=0.0, window=0.0, dense_tail_blocks=0)
    plan = prefill_plan(q, k, cfg, make_srht(16, 128, 0, 2))
    mask = selection_mask(plan.selection, 16)[0, 0]
    assert mask[-4:, 5].all()


@pytest.mark.parametrize("method", ["quest", "xattention"])
@pytest.mark.parametrize("density", [0.1, 0.3])
def test_selection_keeps_the_density_budget_and_causality(method, density):
    """Same budget as Sketch&Walk (published sink/window), on the target when nothing is forced."""
    q, k = qk(t=64 * 40, h=4, hkv=2, d=16)
    srht = make_srht(16, 128, 0, 2)
    cfg = preset("paper", method=method, density=density)
    sel = prefill_plan(q, k, cfg, srht).selection
    ours = prefill_plan(q, k, cfg.with_(method="sketchwalk"), srht).selection
    assert sel.kept == ours.kept and sel.candidates == ours.candidates
    assert torch.equal(sel.count, ours.count)
    assert not selection_mask(sel, 40).triu(1).any()
    free = cfg.with_(sink=0.0, window=0.0, dense_tail_blocks=0)
    sel = prefill_plan(q, k, free, srht).selection
    assert density - 1 / 40 <= sel.density <= density + 1e-9
    assert not selection_mask(sel, 40).triu(1).any()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


@pytest.mark.parametrize("method", ["quest", "xattention"])
def test_tiny_model_runs_both_phases_near_the_target(tiny, method):
    cfg = SketchWalkConfig(
        block_size=16, density=0.3, dense_layers=(0,), dense_tail_blocks=0, method=method,
        query_block=0,  # a short prompt: the forced blocks of 64-token tiles exceed 0.3
    )  # fmt: skip
    res = run(tiny, PROMPT * 3, cfg, RunOptions(max_new_tokens=4, record=False))
    m = res.metrics
    n = -(-res.prompt_tokens // 16)
    assert 0.3 - 1 / n <= m["density_achieved"] <= 0.3 + 1e-9
    assert m["density_decode"] is not None and m["density_decode"] < 1.0
    assert m["kl_mean"] > 0  # sparse really ran


@pytest.mark.parametrize("method", [m for m in names(True) if REGISTRY[m].rule is None])
def test_every_method_at_density_one_equals_dense(tiny, method):
    cfg = SketchWalkConfig(
        block_size=16, density=1.0, dense_tail_blocks=0, dense_layers=(), method=method
    )
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=4, record=False))
    assert res.metrics["kl_mean"] < 1e-6 and res.metrics["top1_agreement"] == 1.0
    assert res.metrics["density_achieved"] == 1.0 and res.metrics["density_decode"] == 1.0
    assert res.dense_text == res.sparse_text


def test_registry_declares_every_method_once_with_what_it_needs():
    assert names() == tuple(REGISTRY) and "dense" in names() and "dense" not in names(True)
    assert REGISTRY["oracle"].needs_exact and not REGISTRY["sketchwalk"].needs_exact
    needs_qk = {"quest", "xattention", "xattention-threshold"}
    assert {m for m in names(True) if REGISTRY[m].needs_qk} == needs_qk
    assert {m for m in names() if REGISTRY[m].rule is not None} == {"xattention-threshold"}
    assert {m for m in names() if REGISTRY[m].chunks} == {"sketchwalk", "nowalk", "streaming"}
    assert SketchWalkConfig(method="nowalk").effective_beta == 0.0
    assert SketchWalkConfig(method="sketchwalk", beta=0.3).effective_beta == 0.3


def test_streaming_scores_rank_recent_blocks_first_and_compare_across_rows():
    rows = torch.tensor([3, 7])
    x = ScoreInputs((1, 1, 2, 8), torch.device("cpu"), rows, 16)
    s = get("streaming").score(x)[0, 0]
    assert s[0, 3] > s[0, 2] > s[0, 0] and s[1, 7] > s[1, 6]
    assert s[0, 3] == s[1, 7]  # the diagonal scores the same in every row


def test_previews_come_from_the_stored_record_where_it_can_reproduce_them():
    import numpy as np

    rec = {"sketch": np.eye(3), "walk": np.ones((3, 3)), "exact": np.zeros((3, 3)), "n_blocks": 3}
    assert np.array_equal(REGISTRY["sketchwalk"].preview(rec), rec["walk"])
    assert np.array_equal(REGISTRY["nowalk"].preview(rec), rec["sketch"])
    assert np.array_equal(REGISTRY["oracle"].preview(rec), rec["exact"])
    assert REGISTRY["quest"].preview is None and REGISTRY["xattention"].preview is None


def test_methods_that_do_not_read_the_sketch_get_the_cheap_estimate_only_when_unrecorded():
    sampled = SketchWalkConfig(estimator="sampled", query_samples=4)
    for m in names(sparse_only=True):
        reads = REGISTRY[m].reads_sketch
        assert reads == (m in ("sketchwalk", "nowalk"))
        cfg = sampled.with_(method=m)
        assert cfg.for_estimate(recorded=True) is cfg  # the explorer shows the real estimate
        cheap = cfg.for_estimate(recorded=False)
        if reads:
            assert cheap is cfg
        else:
            assert (cheap.estimator, cheap.query_samples) == ("mean", 0)
            assert cheap.with_(estimator="sampled", query_samples=4) == cfg  # nothing else moved


@pytest.mark.parametrize(
    "method", ["streaming", "quest", "xattention", "xattention-threshold", "oracle"]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_cheap_estimate_leaves_a_peers_selection_unchanged(method, seed):
    """Those methods never read the estimate: the same lists with the sampled estimate and with
    block means, on random inputs and a tiled 16-token-block layer."""
    from sketchwalk.engine.method.pipeline import layer_exact

    q, k = qk(t=16 * 48, h=4, hkv=2, d=16, seed=seed)
    srht = make_srht(16, 128, 0, 2)
    cfg = SketchWalkConfig(method=method, block_size=16, density=0.2, query_samples=4)
    exact = layer_exact(q, k, None, None, cfg) if REGISTRY[method].needs_exact else None
    full = prefill_plan(q, k, cfg, srht, exact=exact).selection
    cheap = prefill_plan(q, k, cfg.for_estimate(recorded=False), srht, exact=exact).selection
    assert torch.equal(full.index, cheap.index)
    assert torch.equal(full.count, cheap.count)


@pytest.mark.parametrize("method", ["streaming", "quest"])
def test_a_peers_unrecorded_run_writes_what_its_recorded_run_writes(tiny, method):
    cfg = SketchWalkConfig(block_size=16, density=0.3, dense_tail_blocks=0, method=method)
    recorded = run(tiny, PROMPT * 3, cfg, RunOptions(max_new_tokens=4))
    plain = run(tiny, PROMPT * 3, cfg, RunOptions(max_new_tokens=4, record=False))
    assert recorded.sparse_text == plain.sparse_text
    assert recorded.metrics["kl_mean"] == plain.metrics["kl_mean"]
    assert recorded.metrics["density_achieved"] == plain.metrics["density_achieved"]


def test_xattention_threshold_scores_at_stride_16_where_xattention_scores_at_8():
    """The operating point's scores are XAttention's antidiagonal scores at stride 16; the
    `xattention` method's stay at stride 8 (prefill and decode)."""
    q, k = qk(t=512, h=4, hkv=2, d=16, seed=2)
    for lq, shape in ((512, (1, 2, 4, 4)), (1, (1, 2, 1, 4))):
        qq = q[:, :, -lq:]
        fn = xattention_prefill_scores if lq > 1 else xattention_decode_scores
        at16 = fn(qq, k, None, 128, 0.25, 2, stride=16)
        at8 = fn(qq, k, None, 128, 0.25, 2, stride=8)
        assert not torch.allclose(at16, at8)
        assert torch.equal(
            baseline_scores("xattention-threshold", qq, k, None, 0.25, 128, shape), at16
        )
        assert torch.equal(baseline_scores("xattention", qq, k, None, 0.25, 128, shape), at8)


def test_xattention_threshold_keeps_the_threshold_whatever_the_density():
    """The method selects by its own rule: the same lists at any target density, each row
    reaching 0.9 of its estimated mass with its first and diagonal blocks, causal; and a
    sharper attention pattern keeps fewer blocks."""
    from sketchwalk.engine.method.methods.xattention_threshold import THRESHOLD

    q, k = qk(t=128 * 12, h=4, hkv=2, d=16, seed=4)
    srht = make_srht(16, 128, 0, 2)
    cfg = SketchWalkConfig(method="xattention-threshold", block_size=128)
    plan = prefill_plan(q, k, cfg, srht)
    sel = plan.selection
    other = prefill_plan(q, k, cfg.with_(density=0.05, sink_blocks=3, window_blocks=4), srht)
    assert torch.equal(sel.index, other.selection.index) and sel.kept == other.selection.kept
    mask = selection_mask(sel, 12)
    assert not mask.triu(1).any()
    assert mask[..., 0].all() and mask.diagonal(dim1=-2, dim2=-1).all()
    scores = baseline_scores("xattention-threshold", q, k, None, None, 128, (1, 2, 12, 12))
    assert torch.all((scores * mask).sum(-1) >= THRESHOLD * scores.sum(-1) - 1e-5)
    sharp = prefill_plan(q * 8.0, k, cfg, srht).selection
    assert sharp.density < sel.density


def test_xattention_threshold_runs_both_phases_on_a_tiny_model(tiny):
    """Sparse in prefill and decode at a density of its own: the same run at any target."""
    got = []
    for density in (0.3, 0.6):
        cfg = SketchWalkConfig(
            block_size=16, density=density, dense_layers=(0,), method="xattention-threshold",
            query_block=0,  # one list per block: 64-query tiles' unions keep every block here
        )  # fmt: skip
        res = run(tiny, PROMPT * 3, cfg, RunOptions(max_new_tokens=4, record=False))
        m = res.metrics
        assert 0.3 < m["density_achieved"] < 1.0  # the random tiny model's attention is flat
        assert m["density_decode"] is not None and 0.0 < m["density_decode"] < 1.0
        assert m["kl_mean"] > 0  # sparse really ran
        got.append((m["density_achieved"], m["density_decode"], m["kl_mean"], res.sparse_text))
    assert got[0] == got[1]
