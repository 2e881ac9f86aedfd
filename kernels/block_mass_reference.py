"""The torch reference of the sampled estimator's block mass, pooled over a KV head's query heads.

`pooled_block_mass_reference` is the plain version kernels/triton_block_mass.py must match: the
dense masked scores of every scored query against every key, a softmax per query, its sum per key
block, pooled over each query block's scored queries and over the query heads of a KV head. It
writes the whole [B, H, S, Lk] score matrix, so it is for tests and small inputs only. Torch only
(no Triton), so CPU tests can import it.
"""

from __future__ import annotations

import torch

POOLS = ("max", "mean")


def check_block_mass_inputs(
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    pos: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    block_size: int,
    pool: str,
) -> None:
    """One-line ValueErrors for inputs the estimator cannot take (shapes, block size, pool).
    Reads pos, which must be on the CPU (the kernel's row pointer is built there: no sync)."""
    if qs.dim() != 4 or ks.dim() != 4:
        raise ValueError(f"qs and ks must be [B, H, S, r] and [B, Hkv, Lk, r], got "
                         f"{tuple(qs.shape)} and {tuple(ks.shape)}")  # fmt: skip
    bsz, h, s, r = qs.shape
    hkv, lk = ks.shape[1], ks.shape[2]
    if ks.shape[0] != bsz or ks.shape[3] != r or hkv == 0 or h % hkv:
        raise ValueError(f"keys {tuple(ks.shape)} do not fit queries {tuple(qs.shape)} "
                         "(same batch and sketch width, heads a multiple of KV heads)")  # fmt: skip
    if s == 0 or lk == 0 or r == 0:
        raise ValueError(f"need at least one query, key and sketch coordinate, got S={s}, "
                         f"Lk={lk}, r={r}")  # fmt: skip
    if tuple(q_valid.shape) != (bsz, s) or tuple(k_valid.shape) != (bsz, lk):
        raise ValueError(f"q_valid {tuple(q_valid.shape)} / k_valid {tuple(k_valid.shape)} "
                         f"must be [B, S] = {(bsz, s)} / [B, Lk] = {(bsz, lk)}")  # fmt: skip
    if pos.dim() != 1 or pos.numel() != s or pos.is_floating_point() or pos.device.type != "cpu":
        raise ValueError(f"pos must be S = {s} integer positions in a CPU tensor, got "
                         f"{tuple(pos.shape)} {pos.dtype} on {pos.device}")  # fmt: skip
    if int(pos[0]) < 0 or (s > 1 and not bool((pos[1:] > pos[:-1]).all())):
        raise ValueError("pos must be non-negative and strictly ascending")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")


def normalise_rows(mass: torch.Tensor) -> torch.Tensor:
    """Rows of pooled block mass [..., n] scaled to sum to 1 (rows of zeros stay zero), as
    engine/method/sketch.py aggregate_heads does after pooling."""
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp(min=1e-30), mass)


def pooled_block_mass_reference(  # many parameters: the block_mass op's (kernels/backends.py)
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
) -> torch.Tensor:
    """Pooled block mass [B, Hkv, R, n] (float32, rows not normalised) for the query blocks
    pos[0] // b .. pos[-1] // b and the key blocks 0 .. ceil(Lk / b) - 1.

    The query qs[:, h, s] at position pos[s] sees the keys j with k_valid[:, j] and j <= pos[s];
    its softmax of c q.k (c = dim**-0.5 / tau; q scaled by c, then q and k rounded to `dtype`
    for the product, the softmax in float32) is summed per key block. pool "max": each row
    block's largest mass per key block over its scored queries and the KV head's query heads
    (padding queries count as 0); "mean": the sum over the query heads of the mean over the row
    block's real scored queries (0 without one)."""
    check_block_mass_inputs(qs, q_valid, pos, ks, k_valid, block_size, pool)
    bsz, h, s, r = qs.shape
    hkv, lk = ks.shape[1], ks.shape[2]
    gh, b = h // hkv, block_size
    n = -(-lk // b)
    dev = qs.device
    pos = pos.to(dev, torch.int64)
    c = dim**-0.5 / tau
    q = (qs.float() * c).to(dtype).view(bsz, hkv, gh, s, r)
    k = ks.to(dtype)[:, :, None]  # [B, Hkv, 1, Lk, r]
    scores = (q @ k.transpose(-1, -2)).float()  # [B, Hkv, G, S, Lk]
    seen = k_valid.bool()[:, None, :] & (torch.arange(lk, device=dev) <= pos[:, None])[None]
    scores = scores.masked_fill(~seen[:, None, None], float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # a query that sees no key: 0
    probs = probs * q_valid.float()[:, None, None, :, None]
    probs = torch.nn.functional.pad(probs, (0, n * b - lk))
    mass = probs.unflatten(-1, (n, b)).sum(-1)  # [B, Hkv, G, S, n]
    rows = pos // b - pos[0] // b
    nrows = int(rows[-1]) + 1
    out = torch.zeros(bsz, hkv, nrows, n, device=dev)
    for i in range(nrows):  # the scored queries of row block i, with all G heads
        mine = mass[:, :, :, rows == i]  # [B, Hkv, G, s_i, n]
        if mine.shape[3] == 0:
            continue
        if pool == "max":
            out[:, :, i] = mine.amax(dim=(2, 3))
        else:
            count = q_valid[:, rows == i].float().sum(1).clamp(min=1.0)  # [B]
            out[:, :, i] = mine.sum(dim=(2, 3)) / count[:, None, None]
    return out


__all__ = ["check_block_mass_inputs", "normalise_rows", "pooled_block_mass_reference"]
