"""`sketchwalk run`: JSON output, storage, and one-line errors that write nothing."""

import json

import pytest

from sketchwalk.cli.main import main

PROMPT = "Sketch and walk over blocks of tokens, layer after layer. " * 6


def test_run_json_on_tiny_model_is_stored(tiny_model_dir, tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    rc = main(
        [
            "run",
            PROMPT,
            "--model",
            str(tiny_model_dir),
            "--block-size",
            "16",
            "--max-new-tokens",
            "4",
            "--db",
            str(db),
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "run_id",
        "model",
        "prompt_tokens",
        "method",
        "density_target",
        "density_achieved",
        "top1_agreement",
        "kl_mean",
        "ppl_dense",
        "ppl_sparse",
        "dense_text",
        "sparse_text",
        "timings",
    ):
        assert key in out
    assert out["run_id"] and out["density_target"] == 0.2
    assert out["time_only"] is False and out["layer_records"] > 0
    speed = out["speed"]  # a recorded run also times a clean pass, and says what recording cost
    assert set(speed["clean"]) == {
        "prefill_whole_model",
        "prefill_attention_alone",
        "decode_whole_model",
        "decode_attention_alone",
    }
    assert speed["run_passes_recorded"] is True
    assert "prefill_ms" in speed["recording_overhead"]
    ceiling = speed["ceiling"]["prefill"]  # at the achieved density: at most 1/density
    assert ceiling["density"] == out["density_achieved"]
    assert 1.0 <= ceiling["at_density"] <= ceiling["attention_free"]
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        runs = store.list_runs()
        assert (
            list(runs["id"]) == [out["run_id"]] and store.get_run(out["run_id"])["status"] == "done"
        )


def test_run_says_how_its_layer_profile_spread_the_density(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from transformers import AutoConfig

    from sketchwalk.cli.run import profile_line
    from sketchwalk.engine.method.layer_profile import LayerProfile, fingerprint, save

    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    model_config = AutoConfig.from_pretrained(tiny_model_dir)
    groups = model_config.num_key_value_heads
    layers = range(2, model_config.num_hidden_layers)
    shares = {i: tuple((0.1 + 0.1 * g,) for g in range(groups)) for i in layers}
    save(LayerProfile(fingerprint(model_config), (0.2,), shares, "test"))
    argv = ["run", PROMPT, "--model", str(tiny_model_dir), "--block-size", "16"]
    argv += ["--max-new-tokens", "2", "--no-store", "--no-record"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = {str(i): pytest.approx([g[0] for g in s]) for i, s in shares.items()}
    assert out["layer_densities"] == want
    assert main(argv) == 0
    text = capsys.readouterr().out
    top = 0.1 + 0.1 * (groups - 1)
    assert (
        f"layer profile  {len(layers)} sparse layers x {groups} groups, shares 0.100-{top:.3f}"
        in text
    )
    assert main([*argv, "--layer-profile", "uniform"]) == 0
    assert "layer profile  none: every sparse layer at the target" in capsys.readouterr().out
    assert (
        profile_line(None)
        == profile_line({})
        == "layer profile  none: every sparse layer at the target"
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", ""], "empty"),
        (["run", "x", "--density", "0"], "density"),
        (["run", "x", "--block-size", "48"], "power of two"),
        (["run", "x", "--sketch-dim", "0"], "sketch dim"),
        (["run", "--prompt-file", "/no/such/file"], "cannot read prompt file"),
        (["run", "x", "--time-only", "--no-clean-timing"], "always times a clean pass"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(argv, words, tiny_model_dir, tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    rc = main(argv + ["--model", str(tiny_model_dir), "--db", str(db)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0]
    if db.exists():
        from sketchwalk.store import open_store

        with open_store(str(db)) as store:
            assert len(store.list_runs()) == 0


def test_a_prompt_shorter_than_a_block_runs_dense_and_says_so(tiny_model_dir, tmp_path, capsys):
    """Nothing can be sparse in one block: the run goes ahead, every layer keeps all of it, one
    line says so, and the stored run has density 1.0."""
    db = tmp_path / "runs.duckdb"
    argv = ["run", "Hello there", "--model", str(tiny_model_dir), "--db", str(db)]
    assert main([*argv, "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "note  the prompt (2 tokens) fits in one block of 16" in out
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        runs = store.list_runs()
        assert runs["status"].tolist() == ["done"]
        assert store.get_run(runs["id"].iloc[0])["metrics"]["density_achieved"] == 1.0
    assert main([*argv, "--max-new-tokens", "3", "--block-size", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["note"] is None


def test_every_knob_has_a_flag_and_presets_are_the_base(capsys):
    """The flags are generated from the knob declarations: a new knob needs no CLI edit."""
    import argparse

    from sketchwalk.cli.knobs import add_config_args, config_from_args
    from sketchwalk.engine.method.config import knobs, preset

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    for f, k in knobs():
        assert "--" + (k.flag or f.name).replace("_", "-") in help_text
    assert "--per-group" in help_text and "--query-window" in help_text

    p = argparse.ArgumentParser()
    add_config_args(p)
    assert config_from_args(p.parse_args([])) == preset("default")
    paper = config_from_args(p.parse_args(["--preset", "paper", "--density", "0.3"]))
    assert paper == preset("paper", density=0.3)
    cfg = config_from_args(p.parse_args(["--no-per-group", "--dense-layers", "", "--beta", "0"]))
    assert (cfg.per_group, cfg.dense_layers, cfg.beta) == (False, (), 0.0)


@pytest.mark.parametrize("flag", ["--time-only", "--no-record"])
def test_time_only_stores_the_run_and_its_timings_but_no_layer_records(
    flag, tiny_model_dir, tmp_path, capsys
):
    db = tmp_path / "runs.duckdb"
    argv = ["run", PROMPT, "--model", str(tiny_model_dir), "--block-size", "16"]
    rc = main(argv + ["--max-new-tokens", "2", "--db", str(db), flag])
    assert rc == 0
    out = capsys.readouterr().out
    assert "speed, clean pass (dense -> sparse): prefill whole model" in out
    assert "speed, time-only pass (no recorder)" in out and "recording overhead" not in out
    assert "time-only run: no per-layer records were kept" in out
    assert "ceiling at this length: attention is" in out  # what the length allows at all
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        (run_id,) = store.run_ids()
        run = store.get_run(run_id)
        assert run["status"] == "done" and run["request"]["time_only"] is True
        assert store.layer_stats(run_id).empty
        assert run["timings"]["clean_sparse_prefill_ms"] > 0 and run["sparse_text"] is not None
