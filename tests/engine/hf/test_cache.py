"""The growing KV cache (engine/hf/cache.py): the same K/V and the same generations as transformers'
DynamicCache, without copying the cache per token."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from sketchwalk.engine.hf import cache as growing
from sketchwalk.engine.hf.cache import GrowingLayer, cache_kwarg, growing_cache, new_cache
from sketchwalk.engine.hf.hook import NAME
from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.runner import greedy


def _kv(gen: torch.Generator, n: int, bsz: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(bsz, 3, n, 8, generator=gen), torch.randn(bsz, 3, n, 8, generator=gen)


def test_updates_equal_concatenation_and_grow_in_place(monkeypatch):
    monkeypatch.setattr(growing, "_MIN_ROOM", 5)
    gen = torch.Generator().manual_seed(0)
    ours, theirs = GrowingLayer(), DynamicLayer()
    moved = 0
    ptr = None
    for n in [7, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 9, 1]:  # a prefill, tokens, a chunk
        k, v = _kv(gen, n)
        ko, vo = ours.update(k, v)
        kt, vt = theirs.update(k, v)
        assert torch.equal(ko, kt) and torch.equal(vo, vt)
        assert ko.stride(-2) == ko.shape[-1] and ko.stride(-1) == 1  # rows stay contiguous
        assert ours.get_seq_length() == theirs.get_seq_length()
        moved += ptr is not None and ko.data_ptr() != ptr
        ptr = ko.data_ptr()
    assert 1 <= moved <= 3  # the buffer grew a few times, not once per token


def test_room_is_a_quarter_within_bounds():
    gen = torch.Generator().manual_seed(2)
    for n, room in [(10, 256), (2000, 500), (40000, 4096)]:
        layer = GrowingLayer()
        layer.update(*_kv(gen, n, bsz=1))
        assert layer._kbuf.shape[2] - n == room


@pytest.mark.parametrize("op", ["crop", "select", "reorder", "repeat"])
def test_cache_edits_then_updates_stay_equal(op):
    """transformers' crop / batch selection / beam reorder replace the views; the next update
    then starts a new buffer from them instead of writing where the old views point."""
    gen = torch.Generator().manual_seed(1)
    ours, theirs = GrowingLayer(), DynamicLayer()
    for n in (6, 1, 1):
        k, v = _kv(gen, n)
        ours.update(k, v)
        theirs.update(k, v)
    for layer in (ours, theirs):
        if op == "crop":
            layer.crop(-2)
        elif op == "select":
            layer.batch_select_indices(torch.tensor([1]))
        elif op == "reorder":
            layer.reorder_cache(torch.tensor([1, 0]))
        else:
            layer.batch_repeat_interleave(2)
    bsz = ours.keys.shape[0]
    for n in (1, 1, 2):
        k, v = _kv(gen, n, bsz)
        ko, vo = ours.update(k, v)
        kt, vt = theirs.update(k, v)
        assert torch.equal(ko, kt) and torch.equal(vo, vt)


def test_sliding_window_layers_stay_as_transformers_makes_them():
    from transformers import MistralConfig

    cfg = MistralConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64, sliding_window=16,
    )  # fmt: skip
    assert {type(x) for x in growing_cache(cfg).layers} == {DynamicSlidingWindowLayer}
    cfg.sliding_window = None
    assert {type(x) for x in growing_cache(cfg).layers} == {GrowingLayer}


@pytest.mark.parametrize("impl", ["sdpa", NAME])
def test_generation_equals_the_default_cache(impl, monkeypatch):
    """Dense and sparse (prefill and decode, selections kept across steps) give the very same
    logits on the growing cache as on transformers' DynamicCache, in the same decode loop."""
    import sketchwalk.engine.run.runner as runner

    model = tiny_llama()
    model.set_attn_implementation(impl)
    ids = torch.randint(1, 128, (1, 150), generator=torch.Generator().manual_seed(3))
    cfg = SketchWalkConfig(
        block_size=16, density=0.4, dense_layers=(), query_window=8, decode_reselect_span=0
    )
    assert isinstance(new_cache(model)[cache_kwarg(model)].layers[0], GrowingLayer)
    with torch.no_grad(), sketch_walk_session(cfg) as session:
        got = greedy(model, ids, 40, None)
    assert (session.decode_reused > 0) == (impl == NAME)  # kept selections read the views
    monkeypatch.setattr(runner, "new_cache", lambda m: {cache_kwarg(m): DynamicCache()})
    with torch.no_grad(), sketch_walk_session(cfg):
        want = greedy(model, ids, 40, None)
    assert got.new_ids == want.new_ids
    assert torch.equal(got.new_logits, want.new_logits)
