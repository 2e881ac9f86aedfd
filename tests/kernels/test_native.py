"""The loader of the C kernels (kernels/native.py): the build, the cache, the fallback to torch
when they cannot be built or are turned off, and what loading them must not change."""

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from sketchwalk.kernels import native
from sketchwalk.kernels.block_softmax import block_softmax_sums, block_softmax_sums_reference


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A private cache folder and no library loaded yet, so the test sees the build itself."""
    monkeypatch.setenv("SKETCHWALK_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    native._build_key.cache_clear()
    yield tmp_path
    native._build_key.cache_clear()


def test_the_c_kernels_are_built_where_there_is_a_compiler(fresh_build):
    assert shutil.which(native._compiler()), "these tests need a C compiler (cc)"
    lib = native.library()
    assert lib is not None
    built = list((fresh_build / "native").glob("kernels-*.so"))
    assert len(built) == 1
    assert [p.name for p in fresh_build.joinpath("native").iterdir()] == [built[0].name]
    assert native.library() is lib  # loaded once
    for name, args in native._SIGNATURES.items():  # every kernel is in it, with its arguments
        assert len(getattr(lib, name).argtypes) == len(args.split())


def test_turned_off_it_is_torch(fresh_build, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert native.library() is None
    assert not (fresh_build / "native").exists()  # nothing built
    x = torch.randn(3, 40)
    assert torch.equal(block_softmax_sums(x, 0, 40, 8), block_softmax_sums_reference(x, 0, 40, 8))


def test_without_a_compiler_it_warns_once_and_uses_torch(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    with pytest.warns(RuntimeWarning, match="C kernels are unavailable"):
        assert native.library() is None
    assert native.library() is None  # no second try, no second warning
    assert list((fresh_build / "native").iterdir()) == []  # no half-built library left
    x = torch.randn(2, 5, 33)
    assert torch.equal(block_softmax_sums(x, 1, 30, 16), block_softmax_sums_reference(x, 1, 30, 16))


def test_a_failing_compiler_says_why(fresh_build, monkeypatch):
    fake = fresh_build / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: error: out of cheese' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(RuntimeWarning, match="out of cheese"):
        assert native.library() is None


def test_threads_share_one_build_and_run_at_once(fresh_build):
    """The estimator's parts call it from two threads at once, the first call included."""
    x = torch.randn(4, 9, 500)
    want = block_softmax_sums_reference(x, 0, 500, 16)
    results, errors = [], []

    def call() -> None:
        try:
            results.append(block_softmax_sums(x, 0, 500, 16))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(torch.allclose(r, want, atol=2e-6) for r in results)
    assert len(list((fresh_build / "native").glob("*.so"))) == 1


def test_loading_it_keeps_subnormal_floats(tmp_path):
    """Built with -ffast-math the library's constructor turned on flush-to-zero for the whole
    process: every subnormal float in torch and Python read as 0 after the first estimate."""
    code = (
        "import torch\n"
        "from sketchwalk.kernels.native import library\n"
        "assert library() is not None\n"
        "x = float(torch.tensor([1e-40]) * 1.0)\n"
        "y = 5e-324 * 1.0\n"
        "print(x > 0, y > 0)\n"
    )
    env = {**os.environ, "SKETCHWALK_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
