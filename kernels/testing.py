"""Random kernel inputs, one module for the tests (tests/kernels) and the GPU check
(benchmarks/gpu_check.py): tensors and index lists of many shapes, so both exercise the same
situations. Plain torch, no test framework."""

from __future__ import annotations

import torch


def random_qkv(
    batch: int,
    heads: int,
    kv_heads: int,
    lq: int,
    lk: int,
    dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B,H,Lq,D], k/v [B,Hkv,Lk,D]; scaled so softmax is neither flat nor one-hot."""
    q = torch.randn(batch, heads, lq, dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, lk, dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, lk, dim, generator=gen).to(dtype)
    return q, k, v


def random_block_index(
    batch: int,
    groups: int,
    lq: int,
    lk: int,
    block_size: int,
    density: float,
    gen: torch.Generator,
    diagonal: bool = True,
    junk: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted random causal key-block lists per (batch, group, query block), varying counts.

    Each list keeps about `density` of its causal blocks (at least one), always the diagonal block(s)
    when `diagonal`; entries past the count hold junk when `junk`, since kernels must ignore them.
    """
    b = block_size
    nq, nk = -(-lq // b), -(-lk // b)
    off = lk - lq
    index = torch.zeros(batch, groups, nq, nk, dtype=torch.int32)
    count = torch.zeros(batch, groups, nq, dtype=torch.int32)
    for bi in range(batch):
        for gi in range(groups):
            for i in range(nq):
                last = (off + min(i * b + b, lq) - 1) // b  # last causal key block
                first_diag = (off + i * b) // b
                cand = torch.arange(last + 1)
                want = max(1, round(density * (last + 1)))
                keep = cand[torch.randperm(last + 1, generator=gen)[:want]]
                if diagonal:
                    keep = torch.cat([keep, torch.arange(first_diag, last + 1)])
                keep = torch.unique(keep)
                index[bi, gi, i, : keep.numel()] = keep.to(torch.int32)
                count[bi, gi, i] = keep.numel()
                if junk and keep.numel() < nk:
                    index[bi, gi, i, keep.numel() :] = torch.randint(
                        0, nk, (nk - keep.numel(),), generator=gen
                    )
    return index, count


def patterned_block_index(
    batch: int,
    groups: int,
    lq: int,
    lk: int,
    block_size: int,
    gen: torch.Generator,
    sink: int = 2,
    window: int = 3,
    extra: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the selector really emits: sink blocks, a local window ending at the diagonal, and a
    few scattered picks between them (runs of blocks, which the CPU path reads as strided views)."""
    b = block_size
    nq, nk = -(-lq // b), -(-lk // b)
    off = lk - lq
    index = torch.full((batch, groups, nq, nk), nk + 7, dtype=torch.int32)  # junk past the count
    count = torch.zeros(batch, groups, nq, dtype=torch.int32)
    for bi in range(batch):
        for gi in range(groups):
            for i in range(nq):
                last = (off + min(i * b + b, lq) - 1) // b
                keep = set(range(min(sink, last + 1))) | set(range(max(0, last - window), last + 1))
                middle = [j for j in range(last + 1) if j not in keep]
                if middle:
                    pick = torch.randperm(len(middle), generator=gen)[:extra]
                    keep |= {middle[int(p)] for p in pick}
                ids = sorted(keep)
                index[bi, gi, i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
                count[bi, gi, i] = len(ids)
    return index, count


def staircase_block_index(
    batch: int, groups: int, lq: int, lk: int, block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sink runs of uneven, mostly growing length per row, a window, and the last rows dense: the
    CPU path shares one sink run between neighbouring rows and moves the excess to its middle."""
    b = block_size
    nq, nk = -(-lq // b), -(-lk // b)
    off = lk - lq
    index = torch.full((batch, groups, nq, nk), -1, dtype=torch.int32)
    count = torch.zeros(batch, groups, nq, dtype=torch.int32)
    for bi in range(batch):
        for gi in range(groups):
            for i in range(nq):
                last = (off + min(i * b + b, lq) - 1) // b
                prefix = 1 + i // 2 + int(torch.randint(0, 3, (1,), generator=gen))
                if i >= nq - 2:  # dense rows
                    prefix = last + 1
                keep = set(range(min(prefix, last + 1))) | set(range(max(0, last - 1), last + 1))
                ids = sorted(keep)
                index[bi, gi, i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
                count[bi, gi, i] = len(ids)
    return index, count


def uneven_block_index(
    batch: int,
    groups: int,
    lq: int,
    lk: int,
    block_size: int,
    gen: torch.Generator,
    tile: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists shaped like a real layer budget's, one per query tile of `tile` blocks: very uneven
    counts (each group's first row 1 block, its second nearly all, some rows empty), a sink that
    may be missing, and a window ending at the diagonal whose first blocks are sometimes dropped."""
    b, qt = block_size, block_size * tile
    nq, nk = -(-lq // qt), -(-lk // b)
    off = lk - lq
    index = torch.zeros(batch, groups, nq, nk, dtype=torch.int32)
    count = torch.zeros(batch, groups, nq, dtype=torch.int32)

    def draw(hi: int) -> int:
        return int(torch.randint(0, hi, (1,), generator=gen))

    for bi in range(batch):
        for gi in range(groups):
            for i in range(nq):
                last = min((off + min(i * qt + qt, lq) - 1) // b, nk - 1)  # last causal block
                if i == 0:
                    keep = {draw(last + 1)}
                elif i == 1 or draw(8) == 0:
                    keep = set(range(last + 1)) - {draw(last + 1)}
                elif draw(10) == 0:
                    keep = set()
                else:
                    window = tile + 2 + draw(3)
                    keep = set(range(max(0, last - window + 1 + draw(2)), last + 1))
                    if draw(4):
                        keep.add(0)
                    extra = torch.randperm(last + 1, generator=gen)[: draw(last + 1)]
                    keep |= set(extra.tolist())
                ids = sorted(keep)
                index[bi, gi, i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
                count[bi, gi, i] = len(ids)
    return index, count


def poisoned(like: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel forgets to write stays NaN."""
    return torch.full_like(like, float("nan"))


def with_spare_rows(x: torch.Tensor, spare: int) -> torch.Tensor:
    """x [B, H, L, D] as the filled part of a buffer with `spare` more rows per head, NaN there,
    as a growing KV cache hands it over (engine/hf/cache.py): a kernel that reads past L, or that
    assumes the heads are L rows apart, gives NaN or wrong values."""
    bsz, h, length, d = x.shape
    buf = torch.full((bsz, h, length + spare, d), float("nan"), dtype=x.dtype)
    buf[:, :, :length] = x
    return buf[:, :, :length]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in fp32; NaN anywhere gives inf (never passes)."""
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
