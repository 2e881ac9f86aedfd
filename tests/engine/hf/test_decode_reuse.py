"""Decode selections reused across steps: a reused step only feeds the sums, and the next fresh
selection is the one an every-step update makes (bit for bit); whole-model decode with reuse
matches the per-step rule exactly at density 1; a clean pass equals a recorded pass."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import LEGACY, SketchWalkConfig
from sketchwalk.engine.method.decode import decode_reuse, decode_step, reusable, start_decode
from sketchwalk.engine.method.pipeline import prefill_plan
from sketchwalk.engine.method.sketch import make_srht
from sketchwalk.engine.run.recorder import Recorder
from sketchwalk.engine.run.runner import greedy
from sketchwalk.errors import ConfigError


def _same_state(a, b) -> None:
    assert torch.equal(a.a, b.a)
    assert torch.equal(a.window, b.window)
    for f in ("q_sum", "q_count", "k_sum", "k_count"):
        assert torch.equal(getattr(a.sketched, f), getattr(b.sketched, f)), f


@pytest.mark.parametrize(
    "every,span", [(0, 0), (3, 0), (5, 0), (40, 0), (0, 30), (40, 12)]
)  # 40: kept selections cross key blocks; span: re-select every lk // span tokens at most
@pytest.mark.parametrize(
    "t,block,heads,kv,per_group",
    [(100, 16, 4, 2, False), (130, 32, 6, 2, True), (64, 16, 2, 1, False)],
)
@pytest.mark.parametrize("phase", [None, 0.0, 0.37])  # None: not staggered
def test_fresh_selection_after_reuse_equals_every_step(
    every, span, t, block, heads, kv, per_group, phase
):
    torch.manual_seed(t + every)
    d = 16
    cfg = SketchWalkConfig(
        block_size=block,
        density=0.3,
        per_group=per_group,
        query_window=8,
        sketch_dim=8,
        decode_reselect_span=span,
        decode_stagger=phase is not None,
    )
    q, k = torch.randn(1, heads, t, d), torch.randn(1, kv, t, d)
    srht = make_srht(d, cfg.sketch_dim, 0, 3)
    plan = prefill_plan(q, k, cfg, srht)
    fresh = start_decode(plan, q, srht, cfg)
    lazy = copy.deepcopy(fresh)
    lazy.phase = phase or 0.0
    reused = 0
    for step in range(1, 2 * block + 7):
        lk = t + step
        qn, kn = torch.randn(1, heads, 1, d), torch.randn(1, kv, 1, d)
        valid = torch.ones(1, lk, dtype=torch.bool)
        want = decode_step(fresh, qn, kn, lk, cfg, srht, valid).selection
        if reusable(lazy, lk, cfg, every):
            got = decode_reuse(lazy, qn, kn, lk, cfg, srht, valid).selection
            reused += 1
            assert lazy.selected_block == (lk - 1) // block  # same key block as when selected
            assert lazy.steps_since < (every or block)
            assert not span or lazy.steps_since < max(1, lk // span)
            for f in ("q_sum", "k_sum", "q_count", "k_count"):  # sums always current
                assert torch.equal(getattr(lazy.sketched, f), getattr(fresh.sketched, f))
        else:
            got = decode_step(lazy, qn, kn, lk, cfg, srht, valid).selection
            assert torch.equal(got.index, want.index)
            assert torch.equal(got.count, want.count)
            _same_state(lazy, fresh)
        cur = (lk - 1) // block
        ids = got.index[0, :, 0, : int(got.count.min())]
        assert bool((ids == cur).any(-1).all())  # the current block is always attended
    assert reused > 0


def test_every_one_never_reuses():
    cfg = SketchWalkConfig(block_size=16, decode_reselect_span=0, decode_stagger=False)
    q, k = torch.randn(1, 2, 64, 16), torch.randn(1, 1, 64, 16)
    srht = make_srht(16, cfg.sketch_dim, 0, 0)
    st = start_decode(prefill_plan(q, k, cfg, srht), q, srht, cfg)
    decode_step(st, q[:, :, -1:], k[:, :, -1:], 65, cfg, srht, torch.ones(1, 65, dtype=torch.bool))
    assert not reusable(st, 66, cfg, 1)
    assert reusable(st, 66, cfg, 0) and not reusable(st, 81, cfg, 0)  # 81: key block 5 starts
    assert reusable(st, 81, cfg, 20) and not reusable(st, 81, cfg, 1)  # every 20 tokens: crosses
    assert not reusable(st, 66, cfg.with_(method="oracle"), 0)
    # the span: at most every lk // span tokens; with every 0 that cadence crosses key blocks
    assert not reusable(st, 66, cfg.with_(decode_reselect_span=64), 0)  # 66 // 64 = 1: every token
    assert reusable(st, 81, cfg.with_(decode_reselect_span=40), 0)  # every 2 tokens, crossing
    assert reusable(st, 66, cfg.with_(decode_reselect_span=4), 0)  # 16: the block rule again
    assert not reusable(st, 81, cfg.with_(decode_reselect_span=4), 0)


def _schedule(phases: list[float], first: int, steps: int, cfg) -> list[list[int]]:
    """Per decode token, the layers (by index into phases) that re-select, all having selected
    at token `first`."""
    from sketchwalk.engine.method.decode import DecodeLayerState

    states = [DecodeLayerState(None, None, None, selection=object(), phase=p) for p in phases]
    for st in states:
        st.selected_block = (first - 1) // cfg.block_size
    out = []
    for lk in range(first + 1, first + 1 + steps):
        now = []
        for i, st in enumerate(states):
            if reusable(st, lk, cfg, cfg.decode_reselect):
                st.steps_since += 1
            else:
                now.append(i)
                st.steps_since = 0
            st.selected_block = (lk - 1) // cfg.block_size
        out.append(now)
    return out


@pytest.mark.parametrize("t, span", [(7376, 512), (9000, 512), (2048, 512)])
def test_staggered_layers_take_turns(t, span):
    """28 layers: without the stagger every layer re-selects at the same tokens; with it they
    take turns (a few per token), each as often as before and never later than its cadence."""
    from sketchwalk.engine.method.decode import stagger_phase

    cfg = SketchWalkConfig(decode_reselect_span=span)
    cadence = min(max(1, t // span), cfg.block_size)  # 14, 16 (the key-block rule), 4
    phases = [stagger_phase(layer) for layer in range(2, 30)]
    together = _schedule(phases, t, 112, cfg.with_(decode_stagger=False))
    turns = _schedule(phases, t, 112, cfg)
    assert max(len(now) for now in together) == 28
    assert max(len(now) for now in turns) <= -(-28 // cadence) + 2
    total = sum(len(now) for now in turns)
    assert abs(total - sum(len(now) for now in together)) <= 28  # the same cost per token
    for layer in range(28):  # never a longer wait than the cadence
        at = [i for i, now in enumerate(turns) if layer in now]
        assert at[0] < cadence and max(b - a for a, b in zip(at, at[1:], strict=False)) <= cadence


def _generate(model, ids, cfg, reselect, recorder=None, new=12):
    model.set_attn_implementation("sketch_walk")
    with sketch_walk_session(cfg.with_(decode_reselect=reselect), recorder) as s:
        out = greedy(model, ids, new, None)
    return out, s


@pytest.mark.parametrize("native", ["1", "0"])  # the C kernel, or torch's gathered K/V
@pytest.mark.parametrize("stagger", [False, True])  # True: the block rule crosses blocks too
@pytest.mark.parametrize("reselect", [0, 4, 40])  # 40: kept across a key block (token 97)
def test_density_one_decode_with_reuse_equals_per_step(reselect, stagger, native, monkeypatch):
    from sketchwalk.kernels import decode_cache

    monkeypatch.setenv("SKETCHWALK_NATIVE", native)
    advanced = []
    real = decode_cache.advance
    monkeypatch.setattr(
        decode_cache, "advance", lambda *a, **kw: advanced.append(1) or real(*a, **kw)
    )
    model = tiny_llama(heads=4, kv_heads=2)
    ids = torch.randint(1, 128, (1, 90))
    cfg = SketchWalkConfig(
        density=1.0,
        block_size=16,
        dense_layers=(0,),
        decode_reselect_span=0,
        decode_stagger=stagger,
    )
    a, _ = _generate(model, ids, cfg, 1)
    b, s = _generate(model, ids, cfg, reselect)
    assert a.new_ids == b.new_ids
    torch.testing.assert_close(a.new_logits, b.new_logits, atol=1e-5, rtol=1e-5)
    assert s.decode_reused > 0  # some steps did reuse ...
    if native == "1":  # ... the C kernel reads the cache in place: nothing gathered
        assert s.decode_states[1].gathered is None and not advanced
        return
    assert s.decode_states[1].gathered is not None  # ... through the gathered K/V path
    # kept across a block: the gathered K/V moved along
    assert bool(advanced) == (reselect != 0 or stagger)


@pytest.mark.parametrize("reselect", [1, 0])
def test_clean_pass_equals_recorded_pass(reselect):
    model = tiny_llama(heads=4, kv_heads=2)
    ids = torch.randint(1, 128, (1, 100))
    cfg = SketchWalkConfig(density=0.3, block_size=16, dense_layers=(0,))
    clean, _ = _generate(model, ids, cfg, reselect)
    rec = Recorder()
    recorded, _ = _generate(model, ids, cfg, reselect, recorder=rec)
    assert rec.layers  # it did record
    assert clean.new_ids == recorded.new_ids
    assert torch.equal(clean.prompt_hidden, recorded.prompt_hidden)  # the logits come from these
    assert torch.equal(clean.new_logits, recorded.new_logits)


def test_decode_reselect_is_a_checked_knob_and_older_runs_reselect_every_token():
    with pytest.raises(ConfigError, match="decode reselect must be >= 0"):
        SketchWalkConfig(decode_reselect=-1)
    with pytest.raises(ConfigError, match="decode reselect must be an integer"):
        SketchWalkConfig(decode_reselect=1.5)
    assert SketchWalkConfig(decode_reselect=0).decode_reselect == 0
    assert LEGACY["decode_reselect"] == 1
    old = SketchWalkConfig(decode_reselect=0).to_dict()
    assert SketchWalkConfig.from_stored(old).decode_reselect == 0  # a stored value is kept ...
    old.pop("decode_reselect")
    assert SketchWalkConfig.from_stored(old).decode_reselect == 1  # ... a missing one is legacy


@pytest.mark.parametrize("native", ["0", "1"])
def test_long_cache_decode_takes_the_one_gather_path_and_matches_the_reference_kernel(
    native, monkeypatch
):
    """Re-selecting every token past the masked-cache length: the CPU kernel runs in C, or
    without it gathers the selection's K/V in one go (kernels/cpu_decode.py _decode_one_gather);
    outputs equal the reference kernel's on the same selections."""
    from sketchwalk.engine.hf.session import Session
    from sketchwalk.kernels import cpu_decode as cpu

    monkeypatch.setenv("SKETCHWALK_NATIVE", native)
    calls = []
    one = cpu._decode_one_gather
    monkeypatch.setattr(
        cpu,
        "_decode_one_gather",
        lambda *a: calls.append(1) or one(*a),  # counts, then runs
    )
    torch.manual_seed(0)
    t, steps, d = cpu._DECODE_MASKED_MAX_TOKENS + 40, 20, 16
    q = torch.randn(1, 4, t + steps, d)
    k, v = torch.randn(1, 2, t + steps, d), torch.randn(1, 2, t + steps, d)
    cfg = SketchWalkConfig(block_size=16, sketch_dim=8, decode_reselect=1)  # every token
    runs = {}
    for backend in ("cpu", "reference"):
        s = Session(cfg, kernel_backend=backend)
        s.attend(2, q[:, :, :t], k[:, :, :t], v[:, :, :t], None, d**-0.5)
        outs = []
        for lk in range(t + 1, t + steps + 1):
            kk, vv = k[:, :, :lk].contiguous(), v[:, :, :lk].contiguous()
            outs.append(s.attend(2, q[:, :, lk - 1 : lk], kk, vv, None, d**-0.5))
        runs[backend] = torch.cat(outs, 2)
    assert len(calls) == (steps if native == "0" else 0)
    torch.testing.assert_close(runs["cpu"], runs["reference"], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 5, 32])
