"""Block-sparse attention kernels behind one entry point.

`block_sparse_attention` picks an implementation by device: Triton on CUDA (and on CPU tensors
when TRITON_INTERPRET=1), the fast torch path on CPU, the reference when asked
(backend="reference" or SKETCHWALK_KERNEL=reference). Shapes and conventions: kernels/reference.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch

from .reference import (
    block_sparse_attention_reference,
    dense_block_index,
    rows_of_tiles,
    selected_block_mask,
    tiles_of_rows,
)

BACKENDS = ("auto", "reference", "cpu", "triton")


class BlockSparseAttention(Protocol):
    """The one signature every backend implements (reference, cpu, triton); conventions in
    kernels/reference.py. Backends may add keyword-only extras after these (triton: out=)."""

    def __call__(
        self,
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
        query_block: int | None = None,
    ) -> torch.Tensor: ...


def backend_fn(which: str) -> BlockSparseAttention:
    """The implementation behind a resolved backend name (imports Triton only when asked)."""
    if which == "reference":
        return block_sparse_attention_reference
    if which == "cpu":
        from .cpu import block_sparse_attention_cpu

        return block_sparse_attention_cpu
    if which == "triton":
        from .triton_dispatch import block_sparse_attention_triton

        return block_sparse_attention_triton
    raise ValueError(f"unknown kernel backend {which!r}; choose one of {', '.join(BACKENDS)}")


def choose_backend(device: torch.device, backend: str | None = None) -> str:
    backend = backend or os.environ.get("SKETCHWALK_KERNEL", "auto")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "triton"
    return "cpu"


@dataclass(frozen=True)
class BackendLimits:
    """What a backend's kernels take, declared once and checked when a run is asked for (not
    late, inside a kernel, after the model loaded). min_block/power_of_two: key block sizes;
    dtypes: model dtypes by name."""

    min_block: int = 1
    power_of_two: bool = False
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")

    def why_not(self, block_size: int, dtype: str) -> str | None:
        pow2 = block_size > 0 and not block_size & (block_size - 1)
        if block_size < self.min_block or (self.power_of_two and not pow2):
            return f"a power-of-two block size >= {self.min_block}, got {block_size}"
        if dtype not in self.dtypes:
            return f"a dtype among {', '.join(self.dtypes)}, got {dtype}"
        return None


# the Triton kernels (attention and the sampled estimator) tile key blocks in powers of two >= 16
LIMITS = {
    "reference": BackendLimits(),
    "cpu": BackendLimits(),
    "triton": BackendLimits(min_block=16, power_of_two=True),
}


def limits_error(
    device: torch.device | str, block_size: int, dtype: str, backend: str | None = None
) -> str | None:
    """Why the kernels a run on `device` takes cannot run these knobs (one line), or None."""
    name = choose_backend(torch.device(device), backend)
    why = LIMITS[name].why_not(block_size, dtype)
    return None if why is None else f"the {name} kernels on {device} need {why}"


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    causal: bool = True,
    scale: float | None = None,
    seq_start: torch.Tensor | None = None,
    backend: str | None = None,
    query_block: int | None = None,
) -> torch.Tensor:
    """Attention of q over the key blocks each query block (or tile of query_block rows) lists;
    returns [B, H, Lq, D] in q's dtype."""
    fn = backend_fn(choose_backend(q.device, backend))
    args = (q, k, v, block_index, block_count, block_size, causal, scale, seq_start)
    return fn(*args, query_block=query_block)


__all__ = [
    "BACKENDS",
    "LIMITS",
    "BackendLimits",
    "BlockSparseAttention",
    "backend_fn",
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "choose_backend",
    "dense_block_index",
    "limits_error",
    "rows_of_tiles",
    "selected_block_mask",
    "tiles_of_rows",
]
