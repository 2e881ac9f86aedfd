"""`sketchwalk calibrate`: writes a profile runs then find; bad input is one line, writes nothing."""

from __future__ import annotations

import pytest

from sketchwalk.cli.main import main
from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.method.layer_profile import load


def test_calibrate_writes_a_profile_for_the_models_architecture(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path / "profiles"))
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    rc = main(["calibrate", "--model", str(tiny_model_dir), "--text", str(text), "--tokens", "512"])
    assert rc == 0
    written = list((tmp_path / "profiles").glob("*.json"))
    assert len(written) == 1
    profile = load(written[0])
    assert "first 512 tokens of t.txt" in profile.source
    shown = dict(x.split(":") for x in capsys.readouterr().out.split())
    want = profile.at(0.2)
    assert sorted(int(k) for k in shown) == sorted(want)
    for k, v in shown.items():
        assert [float(x) for x in v.split("/")] == pytest.approx(want[int(k)], abs=1e-3)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--tokens", "8"], f"--tokens must be at least {4 * SketchWalkConfig().block_size}"),
        (["--text", "/no/such/file"], "cannot read /no/such/file"),
        (["--block-size", "24"], "power of two"),
    ],
)
def test_calibrate_bad_input_is_one_line(
    argv, words, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path / "profiles"))
    rc = main(["calibrate", "--model", str(tiny_model_dir), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0]
    assert not (tmp_path / "profiles").exists()
