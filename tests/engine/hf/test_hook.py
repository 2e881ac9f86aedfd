"""Sketch&Walk inside a real transformers model: density 1.0 is exactly dense; sparse really runs."""

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.cache import cache_kwarg
from sketchwalk.engine.hf.session import current_session, dense_context, sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.recorder import Recorder

FULL = dict(density=1.0, block_size=16, dense_layers=(), dense_tail_blocks=0)
SPARSE = SketchWalkConfig(density=0.3, block_size=16, dense_layers=(), dense_tail_blocks=0)


def logits(model, ids, impl, cfg=None, recorder=None, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        if impl == "sketch_walk":
            with sketch_walk_session(cfg, recorder):
                return model(ids, **kw).logits
        return model(ids, **kw).logits


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (8, 2)])
@pytest.mark.parametrize("length", [37, 64, 101])
def test_density_one_equals_dense_model(heads, kv_heads, length):
    model = tiny_llama(heads=heads, kv_heads=kv_heads)
    ids = torch.randint(1, 128, (1, length))
    dense = logits(model, ids, "sdpa")
    sparse = logits(model, ids, "sketch_walk", SketchWalkConfig(**FULL))
    assert torch.allclose(dense, sparse, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("length", [80, 101])
def test_a_dense_context_is_the_models_own_sdpa_bit_for_bit(length):
    """Under "sketch_walk", a thread in dense_context() runs SDPA exactly (a run's dense side
    shares the model with a sparse session in another thread); another thread stays sparse."""
    import threading

    model = tiny_llama(heads=6, kv_heads=2)
    ids = torch.randint(1, 128, (1, length))
    dense = logits(model, ids, "sdpa")
    model.set_attn_implementation("sketch_walk")
    with torch.no_grad(), dense_context():
        beside = model(ids).logits
        elsewhere: list[torch.Tensor] = []
        other = threading.Thread(
            target=lambda: elsewhere.append(logits(model, ids, "sketch_walk", SPARSE))
        )
        other.start()
        other.join()
    assert torch.equal(dense, beside)
    assert not torch.allclose(dense, elsewhere[0], atol=1e-4)  # no context there: sparse


def test_density_one_generation_is_identical_and_decode_is_recorded():
    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 50))
    model.set_attn_implementation("sdpa")
    ref = model.generate(ids, max_new_tokens=24, do_sample=False)
    model.set_attn_implementation("sketch_walk")
    rec = Recorder()
    with sketch_walk_session(SketchWalkConfig(**FULL), rec) as s:
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(ref, out)
    decode = [r for r in rec.layers if r.phase == "decode"]
    assert len(decode) == 23 * 3 and s.step == 23
    assert all(not r.dense and r.selected is not None and r.selected.shape[0] == 1 for r in decode)
    assert s.density("decode") == 1.0


def test_padded_batch_matches_eager_at_density_one():
    model = tiny_llama()
    torch.manual_seed(3)
    ids = torch.randint(1, 128, (3, 45))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding
    mask[2, :20] = 0
    ids[mask == 0] = 0
    eager = logits(model, ids, "eager", attention_mask=mask)
    sparse = logits(model, ids, "sketch_walk", SketchWalkConfig(**FULL), attention_mask=mask)
    real = mask.bool()
    assert torch.allclose(eager[real], sparse[real], atol=2e-5, rtol=1e-4)
    # and decoding a padded batch: every row equals its own unpadded greedy continuation, with a
    # selection per token and with selections kept across key blocks (token 49 starts block 3)
    model.set_attn_implementation("sdpa")
    alone = [
        model.generate(ids[b : b + 1, ~(mask[b] == 0)], max_new_tokens=8, do_sample=False)
        for b in range(3)
    ]
    for keep in ({}, {"decode_reselect": 6, "decode_reselect_span": 0}):
        model.set_attn_implementation("sketch_walk")
        with sketch_walk_session(SketchWalkConfig(**FULL, **keep)) as s:
            out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        model.set_attn_implementation("sdpa")
        assert (s.decode_reused > 0) == bool(keep)
        for b in range(3):
            assert torch.equal(out[b, -8:], alone[b][0, -8:])