def test_window_ring_and_block_estimates_equal_their_full_recomputation(window):
    """The decode state's incremental parts: the query window (a 2w ring of views) equals the
    cat of the last w sketched queries (to float noise: a decode token is sketched in C where
    it can be), and the cached per-block key estimates equal a full
    recomputation from the sums, bit for bit, across block starts, reused steps and a chunk; the
    window's kept logits equal one product against every block (float noise: other ops)."""
    from sketchwalk.engine.method.decode import chunk_step
    from sketchwalk.engine.method.estimators.gaussian import token_keys, token_logits
    from sketchwalk.engine.method.estimators.window import key_estimates, window_logits
    from sketchwalk.engine.method.sketch import key_summary

    torch.manual_seed(window)
    d, t, block = 16, 70, 16
    cfg = SketchWalkConfig(
        block_size=block, density=0.3, query_window=window, sketch_dim=8, estimator="sampled"
    )
    q, k = torch.randn(1, 4, t + 120, d), torch.randn(1, 2, t + 120, d)
    srht = make_srht(d, cfg.sketch_dim, 0, 3)
    st = start_decode(prefill_plan(q[:, :, :t], k[:, :, :t], cfg, srht), q[:, :, :t], srht, cfg)
    want = srht(q[:, :, :t])[:, :, -window:]
    lk = t
    while lk < t + 110:
        if lk == t + 50:  # a chunk of 7 queries after some decode steps
            valid = torch.ones(1, lk + 7, dtype=torch.bool)
            chunk_step(
                st, q[:, :, lk : lk + 7], k[:, :, lk : lk + 7], lk + 7, cfg, srht, valid, None
            )
            want = torch.cat([want, srht(q[:, :, lk : lk + 7])], 2)[:, :, -window:]
            lk += 7
            continue
        lk += 1
        qn, kn = q[:, :, lk - 1 : lk], k[:, :, lk - 1 : lk]
        valid = torch.ones(1, lk, dtype=torch.bool)
        if reusable(st, lk, cfg, 3):
            decode_reuse(st, qn, kn, lk, cfg, srht, valid)
        else:
            decode_step(st, qn, kn, lk, cfg, srht, valid, all_valid=lk % 2 == 0)
        want = torch.cat([want, srht(qn)], 2)[:, :, -window:]
        assert torch.allclose(st.window, want, atol=1e-6)  # C sketches sum in another order
        sk = st.sketched
        n = sk.k_sum.shape[2]
        km, keys = key_estimates(st, d, cfg, n)
        mean, var = key_summary(sk.k_sum, sk.k_sq, sk.k_count)
        assert torch.equal(km, mean)
        assert torch.equal(keys, token_keys(mean, var, sk.k_count, d, cfg.tau))
        # the window's logits kept per slot: those of one product against every block
        torch.testing.assert_close(
            window_logits(st, keys, True), token_logits(st.window, keys, True), atol=1e-5, rtol=1e-5
        )


