"""What the quality half of a run computes, and what it does not do twice: the exact block mass
from the C kernel equals a plain softmax, the prompt comparison on a prompt seen before runs the
LM head on its sparse side only, and the quality half times no dense attention per layer."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.app.prompts import license_text
from sketchwalk.engine.method import blockstats
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.metrics import compare_prompt_chunked
from sketchwalk.engine.run.models import load_model
from sketchwalk.engine.run.runner import LMParts, RunOptions, run


def _plain_exact(q, k, scale, b, groups, pool):
    """The definition: causal softmax per head and row, summed per key block, then pooled over a
    group's heads and a query block's rows (mean; or max, rows then scaled to sum to 1)."""
    _, h, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(h // hkv, dim=1).float()
    scores = (q.float() @ kk.transpose(-1, -2)) * scale  # [B, H, lq, lk]
    pos = torch.arange(lk - lq, lk)[:, None]
    scores = scores.masked_fill(torch.arange(lk)[None, :] > pos, float("-inf"))
    p = torch.softmax(scores, -1)
    nk, nq = -(-lk // b), -(-lq // b)
    p = torch.nn.functional.pad(p, (0, nk * b - lk)).unflatten(-1, (nk, b)).sum(-1)
    p = p.unflatten(1, (groups, h // groups))
    p = p.amax(2) if pool == "max" else p.mean(2)  # [B, G, lq, nk]
    p = torch.nn.functional.pad(p, (0, 0, 0, nq * b - lq)).unflatten(2, (nq, b))
    if pool == "max":
        out = p.amax(3)
        return out / out.sum(-1, keepdim=True)
    counts = torch.full((nq,), float(b))
    counts[-1] = lq - (nq - 1) * b
    return p.sum(3) / counts[None, None, :, None]


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize(("lq", "lk"), [(100, 100), (37, 100), (1, 90), (64, 64)])
@pytest.mark.parametrize("native", [True, False])
def test_exact_block_mass_equals_the_plain_softmax(pool, lq, lk, native, monkeypatch):
    """Both paths (the C kernel's and the torch product's) against the definition, prefill
    (whole and a later chunk of queries, a partial last block) and a decode row."""
    if native and blockstats.library() is None:
        pytest.skip("no C compiler")
    if not native:
        monkeypatch.setattr(blockstats, "library", lambda: None)
    g = torch.Generator().manual_seed(lq + lk)
    q = torch.randn(1, 6, lq, 16, generator=g)
    k = torch.randn(1, 2, lk, 16, generator=g)
    valid = torch.ones(1, lk, dtype=torch.bool)
    for groups in (1, 2):
        got = blockstats.exact_block_mass(q, k, 0.25, 16, valid, groups, pool=pool)
        want = _plain_exact(q, k, 0.25, 16, groups, pool)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_exact_block_mass_takes_the_c_kernel_for_prefill_only(monkeypatch):
    calls = []
    real = blockstats.scored_block_mass
    monkeypatch.setattr(
        blockstats, "scored_block_mass", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    if blockstats.library() is None:
        pytest.skip("no C compiler")
    q, k = torch.randn(1, 4, 64, 16), torch.randn(1, 2, 64, 16)
    valid = torch.ones(1, 64, dtype=torch.bool)
    blockstats.exact_block_mass(q[:, :, -1:], k, 0.25, 16, valid, 2)  # a decode row
    assert not calls
    blockstats.exact_block_mass(q, k, 0.25, 16, valid, 2)
    assert calls
    calls.clear()
    valid[0, :5] = False  # padded keys: the torch path masks them
    blockstats.exact_block_mass(q, k, 0.25, 16, valid, 2)
    assert not calls


def test_the_comparison_reuses_the_dense_log_probabilities():
    """With the dense side's log-probabilities kept from a first comparison, a second one runs
    the head on the sparse hidden states only, and gives the same numbers."""
    g = torch.Generator().manual_seed(0)
    head = torch.randn(8, 50, generator=g)
    dense_h, sparse_h = torch.randn(40, 8, generator=g), torch.randn(40, 8, generator=g)
    ids = torch.randint(0, 50, (40,), generator=g)
    seen = []

    def logits(h):
        seen.append(h)
        return h @ head

    keep = torch.empty(39, 50)
    first = compare_prompt_chunked(logits, dense_h, sparse_h, ids, chunk=7, keep_dense=keep)
    seen.clear()
    again = compare_prompt_chunked(logits, dense_h, sparse_h, ids, chunk=7, dense_logprobs=keep)
    assert sum(len(h) for h in seen) == 39
    assert all(any(torch.equal(h, sparse_h[s : s + len(h)]) for s in range(40)) for h in seen)
    for name in ("kl", "logprob_dense", "logprob_sparse", "agree"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(tiny_model)


def test_a_second_density_runs_the_head_on_the_sparse_side_only(tiny, monkeypatch):
    """The dense model's head is not applied to the prompt again at a second density: the
    comparison's head rows are the sparse side's, and its numbers equal a fresh run's."""
    prompt = license_text()[:900]
    opts = RunOptions(max_new_tokens=3)
    tiny.dense_memo = None
    run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.5), opts, speed=False)
    assert tiny.dense_memo.prompt_logprobs is not None
    rows = []
    real = LMParts.logits
    monkeypatch.setattr(LMParts, "logits", lambda self, h: rows.append(len(h)) or real(self, h))
    second = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), opts, speed=False)
    n = second.prompt_tokens
    assert second.metrics["dense_reused"] is True
    # the sparse pass's decode steps, the judge's continuation, the prompt's sparse side once
    assert sum(rows) < 2 * (n - 1)
    monkeypatch.setattr(LMParts, "logits", real)
    tiny.dense_memo = None
    fresh = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), opts, speed=False)
    for key in ("kl_mean", "kl_max", "top1_agreement", "ppl_dense", "ppl_sparse"):
        assert second.metrics[key] == fresh.metrics[key], key


