"""App settings from the environment: defaults and bad values."""

from __future__ import annotations

import os

import pytest

from sketchwalk.errors import SketchWalkError
from sketchwalk.settings import load


def test_in_app_worker_leaves_one_core(monkeypatch):
    monkeypatch.delenv("SKETCHWALK_THREADS", raising=False)
    assert load().threads == max(1, (os.cpu_count() or 2) - 1)
    monkeypatch.setenv("SKETCHWALK_THREADS", "3")
    assert load().threads == 3


@pytest.mark.parametrize("raw", ["0", "-2", "two"])
def test_bad_thread_counts_are_refused(monkeypatch, raw):
    monkeypatch.setenv("SKETCHWALK_THREADS", raw)
    with pytest.raises(ValueError, match="SKETCHWALK_THREADS"):
        load()


@pytest.mark.parametrize("raw", ["2097153", "99999999", "0", "-5"])
def test_prompt_chars_above_what_the_store_keeps_are_refused(monkeypatch, raw):
    """A prompt the request accepts is never refused by the store at save."""
    from sketchwalk.store.limits import MAX_RUN_TEXT

    monkeypatch.setenv("SKETCHWALK_MAX_PROMPT_CHARS", raw)
    with pytest.raises(SketchWalkError) as e:
        load()
    assert "MAX_PROMPT_CHARS" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("SKETCHWALK_MAX_PROMPT_CHARS", str(MAX_RUN_TEXT))
    assert load().max_prompt_chars == MAX_RUN_TEXT
