"""Softmax mass per key block of score rows: the sampled estimator's inner loop.

`block_softmax_sums(scores, lo, hi, block_size)`: row i's softmax over its columns lo .. hi - 1,
summed per block of `block_size` columns. On CPU it runs block_softmax.c (built and loaded by
kernels/native.py); elsewhere, without a compiler, or with SKETCHWALK_NATIVE=0 it runs the torch
reference below. Why C: torch's mask, softmax and block sum are three passes that write and
re-read every probability; the C loop reads each row twice while it is in cache (docs/speed.md
has the measurements).
"""

from __future__ import annotations

import torch

from .native import library


def block_softmax_sums_reference(
    scores: torch.Tensor, lo: torch.Tensor | int, hi: torch.Tensor | int, block_size: int
) -> torch.Tensor:
    """The torch reference: scores [..., W] with lo, hi broadcastable to scores.shape[:-1] ->
    float32 [..., ceil(W / b)]; rows that see no column are 0."""
    width = scores.shape[-1]
    nb = -(-width // block_size)
    cols = torch.arange(width, device=scores.device)
    lo, hi = torch.as_tensor(lo, device=scores.device), torch.as_tensor(hi, device=scores.device)
    seen = (cols >= lo[..., None]) & (cols < hi[..., None])
    logits = scores.float().masked_fill(~seen, float("-inf"))
    probs = torch.softmax(logits, -1).nan_to_num(0.0)  # rows that see nothing: NaN -> 0
    probs = torch.nn.functional.pad(probs, (0, nb * block_size - width))
    return probs.unflatten(-1, (nb, block_size)).sum(-1)


def block_softmax_sums(
    scores: torch.Tensor, lo: torch.Tensor | int, hi: torch.Tensor | int, block_size: int
) -> torch.Tensor:
    """block_softmax_sums_reference, in C where it can be (CPU, float32 or bfloat16 scores).
    The scores must be finite where they are seen."""
    lib = library() if scores.device.type == "cpu" else None
    fn = None
    if lib is not None and scores.dtype == torch.float32:
        fn = lib.block_softmax_sums_f32
    elif lib is not None and scores.dtype == torch.bfloat16:
        fn = lib.block_softmax_sums_bf16
    if fn is None:
        return block_softmax_sums_reference(scores, lo, hi, block_size)
    *lead, width = scores.shape
    nb = -(-width // block_size)
    flat = scores.contiguous()
    lo_rows = torch.as_tensor(lo, dtype=torch.int64).expand(lead).contiguous()
    hi_rows = torch.as_tensor(hi, dtype=torch.int64).expand(lead).contiguous()
    out = torch.empty(*lead, nb, dtype=torch.float32)
    rows = flat.numel() // max(width, 1)
    # ctypes releases the GIL for the call: the estimator's parts run it on both cores at once
    status = fn(flat.data_ptr(), rows, width, lo_rows.data_ptr(), hi_rows.data_ptr(),
                block_size, out.data_ptr())  # fmt: skip
    if status != 0:
        raise MemoryError(f"block_softmax_sums: no memory for a scratch row of {width} scores")
    return out
