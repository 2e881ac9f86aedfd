"""A shared deployment's settings file on the pages: the Model box offers only the listed
models (no free path from the browser), deleting and importing can be switched off, and user
text in error boxes stays literal (no markdown links)."""

from __future__ import annotations

import pytest
from run_helpers import new_app

from sketchwalk.store import open_store


@pytest.fixture
def shared(monkeypatch, tmp_path, tiny_model):
    url = str(tmp_path / "shared.duckdb")
    settings = tmp_path / "app.toml"
    settings.write_text(
        "[models]\n"
        'default = "tiny"\n'
        "[models.allowed]\n"
        f'tiny = "{tiny_model}"\n'
        '"also tiny" = "smollm2"\n'
        "[rights]\n"
        "delete = false\n"
        "import = false\n"
    )
    monkeypatch.setenv("SKETCHWALK_DB", url)
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    monkeypatch.setenv("SKETCHWALK_APP_CONFIG", str(settings))
    return url


def test_the_model_box_offers_only_listed_models(shared, tiny_model):
    at = new_app().run()
    assert not at.exception
    assert not [t for t in at.text_input if t.key == "nr_model"]  # no free text, no paths
    (box,) = [s for s in at.selectbox if s.label == "Model"]
    assert box.options == ["tiny", "also tiny"] and box.value == "tiny"
    at.text_area(key="nr_prompt").input("The quick brown fox jumps. " * 20).run()
    at.button(key="btn_run").click().run()
    with open_store(shared) as store:
        (job,) = store.list_jobs()
    assert job.request["model"] == tiny_model


def test_delete_and_import_can_be_switched_off(shared):
    at = new_app().run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    keys = {b.key for b in at.button}
    assert "btn_delete" not in keys and "btn_import" not in keys
    assert not [c for c in at.checkbox if c.key == "runs_confirm"]
    assert "Import" not in [h.value for h in at.subheader]


def test_user_text_in_errors_is_not_markdown(monkeypatch, tmp_path):
    monkeypatch.setenv("SKETCHWALK_DB", str(tmp_path / "x.duckdb"))
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = new_app().run()
    at.text_input(key="nr_model").input("[click](http://evil.example/x)").run()
    bodies = [e.value for e in at.error]
    assert bodies and all("[click](http" not in b for b in bodies)
    assert any(r"\[click\](http\://" in b for b in bodies)


def test_the_page_refuses_what_the_worker_would(monkeypatch, tmp_path, tiny_model):
    monkeypatch.setenv("SKETCHWALK_DB", str(tmp_path / "y.duckdb"))
    monkeypatch.setenv("SKETCHWALK_APP_WORKER", "0")
    at = new_app().run()
    at.text_input(key="nr_model").input(tiny_model).run()
    at.text_area(key="nr_prompt").input("The quick brown fox jumps. " * 20 + "\x00").run()
    assert any("NUL character" in e.value for e in at.error)
    assert at.button(key="btn_run").disabled