def test_state_grows_inside_buffers_with_room():
    """A_l and the block sums grow by one block per key block formed: new entries are zero, old
    ones kept, and while the buffer has room the grown tensor is a view of it (no copy)."""
    from sketchwalk.engine.method.decode import DecodeLayerState, _grow_state
    from sketchwalk.engine.method.pipeline import SketchedBlocks

    torch.manual_seed(0)
    a = torch.rand(1, 3, 5, 5)
    sk = SketchedBlocks(
        torch.rand(1, 9, 5, 8), torch.rand(1, 5), torch.rand(1, 3, 5, 8), torch.rand(1, 5)
    )
    st = DecodeLayerState(a.clone(), sk, torch.zeros(1, 9, 2, 8))
    _grow_state(st, 7)
    assert st.a.shape == (1, 3, 7, 7) and torch.equal(st.a[..., :5, :5], a)
    assert not st.a[..., 5:, :].any() and not st.a[..., :, 5:].any()
    assert torch.equal(st.sketched.k_sum[:, :, :5], sk.k_sum) and st.sketched.k_sq is None
    st.a[0, 0, 6, 6] = 1.0  # callers fill the new row in place
    ptr = st.a.data_ptr()
    _grow_state(st, 9)
    assert st.a.data_ptr() == ptr and st.a.shape[-1] == 9  # a new view, the same buffer
    assert st.a[0, 0, 6, 6] == 1.0 and not st.a[..., 7:, :].any()
    st.a = st.a.clone()  # not the buffer's view any more: the next growth starts a new buffer
    _grow_state(st, 10)
    assert st.a.data_ptr() != ptr and st.a[0, 0, 6, 6] == 1.0 and st.a.shape[-1] == 10


