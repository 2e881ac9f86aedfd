"""Every C kernel wrapper declines tensors that are not on the CPU, even where the library is
built: a GPU host may well have a C compiler, and a device pointer handed to C code would crash
or read garbage. The engine's device-path tests run with SKETCHWALK_NATIVE=0, so they never see
these gates; "meta" tensors stand in for a GPU's here (not on the CPU, no data)."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import (
    block_lists,
    block_softmax,
    decode_attention,
    hadamard,
    native,
    prefill_attention,
    token_sketch,
)


class _NoLibrary:
    """A built library whose every function fails the test when called."""

    def __getattr__(self, name: str):
        raise AssertionError(f"C function {name} called with non-CPU tensors")


@pytest.fixture(autouse=True)
def _library(monkeypatch):
    """The library "built" in every module that calls it (native's own serves runs_on)."""
    lib = _NoLibrary()
    modules = (native, block_lists, block_softmax, decode_attention, hadamard)
    for module in (*modules, prefill_attention, token_sketch):
        monkeypatch.setattr(module, "library", lambda: lib)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_the_gates_decline_non_cpu_tensors():
    b, h, hkv, n, d = 1, 2, 1, 32, 16
    q, k, v = _meta(b, h, n, d), _meta(b, hkv, n, d), _meta(b, hkv, n, d)
    idx = torch.zeros(b, 1, 2, 2, dtype=torch.int32, device="meta")
    cnt = torch.ones(b, 1, 2, dtype=torch.int32, device="meta")
    assert prefill_attention.prefill_block_attention(q, k, v, idx, cnt, 16, 1.0) is None
    q1 = _meta(b, h, 1, d)
    assert (
        decode_attention.decode_block_attention(q1, k, v, idx[:, :, :1], cnt[:, :, :1], 16, 1.0)
        is None
    )
    m = _meta(d, 8)
    sums = (_meta(b, h, 8), _meta(b, hkv, 8), _meta(b, hkv, 8), _meta(b), _meta(b))
    assert token_sketch.absorb_token(_meta(b, h, d), _meta(b, hkv, d), m, *sums) is None
    assert hadamard.srht_rows(q, _meta(16), None, 1.0, 16) is None
    # these fall back to their torch reference (on meta: shapes only)
    keep = torch.zeros(b, 1, 2, 2, dtype=torch.bool, device="meta")
    assert block_lists.block_lists(keep, 2).device.type == "meta"
    scores = _meta(b, h, 4, n)
    assert block_softmax.block_softmax_sums(scores, 0, n, 16).device.type == "meta"
    panels = block_softmax.pack_keys(k, 16)
    mass = block_softmax.scored_block_mass(q[:, :, :4], panels, 0, n, 16, n)
    assert mass.device.type == "meta"
