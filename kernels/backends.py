"""The backends behind block_sparse_attention: one registry line each, with their limits.

A backend is a module with a function of the BlockSparseAttention signature (and, where it keeps
state across decode steps, a DecodeKeeper). Which one runs: the caller's choice, else
SKETCHWALK_KERNEL, else by device: Triton on CUDA (and on CPU tensors under TRITON_INTERPRET=1),
the CPU kernels otherwise. Limits are declared here and checked when a run is asked for
(engine/request.py), not late inside a kernel after the model has loaded.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Protocol

import torch

from .lists import BlockLists


class BlockSparseAttention(Protocol):
    """Attention of q [B, H, Lq, D] over the key blocks `lists` names in k, v [B, Hkv, Lk, D];
    returns [B, H, Lq, D] in q's dtype (conventions: kernels/lists.py, kernels/reference.py).
    Backends may add keyword-only extras (triton: out=)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lists: BlockLists,
        causal: bool = True,
        scale: float | None = None,
    ) -> torch.Tensor: ...


class DecodeKeeper(Protocol):
    """Decode over lists reused across steps: `plan` keeps what the lists need (e.g. their K/V
    gathered once) or returns None where the stateless kernel should run; `run` attends with it.
    previous: the last plan of this layer; extended_from: the lists these extend by one block."""

    def plan(
        self,
        previous: object | None,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lists: BlockLists,
        extended_from: BlockLists | None,
        room: int,
    ) -> object | None: ...

    def run(
        self, plan: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class BackendLimits:
    """What a backend's kernels take. min_block/power_of_two: key block sizes; dtypes: model
    dtypes by name."""

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


@dataclass(frozen=True)
class Backend:
    """name; attend: "module:function" of its BlockSparseAttention (imported on first use, so
    Triton loads only when asked); decode: "module:object" of its DecodeKeeper, if any."""

    name: str
    attend_at: str
    limits: BackendLimits = BackendLimits()
    decode_at: str | None = None

    @property
    def attend(self) -> BlockSparseAttention:
        return _load(self.attend_at)

    @property
    def decode(self) -> DecodeKeeper | None:
        return None if self.decode_at is None else _load(self.decode_at)


def _load(where: str):
    module, name = where.split(":")
    return getattr(importlib.import_module(f".{module}", __package__), name)


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("reference", "reference:block_sparse_attention_reference"),
        Backend("cpu", "cpu:block_sparse_attention_cpu", decode_at="decode_cache:KEEPER"),
        # the Triton kernels (attention and the sampled estimator) tile key blocks in powers of 2
        Backend(
            "triton",
            "triton_dispatch:block_sparse_attention_triton",
            BackendLimits(min_block=16, power_of_two=True),
        ),
        # PyTorch's FlexAttention on the same lists (prefill; decode takes the device's kernel)
        Backend("flex", "flex:block_sparse_attention_flex", BackendLimits(16, True)),
    )
}
BACKENDS = ("auto", *REGISTRY)


def choose_backend(device: torch.device | str, backend: str | None = None) -> str:
    """The backend name for tensors on `device`: `backend`, else SKETCHWALK_KERNEL, else auto."""
    backend = backend or os.environ.get("SKETCHWALK_KERNEL", "auto")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "triton"
    return "cpu"


def backend_for(device: torch.device | str, backend: str | None = None) -> Backend:
    return REGISTRY[choose_backend(device, backend)]


def limits_error(
    device: torch.device | str, block_size: int, dtype: str, backend: str | None = None
) -> str | None:
    """Why the kernels a run on `device` takes cannot run these knobs (one line), or None."""
    name = choose_backend(device, backend)
    why = REGISTRY[name].limits.why_not(block_size, dtype)
    return None if why is None else f"the {name} kernels on {device} need {why}"


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: BlockLists,
    causal: bool = True,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Attention of q over the key blocks each query block (or tile) lists, by the backend of
    q's device; returns [B, H, Lq, D] in q's dtype."""
    return backend_for(q.device, backend).attend(q, k, v, lists, causal, scale)
