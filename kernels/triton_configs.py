"""Tile shapes for the Triton block-sparse kernels, by GPU generation, head dim, dtype and block size.

Prefill tiles: BLOCK_M query rows per program (at most the rows that share one list, and dividing
them), BLOCK_N keys per inner step (several 16/32-token blocks gathered into one step, or one
64/128-token block cut into sub-steps), warps, and software-pipeline stages. The table starts from
the shapes Triton's fused-attention tutorial keeps on Hopper (128x128 tiles with 8 warps where the
tile allows) and was checked by compiling every fitted entry offline for sm90/sm80/sm89 with
padding on (the widest variant): no register spills, shared memory within the SM's. The key loads
hang off an index load, so Triton's pipeliner splits the stages between the two: 3 stages = two
K/V buffers in flight on sm90 (64x64 tiles at head dim 128: ~82 KiB, two CTAs per SM), 5 = three
(~115 KiB, one CTA). 64x128 tiles with 4 warps spill at head dim 128, so head dim 128 steps 64 keys.
fp32 (exact dots, tests only) runs small tiles: its FMA dots spill at 64x64.
None of it is timed here: SKETCHWALK_TRITON_AUTOTUNE=1 times `prefill_candidates` on the GPU.
The interpreter (capability None) gets Hopper's tiles, so CPU tests run the shapes the GPU runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillConfig:
    """One prefill launch's tile shape (powers of two; block_m, block_n >= 16)."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class DecodeConfig:
    """Split-K decode: keys per inner step (small blocks gathered), warps, pipeline stages."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


# 16-bit inputs: (largest head dim, config) per generation, first match wins.
_TABLE: dict[str, list[tuple[int, PrefillConfig]]] = {
    "hopper": [  # sm90 / sm100: ~227 KiB shared memory per SM
        (64, PrefillConfig(128, 128, 8, 3)),
        (128, PrefillConfig(128, 64, 8, 3)),
        (256, PrefillConfig(64, 32, 4, 2)),
    ],
    "ampere": [  # sm80: ~163 KiB; 128x64 at head dim 128 spills there
        (64, PrefillConfig(128, 64, 8, 3)),
        (128, PrefillConfig(128, 32, 8, 2)),
        (256, PrefillConfig(64, 32, 4, 2)),
    ],
    "small": [  # sm75, sm86, sm89, sm120: ~100 KiB
        (128, PrefillConfig(64, 64, 4, 2)),
        (256, PrefillConfig(64, 32, 4, 1)),
    ],
}


def generation(capability: tuple[int, int] | None) -> str:
    """The table row for a compute capability; None (the interpreter) reads Hopper's."""
    if capability is None or capability[0] in (9, 10):
        return "hopper"
    if capability == (8, 0):
        return "ampere"
    return "small"


def query_tile(block_size: int, query_block: int | None) -> int:
    """Rows that share one list: query_block when given (a multiple of block_size), else one block."""
    tile = block_size if not query_block else int(query_block)
    if tile % block_size:
        raise ValueError(f"query block {tile} must be a multiple of the block size {block_size}")
    return tile


def _fit(cfg: PrefillConfig, tile: int, dtype: torch.dtype) -> PrefillConfig:
    """Shrink a table entry to what the query tile and dtype allow."""
    bm = min(cfg.block_m, tile & -tile)  # largest power of two dividing the tile
    bn, warps, stages = cfg.block_n, cfg.num_warps, cfg.num_stages
    if dtype == torch.float32:  # twice the bytes per tile, exact (not tf32) dots
        bm, bn, stages = min(bm, 64), min(bn, 32), min(stages, 2)
    if bm < 128:
        warps = min(warps, 4)
    return PrefillConfig(bm, bn, warps, stages)


def prefill_config(
    capability: tuple[int, int] | None,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    query_block: int | None = None,
) -> PrefillConfig:
    """The table's tiles for this launch, fitted to its query tile and dtype. Any BLOCK_N suits any
    block size: smaller blocks are gathered into a step, larger ones cut into sub-steps."""
    tile = query_tile(block_size, query_block)
    rows = _TABLE[generation(capability)]
    cfg = next((c for d, c in rows if head_dim <= d), rows[-1][1])
    return _fit(cfg, tile, dtype)


def check_prefill_config(cfg: PrefillConfig, tile: int) -> None:
    """An explicit override must be a launchable shape for this tile (one-line ValueError)."""
    for name in ("block_m", "block_n"):
        x = getattr(cfg, name)
        if x < 16 or x & (x - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {x}")
    if tile % cfg.block_m:
        raise ValueError(f"block_m {cfg.block_m} must divide the query tile of {tile} rows")
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.num_stages < 1:
        raise ValueError(f"bad num_warps {cfg.num_warps} or num_stages {cfg.num_stages}")


def prefill_candidates(tile: int, head_dim: int, dtype: torch.dtype) -> list[PrefillConfig]:
    """The shapes SKETCHWALK_TRITON_AUTOTUNE=1 times: the table's neighbourhood, tile-fitted."""
    out = []
    for bm in (64, 128):
        for bn in (32, 64, 128):
            for warps, stages in ((4, 2), (4, 3), (4, 5), (8, 2), (8, 3), (8, 5)):
                if head_dim > 128 and bn > 64:
                    continue
                cfg = _fit(PrefillConfig(bm, bn, warps, stages), tile, dtype)
                if cfg not in out:
                    out.append(cfg)
    return out


def decode_config(capability: tuple[int, int] | None) -> DecodeConfig:
    """Decode is bandwidth-bound: 64 keys a step (four 16-blocks gathered), deeper pipelines
    where shared memory allows."""
    return DecodeConfig(64, 4, 3 if generation(capability) != "small" else 2)


def autotune_enabled(device: torch.device) -> bool:
    """SKETCHWALK_TRITON_AUTOTUNE=1 on a CUDA device (never in the interpreter: it times kernels)."""
    return device.type == "cuda" and os.environ.get("SKETCHWALK_TRITON_AUTOTUNE") == "1"
