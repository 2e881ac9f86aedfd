"""Launch the Triton block-sparse kernels: prefill for Lq > 1, split-K decode for Lq == 1.

Handles what the kernels should not care about: tile sizes (kernels/triton_configs.py), the grid,
strides, the interpreter on CPU tensors (TRITON_INTERPRET=1 must be set before triton is imported:
triton's own library functions are compiled or interpreted at import), and bf16 there (the
interpreter misreads bf16, so CPU bf16 runs in fp32 and is cast back). Preconditions beyond
kernels/reference.py: block_size is a power of two >= 16, and each list's live ids are sorted
ascending and unique (as engine.select produces them; the kernels find a list's unmasked run by
counting ids below a bound).
"""

from __future__ import annotations

import math

import torch

from .lists import BlockLists
from .triton_configs import (
    PrefillConfig,
    autotune_enabled,
    check_prefill_config,
    decode_config,
    prefill_candidates,
    prefill_config,
    query_tile,
)
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


def _wide(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a key's element offset inside its (batch, head) can pass int32."""
    return max(k.shape[2] * max(x.stride(2), 1) + x.shape[3] * x.stride(3) for x in (k, v)) >= 2**31


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def _check(q: torch.Tensor, k: torch.Tensor, block_index: torch.Tensor, block_size: int) -> None:
    h, hkv, g = q.shape[1], k.shape[1], block_index.shape[1]
    if h % hkv or h % g:
        raise ValueError(f"heads {h} must be a multiple of KV heads {hkv} and index groups {g}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"Triton kernels need a power-of-two block size >= 16, got {block_size}")


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


_TUNED: dict[tuple, PrefillConfig] = {}


def _autotuned(key: tuple, candidates: list[PrefillConfig], launch) -> PrefillConfig:
    """The fastest candidate for `key`, timed once per process (SKETCHWALK_TRITON_AUTOTUNE=1);
    shapes that do not fit the GPU's registers or shared memory are dropped."""
    if key not in _TUNED:
        from triton.runtime.errors import OutOfResources
        from triton.testing import do_bench

        times = {}
        for cfg in candidates:
            try:
                times[cfg] = do_bench(lambda cfg=cfg: launch(cfg), warmup=5, rep=25)
            except OutOfResources:
                continue
        _TUNED[key] = min(times, key=times.get)
    return _TUNED[key]


def block_sparse_prefill(  # many parameters: the launcher takes the lists' tensors one by one
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
    *,
    query_block: int | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Any Lq >= 1; writes into `out` ([B, H, Lq, D], any strides) when given. Lists per query
    tile of query_block rows (default: one block); `config` overrides the table's tiles."""
    _check(q, k, block_index, block_size)
    bsz, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = block_index.shape[1]
    tile = query_tile(block_size, query_block)
    if block_index.shape[2] < -(-lq // tile) or block_count.shape[2] < -(-lq // tile):
        raise ValueError(f"{lq} queries need {-(-lq // tile)} lists of {tile} rows")
    out = torch.empty_like(q) if out is None else out
    scale = d**-0.5 if scale is None else float(scale)
    ss = seq_start.to(q.device, torch.int64) if seq_start is not None else block_count

    def launch(cfg: PrefillConfig) -> None:
        grid = (-(-lq // cfg.block_m), bsz * h)
        _kernel(block_sparse_prefill_kernel, q.device)[grid](
            q, k, v, out, block_index, block_count, ss,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            *block_index.stride(), *block_count.stride(),
            h, g, hkv, lq, lk, scale * LOG2E,
            HEAD_DIM=d, BLOCK_SIZE=block_size, QUERY_TILE=tile, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_D=max(16, _pow2(d)), CAUSAL=causal,
            HAS_SS=seq_start is not None, IEEE_DOT=q.dtype == torch.float32, WIDE=_wide(k, v),
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip

    cap = _capability(q.device)
    if config is not None:
        check_prefill_config(config, tile)
    elif autotune_enabled(q.device):
        key = (cap, d, q.dtype, block_size, tile, causal, seq_start is not None, _pow2(lk))
        config = _autotuned(key, prefill_candidates(tile, d, q.dtype), launch)
    else:
        config = prefill_config(cap, d, q.dtype, block_size, tile)
    launch(config)
    return out


def _num_splits(programs: int, kmax: int, device: torch.device) -> int:
    """Enough split-K slices to fill the GPU twice over, never more than the list is long."""
    if device.type != "cuda":
        return max(1, min(kmax, 3))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(kmax, -(-2 * sms // max(programs, 1)), 64))


def block_sparse_decode(  # many parameters: the launcher takes the lists' tensors one by one
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
    cfg = decode_config(_capability(q.device))
    _kernel(block_sparse_decode_split_kernel, q.device)[(splits, bsz * units)](
        q, k, v, part, lse, block_index, block_count, ss,
        q.stride(0), q.stride(1), q.stride(3), *k.stride(), *v.stride(),
        block_index.stride(0), block_index.stride(1), block_index.stride(3),
        block_count.stride(0), block_count.stride(1),
        h, g, hkv, lk, scale * LOG2E,
        NUM_SPLITS=splits, HEADS=heads, BLOCK_H=max(16, _pow2(heads)), HEAD_DIM=d,
        BLOCK_SIZE=block_size, BLOCK_N=cfg.block_n, BLOCK_D=bd, HAS_SS=seq_start is not None,
        IEEE_DOT=q.dtype == torch.float32, WIDE=_wide(k, v), NUM_STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
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
    lists: BlockLists,
    causal: bool = True,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as the reference; decode kernel for Lq == 1 (causal), prefill otherwise.

    Query tiles (lists.query_block rows per list) go to the prefill kernel as they are."""
    block_index, block_count, block_size = lists.index, lists.count, lists.block_size
    seq_start, query_block = lists.seq_start, lists.query_block
    tile = query_tile(block_size, query_block)
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
            q, k, v, block_index, block_count, block_size, causal, scale, seq_start, target,
            query_block=tile,
        )  # fmt: skip
    if upcast:
        res = res.to(dtype)
        if out is not None:
            out.copy_(res)
            res = out
    return res


__all__ = ["block_sparse_attention_triton", "block_sparse_decode", "block_sparse_prefill"]