@pytest.mark.parametrize("method", ["sketchwalk", "nowalk", "oracle", "streaming"])
def test_sparse_methods_hit_their_budget_and_change_the_output(method):
    model = tiny_llama(layers=3)
    ids = torch.randint(1, 128, (1, 256))
    dense = logits(model, ids, "sdpa")
    cfg = SketchWalkConfig(
        density=0.2,
        block_size=16,
        dense_layers=(0,),
        dense_tail_blocks=0,
        method=method,
        query_block=0,  # one list per block: at 256 tokens 64-token tiles force ~0.47
    )
    rec = Recorder()
    sparse = logits(model, ids, "sketch_walk", cfg, rec)
    assert not torch.allclose(dense, sparse, atol=1e-3)
    sparse_layers = [r for r in rec.layers if not r.dense]
    assert [r.layer for r in sparse_layers] == [1, 2]
    for r in sparse_layers:
        assert 0.2 <= r.density_achieved < 0.45  # forced sink/window push it a little above
        assert (
            r.selected.shape == (16, 16)
            and not r.selected[~torch.ones(16, 16).tril().bool().numpy()].any()
        )
        assert 0.0 < r.mass_recall <= 1.0 + 1e-6 and r.sketch_error is not None
    dense_layer = [r for r in rec.layers if r.dense][0]
    assert dense_layer.layer == 0 and dense_layer.selected is None and dense_layer.exact is not None


def test_oracle_recalls_more_mass_than_streaming():
    model = tiny_llama(layers=2)
    ids = torch.randint(1, 128, (1, 320))
    recall = {}
    for method in ("oracle", "streaming"):
        cfg = SketchWalkConfig(
            density=0.2,
            block_size=16,
            dense_layers=(),
            dense_tail_blocks=0,
            method=method,
            sink=0.0,
            window=0.0,
            sink_blocks=0,
            window_blocks=0,
            query_block=0,  # one list per block: at 320 tokens tiles leave little to choose
        )
        rec = Recorder()
        logits(model, ids, "sketch_walk", cfg, rec)
        recall[method] = sum(r.mass_recall for r in rec.layers) / len(rec.layers)
    assert recall["oracle"] > recall["streaming"]


def test_per_group_selection_gives_each_kv_group_its_own_lists():
    from sketchwalk.engine.method.pipeline import prefill_plan
    from sketchwalk.engine.method.sketch import make_srht

    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 320, 16), torch.randn(1, 2, 320, 16)
    q[:, 2:] *= -1  # the two KV groups want different blocks
    base = dict(
        density=0.3,
        block_size=16,
        dense_layers=(),
        dense_tail_blocks=0,
        sink=0.0,
        window=0.0,
        sink_blocks=0,
        window_blocks=0,
        query_block=0,
    )
    srht = make_srht(16, 16, 0, 0)
    shared = prefill_plan(q, k, SketchWalkConfig(**base, per_group=False), srht).selection
    grouped = prefill_plan(q, k, SketchWalkConfig(**base, per_group=True), srht).selection
    assert shared.index.shape[1] == 1 and grouped.index.shape[1] == 2
    assert not torch.equal(grouped.index[:, 0], grouped.index[:, 1])
    assert grouped.density == pytest.approx(shared.density)
    # and a model runs end to end with per-group lists
    model = tiny_llama(heads=4, kv_heads=2)
    ids = torch.randint(1, 128, (1, 200))
    out = logits(model, ids, "sketch_walk", SketchWalkConfig(**base, per_group=True))
    assert torch.isfinite(out).all()


def test_sessions_do_not_share_state_and_implicit_session_works():
    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 80))
    cfg = SketchWalkConfig(density=0.3, block_size=16, dense_layers=())
    a = logits(model, ids, "sketch_walk", cfg)
    logits(model, torch.randint(1, 128, (1, 150)), "sketch_walk", cfg)
    b = logits(model, ids, "sketch_walk", cfg)
    assert torch.equal(a, b)
    with torch.no_grad():  # no session bound: a default one is created for this context
        model(ids)
    assert current_session().cfg == SketchWalkConfig()


def test_phase_prefill_only_keeps_decode_dense():
    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 120))
    model.set_attn_implementation("sketch_walk")
    rec = Recorder()
    with sketch_walk_session(
        SketchWalkConfig(density=0.2, block_size=16, dense_layers=(), phases="prefill"), rec
    ) as s:
        model.generate(ids, max_new_tokens=4, do_sample=False)
    assert s.density("prefill") < 1.0 and s.density("decode", sparse_only=False) == 1.0
    assert all(r.dense for r in rec.layers if r.phase == "decode")


