"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with the real tokenizer, saved once per test session."""
    from sketchwalk.engine.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")
