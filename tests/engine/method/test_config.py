import pytest

from sketchwalk.engine.method.config import (
    LEGACY,
    PRESET_NOTES,
    PRESETS,
    SketchWalkConfig,
    knobs,
    preset,
    presets_help,
)
from sketchwalk.errors import ConfigError, SketchWalkError


def test_the_paper_preset_is_the_published_configuration():
    c = preset("paper")
    assert (c.block_size, c.sketch_dim, c.degree, c.query_window) == (64, 128, 3, 32)
    assert (c.beta, c.sink, c.window, c.density) == (0.25, 0.025, 0.05, 0.2)
    assert c.dense_layers == (0, 1) and c.dense_tail_blocks == 4
    assert (c.per_group, c.budget, c.sink_blocks, c.window_blocks) == (False, "row", 0, 0)
    assert preset("paper", density=0.3).density == 0.3
    assert (c.estimator, c.sampled_depth, c.query_samples) == ("mean", 0.0, 0)
    assert preset("default") == SketchWalkConfig()
    fid = preset("fidelity")  # every query scored
    assert (fid.block_size, fid.estimator, fid.query_samples, fid.beta) == (16, "sampled", 0, 0.0)
    assert all(fid.at_depth(layer, 30) is fid for layer in range(30))
    d = SketchWalkConfig()
    assert (d.block_size, d.query_block, d.estimator, d.query_samples, d.score_rank, d.beta) == (
        16, 64, "sampled", 8, 0, 0.0,
    )  # fmt: skip
    assert all(d.at_depth(layer, 30) is d for layer in range(30))  # sampled in every layer
    lean = preset("lean")  # the defaults until 2026-12-06, as measured
    assert (lean.block_size, lean.query_block, lean.query_samples, lean.score_rank) == (
        32, 64, 4, 24,
    )  # fmt: skip
    assert [lean.at_depth(layer, 30).estimator for layer in (0, 20, 21, 29)] == [
        "sampled", "sampled", "mean", "mean",
    ]  # fmt: skip
    gpu = preset("gpu")  # as measured, whatever the defaults
    assert (gpu.block_size, gpu.query_block, gpu.estimator, gpu.query_samples, gpu.score_rank) == (
        32, 128, "sampled", 4, 24,
    )  # fmt: skip
    fast = preset("fast")
    assert (fast.block_size, fast.estimator, fast.per_group, fast.budget) == (
        64,
        "mean",
        True,
        "layer",
    )
    assert (fast.sampled_depth, fast.beta) == (0.0, 0.25)  # as measured, whatever the defaults


@pytest.mark.parametrize("depth, n_layers", [(0.0, 30), (0.35, 30), (0.5, 4), (1.0, 7), (0.35, 0)])
def test_sampled_depth_gives_the_first_layers_the_sampled_estimator(depth, n_layers):
    cfg = SketchWalkConfig(estimator="mean", query_samples=2, sampled_depth=depth)
    for layer in range(max(n_layers, 3)):
        at = cfg.at_depth(layer, n_layers)
        if layer < depth * n_layers:
            assert at == cfg.with_(estimator="sampled")
        else:
            assert at is cfg
    sampled = cfg.with_(estimator="sampled")
    assert sampled.at_depth(0, 30) is sampled
    with pytest.raises(ConfigError, match="sampled depth"):
        SketchWalkConfig(sampled_depth=1.5)


def test_every_preset_says_what_it_is_for():
    assert set(PRESET_NOTES) == set(PRESETS)
    line = presets_help()
    assert all(f"{name}: {note}" in line for name, note in PRESET_NOTES.items())


def test_every_knob_is_declared_with_help_and_presets_name_only_knobs():
    declared = {f.name for f, _ in knobs()}
    # not knobs: free-form extras, and the per-group densities the session sets for one layer
    internal = {"extra", "group_density"}
    assert declared == {f for f in SketchWalkConfig.__dataclass_fields__ if f not in internal}
    assert "group_density" not in SketchWalkConfig().to_dict()  # never stored with a run
    assert all(k.help and k.group in ("basic", "advanced") for _, k in knobs())
    for values in PRESETS.values():
        assert set(values) <= declared
    assert set(LEGACY) <= declared
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("turbo")


def test_stored_configs_of_older_versions_keep_their_behaviour():
    old = preset("paper").to_dict()
    for name in LEGACY:
        old.pop(name)
    c = SketchWalkConfig.from_stored(old)
    assert (c.budget, c.sink_blocks, c.window_blocks) == ("row", 0, 0)
    assert SketchWalkConfig.from_stored(SketchWalkConfig().to_dict()) == SketchWalkConfig()


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"density": float("nan")}, "density"),
        ({"block_size": 48}, "power of two"),
        ({"block_size": 0}, "power of two"),
        ({"sketch_dim": 0}, "sketch dim"),
        ({"beta": -0.1}, "beta"),
        ({"degree": 0}, "degree"),
        ({"tau": 0.0}, "tau"),
        ({"sink": 2.0}, "sink"),
        ({"method": "magic"}, "method"),
        ({"phases": "train"}, "phase"),
        ({"dense_layers": (-1,)}, "dense layers"),
        ({"budget": "global"}, "budget"),
        ({"sink_blocks": -1}, "sink blocks"),
        ({"per_group": "yes"}, "per group"),
        ({"block_size": 2.0}, "block size"),
        ({"query_block": 48}, "query block"),
        ({"query_block": -64}, "query block"),
        ({"score_dtype": "float8"}, "score dtype"),
    ],
)
def test_bad_knobs_give_one_line_errors(kw, words):
    with pytest.raises(ConfigError) as e:
        SketchWalkConfig(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, SketchWalkError)


def test_round_trip_dict_and_nowalk_switch():
    c = SketchWalkConfig(method="nowalk", dense_layers=[3], density=0.3, beta=0.25)
    assert SketchWalkConfig.from_dict(c.to_dict()) == c
    assert c.effective_beta == 0.0 and c.with_(method="sketchwalk").effective_beta == 0.25
    assert preset("fast").effective_beta == 0.25 and SketchWalkConfig().effective_beta == 0.0
    assert SketchWalkConfig.from_dict(SketchWalkConfig(per_group=False).to_dict()).groups(3) == 1
    with pytest.raises(ConfigError):
        SketchWalkConfig.from_dict({"densty": 0.1})


def test_query_block_counts_rows_per_list():
    assert SketchWalkConfig(query_block=0).rows_per_list == 1
    assert SketchWalkConfig(block_size=16, query_block=64).rows_per_list == 4
    assert SketchWalkConfig(block_size=64, query_block=64).rows_per_list == 1
    assert SketchWalkConfig(block_size=128, query_block=64).rows_per_list == 1
    assert SketchWalkConfig(block_size=16, query_block=64, budget="row").rows_per_list == 1


@pytest.mark.parametrize("bad", [(0.2, 0.0), (0.2, 1.5), (float("nan"),), "ab", 3])
def test_group_densities_are_checked_like_knobs(bad):
    with pytest.raises(ConfigError, match="group densities"):
        SketchWalkConfig(group_density=bad)


def test_group_densities_are_what_a_layer_spends():
    assert SketchWalkConfig(density=0.3).rates == 0.3
    assert SketchWalkConfig(density=0.3, group_density=(0.2, 0.4)).rates == (0.2, 0.4)
