"""Fixtures shared by every test folder."""

from __future__ import annotations

import os

import pytest
from pg_testdb import PG_ENV, fresh_schema, in_ci, pg_base_url

pytest_plugins = ["quick_loop"]  # `make check`: the --quick selection

# Fixtures that load a model from disk, run a worker or seed a store through one: a test that
# takes any of them, and every AppTest (tests/app), is marked `model` and left out of the quick
# loop (`make check`); `make test` runs everything.
MODEL_FIXTURES = {"tiny_model", "tiny_model_dir", "models", "seeded", "app_env", "known_pair"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        in_app = "tests/app/" in str(item.path).replace(os.sep, "/")
        if in_app or MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


def pytest_report_header(config):
    """Say up front whether the PostgreSQL variants run (they are required in CI)."""
    if pg_base_url():
        return f"PostgreSQL tests: on ({PG_ENV} set)"
    if in_ci():
        return f"PostgreSQL tests: REQUIRED in CI but {PG_ENV} is not set (they will fail)"
    return 'PostgreSQL tests: off (eval "$(.ci/postgres.sh)" to run them)'


@pytest.fixture(scope="session", autouse=True)
def _no_user_layer_profiles(tmp_path_factory):
    """Layer profiles from an empty folder: one the developer calibrated for a test model
    (~/.cache/sketchwalk/profiles) would change which layers run sparse. Tests that calibrate
    set their own folder."""
    old = os.environ.get("SKETCHWALK_PROFILES")
    os.environ["SKETCHWALK_PROFILES"] = str(tmp_path_factory.mktemp("profiles"))
    yield
    if old is None:
        os.environ.pop("SKETCHWALK_PROFILES", None)
    else:
        os.environ["SKETCHWALK_PROFILES"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with the real tokenizer, saved once per test session."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir) -> str:
    """The tiny model's folder as the model id a run request carries."""
    return str(tiny_model_dir)


@pytest.fixture(scope="session")
def models():
    """One model cache for the session's worker tests (models load once)."""
    from sketchwalk.worker.loop import ModelCache

    return ModelCache(2)


@pytest.fixture
def pg_url():
    """A URL into a fresh, empty schema on the test PostgreSQL server (dropped afterwards).

    Fails in CI when no server is configured; skips a local run without one."""
    with fresh_schema() as url:
        yield url
