"""A prefill's sketch of many rows in C (hadamard.c), with their block sums and squares, beside
its torch reference.

Why: the sketch as a [L, d] x [d, r] product costs d * r multiply-adds a row, the Hadamard
transform it stands for m log2(m) additions; at 7k tokens the keys' sketch and its two poolings
were ~3 ms of a layer's selection. `srht_rows` returns None where the C kernel does not apply
(not CPU, not float32, no compiled library, a padded width outside 8 .. 1024), and the caller runs
`srht_rows_reference`.
"""

from __future__ import annotations

import torch

from .native import library
from .parts import run_in_parts, workers

_MAX_WIDTH = 1024  # MAX_VECTORS * 8 in hadamard.c
# rows from which a second thread starts: at 7k tokens (22k keys) two gained nothing in a layer
_PART_ROWS = 1 << 16


def srht_rows_reference(
    x: torch.Tensor,
    matrix: torch.Tensor,
    block_size: int = 0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """x [B, H, L, d] @ matrix [d, r] in float32, and with block_size the sums of the sketched
    rows and of their squares per block of block_size rows [B, H, ceil(L / b), r], each row
    weighted by weights [B, L] (None: 1)."""
    y = x.float() @ matrix
    if not block_size:
        return y, None, None
    bsz, h, length, r = y.shape
    n = -(-length // block_size)
    w = torch.ones(bsz, length, device=y.device) if weights is None else weights.float()
    w = torch.nn.functional.pad(w, (0, n * block_size - length))[:, None, :, None]
    yp = torch.nn.functional.pad(y, (0, 0, 0, n * block_size - length))
    sums = (yp * w).unflatten(2, (n, block_size)).sum(3)
    squares = (yp * yp * w).unflatten(2, (n, block_size)).sum(3)
    return y, sums, squares


def srht_rows(
    x: torch.Tensor,
    signs: torch.Tensor,
    keep: torch.Tensor | None,
    factor: float,
    block_size: int = 0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """srht_rows_reference for the sketch factor * H_m (signs * pad(x))[keep] (signs [m], keep
    [r] int64 or None for every coordinate), in C; None where it does not apply."""
    lib = library() if x.device.type == "cpu" else None
    m = signs.shape[0]
    if x.shape[-1] > m:
        raise ValueError(f"rows of {x.shape[-1]} coordinates for a sketch of width {m}")
    if (
        lib is None
        or x.dtype != torch.float32
        or x.stride(-1) != 1
        or not 8 <= m <= _MAX_WIDTH
        or m & (m - 1)
    ):
        return None
    bsz, h, length, d = x.shape
    r = m if keep is None else keep.shape[0]
    b = block_size or length or 1
    n = -(-length // b)
    sg = signs.float().contiguous()
    kp = None if keep is None else keep.to(torch.int64).contiguous()
    w = None if weights is None else weights.float().contiguous()
    y = torch.empty(bsz, h, length, r)
    sums = torch.zeros(bsz, h, n, r) if block_size else None
    squares = torch.zeros(bsz, h, n, r) if block_size else None
    parts = max(1, min(workers(), n, bsz * h * length // _PART_ROWS))

    def run(part: int, _end: int) -> None:
        status = lib.srht_rows_f32(
            x.data_ptr(), bsz * h, h, length, x.stride(0), x.stride(1), x.stride(2), d, m,
            sg.data_ptr(), None if kp is None else kp.data_ptr(), r, float(factor),
            None if w is None else w.data_ptr(), b, part, parts, y.data_ptr(),
            None if sums is None else sums.data_ptr(),
            None if squares is None else squares.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise MemoryError("srht_rows: no memory for a row's scratch")

    if parts > 1:
        run_in_parts(run, list(range(parts + 1)))
    else:
        run(0, 1)
    return y, sums, squares


def srht_rows_torch(
    x: torch.Tensor,
    matrix: torch.Tensor,
    signs: torch.Tensor,
    keep: torch.Tensor | None,
    factor: float,
    block_size: int = 0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The backends' sketch_rows op in torch: x [B, H, L, d] through the sketch's [d, r] matrix
    (the same map as signs, keep and factor), with its block sums and squares."""
    return srht_rows_reference(x, matrix.to(x.device), block_size, weights)


def srht_rows_cpu(
    x: torch.Tensor,
    matrix: torch.Tensor,
    signs: torch.Tensor,
    keep: torch.Tensor | None,
    factor: float,
    block_size: int = 0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The backends' sketch_rows op on a CPU: the fast transform in C where it applies, else
    srht_rows_torch."""
    fast = srht_rows(x, signs, keep, factor, block_size, weights)
    if fast is not None:
        return fast
    return srht_rows_torch(x, matrix, signs, keep, factor, block_size, weights)
