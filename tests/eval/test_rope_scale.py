"""--rope-scale: the model RoPE-scaled at load, for eval and frontier past its trained context."""

from __future__ import annotations

import json

import pytest
import torch

from sketchwalk.cli.main import main
from sketchwalk.engine.run.models import (
    ModelError,
    RopeScale,
    load_model,
    parse_rope_scale,
    scaled_config,
)


def test_parse_rope_scale():
    assert parse_rope_scale(None) is None and parse_rope_scale(" ") is None
    assert parse_rope_scale("4") == RopeScale("yarn", 4.0)
    assert parse_rope_scale("Linear:2.5") == RopeScale("linear", 2.5)
    assert parse_rope_scale("yarn:4").label == "yarn:4"
    for bad, words in [
        ("1", "must be in"),
        ("yarn:0.5", "must be in"),
        ("nan", "must be in"),
        ("yarn:65", "must be in"),
        ("ntk:4", "TYPE yarn or linear"),
        ("yarn:", "needs a number"),
        ("yarn:four", "needs a number"),
    ]:
        with pytest.raises(ModelError, match=words):
            parse_rope_scale(bad)


def test_scaled_config_sets_the_rope_parameters_and_the_context():
    from transformers import LlamaConfig  # after sketchwalk (sketchwalk/__init__.py)

    cfg = scaled_config(LlamaConfig(max_position_embeddings=8192), RopeScale("yarn", 4.0))
    assert cfg.max_position_embeddings == 32768
    p = cfg.rope_parameters
    assert p["rope_type"] == "yarn" and p["factor"] == 4.0
    assert p["original_max_position_embeddings"] == 8192
    cfg = scaled_config(LlamaConfig(max_position_embeddings=2048), RopeScale("linear", 2.0))
    assert cfg.max_position_embeddings == 4096 and cfg.rope_parameters["rope_type"] == "linear"
    with pytest.raises(ModelError, match="already scales RoPE"):
        scaled_config(cfg, RopeScale("linear", 2.0))


def test_load_model_scales_the_rotary_embedding(tiny_model):
    plain = load_model(tiny_model)
    lin = load_model(tiny_model, rope_scale=RopeScale("linear", 2.0))
    yarn = load_model(tiny_model, rope_scale=RopeScale("yarn", 4.0))
    assert (plain.max_context, lin.max_context, yarn.max_context) == (4096, 8192, 16384)
    assert lin.model_id.endswith("+rope-linear-x2") and plain.model_id == tiny_model
    f0, f1 = plain.model.model.rotary_emb.inv_freq, lin.model.model.rotary_emb.inv_freq
    assert torch.allclose(f1, f0 / 2)  # linear: every position divided by the factor
    fy = yarn.model.model.rotary_emb.inv_freq
    assert torch.allclose(fy[0], f0[0]) and torch.allclose(fy[-1], f0[-1] / 4)  # fast kept
    ids = torch.arange(100, 164)[None]
    with torch.no_grad():
        a, b = plain.model(ids).logits, lin.model(ids).logits
    assert not torch.allclose(a, b, atol=1e-4)  # the same weights, other positions


def test_frontier_rows_name_the_scaled_model(tiny_model, capsys):
    argv = ["frontier", "--model", tiny_model, "--lengths", "192", "--blocks", "32"]
    argv += ["--granularity", "group", "--methods", "sketchwalk", "--densities", "0.5"]
    argv += ["--dense-layers", "", "--rope-scale", "linear:2", "--no-store", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["method"] for r in rows} == {"oracle", "sketchwalk"}
    for r in rows:
        assert r["model_id"] == f"{tiny_model}+rope-linear-x2"
        assert r["extra"]["rope_scale"] == "linear:2" and r["kl_mean"] > 0


@pytest.mark.parametrize("command", ["frontier", "eval"])
@pytest.mark.parametrize("bad", ["cubic:2", "0.5", "x"])
def test_a_bad_rope_scale_is_one_line_and_exit_2(command, bad, capsys):
    assert main([command, "--rope-scale", bad, "--no-store"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sketchwalk: error: --rope-scale") and "\n" not in err
