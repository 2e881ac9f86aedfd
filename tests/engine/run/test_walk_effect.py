"""Every recorded run shows the walk: its own scores, or the counterfactual walk's where the run
selected on A_l alone, and what the walk adds to and drops from the selection (engine/method/pipeline.py
walk_alternative, engine/run/recorder.py walk_change and walk_gain)."""

import torch
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.walk import COUNTERFACTUAL_BETA, walk
from sketchwalk.engine.run.recorder import Recorder
from sketchwalk.engine.run.runner import summarise_walk_effect

KNOBS = dict(block_size=16, dense_layers=(0,), density=0.3, query_samples=4, query_block=0)


def _record(model, ids, beta: float) -> Recorder:
    rec = Recorder()
    with torch.no_grad(), sketch_walk_session(SketchWalkConfig(beta=beta, **KNOBS), rec):
        model(ids)
    return rec


def _prefill(rec: Recorder, layer: int):
    return next(r for r in rec.layers if r.phase == "prefill" and r.layer == layer)


def test_a_run_without_the_walk_records_the_counterfactual_walk_and_its_effect():
    """At the first sparse layer both runs see the same A_l, so the counterfactual walk of the
    run without the walk must be the walking run's walk, and its added / dropped blocks exactly
    the difference of the two runs' selections there; a walking run reports the same effect
    from the other side."""
    model = tiny_llama(layers=3, heads=4, kv_heads=2, head_dim=16, seed=2)
    model.set_attn_implementation("sketch_walk")
    ids = torch.randint(1, 128, (1, 500), generator=torch.Generator().manual_seed(5))
    off, on = _record(model, ids, 0.0), _record(model, ids, COUNTERFACTUAL_BETA)
    first_off, first_on = _prefill(off, 1), _prefill(on, 1)
    assert first_off.walk is not None and first_off.sketch is not None
    assert not torch.allclose(torch.as_tensor(first_off.walk), torch.as_tensor(first_off.sketch))
    torch.testing.assert_close(torch.as_tensor(first_off.walk), torch.as_tensor(first_on.walk))
    want = walk(torch.as_tensor(first_off.sketch)[None], None, COUNTERFACTUAL_BETA, 3)[0]
    torch.testing.assert_close(torch.as_tensor(first_off.walk), want, atol=1e-5, rtol=1e-4)

    # per-group selections differ per group: compare the group records' masks summed over groups
    def groups(rec):
        g = [r for r in rec.group_layers if r.layer == 1 and r.phase.startswith("prefill")]
        return torch.stack([torch.as_tensor(r.selected) for r in g])

    without, with_walk = groups(off), groups(on)
    added = int((with_walk & ~without).sum())
    dropped = int((without & ~with_walk).sum())
    assert added + dropped > 0  # the walk changes this layer's selection
    eff_off = off.walk_effect[0]
    eff_on = on.walk_effect[0]
    assert eff_off["layer"] == eff_on["layer"] == 1
    assert (eff_off["added"], eff_off["dropped"], eff_off["used"]) == (added, dropped, False)
    assert (eff_on["added"], eff_on["dropped"], eff_on["used"]) == (added, dropped, True)
    assert eff_off["mass_gain"] is not None and abs(eff_off["mass_gain"]) <= 1.0
    assert eff_off["mass_gain"] == eff_on["mass_gain"]


def test_the_run_summary_says_whether_the_walk_selected():
    layers = [
        {"layer": 2, "used": False, "added": 3, "dropped": 2, "mass_gain": 0.01},
        {"layer": 3, "used": False, "added": 0, "dropped": 1, "mass_gain": None},
    ]
    s = summarise_walk_effect(layers, SketchWalkConfig())
    assert s["used"] is False and s["beta"] == COUNTERFACTUAL_BETA
    assert (s["added"], s["dropped"], s["mass_gain"]) == (3, 3, 0.01)
    assert summarise_walk_effect([], SketchWalkConfig()) is None
    on = summarise_walk_effect([{**layers[0], "used": True}], SketchWalkConfig(beta=0.4))
    assert on["used"] is True and on["beta"] == 0.4


def test_the_walk_effect_is_left_out_past_its_block_limit():
    """The counterfactual walk costs degree x n^3 a group: past RecorderOptions.walk_max_blocks
    a recorded run keeps no walk effect (and A_l is its walk record, as before)."""
    from sketchwalk.engine.run.recorder import RecorderOptions

    model = tiny_llama(layers=3, heads=4, kv_heads=2, head_dim=16, seed=2)
    model.set_attn_implementation("sketch_walk")
    ids = torch.randint(1, 128, (1, 500), generator=torch.Generator().manual_seed(5))
    rec = Recorder(RecorderOptions(walk_max_blocks=31))  # 500 tokens: 32 blocks of 16
    with torch.no_grad(), sketch_walk_session(SketchWalkConfig(beta=0.0, **KNOBS), rec):
        model(ids)
    assert rec.walk_effect == []
    first = _prefill(rec, 1)
    torch.testing.assert_close(torch.as_tensor(first.walk), torch.as_tensor(first.sketch))
    assert _record(model, ids, 0.0).walk_effect  # at the default limit it is there
