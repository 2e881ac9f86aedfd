"""The sampled estimator's block mass on a CPU (or in plain torch): the launcher of
block_softmax.c, beside the reference it must match (kernels/block_mass_reference.py).

A few sketched queries per query block are scored against every sketched key; each query's
softmax mass is summed per key block and pooled over the block's scored queries. On CPU float32
the scores and block mass are one C call (scored_block_mass); otherwise a chunked torch product,
then the softmax sums in C (or in torch with native=False). Work is cut into parts of equal causal
work, one per core. The Triton kernel for GPUs is kernels/triton_block_mass.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .block_softmax import (
    PackedKeys,
    block_softmax_sums,
    block_softmax_sums_reference,
    pack_keys,
    pack_keys_vnni,
    scored_block_mass,
)
from .native import amx, library
from .parts import run_in_parts, workers
from .pooling import kv_rows, mean_per_row, pool_heads, pool_into

# A chunk scores its queries against the keys up to its last query: the keys past each earlier
# query are computed and masked, on average half the chunk's span per query. At short contexts
# the element budget alone made chunks span a fifth of the keys (2048 tokens: ~20% wasted); with
# spans capped at lk / 16 the estimator ran 1.2-1.8x faster at 1-2k tokens, the same from 4k on.
_CHUNK_SPAN = 16


_SCORE_ELEMS = 1 << 21  # scores per chunk of the torch product: measured best here


# The fused kernel writes block masses, not scores, and scores each tile of rows only up to its
# own causal end, so its chunks need no span cap: at most this many masses (16 MB) a chunk, at
# 7376 tokens one call per core instead of ~30 calls of ~30 queries.
_FUSED_ELEMS = 1 << 22


_PART_QUERIES = 32  # scored queries a thread must get to be worth starting


def _chunk_queries(pos: torch.Tensor, lk: int, row_elems: int, chunk_elems: int) -> int:
    """Queries per chunk: at most chunk_elems score elements (row_elems per query), and
    spanning at most lk / _CHUNK_SPAN positions, but never fewer than 16 queries (each chunk
    costs a dozen small ops)."""
    step = max(1, chunk_elems // max(row_elems, 1))
    if pos.numel() > 1:
        per_token = pos.numel() / (int(pos[-1]) - int(pos[0]) + 1)
        step = min(step, max(16, int(lk / _CHUNK_SPAN * per_token)))
    return step


@dataclass(frozen=True)
class _MassChunks:
    """What every chunk of one sampled_block_mass call reads, and the chunks' scoring: queries
    are scored chunk by chunk (bounded memory), each chunk only against the keys it can see."""

    qs: torch.Tensor  # [B, H, S, r] sketched queries
    q_valid: torch.Tensor  # [B, S]
    pos: torch.Tensor  # [S] their positions, on qs's device
    keys: torch.Tensor  # packed for the fused kernel, else [B, Hkv, r, Lk] in the product dtype
    start: torch.Tensor  # [B, 1, 1] each sequence's first real key
    end: torch.Tensor  # [B, 1, 1] one past its last real key
    out: torch.Tensor  # [B, Hkv, G, R, n] the masses, pooled per row
    c: float  # the logits' scale, dim ** -0.5 / tau
    block_size: int
    lk: int  # keys
    first_row: int  # the query block of out's row 0
    step: int  # queries per chunk
    span: int  # the torch product's key widths are multiples of it
    fused: bool  # scores and block mass in one C call (kernels/block_softmax.py)
    dtype: torch.dtype  # of the score product
    pool: str
    softmax_sums: Callable[..., torch.Tensor]

    def score(self, s0: int, s1: int) -> None:
        """Queries s0 .. s1 - 1, chunk by chunk, into their rows of out. The torch product
        writes into one buffer per part, sized for the longest chunk: chunks score ever more
        keys, and a fresh, larger block per chunk is rarely reused by the heap."""
        buf = None
        if not self.fused:
            bsz, hkv, gh = self.out.shape[:3]
            size = bsz * hkv * gh * self.step * self.lk
            buf = torch.empty(size, dtype=self.dtype, device=self.qs.device)
        for s in range(s0, s1, self.step):
            self.chunk(s, min(s1, s + self.step), buf)

    def chunk(self, s: int, e: int, buf: torch.Tensor | None = None) -> None:
        """Queries s .. e - 1: their softmax over each row's visible keys, summed per key block
        (kernels/block_softmax: in C on CPU, without writing the probabilities: ~half the
        estimator's time in torch), then pooled into their rows of out."""
        bsz, hkv, gh = self.out.shape[:3]
        b, lk = self.block_size, self.lk
        p = self.pos[s:e]
        kend = int(p[-1]) + 1  # no query of this chunk sees past itself
        if not self.fused:
            kend = min(lk, -(-kend // self.span) * self.span)
        nkc = -(-kend // b)
        qg = kv_rows(self.qs[:, :, s:e] * self.c, hkv).to(self.dtype)
        hi = torch.minimum((p + 1).repeat(gh)[None, None], self.end)
        if self.fused:
            mass = scored_block_mass(qg, self.keys, self.start, hi, b, min(kend, lk))
        else:
            kk = self.keys[..., : min(kend, lk)]
            shape = (*qg.shape[:-1], kk.shape[-1])  # [B, Hkv, G * c, kend]
            scores = torch.matmul(qg, kk, out=buf[: math.prod(shape)].view(shape))
            mass = self.softmax_sums(scores, self.start, hi, b)
        mass = mass.view(bsz, hkv, gh, e - s, nkc)
        if not bool(self.q_valid[:, s:e].all()):
            mass.masked_fill_(~self.q_valid[:, None, None, s:e, None], 0.0)  # padding queries
        pool_into(self.out[..., :nkc], 3, p // b - self.first_row, mass, self.pool)


def sampled_block_mass(  # many parameters: the block_mass op's inputs and its scalar knobs
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    chunk_elems: int | None = None,
    pool: str = "mean",
    dtype: torch.dtype = torch.float32,
    native: bool = True,
) -> torch.Tensor:
    """Block mass [B, Hkv, G, R, n] for the query blocks pos[0] // b .. pos[-1] // b from the
    sketched queries qs [B, H, S, r] at ascending positions pos [S] (q_valid [B, S]) against the
    sketched keys ks [B, Hkv, Lk, r] at positions 0 .. Lk - 1 (k_valid [B, Lk], one span of
    real keys per sequence, as padding makes it); each query sees
    the real keys up to itself, a row's estimate is the mean over its scored queries, or with
    pool "max" each key block's largest mass among them (padding queries count as 0). dtype:
    of the score product (score_dtype); the softmax and the masses are float32. chunk_elems:
    what one pass over a chunk of queries may hold (scores, or the fused kernel's block masses;
    None: the measured defaults below). native False: torch only, no C kernel (the reference
    backend's path)."""
    bsz, h, length, r = qs.shape
    hkv, lk = ks.shape[1], ks.shape[2]
    gh, b = h // hkv, block_size
    n = -(-lk // b)
    blk_host = pos.cpu() // b  # positions are host values: their blocks sized without a sync
    pos = pos.to(qs.device)
    blk_all = pos // b
    j0 = int(blk_host[0])
    rows = int(blk_host[-1]) - j0 + 1
    out = torch.zeros(bsz, hkv, gh, rows, n, device=qs.device)
    # float32 on CPU: scores and block mass in one C call over keys packed in panels
    # (kernels/block_softmax.py scored_block_mass: a layer's estimate 1.5x faster at 7k tokens
    # than the product and the C softmax apart); bfloat16 the same call on AMX tiles where the
    # CPU has them (keys packed in pairs, pack_keys_vnni). Otherwise [B, Hkv, r, Lk], contiguous: a
    # bfloat16 product over a key prefix of the transposed view copied the keys in every chunk
    # (~1.7x slower)
    fused = native and qs.device.type == "cpu" and library() is not None
    fused = fused and (dtype == torch.float32 or (dtype == torch.bfloat16 and _amx_fits(ks)))
    if fused:  # bfloat16: the same call on AMX tiles (block_softmax.c), keys paired for them
        keys = pack_keys(ks) if dtype == torch.float32 else pack_keys_vnni(ks)
    else:
        keys = ks.transpose(-1, -2).to(dtype, memory_format=torch.contiguous_format)
    start, end = _key_span(k_valid)
    if fused:  # bounded by its output alone: every row tile's keys end at its own queries
        step = max(1, (chunk_elems or _FUSED_ELEMS) // max(h * n * bsz, 1))
    else:
        step = _chunk_queries(pos, lk, h * lk * bsz, chunk_elems or _SCORE_ELEMS)
    # the torch product's key widths rounded up to a few sizes: every distinct width was a new
    # oneDNN bfloat16 primitive (kept in its cache, with its own scratch), and at 64k tokens a
    # layer's ~1000 chunks held 3.2 GB that way; the extra keys are masked like any future key
    span = max(b, -(-lk // (_CHUNK_SPAN * b)) * b)
    softmax_sums = block_softmax_sums if native else block_softmax_sums_reference
    chunks = _MassChunks(
        qs, q_valid, pos, keys, start, end, out, dim**-0.5 / tau, b, lk, j0, step, span, fused,
        dtype, pool, softmax_sums,
    )  # fmt: skip
    # on CPU, one part per core (kernels/parts.py: at 7k tokens 1.6x faster than every op on
    # both cores); parts end at query blocks, so they add into disjoint rows of out
    on_cpu = qs.device.type == "cpu"
    cuts = _cuts_by_work(pos, b, workers(), _PART_QUERIES) if on_cpu else [0, length]
    if len(cuts) > 2:
        run_in_parts(chunks.score, cuts)
    else:
        chunks.score(0, length)
    return out if pool == "max" else mean_per_row(out, blk_all - j0, q_valid)


def _amx_fits(ks: torch.Tensor) -> bool:
    """Whether the bfloat16 product can run fused on AMX tiles: the CPU has them and the sketch
    width is one the tile kernel takes."""
    return ks.shape[-1] in (64, 128) and amx()


def _key_span(k_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, 1, 1] first real key and one past the last: each sequence's real keys are one span
    (left or right padding), so a query at p sees start .. min(p + 1, end) - 1."""
    bsz, lk = k_valid.shape
    at = torch.arange(lk, device=k_valid.device)
    start = torch.where(k_valid, at, lk).amin(1).view(bsz, 1, 1)
    end = torch.where(k_valid, at + 1, 0).amax(1).view(bsz, 1, 1)
    return start, end


def _cuts_by_work(pos: torch.Tensor, b: int, parts: int, min_len: int) -> list[int]:
    """Bounds [0, ..., L] cutting L ascending query positions into `parts` runs of about equal
    causal work (a query at p scores p + 1 keys), each ending at a query block; [0, L] when a
    part would be shorter than min_len queries."""
    length = pos.numel()
    if parts < 2 or length < parts * min_len:
        return [0, length]
    work = (pos.cpu().double() + 1).cumsum(0)
    blk = pos.cpu() // b
    starts = torch.nonzero(blk[1:] != blk[:-1]).squeeze(1) + 1  # first query of each block
    want = torch.searchsorted(work, work[-1] * torch.arange(1, parts) / parts)
    at = torch.searchsorted(starts, want)
    cuts = [int(starts[i]) for i in at.tolist() if i < starts.numel()]
    return sorted({0, length, *cuts})


def pooled_block_mass_cpu(  # many parameters: the block_mass op's (kernels/backends.py)
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    pool: str = "max",
    dtype: torch.dtype = torch.float32,
    native: bool = True,
) -> torch.Tensor:
    """The backends' block_mass op on a CPU: sampled_block_mass pooled over each KV head's query
    heads, [B, Hkv, R, n] (the contract of kernels/block_mass_reference.py). native False: in
    torch alone (the reference backend's op: chunked, so memory stays bounded at any length,
    unlike pooled_block_mass_reference)."""
    mass = sampled_block_mass(qs, q_valid, pos, ks, k_valid, block_size, dim, tau,
                              pool=pool, dtype=dtype, native=native)  # fmt: skip
    return pool_heads(mass, pool)


pooled_block_mass_torch = functools.partial(pooled_block_mass_cpu, native=False)


def row_mass_cpu(  # the row_mass op's parameters (kernels/backends.py)
    q: torch.Tensor,
    keys: torch.Tensor,
    lo: torch.Tensor | int,
    hi: torch.Tensor | int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    packed: PackedKeys | None = None,
) -> torch.Tensor:
    """The backends' row_mass op on a CPU (row_mass_reference's contract): bfloat16 on AMX tiles
    with a PackedKeys to keep, one fused C call over the kept keys (decode at 2k / 7k tokens:
    ~2x faster than the float32 product over the cache and the softmax apart, half the bytes
    read); else the product and block_softmax_sums (C where it applies)."""
    if packed is not None and dtype == torch.bfloat16 and library() is not None and _amx_fits(keys):
        panels = packed.update(keys)
        return scored_block_mass(q.to(dtype), panels, lo, hi, block_size, keys.shape[-2])
    scores = q.to(dtype).float() @ keys.to(dtype).float().transpose(-1, -2)
    return block_softmax_sums(scores, lo, hi, block_size)
