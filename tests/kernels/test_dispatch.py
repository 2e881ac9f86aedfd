"""One entry point: backend choice by device, argument and environment; same results."""

from __future__ import annotations

import pytest
import torch

from sketchwalk.kernels import block_sparse_attention, choose_backend
from sketchwalk.kernels.lists import BlockLists
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
    out = block_sparse_attention(q, k, v, BlockLists(idx, cnt, 16))
    ref = block_sparse_attention(q, k, v, BlockLists(idx, cnt, 16), backend="reference")
    assert calls == [1]
    assert rel_err(out, ref) < 1e-5
    assert torch.equal(ref, block_sparse_attention_reference(q, k, v, BlockLists(idx, cnt, 16)))


def test_triton_on_cpu_without_interpreter_says_so():
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":  # whole suite run under the interpreter
        return
    from sketchwalk.kernels.triton_dispatch import block_sparse_attention_triton

    q = torch.randn(1, 2, 32, 16)
    idx, cnt = patterned_block_index(1, 1, 32, 32, 16, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        block_sparse_attention_triton(q, q, q, BlockLists(idx, cnt, 16))


def test_backends_share_one_signature():
    """Every registered backend takes the one BlockLists contract (extras keyword-only, with
    defaults), declares its limits, and a decode keeper where it has one."""
    import inspect

    from sketchwalk.kernels import BACKENDS, REGISTRY, BlockSparseAttention, DecodeKeeper

    want = list(inspect.signature(BlockSparseAttention.__call__).parameters.values())[1:]
    assert set(BACKENDS) == {"auto", *REGISTRY} and {"reference", "cpu", "triton"} <= set(REGISTRY)
    for backend in REGISTRY.values():
        got = list(inspect.signature(backend.attend).parameters.values())
        positional = [p for p in got if p.kind != p.KEYWORD_ONLY]
        assert [(p.name, p.default) for p in positional] == [(p.name, p.default) for p in want]
        assert all(p.default is not p.empty for p in got if p.kind == p.KEYWORD_ONLY)
        assert backend.limits.why_not(64, "float32") is None
        if backend.decode is not None:
            for method in ("plan", "run"):
                keeper_args = inspect.signature(getattr(backend.decode, method)).parameters
                protocol = inspect.signature(getattr(DecodeKeeper, method)).parameters
                assert list(keeper_args) == list(protocol)[1:]
    assert REGISTRY["cpu"].decode is not None and REGISTRY["triton"].decode is None
    with pytest.raises(ValueError, match="unknown kernel backend"):
        choose_backend(torch.device("cpu"), "cuda")


def test_triton_tile_table_fits_tiles_and_dtypes():
    from sketchwalk.kernels.triton_configs import (
        PrefillConfig,
        check_prefill_config,
        prefill_candidates,
        prefill_config,
        query_tile,
    )

    bf16, fp32 = torch.bfloat16, torch.float32
    assert prefill_config((9, 0), 128, bf16, 32, 64) == PrefillConfig(
        64, 64, 4, 3
    )  # default preset
    assert prefill_config((9, 0), 128, bf16, 128) == PrefillConfig(128, 64, 8, 3)
    assert prefill_config((9, 0), 64, bf16, 64) == PrefillConfig(64, 128, 4, 3)
    assert prefill_config(None, 128, bf16, 32, 64) == prefill_config((9, 0), 128, bf16, 32, 64)
    assert prefill_config((8, 6), 128, bf16, 128).block_m == 64  # small shared memory
    f = prefill_config((9, 0), 128, fp32, 128)
    assert f.block_m <= 64 and f.block_n <= 32 and f.num_stages <= 2
    assert prefill_config((9, 0), 128, bf16, 16, 48).block_m == 16  # largest power of two dividing
    assert query_tile(32, None) == query_tile(32, 0) == 32 and query_tile(32, 128) == 128
    with pytest.raises(ValueError, match="multiple of the block size"):
        query_tile(32, 48)
    cands = prefill_candidates(64, 128, bf16)
    assert len(set(cands)) == len(cands) > 4
    for c in cands:
        check_prefill_config(c, 64)
    with pytest.raises(ValueError, match="num_warps"):
        check_prefill_config(PrefillConfig(64, 64, 3, 2), 64)


def _compile_for(kernel, target, pointers, constexprs, num_warps, num_stages):
    """Compile a Triton kernel for a GPU that is not here, as a launch would specialise it:
    pointers and strides 16-divisible, unit strides constant."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    names = kernel.arg_names
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in pointers:
            sig[n], attrs[(i,)] = "*" + pointers[n], [["tt.divisibility", 16]]
        elif n == "qk_scale":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if n.startswith("s") and n not in ("sik", "sci"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, sig, constexprs, attrs)
    return compile(src, target=GPUTarget(*target), options=dict(num_warps=num_warps,
                                                                 num_stages=num_stages))  # fmt: skip


def _spilled_bytes(cubin: bytes) -> int:
    import os
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


def test_triton_kernels_compile_for_hopper_pipelined_without_spills():
    """The Hopper table's default-preset tiles (bf16, head dim 128, 32-token blocks in 64-row
    tiles, padding on) and decode compile offline for sm90: within shared memory, no register
    spills, and the full-block loop double-buffers K and V through async copies (pipelined)."""
    import os
    import re

    if os.environ.get("TRITON_INTERPRET") == "1":  # kernels are interpreted: nothing to compile
        return
    from sketchwalk.kernels.triton_configs import decode_config, prefill_config
    from sketchwalk.kernels.triton_decode import block_sparse_decode_split_kernel
    from sketchwalk.kernels.triton_prefill import block_sparse_prefill_kernel

    cfg = prefill_config((9, 0), 128, torch.bfloat16, 32, 64)
    ptrs = dict(Q="bf16", K="bf16", V="bf16", Out="bf16", IDX="i32", CNT="i32", SS="i64")
    const = dict(sqd=1, skd=1, svd=1, sod=1, sik=1, HEAD_DIM=128, BLOCK_SIZE=32, QUERY_TILE=64,
                 BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=128, CAUSAL=True, HAS_SS=True,
                 IEEE_DOT=False, WIDE=False, NUM_STAGES=cfg.num_stages)  # fmt: skip
    pre = _compile_for(block_sparse_prefill_kernel, ("cuda", 90, 32), ptrs, const,
                       cfg.num_warps, cfg.num_stages)  # fmt: skip
    assert pre.metadata.shared <= 227 * 1024 and _spilled_bytes(pre.asm["cubin"]) == 0
    kv_buffers = re.findall(
        r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x64x128xbf16", pre.asm["ttgir"]
    )
    assert len(kv_buffers) == 2 and all(int(n) >= 2 for n in kv_buffers)
    assert "async_copy_global_to_local" in pre.asm["ttgir"]

    dc = decode_config((9, 0))
    ptrs = dict(Q="bf16", K="bf16", V="bf16", OP="fp32", LP="fp32", IDX="i32", CNT="i32", SS="i64")
    const = dict(sqd=1, skd=1, svd=1, sik=1, NUM_SPLITS=8, HEADS=4, BLOCK_H=16, HEAD_DIM=128,
                 BLOCK_SIZE=16, BLOCK_N=dc.block_n, BLOCK_D=128, HAS_SS=True, IEEE_DOT=False,
                 WIDE=False, NUM_STAGES=dc.num_stages)  # fmt: skip
    dec = _compile_for(block_sparse_decode_split_kernel, ("cuda", 90, 32), ptrs, const,
                       dc.num_warps, dc.num_stages)  # fmt: skip
    assert dec.metadata.shared <= 227 * 1024 and _spilled_bytes(dec.asm["cubin"]) == 0