def test_the_quality_half_times_no_dense_attention_per_layer(tiny, monkeypatch):
    """run(speed=False) leaves per-layer dense timing to the speed half: dense attention runs
    only for the dense layers' own attention; a whole run (speed=True) still times it."""
    from sketchwalk.engine.hf import session as session_mod

    calls = []
    real = session_mod.dense_attention
    monkeypatch.setattr(
        session_mod, "dense_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    prompt = license_text()[:700]
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    opts = RunOptions(max_new_tokens=2)
    res = run(tiny, prompt, cfg, opts, speed=False)
    sparse = [r for r in res.layers if r.phase == "prefill" and not r.dense]
    assert sparse and all(r.t_dense_ms is None for r in sparse)
    dense_layers = sum(1 for r in res.layers if r.dense)
    assert len(calls) == dense_layers
    calls.clear()
    whole = run(tiny, prompt, cfg, opts)
    assert all(
        r.t_dense_ms is not None for r in whole.layers if r.phase == "prefill" and not r.dense
    )
    assert len(calls) > dense_layers


def test_the_speed_half_times_each_layers_dense_attention(tiny):
    """speed_timings hands back the clean dense passes' prefill attention per layer (every
    layer, a median over the repeats), and with_layer_dense puts it into the quality half's
    sparse prefill records."""
    from sketchwalk.engine.run.runner import speed_timings, with_layer_dense

    prompt = license_text()[:700]
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    opts = RunOptions(max_new_tokens=2, clean_timing=True, clean_repeats=2)
    res = run(tiny, prompt, cfg, opts, speed=False)
    layer_dense: dict[int, float] = {}
    speed_timings(tiny, prompt, cfg, opts, res.timings, layer_dense=layer_dense)
    n_layers = int(tiny.model.config.num_hidden_layers)
    assert sorted(layer_dense) == list(range(n_layers))
    assert all(ms > 0 for ms in layer_dense.values())
    sparse = [r for r in res.layers if r.phase == "prefill" and not r.dense]
    assert with_layer_dense(res.layers, layer_dense) == len(sparse) > 0
    assert all(r.t_dense_ms == layer_dense[r.layer] for r in sparse)


def _two_densities(tiny, monkeypatch, spare: bool):
    """A new prompt at 0.5, then the same prompt at 0.3 (its dense side reused), with or
    without a spare core; the names of the threads the runner started beside it."""
    from sketchwalk.engine.run import runner as runner_mod
    from sketchwalk.engine.run.alongside import Alongside as real
    from sketchwalk.engine.run.alongside import Stream

    monkeypatch.setattr(runner_mod, "spare_core", lambda device: spare)
    names: list[str] = []
    monkeypatch.setattr(
        runner_mod, "Alongside", lambda work, name: names.append(name) or real(work, name)
    )
    monkeypatch.setattr(runner_mod, "Stream", lambda name: names.append(name) or Stream(name))
    tiny.dense_memo = None
    prompt, opts = license_text()[:900], RunOptions(max_new_tokens=12)  # re-selections too
    runs = [
        run(tiny, prompt, SketchWalkConfig(block_size=16, density=d), opts, speed=False)
        for d in (0.5, 0.3)
    ]
    return runs, names


def test_the_quality_half_on_a_spare_core_gives_what_it_gives_in_turn(tiny, monkeypatch):
    """With a core to spare, the dense side of a new prompt, and the recorder's exact mass and
    metrics and the prompt comparison of a known one, run in a second thread beside the sparse
    side: the same generations, metrics, tokens and per-layer records as one after the other."""
    in_turn, none = _two_densities(tiny, monkeypatch, spare=False)
    beside, names = _two_densities(tiny, monkeypatch, spare=True)
    assert none == [] and names == ["sketchwalk-dense-side", "sketchwalk-second-stream"]
    _same_runs(in_turn, beside)


class _LateStream:
    """A second stream at its slowest: every task runs only once the sparse side is done."""

    def __init__(self, name: str) -> None:
        self.tasks: list = []

    def put(self, task):
        from concurrent.futures import Future

        done: Future = Future()
        self.tasks.append((task, done))
        return done

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> None:
        for task, done in self.tasks if kind is None else []:
            done.set_result(task())


def test_records_finished_late_are_the_records_of_their_step(tiny, monkeypatch):
    """The recorder's work on a known prompt may run long after its layer step (the stream
    lags the sparse side): what it reads is copied at the step, so records finished after the
    whole decode equal those made in place."""
    from sketchwalk.engine.run import runner as runner_mod

    in_turn, _ = _two_densities(tiny, monkeypatch, spare=False)
    monkeypatch.setattr(runner_mod, "spare_core", lambda device: True)
    tiny.dense_memo = None
    prompt, opts = license_text()[:900], RunOptions(max_new_tokens=12)
    run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.5), opts, speed=False)
    monkeypatch.setattr(runner_mod, "Stream", _LateStream)
    late = run(tiny, prompt, SketchWalkConfig(block_size=16, density=0.3), opts, speed=False)
    _same_runs(in_turn[1:], [late])


