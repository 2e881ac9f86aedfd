import pytest

from sketchwalk.engine.config import ConfigError, SketchWalkConfig
from sketchwalk.errors import SketchWalkError


def test_defaults_are_the_published_ones():
    c = SketchWalkConfig()
    assert (c.block_size, c.sketch_dim, c.degree, c.query_window) == (64, 128, 3, 32)
    assert (c.beta, c.sink, c.window, c.density) == (0.25, 0.025, 0.05, 0.2)
    assert c.dense_layers == (0, 1) and c.dense_tail_blocks == 4


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
    ],
)
def test_bad_knobs_give_one_line_errors(kw, words):
    with pytest.raises(ConfigError) as e:
        SketchWalkConfig(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, SketchWalkError)


def test_round_trip_dict_and_nowalk_switch():
    c = SketchWalkConfig(method="nowalk", dense_layers=[3], density=0.3)
    assert SketchWalkConfig.from_dict(c.to_dict()) == c
    assert c.effective_beta == 0.0 and SketchWalkConfig().effective_beta == 0.25
    with pytest.raises(ConfigError):
        SketchWalkConfig.from_dict({"densty": 0.1})
