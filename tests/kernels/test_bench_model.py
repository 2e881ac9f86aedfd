"""`sketchwalk bench model` on the tiny model: fields, ratios, errors, JSON (no timed assertions)."""

from __future__ import annotations

import json

import pytest

from sketchwalk.benchmarks.model import prompt_ids
from sketchwalk.cli.main import main

KEYS = {
    "seq_len", "density", "block_size", "dense_prefill_ms", "sparse_prefill_ms",
    "prefill_speedup", "dense_decode_ms", "sparse_decode_ms", "decode_speedup",
    "sparse_stages_ms", "same_first_token", "model", "dtype",
}  # fmt: skip


def test_prompt_ids_repeats_short_text():
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            class R:
                input_ids = [ord(c) for c in text]

            return R()

    ids = prompt_ids(Tok(), "abc", 7)
    assert ids.tolist() == [[97, 98, 99, 97, 98, 99, 97]]


def test_cli_json_on_tiny_model(tiny_model, tmp_path, capsys):
    text = tmp_path / "p.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    argv = ["bench", "model", "--model", tiny_model, "--seq-len", "150", "200"]
    argv += ["--block-size", "16", "--new-tokens", "3", "--repeats", "2", "--decode-reselect", "0"]
    assert main([*argv, "--prompt-file", str(text), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["seq_len"] for r in rows] == [150, 200]
    for r in rows:
        assert r.keys() >= KEYS and r["block_size"] == 16 and r["decode_reselect"] == 0
        assert r["machine"]["score_dtype"] in ("float32", "bfloat16") and r["machine"]["cores"]
        assert r["prefill_speedup"] == pytest.approx(
            r["dense_prefill_ms"] / r["sparse_prefill_ms"], rel=2e-2
        )
        stages = r["sparse_stages_ms"]
        assert {"prefill_attention", "decode_attention", "prefill_sketch"} <= stages.keys()
        assert r["dense_stages_ms"].keys() == {"prefill_attention", "decode_attention"}
        assert 0 < r["dense_stages_ms"]["prefill_attention"] < r["dense_prefill_ms"]
        share = r["dense_stages_ms"]["prefill_attention"] / r["dense_prefill_ms"]
        ceiling = 1 / (1 - share * (1 - r["density"]))  # Amdahl at the run's density
        assert r["prefill_ceiling"] == pytest.approx(ceiling, rel=2e-2)  # rows are rounded
        assert 1 <= r["decode_ceiling"] <= 1 / r["density"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--density", "0"], "density must be in (0, 1]"),
        (["--repeats", "0"], "--repeats must be in 1..10000, got 0"),
        (["--new-tokens", "-1"], "--new-tokens must be in 0..65536, got -1"),
        (["--decode-reselect", "-2"], "decode reselect must be >= 0"),
        (["--seq-len", "0"], "--seq-len must be in 1..2097152, got 0"),
        (["--prompt-file", "/nonexistent/x"], "cannot read prompt file"),
        (["--block-size", "48"], "block size must be a positive power of two"),
        (["--seq-len", "5000"], "exceed"),
        (["--seq-len", "8", "--block-size", "16"], "shorter than one block"),
    ],
)
def test_bad_input_is_one_line(tiny_model, extra, message, capsys):
    assert main(["bench", "model", "--model", tiny_model, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_decode_is_the_mean_step_with_the_median_beside_it(monkeypatch):
    """A re-selecting step every few tokens costs a multiple of the others: the reported decode
    time is what a generation pays (the mean step), not the median that leaves it out."""
    import torch

    from sketchwalk.benchmarks import model as bench
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.run.timing import Pass

    def fake(model, ids, new_tokens, cfg, all_logits, backend=None):
        steps = [10.0] * 4 if cfg is None else [4.0, 4.0, 4.0, 28.0]  # one slow re-selection
        stages = {"prefill_attention": 1.0, "decode_attention": 1.0}
        return Pass(100.0, steps, stages, 0)

    class Tok:
        def __call__(self, text, add_special_tokens=False):
            class R:
                input_ids = list(range(50))

            return R()

    monkeypatch.setattr(bench, "run_variant", fake)
    net = torch.nn.Linear(1, 1)
    (row,) = bench.run_model_bench(net, Tok(), "x", [32], SketchWalkConfig(), 4, 2)
    assert row["sparse_decode_ms"] == 10.0 and row["dense_decode_ms"] == 10.0
    assert row["decode_speedup"] == 1.0
    assert row["sparse_decode_median_ms"] == 4.0 and row["dense_decode_median_ms"] == 10.0
    assert row["sparse_decode_worst_ms"] == 28.0  # the slowest step after the first
    assert "1.00" in bench.format_table([row]) and "2.50" in bench.format_table([row])


def test_random_weights_rows_say_so_and_run_the_sparse_layers(capsys):
    argv = ["bench", "model", "--random-weights", "tiny", "--layers", "3", "--seq-len", "200"]
    argv += ["--block-size", "16", "--new-tokens", "2", "--repeats", "1", "--json"]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row.keys() >= KEYS and row["seq_len"] == 200 and row["block_size"] == 16
    assert row["random_weights"] is True and row["model"] == "random:tiny"
    assert row["shape"] == "tiny" and row["layers"] == 3 and row["dtype"] == "float32"
    # layers 0 and 1 are the defaults' dense layers: the third one selects
    assert {"prefill_sketch", "prefill_attention"} <= row["sparse_stages_ms"].keys()
    assert row["dense_prefill_ms"] > 0 and row["sparse_prefill_ms"] > 0


def test_real_model_rows_are_not_random(tiny_model, capsys):
    argv = ["bench", "model", "--model", tiny_model, "--seq-len", "64", "--block-size", "16"]
    assert main([*argv, "--new-tokens", "1", "--repeats", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["random_weights"] is False and "shape" not in row and "layers" not in row


def test_random_model_is_seeded_shaped_and_leaves_the_default_dtype():
    import torch

    from sketchwalk.benchmarks.random_model import (
        MODEL_SHAPES,
        build_random_model,
        random_token_ids,
    )

    a = build_random_model("tiny", 2, torch.bfloat16)
    b = build_random_model("tiny", 2, torch.bfloat16)
    c = build_random_model("tiny", 2, torch.bfloat16, seed=1)
    assert torch.get_default_dtype() == torch.float32
    pa, pb, pc = (list(m.model.parameters()) for m in (a, b, c))
    assert all(x.dtype == torch.bfloat16 for x in pa)
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc, strict=True))
    cfg, shape = a.model.config, MODEL_SHAPES["tiny"]
    assert a.layers == cfg.num_hidden_layers == len(a.model.model.layers) == 2
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (shape.heads, shape.kv_heads)
    assert cfg._attn_implementation == "sdpa"
    assert build_random_model("tiny").layers == shape.layers
    llama = MODEL_SHAPES["llama3-8b"]
    assert llama.hidden // llama.heads == 128 and llama.heads // llama.kv_heads == 4
    ids = random_token_ids(shape.vocab, 300, torch.device("cpu"))
    assert ids.shape == (1, 300) and int(ids.min()) >= 0 and int(ids.max()) < shape.vocab
    assert torch.equal(ids, random_token_ids(shape.vocab, 300, torch.device("cpu")))


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--random-weights", "gpt-5"], "unknown random-weights shape 'gpt-5'; choose from"),
        (["--random-weights", "tiny", "--layers", "0"], "--layers must be in 1..1024, got 0"),
        (["--random-weights", "tiny", "--model", "x"], "give --model or --random-weights"),
        (["--layers", "2"], "--layers applies to --random-weights only"),
        (["--random-weights", "tiny", "--seq-len", "262144"], "exceed random:tiny's context"),
        (["--random-weights", "tiny", "--seq-len", "8"], "shorter than one block"),
    ],
)
def test_random_weights_bad_input_is_one_line(extra, message, capsys):
    assert main(["bench", "model", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
