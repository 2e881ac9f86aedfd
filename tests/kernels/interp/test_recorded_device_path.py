"""Every method and estimator with the recorder on, on the device path (Triton kernels through
the interpreter, no C kernels), a prefill, a decode step and a chunk after the cache.

test_engine_device_path.py runs these configs without a recorder; a recorded run adds the exact
block mass, the dense timing and the recorder's copies (per-group rows too), each a place where
a host tensor can meet the device's. The recorder copies to the host by design: its reads are
allowed, mixed ops are not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from device_trace import DeviceTrace, pause_in_triton_launches

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.recorder import Recorder

_spec = importlib.util.spec_from_file_location(
    "tiny_models", Path(__file__).parents[2] / "tiny_models.py"
)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

CONFIGS = {
    "defaults": {},
    "sampled estimator": {"estimator": "sampled", "sampled_depth": 1.0},
    "query estimator": {"estimator": "query"},
    "block means, one list a layer": {"estimator": "mean", "per_group": False},
    "row budget, no tiles": {"budget": "row", "query_block": 16},
    "streaming": {"method": "streaming"},
    "no walk": {"method": "nowalk"},
    "oracle": {"method": "oracle"},
    "xattention": {"method": "xattention"},
    "quest": {"method": "quest"},
    "reselect every step": {"decode_reselect": 1},
}
SELECTION = {  # a selection's host reads (test_engine_device_path.py says why)
    ("engine/method/select.py", "selection_from_mask"),
    ("kernels/take_best.py", "take_best_reference"),  # its topk's width
    ("engine/method/select.py", "row_budget_keep"),
    ("engine/method/select.py", "of"),
    ("engine/method/step.py", "of"),  # once a step, where the model hands over a mask (the chunk)
}
RECORDER = {  # the recorder's copies to the host and its scalar metrics
    ("engine/run/recorder.py", "_np"),
    ("engine/run/recorder.py", "_group_and_mean"),  # a layer's per-group scores, copied
    ("kernels/lists.py", "density"),  # a selection's achieved density
}


@pytest.fixture(autouse=True)
def _device_path(monkeypatch):
    from sketchwalk.engine.method import blockstats, score_basis, sketch

    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    for module in (sketch, score_basis, blockstats):
        monkeypatch.setattr(module, "all_on_host", lambda x: False)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recorded_steps_and_a_chunk_stay_on_the_device(name, monkeypatch):
    model = _fixtures.tiny_llama(layers=3, heads=4, kv_heads=2, head_dim=16)
    model.set_attn_implementation("sketch_walk")
    cfg = SketchWalkConfig(dense_layers=(0,), block_size=16, **CONFIGS[name])
    ids = torch.randint(1, 128, (1, 180), generator=torch.Generator().manual_seed(3))
    trace = DeviceTrace()
    pause_in_triton_launches(monkeypatch, [trace])
    rec = Recorder()
    trace.put([ids, *model.parameters(), *model.buffers()])
    with torch.no_grad(), sketch_walk_session(cfg, rec), trace:
        out = model(ids[:, :150], use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
        model(ids[:, 151:], past_key_values=out.past_key_values, use_cache=True)  # a chunk
    assert not trace.mixed, dict(trace.mixed)
    assert set(trace.reads) <= SELECTION | RECORDER, set(trace.reads) - SELECTION - RECORDER
    sparse = [r for r in rec.layers if not r.dense]
    assert {r.phase for r in sparse} == {"prefill", "decode"}  # a chunk is not recorded
    assert all(r.selected is not None and r.selected.dtype == bool for r in sparse)
    for r in sparse:
        assert r.exact is not None and r.mass_recall is not None and 0 <= r.mass_recall <= 1 + 1e-6
    if cfg.per_group:
        assert rec.group_layers  # one record per KV group of each sparse layer
