"""The estimator registry: every estimator's rows are distributions over visible blocks, the knob
takes exactly the registered names, and a new estimator is one registry entry away from running
in a model's prefill, chunks and decode."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method import estimators
from sketchwalk.engine.method.config import SketchWalkConfig, knobs
from sketchwalk.engine.method.estimators import REGISTRY, Estimator
from sketchwalk.engine.method.estimators import mean as mean_estimator
from sketchwalk.engine.method.pipeline import sketch_blocks, transition
from sketchwalk.engine.method.sketch import make_srht
from sketchwalk.errors import ConfigError


def test_the_knob_takes_exactly_the_registered_estimators():
    knob = next(k for f, k in knobs() if f.name == "estimator")
    assert knob.allowed() == tuple(REGISTRY) == estimators.names()
    assert {"mean", "query", "sampled"} <= set(REGISTRY)
    for name in REGISTRY:
        assert SketchWalkConfig(estimator=name).estimator_spec is REGISTRY[name]
    with pytest.raises(ConfigError, match="estimator"):
        SketchWalkConfig(estimator="psychic")


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("t", [70, 128])
def test_each_estimator_gives_causal_distributions(name, t):
    """Rows of A from each estimator's prefill: non-negative, summing to 1, nothing on future
    blocks (a partial last block included)."""
    gen = torch.Generator().manual_seed(t)
    b, h, hkv, d = 16, 4, 2, 16
    q, k = torch.randn(1, h, t, d, generator=gen), torch.randn(1, hkv, t, d, generator=gen)
    cfg = SketchWalkConfig(estimator=name, block_size=b, sketch_dim=8, score_rank=0)
    valid = torch.ones(1, t, dtype=torch.bool)
    token_cfg = cfg if cfg.estimator_spec.keeps_tokens else None
    sk, qt = sketch_blocks(q, k, make_srht(d, 8, 0, 0), b, valid, token_cfg, padded=False)
    n = -(-t // b)
    a = transition(sk, torch.arange(n), d, cfg, qt)
    g = cfg.groups(hkv)
    assert a.shape == (1, g, n, n)
    assert (a >= 0).all() and torch.allclose(a.sum(-1), torch.ones(1, g, n), atol=1e-5)
    assert torch.equal(a.triu(1), torch.zeros_like(a))


def test_a_new_estimator_is_one_registry_entry(monkeypatch):
    """An estimator added to the registry (here: block means with the scores halved) is a valid
    knob value and runs in a model's prefill, a chunk after a cache and decode steps."""
    calls = {"prefill": 0, "decode": 0}

    def prefill(sk, q_blocks, dim, cfg, tokens=None):
        calls["prefill"] += 1
        return mean_estimator.prefill(sk, q_blocks, dim, cfg.with_(tau=cfg.tau * 2), tokens)

    def decode(x):
        calls["decode"] += 1
        return mean_estimator.decode(x)

    monkeypatch.setitem(REGISTRY, "halved", Estimator("halved", "test", prefill, decode))
    model = tiny_llama(layers=3)
    model.set_attn_implementation("sketch_walk")
    cfg = SketchWalkConfig(
        estimator="halved", sampled_depth=0.0, block_size=16, dense_layers=(0,), density=0.3
    )
    ids = torch.randint(1, 128, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), sketch_walk_session(cfg) as session:
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
        first = model(ids[:, :50], use_cache=True)
        model(ids[:, 50:], past_key_values=first.past_key_values, use_cache=True)
    assert out.shape == (1, 104)
    assert calls["prefill"] >= 2 * 2 and calls["decode"] >= 1  # two sparse layers
    assert session.density("prefill") is not None