@pytest.mark.parametrize("per_group", [False, True])
def test_without_the_walk_decode_leaves_a_l_stale_until_it_is_read(per_group):
    """Only the walk reads A_l in decode: with it off no decode step recomputes or grows it, and
    one refresh (what a chunk does first) gives the rows a walking state recomputed at every
    step."""
    from sketchwalk.engine.method.decode import blocks_of, refresh_rows

    torch.manual_seed(3)
    d, block, t = 16, 16, 70
    base = dict(block_size=block, density=0.3, per_group=per_group, query_window=8, sketch_dim=8)
    still, walking = SketchWalkConfig(**base), SketchWalkConfig(**base, beta=0.25)
    q, k = torch.randn(1, 4, t, d), torch.randn(1, 2, t, d)
    srht = make_srht(d, 8, 0, 3)
    lazy = start_decode(prefill_plan(q, k, still, srht), q, srht, still)
    eager = start_decode(prefill_plan(q, k, walking, srht), q, srht, walking)
    prefilled = lazy.a.clone()
    for step in range(1, 2 * block + 3):
        lk = t + step
        qn, kn = torch.randn(1, 4, 1, d), torch.randn(1, 2, 1, d)
        valid = torch.ones(1, lk, dtype=torch.bool)
        decode_step(lazy, qn, kn, lk, still, srht, valid)
        decode_step(eager, qn, kn, lk, walking, srht, valid)
        # A_l is neither recomputed nor grown (no copy into a buffer on the decode path); the
        # sums take the key blocks decode formed
        assert torch.equal(lazy.a, prefilled)
        assert blocks_of(lazy) == eager.a.shape[-1] == (lk - 1) // block + 1
    cur = (lk - 1) // block
    assert lazy.stale_from == (t - 1) // block and eager.stale_from is None
    refresh_rows(lazy, d, still, cur)
    assert lazy.stale_from is None
    assert torch.allclose(lazy.a, eager.a, atol=1e-6)
