"""The GPU preset: chosen by the run's device when no preset is named, runnable by the Triton
kernels, and its knobs are the ones docs/quality.md measured (issue #41 part 3)."""

from __future__ import annotations

import argparse

import pytest

from sketchwalk.cli.knobs import add_config_args, config_from_args
from sketchwalk.engine.method.config import PRESETS, device_preset, preset
from sketchwalk.kernels import limits_error


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    add_config_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "device, name",
    [("cuda", "gpu"), ("cuda:1", "gpu"), ("cpu", "default"), (None, "default"), ("mps", "default")],
)
def test_the_device_picks_the_preset(device, name):
    assert device_preset(device) == name


def test_a_cuda_run_without_a_preset_starts_from_the_gpu_preset():
    assert config_from_args(_args("--device", "cuda")) == preset("gpu")
    assert config_from_args(_args("--device", "cpu")) == preset("default")
    assert config_from_args(_args()) == preset("default")  # a command without --device
    # a named preset wins over the device, and flags still change it
    assert config_from_args(_args("--device", "cuda", "--preset", "default")) == preset("default")
    cfg = config_from_args(_args("--device", "cuda", "--density", "0.1"))
    assert cfg == preset("gpu", density=0.1)


def test_the_gpu_preset_runs_on_the_triton_kernels_in_wide_tiles():
    cfg = preset("gpu")
    assert cfg != preset("default") and "gpu" in PRESETS
    for dtype in ("bfloat16", "float16"):
        assert limits_error("cuda", cfg.block_size, dtype) is None
    # one list per 128 query rows: the Hopper table's BLOCK_M at head dim 64 is not cut down
    assert cfg.query_block == 128 and cfg.rows_per_list * cfg.block_size == 128
    # the sampled estimator in every layer (docs/quality.md)
    assert all(cfg.at_depth(layer, 30).estimator == "sampled" for layer in range(30))