def _same_runs(runs_a: list, runs_b: list) -> None:
    for a, b in zip(runs_a, runs_b, strict=True):
        assert (a.dense_text, a.sparse_text) == (b.dense_text, b.sparse_text)
        assert a.metrics == b.metrics
        assert a.tokens == b.tokens
        assert len(a.layers) == len(b.layers)
        for ra, rb in zip(a.layers, b.layers, strict=True):
            assert (ra.phase, ra.step, ra.layer) == (rb.phase, rb.step, rb.layer)
            for name in ("sketch", "walk", "exact", "selected"):
                x, y = getattr(ra, name), getattr(rb, name)
                assert (x is None) == (y is None) and (x is None or (x == y).all()), name
            for name in ("sketch_error", "walk_error", "mass_recall", "density_achieved"):
                assert getattr(ra, name) == getattr(rb, name), name
        assert any(r.mass_recall is not None for r in b.layers if r.phase == "decode")


def test_a_failing_side_fails_the_run_and_stops_the_other(tiny, monkeypatch):
    """The dense side's error is the run's; a sparse side that fails (a cancelled job raises
    from its progress report) stops the dense side at its next token and leaves no thread."""
    import threading

    from sketchwalk.engine.run import runner as runner_mod

    monkeypatch.setattr(runner_mod, "spare_core", lambda device: True)
    prompt, cfg = license_text()[:700], SketchWalkConfig(block_size=16, density=0.3)
    opts = RunOptions(max_new_tokens=40)

    def broken(*args):
        raise RuntimeError("dense side broke")

    with monkeypatch.context() as m:
        m.setattr(runner_mod, "_dense_greedy", broken)
        tiny.dense_memo = None
        with pytest.raises(RuntimeError, match="dense side broke"):
            run(tiny, prompt, cfg, opts, speed=False)

    def cancel(fraction: float, message: str) -> None:
        if message.startswith("sparse decode"):
            raise KeyboardInterrupt("cancelled")

    sides = ("sketchwalk-dense-side", "sketchwalk-second-stream")
    tiny.dense_memo = None
    with pytest.raises(KeyboardInterrupt):  # a new prompt: its dense side runs beside
        run(tiny, prompt, cfg, opts, progress=cancel, speed=False)
    assert not [t for t in threading.enumerate() if t.name in sides]
    assert tiny.dense_memo is None  # a failed run leaves no memo
    run(tiny, prompt, cfg, opts, speed=False)
    with pytest.raises(KeyboardInterrupt):  # a known prompt: its comparison runs beside
        run(tiny, prompt, cfg, opts, progress=cancel, speed=False)
    assert not [t for t in threading.enumerate() if t.name in sides]