def test_query_tiles_run_in_a_model_on_every_backend():
    """Lists shared by 4-block query tiles: the CPU kernel's long tiles give the reference's
    result, the density target still holds, and the masks differ from per-block lists."""
    model = tiny_llama(heads=6, kv_heads=2)
    ids = torch.randint(1, 128, (1, 700))
    base = dict(density=0.3, block_size=16, dense_layers=(0,))
    tiled = SketchWalkConfig(**base, query_block=64)
    model.set_attn_implementation("sketch_walk")
    outs = {}
    with torch.no_grad():
        for backend in ("cpu", "reference"):
            with sketch_walk_session(tiled, kernel_backend=backend) as s:
                outs[backend] = model(ids).logits
                assert abs(s.density("prefill") - 0.3) < 0.02
        with sketch_walk_session(SketchWalkConfig(**base, query_block=0)):
            per_block = model(ids).logits
    assert torch.allclose(outs["cpu"], outs["reference"], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(outs["cpu"], per_block, atol=1e-3)


def test_sampled_estimator_runs_prefill_decode_and_chunks():
    """Prefill scores sampled queries against every key; decode and a later chunk fall back to
    the token-query estimate from the block sums (no keys kept in the state)."""
    model = tiny_llama(heads=6, kv_heads=2)
    ids = torch.randint(1, 128, (1, 400))
    cfg = SketchWalkConfig(
        density=0.3, block_size=16, query_block=64, estimator="sampled", query_samples=4,
        dense_layers=(0,),
    )  # fmt: skip
    model.set_attn_implementation("sketch_walk")
    with torch.no_grad(), sketch_walk_session(cfg) as s:
        out = model(ids, use_cache=True)
        assert abs(s.density("prefill") - 0.3) < 0.02
        kw = cache_kwarg(model)  # transformers 5.x: `cache`, before: `past_key_values`
        nxt = out.logits[:, -1:].argmax(-1)
        step = model(nxt, use_cache=True, **{kw: out.past_key_values})  # decode
        chunk = model(torch.randint(1, 128, (1, 40)), **{kw: step.past_key_values})
    assert torch.isfinite(step.logits).all() and torch.isfinite(chunk.logits).all()
    assert s.density("decode") is not None and s.density("decode") < 1.0
    from sketchwalk.engine.method.pipeline import prefill_plan
    from sketchwalk.engine.method.sketch import make_srht

    q, k = torch.randn(1, 6, 400, 16) * 3, torch.randn(1, 2, 400, 16)
    srht = make_srht(16, 16, 0, 0)
    a = {e: prefill_plan(q, k, cfg.with_(estimator=e), srht).estimate for e in ("sampled", "query")}
    assert not torch.allclose(a["sampled"], a["query"], atol=1e-3)  # really another estimate


@pytest.mark.parametrize("reselect", [1, 40])  # 40: kept lists extended across key blocks
def test_every_sparse_step_runs_lists_over_its_own_keys(reselect, monkeypatch):
    """Prefill, chunk and decode steps (kept or fresh) hand the kernel the selection's lists
    with the session's block size and the key blocks of the keys it attends over."""
    from transformers import DynamicCache

    from sketchwalk.engine.hf.session import Session

    seen: list[tuple[str, int, int, int]] = []
    real = Session._sparse

    def spy(self, call, plan):
        sel = plan.selection
        seen.append((call.phase, sel.block_size, sel.key_blocks, call.k.shape[2]))
        assert sel.density == float(sel.kept) / max(float(sel.candidates), 1.0)
        return real(self, call, plan)

    monkeypatch.setattr(Session, "_sparse", spy)
    model = tiny_llama(heads=4, kv_heads=2)
    model.set_attn_implementation("sketch_walk")
    ids = torch.randint(1, 128, (1, 120))
    cfg = SketchWalkConfig(density=0.3, block_size=16, dense_layers=(0,), decode_reselect=reselect)
    cache = DynamicCache()
    with sketch_walk_session(cfg.with_(decode_reselect_span=0)), torch.no_grad():
        for s, e in [(0, 70), (70, 100), *((t, t + 1) for t in range(100, 120))]:
            model(ids[:, s:e], use_cache=True, **{cache_kwarg(model): cache})
    assert {p for p, *_ in seen} == {"prefill", "chunk", "decode"}
    for phase, b, key_blocks, lk in seen:
        assert b == 16 and key_blocks == -(-lk // b), phase
