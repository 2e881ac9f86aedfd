"""Hostile values for every shared flag of every model command (run, eval, bench attention and
model, frontier, calibrate): each is refused in one line with exit 2, or, when it is a valid
value, the command goes on to load its model (where the test stops it). Never a traceback.

The model loaders are replaced by a stop (`Reached`, a BaseException no command handler
catches), so a case takes milliseconds and nothing real is loaded or stored.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sketchwalk.cli.main import main

EXAMPLES = 250  # per command (1,500 values in all); derandomized, so a rerun tries the same values

# command words and the flags thrown at, per command (values go in as --flag=VALUE)
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "run": (
        ["run", "a prompt", "--no-store"],
        ["--device", "--model", "--max-new-tokens", "--exact-max-tokens", "--dense-layers",
         "--block-size", "--density"],
    ),
    "eval": (
        ["eval", "--no-store", "--no-png"],
        ["--device", "--model", "--lengths", "--densities", "--depths", "--per-depth",
         "--max-chunks", "--new-tokens", "--seed", "--methods", "--dense-layers", "--rope-scale"],
    ),
    "bench attention": (
        ["bench", "attention"],
        ["--device", "--seq-len", "--density", "--repeats", "--block-size", "--query-block",
         "--layer-depth", "--dense-layers"],
    ),
    "bench model": (
        ["bench", "model"],
        ["--device", "--model", "--seq-len", "--density", "--repeats", "--new-tokens",
         "--block-size", "--dense-layers"],
    ),
    "frontier": (
        ["frontier", "--no-store"],
        ["--device", "--model", "--lengths", "--densities", "--blocks", "--max-chunks",
         "--granularity", "--methods", "--dense-layers"],
    ),
    "calibrate": (
        ["calibrate"],
        ["--device", "--model", "--tokens", "--dense-layers", "--block-size"],
    ),
}  # fmt: skip

HOSTILE = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "x\x00y",
            "%00",
            "nan",
            "inf",
            "-inf",
            "1e309",
            "-1",
            "0",
            "99999999999999999999",
            "-99999999999999999999",
            "9" * 400,
            "cuda:99999999999999999999",
            "cuda:-1",
            "cuda:",
            "bogus",
            "CPU",
            "cpu ",
            "\x1b[31m",
            "0x10",
            "1,,2",
            ",",
            "1;2",
            "a" * 5000,
            ",".join(["1"] * 3000),
            "\u202e",
            "\ufeff1",
            "1_000",
            "2.5",
            "1e3",
        ]
    ),  # fmt: skip
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=40),
)


class Reached(BaseException):
    """The command got past every check to its model load: the value was accepted."""


def _stop_load(model_id, dtype, device, *args, **kwargs):
    """What a loader may be given after the checks: a device torch names, a model id that is
    not empty (None: the default)."""
    import torch

    torch.device(device)
    assert model_id is None or model_id.strip(), repr(model_id)
    raise Reached


def _stop_bench(device, seq_lens, densities, shapes, repeats, **kwargs):
    """What the kernel timing may be given: lengths and repeats a run can finish."""
    assert all(1 <= n <= 1 << 21 for n in seq_lens), seq_lens
    assert 1 <= repeats <= 10_000 and all(0 < d <= 1 for d in densities)
    raise Reached


@pytest.fixture
def stopped(monkeypatch, tmp_path):
    """Every command stops where it would load a model or time a kernel; cwd is a scratch
    folder (eval writes its --out there)."""
    import sketchwalk.benchmarks.attention as attention
    import sketchwalk.engine.run.models as models
    from sketchwalk.cli import bench

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_model", _stop_load)
    monkeypatch.setattr(attention, "run_attention_bench", _stop_bench)
    monkeypatch.setattr(bench, "_announce_machine", lambda *a: {})
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.mark.heavy
@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_flag_values_are_one_line_or_accepted(stopped, capsys, command, data):
    words, flags = COMMANDS[command]
    flag = data.draw(st.sampled_from(flags), label="flag")
    value = data.draw(HOSTILE, label="value")
    capsys.readouterr()
    try:
        code = main([*words, f"{flag}={value}"])
    except Reached:
        event(f"{command}: accepted")
        return
    except SystemExit as exc:  # the parser's own exit (usage error)
        code = exc.code
    err = capsys.readouterr().err
    event(f"{command}: refused")
    assert code == 2, (flag, value, err)
    assert err.count("\n") == 1 and err.endswith("\n"), (flag, value, err)
    assert "Traceback" not in err and "\x00" not in err and "\x1b" not in err
    assert len(err) < 800, (flag, value, len(err))  # a long value is never echoed whole


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "x", "--model="], "--model is empty"),
        (["bench", "model", "--model="], "--model is empty"),
        (["eval", "--model="], "--model is empty"),
        (["bench", "attention", "--seq-len", "99999999999999999999"], "--seq-len must be in"),
        (["bench", "model", "--repeats", "99999999999999999999"], "--repeats must be in"),
        (["bench", "attention", "--repeats", "99999999999999999999"], "--repeats must be in"),
        (["eval", "--dense-layers", "99999999999999999999"], "layer indices 0..1023"),
        (["frontier", "--dense-layers", "99999999999999999999"], "layer indices 0..1023"),
        (["calibrate", "--dense-layers", "99999999999999999999"], "layer indices 0..1023"),
        (["bench", "model", "--dense-layers", "99999999999999999999"], "layer indices 0..1023"),
        (["bench", "attention", "--dense-layers", "99999999999999999999"], "layer indices"),
        (["run", "x", "--dense-layers", "99999999999999999999"], "layer indices 0..1023"),
        (["eval", "--device", "bogus"], "unknown device 'bogus'"),
        (["bench", "model", "--device", "bogus"], "unknown device 'bogus'"),
        (["frontier", "--device", "bogus"], "unknown device 'bogus'"),
        (["calibrate", "--device", "bogus"], "unknown device 'bogus'"),
        (["run", "x", "--device", "bogus"], "unknown device 'bogus'"),
    ],
)
def test_each_shared_flag_is_checked_by_every_command(stopped, capsys, argv, words):
    try:
        code = main([*argv, "--no-store"] if argv[0] in ("run", "eval", "frontier") else argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
