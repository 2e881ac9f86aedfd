"""The engine's GPU path on this CPU: the Triton kernels (interpreter) and the torch code a GPU
runs (SKETCHWALK_NATIVE=0: no C kernels, as off a CPU), in a tiny model.

What a GPU would show and a CPU test can: the same generations as the CPU path (prefill, decode,
a chunk after a cache, recorded or not), no host round trip per layer beyond the two a selection
needs (the widths of its topk and of its lists), no op mixing device and host tensors (the crash
of the first sparse layer on an H200), and a number of launches per layer that does not grow
with the length (device_trace.py says how each is counted).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from device_trace import DeviceTrace, OpCount, pause_in_triton_launches

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.recorder import Recorder

_spec = importlib.util.spec_from_file_location(
    "tiny_models", Path(__file__).parents[2] / "tiny_models.py"
)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

LAYERS, SPARSE = 4, 3  # layer 0 dense (dense_layers), three sparse layers
CONFIGS = {
    "defaults": {},
    "query estimator": {"estimator": "query"},
    "block means": {"estimator": "mean", "sampled_depth": 0.0},
    "row budget, no tiles": {"budget": "row", "query_block": 32},
    "streaming": {"method": "streaming"},
    "no walk": {"method": "nowalk"},
    "oracle": {"method": "oracle"},
    "xattention": {"method": "xattention"},
    "quest": {"method": "quest"},
    "per-group lists": {"per_group": True},
    "reselect every step": {"decode_reselect": 1},
}
# the host reads a selection needs, per sparse layer: its topk's width and its lists' width
PER_LAYER = {
    ("engine/method/select.py", "selection_from_mask"),
    ("kernels/take_best.py", "take_best_reference"),  # its topk's width
    ("engine/method/select.py", "row_budget_keep"),
}
PER_STEP = {("engine/method/select.py", "of")}  # the tile layout, once per forward step (Tiles.of)


@pytest.fixture(autouse=True)
def _device_path(monkeypatch):
    """What differs on a GPU besides the kernels: no C library, and no free `.all()` reads
    (engine/method/sketch.py all_on_host answers False off a CPU)."""
    from sketchwalk.engine.method import blockstats, score_basis, sketch

    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    for module in (sketch, score_basis, blockstats):
        monkeypatch.setattr(module, "all_on_host", lambda x: False)


def _model():
    model = _fixtures.tiny_llama(layers=LAYERS, heads=4, kv_heads=2, head_dim=16)
    model.set_attn_implementation("sketch_walk")
    return model


def _cfg(**kw) -> SketchWalkConfig:
    return SketchWalkConfig(dense_layers=(0,), **kw)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _trace(model, cfg, n: int, phase: str, modes: list) -> None:
    """A prefill of n tokens, then one decode step; `modes` count `phase` only. A DeviceTrace
    watches the prefill either way, so the decode state it leaves is on the "device"."""
    ids = _ids(n)
    traces = [m for m in modes if isinstance(m, DeviceTrace)]
    with sketch_walk_session(cfg, None):
        for t in traces:  # the input and the weights live on the device
            t.put([ids, *model.parameters(), *model.buffers()])
        with _modes(traces if phase == "decode" else modes):
            out = model(ids, use_cache=True)
        if phase == "prefill":
            return
        for t in traces:
            t.reads.clear()
            t.mixed.clear()
        nxt = out.logits[:, -1:].argmax(-1)
        for t in traces:
            t.put(nxt)
        with _modes(modes):
            model(nxt, past_key_values=out.past_key_values, use_cache=True)


class _modes:
    """Enter several modes at once (innermost last)."""

    def __init__(self, modes: list) -> None:
        self.modes = modes

    def __enter__(self) -> None:
        for m in self.modes:
            m.__enter__()

    def __exit__(self, *exc) -> None:
        for m in reversed(self.modes):
            m.__exit__(*exc)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_no_host_round_trip_or_mixed_device_op_per_layer(name, monkeypatch):
    model, cfg = _model(), _cfg(**CONFIGS[name])
    for phase in ("prefill", "decode"):
        trace = DeviceTrace()
        pause_in_triton_launches(monkeypatch, [trace])
        _trace(model, cfg, 300, phase, [trace])
        assert not trace.mixed, (phase, dict(trace.mixed))
        if phase == "decode":
            assert not trace.reads, dict(trace.reads)  # a decode step never waits on the GPU
            continue
        assert set(trace.reads) <= PER_LAYER | PER_STEP, dict(trace.reads)
        for site, n in trace.reads.items():
            assert n == (1 if site in PER_STEP else SPARSE), (site, n)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_launches_per_layer_do_not_grow_with_the_length(phase, monkeypatch):
    """The same ops and Triton launches at 4x the tokens (the CPU path chunks queries by cache
    sizes: on a GPU that was 2048 Python iterations a layer at 32k)."""
    model, cfg = _model(), _cfg()
    counts = []
    # 1260 = 300 + 15 x 64: the same last partial block and partial query tile for blocks and
    # tiles up to 64 (a whole last tile at one length only pools in one run fewer), and neither
    # decode step opens a key block
    for n in (300, 1260):
        ops = OpCount()
        pause_in_triton_launches(monkeypatch, [ops])
        _trace(model, cfg, n, phase, [ops])
        counts.append(ops)
    short, long = counts
    assert sum(short.ops.values()) > 50 and sum(short.launches.values()) >= SPARSE
    assert short.ops == long.ops
    assert short.launches == long.launches
    kernels = {"prefill": "block_sparse_prefill_kernel", "decode": "block_sparse_decode"}[phase]
    assert any(k.startswith(kernels) for k in short.launches), dict(short.launches)


def _generate(model, cfg, ids, recorder, backend_env: str | None, monkeypatch):
    if backend_env is None:
        monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
        monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    else:
        monkeypatch.setenv("SKETCHWALK_KERNEL", backend_env)
        monkeypatch.setenv("SKETCHWALK_NATIVE", "1")
    with torch.no_grad(), sketch_walk_session(cfg, recorder):
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
        half = ids.shape[1] // 2  # and a chunk after a cache: a later turn's queries
        first = model(ids[:, :half], use_cache=True)
        chunk = model(ids[:, half:], past_key_values=first.past_key_values, use_cache=True)
    return out, chunk.logits[:, -1]


@pytest.mark.parametrize("record", [False, True])
def test_device_path_generates_as_the_cpu_path(record, monkeypatch):
    """Triton kernels and the GPU's torch code against the CPU kernels and C code: the same
    tokens, the same kept blocks per layer, logits within float32 rounding."""
    model, cfg = _model(), _cfg(density=0.25)
    ids = _ids(400, seed=1)
    runs = []
    for env in (None, "cpu"):
        rec = Recorder() if record else None
        runs.append((*_generate(model, cfg, ids, rec, env, monkeypatch), rec))
    (dev_out, dev_chunk, dev_rec), (cpu_out, cpu_chunk, cpu_rec) = runs
    assert torch.equal(dev_out, cpu_out)
    assert torch.allclose(dev_chunk, cpu_chunk, atol=2e-3, rtol=1e-3)
    if record:
        assert len(dev_rec.layers) == len(cpu_rec.layers) > SPARSE
        sparse = 0
        for a, b in zip(dev_rec.layers, cpu_rec.layers, strict=True):
            assert (a.phase, a.layer, a.dense) == (b.phase, b.layer, b.dense)
            if a.selected is not None:
                assert np.array_equal(a.selected, b.selected), (a.phase, a.layer)
                sparse += 1
        assert sparse >= SPARSE
