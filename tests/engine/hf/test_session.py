"""The session: one recorder call site with a frozen LayerStep, the exact block mass computed at
most once per layer step, and the phase read from the cache (a one-token prompt is a prefill)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import Session, phase_of, sketch_walk_session
from sketchwalk.engine.method import pipeline
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.recorder import LayerStep, Recorder
from sketchwalk.engine.run.runner import greedy

LAYERS, PROMPT, NEW = 3, 40, 5


class CountingRecorder(Recorder):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[LayerStep] = []

    def record(self, obs: LayerStep) -> None:
        assert isinstance(obs, LayerStep)
        with pytest.raises(dataclasses.FrozenInstanceError):
            obs.layer = -1  # an observer cannot change what it is shown
        self.seen.append(obs)
        super().record(obs)


def _run(cfg, recorder=None, prompt=PROMPT, new=NEW, on_layer=None):
    model = tiny_llama(layers=LAYERS)
    ids = torch.randint(1, 128, (1, prompt), generator=torch.Generator().manual_seed(5))
    model.set_attn_implementation("sketch_walk")
    with sketch_walk_session(cfg, recorder, on_layer) as s:
        out = greedy(model, ids, new, None)
    return out, s


def test_every_recorded_layer_step_goes_through_one_record_call():
    rec = CountingRecorder()
    _run(SketchWalkConfig(density=0.3, block_size=16, dense_layers=(0,)), rec)
    where = [(o.phase, o.step, o.layer) for o in rec.seen]
    prefill = [("prefill", 0, i) for i in range(LAYERS)]
    decode = [("decode", s, i) for s in range(1, NEW) for i in range(LAYERS)]
    assert where == prefill + decode
    assert len(rec.layers) == len(rec.seen)
    assert [o.density_target for o in rec.seen[:LAYERS]] == [None, 0.3, 0.3]  # layer 0 is dense


@pytest.mark.parametrize(
    "method, pool, exact_max_tokens, per_step",
    [
        ("sketchwalk", "max", 8192, LAYERS),  # the recorder's ground truth, every layer step
        ("oracle", "mean", 8192, LAYERS),  # the oracle selects on the same tensor: still once
        # max pooling: the oracle's max-pooled mass on the sparse layers, the recorder's mean mass
        ("oracle", "max", 8192, 2 * LAYERS - 1),
        ("oracle", "max", 8, LAYERS - 1),  # past the recorder's limit only the sparse layers
        ("sketchwalk", "max", 8, 0),
    ],
)
def test_exact_mass_is_computed_once_per_use_and_layer_step(
    monkeypatch, method, pool, exact_max_tokens, per_step
):
    calls = []
    real = pipeline.exact_block_mass

    def counted(q, k, *args, **kw):
        calls.append(q.shape[0])
        return real(q, k, *args, **kw)

    monkeypatch.setattr(pipeline, "exact_block_mass", counted)
    rec = CountingRecorder()
    rec.options.exact_max_tokens = exact_max_tokens
    cfg = SketchWalkConfig(method=method, density=0.3, block_size=16, dense_layers=(0,), pool=pool)
    _run(cfg, rec)
    assert len(calls) == per_step * NEW
    for obs, r in zip(rec.seen, rec.layers, strict=True):
        assert (obs.exact is None) == (r.exact is None)  # only what the session offers
        if obs.exact is not None:  # the ground truth is the mean mass: every row a distribution
            sums = obs.exact()[:1].sum(-1)
            assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)


def test_a_one_token_prompt_is_a_prefill_and_then_decodes():
    seen = []
    rec = Recorder()
    _, s = _run(
        SketchWalkConfig(density=0.5, block_size=16, dense_layers=()),
        rec,
        prompt=1,
        new=3,
        on_layer=lambda phase, step, layer: seen.append((phase, step, layer)),
    )
    assert seen[:LAYERS] == [("prefill", 0, i) for i in range(LAYERS)]
    assert seen[LAYERS:] == [("decode", s, i) for s in (1, 2) for i in range(LAYERS)]
    assert [r.phase for r in rec.layers[:LAYERS]] == ["prefill"] * LAYERS
    assert set(s.decode_states) == set(range(LAYERS)) and s.step == 2
    assert s.density("prefill") is not None and s.density("decode") is not None


def test_the_phase_comes_from_the_tokens_already_cached():
    assert phase_of(past=0, lq=1) == "prefill"
    assert phase_of(past=0, lq=50) == "prefill"
    assert phase_of(past=50, lq=1) == "decode"
    assert phase_of(past=50, lq=7) == "chunk"
    # one session, fed raw tensors: a prefill, a decode step, a chunk, then a new prompt
    s = Session(SketchWalkConfig(density=0.5, block_size=16, dense_layers=()))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 48, 16, generator=g), torch.randn(1, 2, 48, 16, generator=g)
    s.attend(0, q[:, :, :40], k[:, :, :40], k[:, :, :40], None, 0.25)
    assert s.step == 0 and 0 in s.decode_states
    s.attend(0, q[:, :, 40:41], k[:, :, :41], k[:, :, :41], None, 0.25)
    assert s.step == 1
    s.attend(0, q[:, :, 41:48], k, k, None, 0.25)  # a chunk: no step, its own walk
    assert s.step == 1 and s.chunk_walk is not None
    s.attend(0, q[:, :, :1], k[:, :, :1], k[:, :, :1], None, 0.25)  # a one-token prompt
    assert s.step == 0 and s.decode_states[0].a.shape[-1] == 1


def test_sampled_depth_switches_the_first_layers_to_the_sampled_estimator():
    """Prefill and decode: sampled_depth 1 with block means is the sampled estimator in every
    layer, bit for bit; 0.5 of 4 layers samples in layers 0-1 and keeps block means after."""
    model = tiny_llama(layers=4)
    model.set_attn_implementation("sketch_walk")
    ids = torch.randint(1, 128, (1, 72), generator=torch.Generator().manual_seed(3))
    base = dict(block_size=8, query_block=0, density=0.3, dense_layers=(), query_samples=2)

    @torch.no_grad()  # inference, as every run of the engine is
    def run(**kw):
        with sketch_walk_session(SketchWalkConfig(**base, **kw)) as s:
            logits = model(ids).logits
            dec = greedy(model, ids, 4, None)
        return logits, (dec.new_ids, dec.new_logits), [s.cfg_for(i).estimator for i in range(4)]

    deep, deep_tokens, deep_est = run(estimator="mean", sampled_depth=1.0)
    sampled, sampled_tokens, sampled_est = run(estimator="sampled")
    assert deep_est == sampled_est == ["sampled"] * 4
    assert torch.equal(deep, sampled) and deep_tokens[0] == sampled_tokens[0]
    assert torch.equal(deep_tokens[1], sampled_tokens[1])
    _, _, half = run(estimator="mean", sampled_depth=0.5)
    assert half == ["sampled", "sampled", "mean", "mean"]
    _, _, none = run(estimator="mean", sampled_depth=0.0)
    assert none == ["mean"] * 4


def test_a_reconfigured_session_runs_its_layers_under_the_new_config():
    """A session bound at prefill keeps its layers' configs: the decode-fidelity benchmark set
    `cfg` alone, and every re-select rule ran the prefill config's (the same selections
    reused whatever the rule asked)."""
    from sketchwalk.benchmarks.decode_fidelity import compare

    model = tiny_llama()
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 96))
    cfg = SketchWalkConfig(block_size=16, density=0.5, decode_reselect=0, decode_reselect_span=0)
    row = compare(model, ids, cfg, ["1", "0", "4"], 6)
    assert row["1"]["reused"] == 0  # every token re-selects
    assert row["0"]["reused"] > row["4"]["reused"] > 0  # at a block start; every 4th token


def test_each_forward_step_builds_one_plan_that_every_layer_reads(monkeypatch):
    """The step plan (phase, validity, step index, backend) is built at layer 0 of each forward
    call, once; the mask's validity is read once per step, not once per layer."""
    from sketchwalk.engine.hf import session as session_module
    from sketchwalk.engine.method.step import StepPlan

    built: list[StepPlan] = []
    real_of, real_valid = StepPlan.of, session_module.key_validity
    reads = []
    monkeypatch.setattr(
        StepPlan,
        "of",
        classmethod(lambda cls, *a, **k: built.append(real_of(*a, **k)) or built[-1]),
    )
    monkeypatch.setattr(
        session_module, "key_validity", lambda *a: reads.append(1) or real_valid(*a)
    )
    seen: list[tuple[str, int, StepPlan]] = []
    real_prefill = Session._prefill

    def spy(self, call, exact):
        seen.append((call.phase, call.layer, self.plan))
        return real_prefill(self, call, exact)

    monkeypatch.setattr(Session, "_prefill", spy)
    _, s = _run(SketchWalkConfig(block_size=8, dense_layers=()), new=NEW)
    assert [p.phase for p in built] == ["prefill"] + ["decode"] * (NEW - 1)
    assert [p.step for p in built] == list(range(NEW))
    assert len(reads) == len(built)  # one validity read per step
    assert [layer for _, layer, _ in seen] == list(range(LAYERS))
    assert all(plan is built[0] for _, _, plan in seen)  # the prefill's layers share its plan
    assert not built[0].padded and built[0].starts() is None


def test_a_padded_step_plan_gives_sequence_starts_and_spans_once():
    from sketchwalk.engine.method.sketch import key_span
    from sketchwalk.engine.method.step import StepPlan

    valid = torch.ones(3, 20, dtype=torch.bool)
    valid[1, :7] = False
    valid[2, :19] = False
    plan = StepPlan.of(valid)
    assert plan.padded
    assert plan.starts().tolist() == [0, 7, 19]
    assert plan.starts() is plan.starts()  # built once per step
    start, end = plan.span()
    want = key_span(valid)
    assert torch.equal(start, want[0]) and torch.equal(end, want[1])
    assert plan.span() is plan.span()
    assert not StepPlan.of(valid, may_pad=False).padded  # the caller knows there is no mask
