"""Launch the Triton block-sparse kernels: prefill for Lq > 1, split-K decode for Lq == 1.

Handles what the kernels should not care about: tile sizes, the grid, strides, the interpreter on CPU
tensors (TRITON_INTERPRET=1 must be set before triton is imported: triton's own library functions
are compiled or interpreted at import), and bf16 there (the interpreter misreads bf16, so CPU bf16
runs in fp32 and is cast back). Preconditions beyond kernels/reference.py: block_size is a power of
two >= 16 and each list's live ids are unique (as engine.select produces them).
"""

from __future__ import annotations

import math

import torch

from .triton_decode import block_sparse_decode_combine_kernel, block_sparse_decode_split_kernel
from .triton_prefill import block_sparse_prefill_kernel

LOG2E = 1.4426950408889634


def _kernel(kernel, device: torch.device):
    """The kernel, after checking it can run on `device` (CPU tensors need the interpreter)."""
    if device.type != "cuda":
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(kernel, InterpretedFunction):
            raise RuntimeError(
                "Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before triton is "
                "imported; use backend='cpu' otherwise"
            )
    return kernel


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def _check(q: torch.Tensor, k: torch.Tensor, block_index: torch.Tensor, block_size: int) -> None:
    h, hkv, g = q.shape[1], k.shape[1], block_index.shape[1]
    if h % hkv or h % g:
        raise ValueError(f"heads {h} must be a multiple of KV heads {hkv} and index groups {g}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"Triton kernels need a power-of-two block size >= 16, got {block_size}")


def _prefill_tiles(block_size: int, head_dim: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): big tiles on the GPU, block-sized ones in the interpreter."""
    if device.type != "cuda":
        return block_size, block_size, 4
    bm = min(block_size, 128 if head_dim <= 64 else 64)
    bn = min(block_size, 64)
    return bm, bn, 4 if bm * head_dim <= 64 * 64 else 8


def block_sparse_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    causal: bool = True,
    scale: float | None = None,
    seq_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Any Lq >= 1; writes into `out` ([B, H, Lq, D], any strides) when given."""
    _check(q, k, block_index, block_size)
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = block_index.shape[1]
    out = torch.empty_like(q) if out is None else out
    scale = d**-0.5 if scale is None else float(scale)
    bm, bn, warps = _prefill_tiles(block_size, d, q.device)
    nq = -(-lq // block_size)
    grid = (nq * (block_size // bm), bsz * h)
    ss = seq_start.to(q.device, torch.int64) if seq_start is not None else block_count
    _kernel(block_sparse_prefill_kernel, q.device)[grid](
        q, k, v, out, block_index, block_count, ss,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *block_index.stride(), *block_count.stride(),
        h, g, hkv, lq, lk, scale * LOG2E,
        HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=max(16, _pow2(d)),
        CAUSAL=causal, HAS_SS=seq_start is not None, IEEE_DOT=q.dtype == torch.float32,
        num_warps=warps,
    )  # fmt: skip
    return out


def _num_splits(programs: int, kmax: int, device: torch.device) -> int:
    """Enough split-K slices to fill the GPU twice over, never more than the list is long."""
    if device.type != "cuda":
        return max(1, min(kmax, 3))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(kmax, -(-2 * sms // max(programs, 1)), 64))


def block_sparse_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    scale: float | None = None,
    seq_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Lq == 1 (the query is the last position, so causal is implied)."""
    _check(q, k, block_index, block_size)
    bsz, h, lq, d = q.shape
    if lq != 1:
        raise ValueError(f"decode takes one query per sequence, got Lq={lq}")
    hkv, lk = k.shape[1], k.shape[2]
    g = block_index.shape[1]
    if g % hkv and hkv % g:  # a program's heads must share one list and one KV head
        block_index = block_index.repeat_interleave(h // g, dim=1)
        block_count = block_count.repeat_interleave(h // g, dim=1)
        g = h
    out = torch.empty_like(q) if out is None else out
    scale = d**-0.5 if scale is None else float(scale)
    heads = h // max(g, hkv)
    units = h // heads
    splits = num_splits or _num_splits(bsz * units, block_index.shape[-1], q.device)
    bd = max(16, _pow2(d))
    part = torch.empty(bsz, h, splits, bd, device=q.device, dtype=torch.float32)
    lse = torch.empty(bsz, h, splits, device=q.device, dtype=torch.float32)
    ss = seq_start.to(q.device, torch.int64) if seq_start is not None else block_count
    bn = min(block_size, 64)
    _kernel(block_sparse_decode_split_kernel, q.device)[(splits, bsz * units)](
        q, k, v, part, lse, block_index, block_count, ss,
        q.stride(0), q.stride(1), q.stride(3), *k.stride(), *v.stride(),
        block_index.stride(0), block_index.stride(1), block_index.stride(3),
        block_count.stride(0), block_count.stride(1),
        h, g, hkv, lk, scale * LOG2E,
        NUM_SPLITS=splits, HEADS=heads, BLOCK_H=max(16, _pow2(heads)), HEAD_DIM=d,
        BLOCK_SIZE=block_size, BLOCK_N=bn, BLOCK_D=bd, HAS_SS=seq_start is not None,
        IEEE_DOT=q.dtype == torch.float32, num_warps=4,
    )  # fmt: skip
    _kernel(block_sparse_decode_combine_kernel, q.device)[(bsz * h,)](
        part, lse, out, out.stride(0), out.stride(1), out.stride(3), h,
        NUM_SPLITS=splits, BLOCK_S=_pow2(splits), HEAD_DIM=d, BLOCK_D=bd,
    )  # fmt: skip
    return out


def block_sparse_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    causal: bool = True,
    scale: float | None = None,
    seq_start: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    query_block: int | None = None,
) -> torch.Tensor:
    """Same contract as the reference; decode kernel for Lq == 1 (causal), prefill otherwise.

    Query tiles (query_block) run as one list per query block (exact; the tile's list repeated)."""
    if query_block and query_block != block_size and q.shape[2] > 1:
        from .reference import rows_of_tiles

        n_rows = -(-q.shape[2] // block_size)
        block_index, block_count = rows_of_tiles(
            block_index, block_count, query_block // block_size, n_rows
        )
    dtype = q.dtype
    upcast = q.device.type != "cuda" and dtype == torch.bfloat16
    if upcast:  # the interpreter reads bf16 wrongly: run fp32, cast back
        q, k, v = q.float(), k.float(), v.float()
    target = None if upcast else out
    if q.shape[2] == 1 and causal:
        res = block_sparse_decode(
            q, k, v, block_index, block_count, block_size, scale, seq_start, out=target
        )
    else:
        res = block_sparse_prefill(
            q, k, v, block_index, block_count, block_size, causal, scale, seq_start, out=target
        )
    if upcast:
        res = res.to(dtype)
        if out is not None:
            out.copy_(res)
            res = out
    return res


__all__ = ["block_sparse_attention_triton", "block_sparse_decode", "block_sparse_prefill"]
