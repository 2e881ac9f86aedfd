"""The one kernel seam: every kernel the engine runs, per backend, one registry line each.

A backend names a function for each op (OPS): block-sparse attention (`attend`, the
BlockSparseAttention signature, and, where it keeps state across decode steps, a DecodeKeeper),
the sampled estimator's block mass, its per-row softmax sums, the Hadamard sketch of many rows,
kept masks as index lists, and a decode token into the sketch's sums. An op a backend does not
name is the device's automatic backend's (flex names attention only). Which backend runs: the
caller's argument, else the one bound with `use_backend` (a session binds its own), else
SKETCHWALK_KERNEL, else by device: Triton on CUDA (and on CPU tensors under TRITON_INTERPRET=1),
the CPU kernels otherwise. The reference backend is plain torch for every op. Limits are
declared here and checked when a run is asked for (engine/run/request.py), not late inside a kernel
after the model has loaded.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

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
    """Decode over lists reused across steps: `plan` returns what it keeps for the lists (e.g.
    their K/V gathered once) or None where the stateless kernel should run; `run` attends with
    that kept state. previous: what `plan` kept last for this layer; extended_from: the lists
    these extend by one block; spare_blocks: key blocks the kept state leaves space for (the
    blocks the lists may cross before they are selected again)."""

    def plan(
        self,
        previous: object | None,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lists: BlockLists,
        extended_from: BlockLists | None,
        spare_blocks: int,
    ) -> object | None: ...

    def run(
        self, kept: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
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


# The ops every automatic backend names, with their contracts (the reference functions):
OPS = (
    "attend",  # reference.py block_sparse_attention_reference
    "block_mass",  # block_mass_reference.py pooled_block_mass_reference: [B, Hkv, R, n]
    "row_mass",  # block_softmax.py row_mass_reference: decode's row, queries x keys -> block mass
    "sketch_rows",  # hadamard.py srht_rows_reference: x @ matrix with block sums and squares
    "block_lists",  # block_lists.py block_lists_reference: kept mask -> sorted index lists
    "absorb_token",  # token_sketch.py absorb_token_torch: one decode token into the sums
    "take_best",  # take_best.py take_best_reference: a layer's budget, best value first
)

_TORCH_OPS = (
    ("block_mass", "cpu_block_mass:pooled_block_mass_torch"),
    ("row_mass", "block_softmax:row_mass_reference"),
    ("sketch_rows", "hadamard:srht_rows_torch"),
    ("block_lists", "block_lists:block_lists_reference"),
    ("absorb_token", "token_sketch:absorb_token_torch"),
    ("take_best", "take_best:take_best_reference"),
)


@dataclass(frozen=True)
class Backend:
    """name; attend_at: "module:function" of its BlockSparseAttention (imported on first use, so
    Triton loads only when asked); decode_at: "module:object" of its DecodeKeeper, if any;
    ops_at: ("op", "module:function") for its other ops (OPS); an op it does not name is the
    device's automatic backend's."""

    name: str
    attend_at: str
    limits: BackendLimits = BackendLimits()
    decode_at: str | None = None
    ops_at: tuple[tuple[str, str], ...] = ()

    @property
    def attend(self) -> BlockSparseAttention:
        return _load(self.attend_at)

    @property
    def decode(self) -> DecodeKeeper | None:
        return None if self.decode_at is None else _load(self.decode_at)

    def op_at(self, op: str) -> str | None:
        """Where this backend's function for `op` lives, or None where it takes the device's."""
        if op == "attend":
            return self.attend_at
        return dict(self.ops_at).get(op)


def _load(where: str):
    """The function at "module:name"; looked up afresh (patched functions are seen), the module
    from sys.modules once imported (import_module cost ~1 us, several times a decode step)."""
    module, name = where.split(":")
    mod = sys.modules.get(f"{__package__}.{module}")
    return getattr(mod or importlib.import_module(f".{module}", __package__), name)


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        # plain torch for every op: what the other backends are tested against
        Backend("reference", "reference:block_sparse_attention_reference", ops_at=_TORCH_OPS),
        # C kernels (kernels/*.c, built on first use; torch where they do not apply)
        Backend(
            "cpu",
            "cpu:block_sparse_attention_cpu",
            decode_at="decode_cache:KEEPER",
            ops_at=(
                ("block_mass", "cpu_block_mass:pooled_block_mass_cpu"),
                ("row_mass", "cpu_block_mass:row_mass_cpu"),
                ("sketch_rows", "hadamard:srht_rows_cpu"),
                ("block_lists", "block_lists:block_lists"),
                ("absorb_token", "token_sketch:absorb_token_cpu"),
                ("take_best", "take_best:take_best"),
            ),
        ),
        # the Triton kernels (attention and the sampled estimator) tile key blocks in powers of
        # 2; the small ops run in torch on the GPU
        Backend(
            "triton",
            "triton_dispatch:block_sparse_attention_triton",
            BackendLimits(min_block=16, power_of_two=True),
            ops_at=(("block_mass", "triton_block_mass:pooled_block_mass_triton"),) + _TORCH_OPS[1:],
        ),
        # PyTorch's FlexAttention on the same lists (prefill; decode takes the device's kernel)
        Backend("flex", "flex:block_sparse_attention_flex", BackendLimits(16, True)),
    )
}
BACKENDS = ("auto", *REGISTRY)

_BOUND: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sketchwalk_kernel_backend", default=None
)


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Within this block, kernels on every device come from backend `name` (None: unchanged);
    a session binds its kernel_backend here for the length of its run."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {', '.join(BACKENDS)}")
    token = _BOUND.set(name if name is not None else _BOUND.get())
    try:
        yield
    finally:
        _BOUND.reset(token)


def kernel(op: str, device: torch.device | str, backend: str | None = None) -> Callable[..., Any]:
    """The function that runs `op` (OPS) on `device` for `backend` (else the bound one, else
    SKETCHWALK_KERNEL, else by device)."""
    if op not in OPS:
        raise ValueError(f"unknown kernel op {op!r}; choose one of {', '.join(OPS)}")
    name = choose_backend(device, backend)
    at = REGISTRY[name].op_at(op)
    if at is None:  # not this backend's own: the device's automatic backend runs it
        at = REGISTRY[choose_backend(device, "auto")].op_at(op)
    return _load(at)


def choose_backend(device: torch.device | str, backend: str | None = None) -> str:
    """The backend name for tensors on `device`: `backend`, else the one bound (use_backend),
    else SKETCHWALK_KERNEL, else auto."""
    backend = backend or _BOUND.get() or os.environ.get("SKETCHWALK_KERNEL", "auto")
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
    q's device; returns [B, H, Lq, D] in q's dtype. Lists over other key blocks than k's are
    refused (BlockLists.check_keys)."""
    lists.check_keys(k.shape[2])
    return backend_for(q.device, backend).attend(q, k, v, lists, causal, scale)
