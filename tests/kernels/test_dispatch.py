"""One entry point: backend choice by device, argument and environment; same results."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import block_sparse_attention, choose_backend
from sketchwalk.kernels.reference import block_sparse_attention_reference
from sketchwalk.kernels.testing import patterned_block_index, random_qkv, rel_err


def test_choice(monkeypatch):
    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_backend(cpu) == "cpu"
    assert choose_backend(cuda) == "triton"
    assert choose_backend(cpu, "reference") == "reference"
    monkeypatch.setenv("SKETCHWALK_KERNEL", "reference")
    assert choose_backend(cpu) == "reference"
    monkeypatch.setenv("SKETCHWALK_KERNEL", "auto")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_backend(cpu) == "triton"
    with pytest.raises(ValueError, match="unknown kernel backend"):
        choose_backend(cpu, "cuda-magic")


def test_cpu_backend_is_the_fast_path_and_agrees(monkeypatch):
    monkeypatch.delenv("SKETCHWALK_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import sketchwalk.kernels.cpu as cpu_mod

    calls = []
    real = cpu_mod.block_sparse_attention_cpu
    monkeypatch.setattr(
        cpu_mod, "block_sparse_attention_cpu", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = random_qkv(1, 6, 2, 100, 100, 32, torch.float32, gen)
    idx, cnt = patterned_block_index(1, 1, 100, 100, 16, gen)
    out = block_sparse_attention(q, k, v, idx, cnt, 16)
    ref = block_sparse_attention(q, k, v, idx, cnt, 16, backend="reference")
    assert calls == [1]
    assert rel_err(out, ref) < 1e-5
    assert torch.equal(ref, block_sparse_attention_reference(q, k, v, idx, cnt, 16))


def test_triton_on_cpu_without_interpreter_says_so():
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":  # whole suite run under the interpreter
        return
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    q = torch.randn(1, 2, 32, 16)
    idx, cnt = patterned_block_index(1, 1, 32, 32, 16, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        block_sparse_attention_triton(q, q, q, idx, cnt, 16)


def test_backends_share_one_signature():
    import inspect

    from sketchwalk.kernels import BlockSparseAttention, backend_fn

    want = list(inspect.signature(BlockSparseAttention.__call__).parameters.values())[1:]
    want = [p for p in want if p.kind != p.KEYWORD_ONLY]  # query_block: keyword-only, all share it
    for which in ("reference", "cpu", "triton"):
        got = list(inspect.signature(backend_fn(which)).parameters.values())
        positional = [p for p in got if p.kind != p.KEYWORD_ONLY]
        assert [(p.name, p.default) for p in positional] == [(p.name, p.default) for p in want]
        assert all(p.default is not p.empty for p in got if p.kind == p.KEYWORD_ONLY)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        backend_fn("cuda")
