"""The access settings file: parsing, refusals in one line, and the model check workers apply."""

from __future__ import annotations

import pytest

from sketchwalk import access
from sketchwalk.access import AccessError


def _write(tmp_path, text: str) -> dict[str, str]:
    path = tmp_path / "app.toml"
    path.write_text(text)
    return {"SKETCHWALK_APP_CONFIG": str(path)}


def test_no_file_allows_everything():
    policy = access.load({})
    assert not policy.restricted and policy.allow_delete and policy.allow_import
    assert policy.resolve(" /any/folder ") == "/any/folder"
    policy.check_model("/etc")  # single user: their machine, their paths


def test_a_listed_model_resolves_and_others_are_refused(tmp_path):
    env = _write(
        tmp_path,
        '[models]\ndefault = "b"\n[models.allowed]\na = "org/a"\nb = "/models/b"\n'
        "[rights]\ndelete = false\n",
    )
    policy = access.load(env)
    assert policy.resolve("a") == "org/a" and policy.resolve(None) == "/models/b"
    assert not policy.allow_delete and policy.allow_import
    policy.check_model("org/a")
    for bad in ("/etc", "org/other", "../models/b"):
        with pytest.raises(AccessError, match="not on this deployment's list"):
            policy.check_model(bad)
    with pytest.raises(AccessError, match="not one this deployment offers"):
        policy.resolve("/etc/passwd")


def test_env_switches_override_the_file(tmp_path):
    env = _write(tmp_path, "[rights]\nimport = true\n")
    policy = access.load({**env, "SKETCHWALK_ALLOW_IMPORT": "0", "SKETCHWALK_ALLOW_DELETE": "no"})
    assert not policy.allow_import and not policy.allow_delete and not policy.restricted


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[models\n", "not valid TOML"),
        ("[models]\n", "at least one model"),
        ('[models]\ndefault = "x"\n[models.allowed]\na = "org/a"\n', "not in [models.allowed]"),
        ('[rights]\ndelete = "sometimes"\n', "true or false"),
    ],
)
def test_bad_files_are_one_line(tmp_path, text, words):
    with pytest.raises(AccessError, match=words.replace("[", r"\[").replace("]", r"\]")) as err:
        access.load(_write(tmp_path, text))
    assert "\n" not in str(err.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(AccessError, match="cannot read"):
        access.load({"SKETCHWALK_APP_CONFIG": str(tmp_path / "nope.toml")})
