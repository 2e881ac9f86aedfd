"""App settings from the environment: defaults and bad values."""

from __future__ import annotations

import os

import pytest

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
