"""Layer profiles: the cross-layer allocation against a brute-force one, reading a profile at any
target, untrusted profile files, finding a model's profile, and runs that follow it."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import tiny_llama

from sketchwalk.engine.hf.session import sketch_walk_session
from sketchwalk.engine.method.config import LEGACY, SketchWalkConfig, preset
from sketchwalk.engine.method.layer_profile import (
    SHIPPED,
    TARGETS,
    LayerProfile,
    ProfileError,
    allocate,
    find,
    fingerprint,
    layer_densities,
    load,
    save,
)
from sketchwalk.engine.method.select import Offers
from sketchwalk.engine.run.recorder import RecorderOptions
from sketchwalk.eval.calibrate import calibrate


def _offers(gen: torch.Generator, groups: int, items: int, cand: int, forced: int) -> Offers:
    value = torch.rand(1, groups, items, generator=gen) ** 4  # a few items hold most mass
    cost = torch.randint(1, 5, (1, items), generator=gen).float()
    value[..., :3] = float("-inf")  # items that cost nothing (forced or not causal)
    return Offers(value, cost, torch.tensor([forced]), torch.tensor([cand]))


def _brute(offers: dict[int, Offers], t: float) -> dict[tuple[int, int], float]:
    """Greedy over every (layer, group, item), one at a time, best value first."""
    items = []
    for li, o in offers.items():
        for g in range(o.value.shape[1]):
            for i in range(o.value.shape[2]):
                v = float(o.value[0, g, i])
                if v > float("-inf"):
                    items.append((-v, li, g, i, float(o.cost[0, i])))
    room = sum((t * float(o.candidates[0]) - float(o.forced[0])) * o.value.shape[1]
               for o in offers.values())  # fmt: skip
    spent, bought = 0.0, {}
    for _, li, g, _, c in sorted(items):
        if spent + c > room:
            break
        spent += c
        bought[li, g] = bought.get((li, g), 0.0) + c
    return {
        (li, g): (float(o.forced[0]) + bought.get((li, g), 0.0)) / float(o.candidates[0])
        for li, o in offers.items()
        for g in range(o.value.shape[1])
    }


@pytest.mark.parametrize("seed", range(6))
def test_allocate_matches_a_brute_force_greedy_and_keeps_the_mean(seed):
    gen = torch.Generator().manual_seed(seed)
    offers = {
        li: _offers(gen, groups=2, items=40, cand=60, forced=int(torch.randint(3, 9, (1,))))
        for li in (2, 3, 5)
    }
    got = allocate(offers, targets=(0.2, 0.35, 0.5))
    assert sorted(got) == [2, 3, 5] and all(len(got[li]) == 2 for li in got)
    for k, t in enumerate((0.2, 0.35, 0.5)):
        want = _brute(offers, t)
        for (li, g), d in want.items():
            assert got[li][g][k] == pytest.approx(d, abs=1e-9)
            assert got[li][g][k] >= float(offers[li].forced[0]) / 60 - 1e-9  # forced always kept
        mean = sum(want.values()) / len(want)
        assert t - 4 / 60 <= mean <= t + 1e-9  # never over; short by less than one item


def _profile(**rows) -> LayerProfile:
    dens = {int(k[1:]): tuple(v) for k, v in rows.items()}
    return LayerProfile("fp", (0.1, 0.2, 0.4), dens, "test")


TWO = {"l2": [(0.15, 0.3, 0.5), (0.05, 0.1, 0.3)], "l3": [(0.05, 0.1, 0.3), (0.15, 0.3, 0.5)]}


@settings(max_examples=60, deadline=None)
@given(t=st.floats(min_value=1e-4, max_value=1.0))
def test_a_profile_read_at_any_target_keeps_its_mean_and_range(t):
    p = _profile(**TWO)  # means 0.1, 0.2, 0.4
    got = p.at(t)
    assert sorted(got) == [2, 3]
    flat = [v for groups in got.values() for v in groups]
    assert len(flat) == 4 and all(0.0 < v <= 1.0 for v in flat)
    assert sum(flat) / 4 == pytest.approx(t, abs=1e-6)


def test_a_profile_at_a_grid_target_is_its_row_and_moves_monotonically():
    p = _profile(**TWO)
    assert p.at(0.2) == {2: (0.3, 0.1), 3: (0.1, 0.3)}
    assert p.at(0.3) == {2: pytest.approx((0.4, 0.2)), 3: pytest.approx((0.2, 0.4))}
    assert p.at(1.0) == {2: (1.0, 1.0), 3: (1.0, 1.0)}
    lows = [p.at(t)[3][0] for t in (0.01, 0.1, 0.15, 0.2, 0.3, 0.4, 0.7, 1.0)]
    assert lows == sorted(lows)


def test_a_profile_round_trips_through_its_file(tmp_path):
    p = _profile(**TWO)
    path = save(p, tmp_path / "p.json")
    assert load(path) == p
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(format=2),
        lambda d: d.pop("fingerprint"),
        lambda d: d.update(targets=[0.2, 0.1, 0.4]),
        lambda d: d.update(targets=[0.1, 0.2, 1.5]),
        lambda d: d.update(targets="0.2"),
        lambda d: d.update(densities={}),
        lambda d: d.update(densities={"two": [[0.1, 0.2, 0.3]]}),
        lambda d: d.update(densities={"2": [0.1, 0.2, 0.3]}),
        lambda d: d.update(densities={"2": []}),
        lambda d: d.update(densities={"2": [[0.1, 0.2]]}),
        lambda d: d.update(densities={"2": [[0.1, 0.0, 0.3]]}),
        lambda d: d.update(densities={"2": [[0.1, float("nan"), 0.3]]}),
        lambda d: d.update(densities={"2": [[0.1, True, 0.3]]}),
    ],
)
def test_a_bad_profile_file_is_one_line_error(tmp_path, mutate):
    d = _profile(**TWO).to_json()
    mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError) as err:
        load(path)
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_json_is_one_line_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(ProfileError):
        load(path)
    path.write_text("{nope")
    with pytest.raises(ProfileError, match="not JSON"):
        load(path)


def test_the_users_profile_comes_before_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    shipped = sorted(SHIPPED.glob("*.json"))
    assert shipped, "a profile ships for the default model"
    fp = shipped[0].stem
    assert find(fp) == load(shipped[0])
    mine = LayerProfile(fp, (0.2,), {2: ((0.2,),)}, "mine")
    save(mine)
    assert find(fp) == mine
    assert find("no-such-architecture") is None


def test_the_default_model_finds_its_shipped_profile():
    from transformers import AutoConfig

    from sketchwalk.engine.run.models import convert_default

    path, _ = convert_default()
    fp = fingerprint(AutoConfig.from_pretrained(path))
    profile = load(SHIPPED / f"{fp}.json")
    assert sorted(profile.densities) == list(range(2, 30))  # every sparse layer of the defaults
    assert profile.targets == TARGETS
    flat = [v for groups in profile.at(0.2).values() for v in groups]
    assert len(flat) == 28 * 3  # one share per KV head
    assert sum(flat) / len(flat) == pytest.approx(0.2, abs=1e-3)
    assert max(flat) > 0.3 and min(flat) < 0.13  # not uniform


def test_layer_densities_respect_the_knob_and_the_runs_dense_layers(tmp_path, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    model = tiny_llama(layers=3)
    shares = {1: ((0.3,), (0.2,)), 2: ((0.1,), (0.2,))}  # tiny_llama: 2 KV heads
    save(LayerProfile(fingerprint(model.config), (0.2,), shares, "t"))
    auto = SketchWalkConfig(dense_layers=(0,))
    assert layer_densities(auto, model.config) == {1: (0.3, 0.2), 2: (0.1, 0.2)}
    assert layer_densities(auto.with_(dense_layers=(0, 1)), model.config) == {2: (0.1, 0.2)}
    one = layer_densities(auto.with_(per_group=False), model.config)  # one selection per layer
    assert one == {1: (pytest.approx(0.25),), 2: (pytest.approx(0.15),)}
    assert layer_densities(auto.with_(layer_profile="uniform"), model.config) == {}
    assert layer_densities(auto, None) == {}
    assert preset("paper").layer_profile == "uniform"
    assert SketchWalkConfig.from_stored({}).layer_profile == LEGACY["layer_profile"] == "uniform"


class _Densities:
    """Recorder stand-in: each prefill layer's achieved selection density."""

    options = RecorderOptions(time_dense=False)

    def __init__(self):
        self.by_layer: dict[int, float] = {}

    def observes(self, phase):
        return phase == "prefill"

    def wants_exact(self, lk):
        return False

    def record(self, obs):
        if obs.plan is not None and obs.plan.selection is not None:
            self.by_layer[obs.layer] = obs.plan.selection.density


