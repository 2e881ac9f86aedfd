"""The block softmax in C (kernels/block_softmax.c) against its torch reference, and its loader:
the build, the cache, the fallback to torch when it cannot be built or is turned off."""

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from sketchwalk.kernels import block_softmax as bs
from sketchwalk.kernels.block_softmax import block_softmax_sums, block_softmax_sums_reference


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A private cache folder and no library loaded yet, so the test sees the build itself."""
    monkeypatch.setenv("SKETCHWALK_CACHE", str(tmp_path))
    monkeypatch.setattr(bs, "_loaded", {})
    bs._build_key.cache_clear()
    yield tmp_path
    bs._build_key.cache_clear()


def test_the_c_kernel_is_built_where_there_is_a_compiler(fresh_build):
    assert shutil.which(bs._compiler()), "these tests need a C compiler (cc)"
    lib = bs.native_library()
    assert lib is not None
    built = list((fresh_build / "native").glob("block_softmax-*.so"))
    assert len(built) == 1
    assert [p.name for p in fresh_build.joinpath("native").iterdir()] == [built[0].name]
    assert bs.native_library() is lib  # loaded once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [1, 3, 16, 32, 64])
@pytest.mark.parametrize("seed", range(6))
def test_c_equals_the_torch_reference_on_random_rows(dtype, block, seed):
    assert bs.native_library() is not None
    gen = torch.Generator().manual_seed(seed * 100 + block)
    lead = [tuple(int(x) for x in torch.randint(1, 5, (k,), generator=gen)) for k in (1, 2, 3)]
    shape = (*lead[seed % 3], int(torch.randint(1, 300, (1,), generator=gen)))
    width = shape[-1]
    scale = float(torch.empty(1).uniform_(0.1, 30, generator=gen))
    scores = (torch.randn(shape, generator=gen) * scale).to(dtype)
    hi = torch.randint(0, width + 3, shape[:-1], generator=gen)  # past the row, empty rows too
    lo = torch.randint(-2, width, shape[:-1], generator=gen)  # before it, past hi too
    got = block_softmax_sums(scores, lo, hi, block)
    want = block_softmax_sums_reference(scores, lo, hi, block)
    assert got.shape == want.shape == (*shape[:-1], -(-width // block))
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    seen = hi.clamp(max=width) > lo.clamp(min=0)
    sums = got.sum(-1)
    assert torch.allclose(sums[seen], torch.ones(1), atol=1e-5)
    assert torch.equal(sums[~seen], torch.zeros_like(sums[~seen]))


def test_broadcast_bounds_and_extreme_scores():
    """lo and hi broadcast over the rows (the estimator passes one start per sequence and one
    end per query); scores far below a row's max underflow to 0 instead of going wrong."""
    scores = torch.tensor([[0.0, -1e4, 50.0, 49.0, -200.0, 3.0]]).repeat(2, 3, 1)
    lo = torch.tensor([0, 1]).view(2, 1)
    hi = torch.tensor([6, 2, 4])
    got = block_softmax_sums(scores, lo, hi, 2)
    assert torch.allclose(got, block_softmax_sums_reference(scores, lo, hi, 2), atol=1e-6)
    assert got[1, 1].tolist() == [1.0, 0.0, 0.0]  # sees column 1 only
    assert block_softmax_sums(scores, 0, 6, 4).shape == (2, 3, 2)


def test_turned_off_it_is_torch(fresh_build, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert bs.native_library() is None
    assert not (fresh_build / "native").exists()  # nothing built
    x = torch.randn(3, 40)
    assert torch.equal(block_softmax_sums(x, 0, 40, 8), block_softmax_sums_reference(x, 0, 40, 8))


def test_without_a_compiler_it_warns_once_and_uses_torch(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    with pytest.warns(RuntimeWarning, match="C block softmax is unavailable"):
        assert bs.native_library() is None
    assert bs.native_library() is None  # no second try, no second warning
    assert list((fresh_build / "native").iterdir()) == []  # no half-built library left
    x = torch.randn(2, 5, 33)
    assert torch.equal(block_softmax_sums(x, 1, 30, 16), block_softmax_sums_reference(x, 1, 30, 16))


def test_a_failing_compiler_says_why(fresh_build, monkeypatch):
    fake = fresh_build / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: error: out of cheese' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(RuntimeWarning, match="out of cheese"):
        assert bs.native_library() is None


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
        "from sketchwalk.kernels.block_softmax import native_library\n"
        "assert native_library() is not None\n"
        "x = float(torch.tensor([1e-40]) * 1.0)\n"
        "y = 5e-324 * 1.0\n"
        "print(x > 0, y > 0)\n"
    )
    env = {**os.environ, "SKETCHWALK_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
