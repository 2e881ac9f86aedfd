"""Queries after a cache (chunked prefill, a later turn): sparse, exact at density 1, and the
estimate of the chunk's rows is the one a full prefill computes."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.cache import cache_kwarg
from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.decode import blocks_of, chunk_step, start_decode
from sketchwalk.engine.method.pipeline import prefill_plan
from sketchwalk.engine.method.sketch import make_srht

FULL = dict(density=1.0, block_size=16, dense_layers=(), dense_tail_blocks=0)


def chunked_logits(model, ids, cuts, cfg=None):
    """Logits of ids fed in pieces split at cuts, through one cache."""
    from transformers import DynamicCache

    cache, outs = DynamicCache(), []
    bounds = [0, *cuts, ids.shape[1]]
    with torch.no_grad():
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            kw = {cache_kwarg(model): cache}
            outs.append(model(ids[:, s:e], use_cache=True, **kw).logits)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("cuts", [[37], [32, 64], [50, 51, 99]], ids=str)
def test_density_one_chunks_equal_the_dense_model(cuts):
    model = tiny_llama(heads=6, kv_heads=2)
    ids = torch.randint(1, 128, (1, 130))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        dense = model(ids).logits
    model.set_attn_implementation("sketch_walk")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="sketch_walk")  # no dense fallback
        with sketch_walk_session(SketchWalkConfig(**FULL)) as s:
            sparse = chunked_logits(model, ids, cuts)
    assert torch.allclose(dense, sparse, atol=3e-5, rtol=1e-4)
    assert s.chunk_walk is not None and s.density("prefill") == 1.0
    assert s.decode_states[2].a.shape[-1] == -(-130 // 16)


def test_sparse_chunks_keep_their_budget_and_match_a_full_sparse_prefill():
    model = tiny_llama(heads=6, kv_heads=2)
    ids = torch.randint(1, 128, (1, 400))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        dense = model(ids).logits[0, 150:].log_softmax(-1)
    model.set_attn_implementation("sketch_walk")
    cfg = SketchWalkConfig(density=0.3, block_size=16, dense_layers=(), dense_tail_blocks=0)
    with sketch_walk_session(cfg) as s:
        chunked = chunked_logits(model, ids, [150, 277])[0, 150:].log_softmax(-1)
    with sketch_walk_session(cfg), torch.no_grad():
        whole = model(ids).logits[0, 150:].log_softmax(-1)
    kept, cand = s.counts["prefill"].kept, s.counts["prefill"].candidates
    assert 0.25 < kept / cand < 0.4  # forced sink/window blocks may add to the target

    def kl(x):
        return float(torch.nn.functional.kl_div(x, dense, log_target=True, reduction="batchmean"))

    assert kl(chunked) > 1e-4  # really sparse
    assert kl(chunked) < 1.5 * kl(whole) + 1e-4  # as good as one sparse prefill of it all


def test_each_chunk_walks_its_own_rows_with_dense_first_layers():
    """Default dense layers (0, 1): the chunk walk restarts at layer 0 even though layer 0 never
    reaches the chunk path, so the second chunk does not read the first chunk's rows. A per-row
    budget, because a layer budget is spread over the rows a call holds (a chunk's rows then
    depend on which other rows share its call)."""
    model = tiny_llama(layers=4)
    ids = torch.randint(1, 128, (1, 200))
    cfg = SketchWalkConfig(
        density=0.4, block_size=16, dense_layers=(0, 1), dense_tail_blocks=0, budget="row"
    )
    model.set_attn_implementation("sketch_walk")
    with sketch_walk_session(cfg) as s:
        two = chunked_logits(model, ids, [70, 140])
    with sketch_walk_session(cfg):
        one = chunked_logits(model, ids, [70])
    assert s.chunk_walk.shape[2] == -(-200 // 16) - 140 // 16
    assert torch.allclose(two[:, :140], one[:, :140], atol=1e-5)
    assert torch.isfinite(two).all()


def test_generate_continues_a_cached_turn_like_dense():
    """A second turn: generate() gets a cache of the first, feeds the rest as one chunk, decodes."""
    from transformers import DynamicCache

    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 90))

    def second_turn(impl):
        model.set_attn_implementation(impl)
        cache = DynamicCache()
        kw = {cache_kwarg(model): cache}
        with torch.no_grad():
            model(ids[:, :41], use_cache=True, **kw)
        return model.generate(ids, max_new_tokens=12, do_sample=False, **kw)

    ref = second_turn("sdpa")
    with sketch_walk_session(SketchWalkConfig(**FULL)) as s:
        out = second_turn("sketch_walk")
    assert torch.equal(ref, out)
    # the sums follow the cache through the chunk and the decode (A_l only when read: no walk)
    assert s.density("decode") == 1.0 and blocks_of(s.decode_states[1]) == -(-101 // 16)


@pytest.mark.parametrize("t0", [48, 53])
def test_chunk_rows_are_the_full_prefill_rows(t0):
    """Sums, A_l rows and W_l rows (two layers, so the walk carries) equal a full prefill's,
    for the estimators that chunks run (the sampled estimator's chunks use the token-query
    estimate from the block sums: the state keeps no keys)."""
    gen = torch.Generator().manual_seed(t0)
    bsz, h, hkv, t, d = 2, 6, 2, 150, 32
    cfg = SketchWalkConfig(
        density=0.4, block_size=16, sketch_dim=16, dense_layers=(), dense_tail_blocks=0,
        estimator="query", query_samples=0, query_block=0,
    )  # fmt: skip
    b, j0 = cfg.block_size, t0 // cfg.block_size
    valid = torch.ones(bsz, t, dtype=torch.bool)
    prev_full, prev_rows = None, None
    for layer in range(2):
        q = torch.randn(bsz, h, t, d, generator=gen)
        k = torch.randn(bsz, hkv, t, d, generator=gen)
        srht = make_srht(d, cfg.sketch_dim, cfg.seed, layer)
        full = prefill_plan(q, k, cfg, srht, prev_full, valid)
        first = prefill_plan(q[:, :, :t0], k[:, :, :t0], cfg, srht, None, valid[:, :t0])
        st = start_decode(first, q[:, :, :t0], srht, cfg)
        plan = chunk_step(st, q[:, :, t0:], k[:, :, t0:], t, cfg, srht, valid, prev_rows)
        torch.testing.assert_close(st.sketched.q_sum, full.sketched.q_sum, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(st.sketched.k_count, full.sketched.k_count)
        torch.testing.assert_close(plan.estimate, full.estimate[:, :, j0:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            plan.walk_scores, full.walk_scores[:, :, j0:], rtol=1e-5, atol=1e-6
        )
        assert plan.selection.index.shape[2] == -(-t // b) - j0
        assert abs(plan.selection.density - cfg.density) < 0.1
        prev_full, prev_rows = full.walk_scores, plan.walk_scores