def _prefill(model, cfg, ids):
    rec = _Densities()
    model.set_attn_implementation("sketch_walk")
    with torch.no_grad(), sketch_walk_session(cfg, rec) as s:
        model(ids)
    return rec.by_layer, s.density("prefill")


def test_a_run_follows_the_models_profile_at_the_same_mean(tmp_path, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    model = tiny_llama(layers=3)
    ids = torch.randint(1, 128, (1, 512), generator=torch.Generator().manual_seed(3))
    # 16-token blocks: at 32 the forced blocks of 16 rows alone exceed the 0.2 share
    cfg = SketchWalkConfig(density=0.3, dense_layers=(0,), query_block=0, block_size=16)
    shares = {1: ((0.45,), (0.35,)), 2: ((0.2,), (0.2,))}
    save(LayerProfile(fingerprint(model.config), (0.3,), shares, "t"))
    auto, mean_auto = _prefill(model, cfg, ids)
    uniform, mean_uniform = _prefill(model, cfg.with_(layer_profile="uniform"), ids)
    assert auto[1] == pytest.approx(0.4, abs=0.02) and auto[2] == pytest.approx(0.2, abs=0.02)
    assert uniform[1] == pytest.approx(0.3, abs=0.02) == uniform[2]
    assert mean_auto == pytest.approx(0.3, abs=0.02) and mean_uniform == pytest.approx(
        0.3, abs=0.02
    )


def test_calibrating_a_tiny_model_gives_a_profile_its_runs_find(tmp_path, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    model = tiny_llama(layers=4)
    ids = torch.randint(1, 128, (1, 1024), generator=torch.Generator().manual_seed(4))
    cfg = SketchWalkConfig(dense_layers=(0,))
    profile = calibrate(model, ids, cfg, "random tokens")
    assert profile.fingerprint == fingerprint(model.config)
    assert sorted(profile.densities) == [1, 2, 3]
    for i, t in enumerate(profile.targets):
        row = [g[i] for groups in profile.densities.values() for g in groups]
        assert all(0.0 < v <= 1.0 for v in row)
        assert sum(row) / len(row) <= t + 1e-9 or min(row) > t  # over only where forced
    assert model.config._attn_implementation != "sketch_walk"  # put back as it was
    save(profile)
    assert find(profile.fingerprint) == load(tmp_path / f"{profile.fingerprint}.json")
    by_layer, mean = _prefill(model, cfg.with_(density=0.3), ids)
    assert sorted(by_layer) == [1, 2, 3]
    assert mean == pytest.approx(0.3, abs=0.03)


def test_calibration_ranks_the_exact_mass_pooled_as_the_selection_pools(monkeypatch):
    """The offers come from the exact mass pooled like the config (max: the largest mass over a
    block's queries and a group's heads), so the two poolings give different profiles."""
    import sketchwalk.eval.calibrate as cal

    seen = []
    real = cal.tile_offers

    def spy(exact, cand, forced, gid, pool="mean"):
        seen.append((exact, pool))
        return real(exact, cand, forced, gid, pool)

    monkeypatch.setattr(cal, "tile_offers", spy)
    model = tiny_llama(layers=3)
    ids = torch.randint(1, 128, (1, 512), generator=torch.Generator().manual_seed(5))
    profiles = {}
    for pool in ("mean", "max"):
        seen.clear()
        profiles[pool] = calibrate(model, ids, SketchWalkConfig(dense_layers=(0,), pool=pool))
        assert [p for _, p in seen] == [pool, pool]  # layers 1 and 2
        for exact, _ in seen:
            rows = exact.sum(-1)  # both poolings give rows that sum to 1 where a row sees keys
            assert torch.allclose(rows[rows > 0], torch.ones(1), atol=1e-5)
    assert profiles["mean"].densities != profiles["max"].densities


def test_calibrate_refuses_what_it_cannot_calibrate():
    from sketchwalk.errors import SketchWalkError

    model = tiny_llama(layers=2)
    ids = torch.randint(1, 128, (1, 256))
    with pytest.raises(SketchWalkError, match="method dense"):
        calibrate(model, ids, SketchWalkConfig(method="dense"))
    with pytest.raises(SketchWalkError, match="at least"):
        calibrate(model, ids[:, :20], SketchWalkConfig())
    with pytest.raises(SketchWalkError, match="every layer is dense"):
        calibrate(model, ids, SketchWalkConfig(dense_layers=(0, 1)))
