"""One decode token into a layer's sketched block sums in C (token_sketch.c), beside its torch twin.

Why: decode adds every token to each layer's sketch state (the query and key sketches, their
block sums, the squared key sketches, the counts): ~15 torch ops of a few floats each, ~0.25 ms
a layer, a tenth of a sparse step at 7k tokens. One C call does it. Returns None where it does
not apply (not CPU, not float32, no compiled library), and the caller runs `absorb_token_torch`.
"""

from __future__ import annotations

import torch

from .native import library, runs_on


def absorb_token_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    matrix: torch.Tensor,
    q_sum: torch.Tensor,
    k_sum: torch.Tensor,
    k_sq: torch.Tensor | None,
    q_count: torch.Tensor,
    k_count: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference: q [B, H, d], k [B, Hkv, d] (one token), matrix [d, r]; adds the sketches
    to q_sum [B, H, r], k_sum and k_sq [B, Hkv, r] and one to q_count, k_count [B] (views of the
    token's block, changed in place); returns the query sketches [B, H, r], written into `out`
    where given (a view: the decode state's window slot)."""
    qs, ks = q.float() @ matrix, k.float() @ matrix
    if out is not None:
        qs = out.copy_(qs)
    q_sum.add_(qs)
    k_sum.add_(ks)
    if k_sq is not None:
        k_sq.add_(ks * ks)
    q_count.add_(1.0)
    k_count.add_(1.0)
    return qs


def absorb_token(
    q: torch.Tensor,
    k: torch.Tensor,
    matrix: torch.Tensor,
    q_sum: torch.Tensor,
    k_sum: torch.Tensor,
    k_sq: torch.Tensor | None,
    q_count: torch.Tensor,
    k_count: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """absorb_token_torch in one C call where it applies (else None: nothing changed)."""
    bsz, h, d = q.shape
    r = matrix.shape[1]
    out = torch.empty(bsz, h, r) if out is None else out
    sums = [q_sum, k_sum, out] + ([] if k_sq is None else [k_sq])
    if matrix.stride(0) != matrix.shape[1] or not runs_on(q, k, matrix, *sums):
        return None
    if q_count.dtype != torch.float32 or k_count.dtype != torch.float32:
        return None
    sq = (None, 0, 0) if k_sq is None else (k_sq.data_ptr(), *k_sq.stride()[:2])
    library().absorb_token_f32(
        q.data_ptr(), *q.stride()[:2], k.data_ptr(), *k.stride()[:2], matrix.data_ptr(), d, r,
        bsz, h, k.shape[1], q_sum.data_ptr(), *q_sum.stride()[:2], k_sum.data_ptr(),
        *k_sum.stride()[:2], *sq, q_count.data_ptr(), q_count.stride(0), k_count.data_ptr(),
        k_count.stride(0), out.data_ptr(), *out.stride()[:2],
    )  # fmt: skip
    return out


def absorb_token_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    matrix: torch.Tensor,
    q_sum: torch.Tensor,
    k_sum: torch.Tensor,
    k_sq: torch.Tensor | None,
    q_count: torch.Tensor,
    k_count: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The backends' absorb_token op on a CPU: one C call where it applies, else the torch twin."""
    sums = (q_sum, k_sum, k_sq, q_count, k_count)
    got = absorb_token(q, k, matrix, *sums, out=out)
    return absorb_token_torch(q, k, matrix, *sums, out=out) if got is None else got
