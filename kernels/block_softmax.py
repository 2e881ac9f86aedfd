"""Softmax mass per key block of score rows: the sampled estimator's inner loop.

`block_softmax_sums(scores, lo, hi, block_size)`: row i's softmax over its columns lo .. hi - 1,
summed per block of `block_size` columns. `scored_block_mass(q, pack_keys(k), lo, hi, b, width)`:
the same for the scores q @ k^T without forming them (bfloat16 q with pack_keys_vnni(k): on AMX
tiles where the CPU has them). On CPU both run block_softmax.c (built and
loaded by kernels/native.py); elsewhere, without a compiler, or with SKETCHWALK_NATIVE=0 the
torch reference below (and the torch product). Why C: torch's mask, softmax and block sum are
three passes that write and re-read every probability, and the product before them writes every
score; the C loops keep a row, or a tile of rows, in cache (docs/notes/speed-log.md has the measurements).
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


def row_mass_reference(
    q: torch.Tensor,
    keys: torch.Tensor,
    lo: torch.Tensor | int,
    hi: torch.Tensor | int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    packed: PackedKeys | None = None,
) -> torch.Tensor:
    """The backends' row_mass op in torch: block_softmax_sums_reference of q [..., R, r] scored
    against keys [..., L, r], both rounded to dtype and their products summed in float32 (as
    the AMX tiles sum them). packed: a PackedKeys the CPU op keeps up to date (not read here)."""
    scores = q.to(dtype).float() @ keys.to(dtype).float().transpose(-1, -2)
    return block_softmax_sums_reference(scores, lo, hi, block_size)


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


PANEL = 16  # keys per panel of pack_keys (PANEL in tile.h)


def pack_keys(k: torch.Tensor, multiple: int = PANEL) -> torch.Tensor:
    """Keys [..., L, r] -> float32 panels [..., n, r, PANEL] (zero keys past L, up to a multiple of
    `multiple` keys, itself a multiple of PANEL), the layout the C kernels read front to back."""
    length = k.shape[-2]
    n = -(-length // multiple) * (multiple // PANEL)
    kf = k.float()
    if n * PANEL > length:  # a pad copies even when it adds nothing
        kf = torch.nn.functional.pad(kf, (0, 0, 0, n * PANEL - length))
    return kf.unflatten(-2, (n, PANEL)).transpose(-1, -2).contiguous()


def pack_keys_vnni(k: torch.Tensor) -> torch.Tensor:
    """Keys [..., L, r] -> bfloat16 [..., n, r / 2, PANEL, 2] (zero keys past L, up to a multiple of
    PANEL): per panel of PANEL keys, coordinate pairs side by side, the layout an AMX tile
    multiply reads its second operand in (r even). In C where it can (_pack_vnni_c), else in
    torch, each pair moved as one int32 (a transpose of 32-bit elements: 1.5x faster than one of
    bfloat16 pairs)."""
    length = k.shape[-2]
    n = -(-length // PANEL)
    out = k.new_empty(*k.shape[:-2], n, k.shape[-1] // 2, PANEL, 2, dtype=torch.bfloat16)
    if _pack_vnni_c(k, 0, out):
        return out
    kb = k.to(torch.bfloat16).contiguous()  # pairs viewed as int32 need a contiguous last dim
    if n * PANEL > length:
        kb = torch.nn.functional.pad(kb, (0, 0, 0, n * PANEL - length))
    pairs = kb.view(torch.int32).unflatten(-2, (n, PANEL))  # [..., n, PANEL, r / 2]
    return pairs.transpose(-2, -1).contiguous().view(torch.bfloat16).unflatten(-1, (PANEL, 2))


def _pack_vnni_c(k: torch.Tensor, start: int, out: torch.Tensor) -> bool:
    """Keys start .. L - 1 of float32 k [B, Hkv, L, r] into their panels of out (contiguous
    [B, Hkv, cap, r / 2, PANEL, 2] bfloat16; start a multiple of PANEL) in one C pass (at 7376
    tokens a layer's keys 1.24-1.32 -> 0.87 ms on one thread); False, with nothing written,
    where C does not apply."""
    lib = library() if k.device.type == "cpu" else None
    if lib is None or k.dim() != 4 or k.dtype != torch.float32 or k.stride(-1) != 1:
        return False
    if k.shape[-1] % 2 or not out.is_contiguous() or out.shape[:2] != k.shape[:2]:
        return False
    sb, sh, sl = k.stride()[:3]
    lib.pack_keys_vnni_f32(k.data_ptr(), sb, sh, sl, k.shape[0], k.shape[1], start, k.shape[2],
                           k.shape[3], out.data_ptr(), out.shape[2])  # fmt: skip
    return True


class PackedKeys:
    """A growing key cache kept in pack_keys_vnni's layout: decode scores the current row against
    every cached key at each re-selection, and packing them afresh each time cost more than the
    scoring (a layer's keys at 7376 tokens: ~0.9 ms against ~0.5 ms for the fused call). `update`
    repacks only the panels from the first that holds new keys, into a buffer with room to grow.
    The cache must only grow: keys already packed are not read again (a shorter or other-shaped
    cache starts the copy afresh)."""

    def __init__(self) -> None:
        self.panels: torch.Tensor | None = None  # [..., cap, r / 2, PANEL, 2] bfloat16
        self.length = 0  # keys packed

    def update(self, keys: torch.Tensor) -> torch.Tensor:
        """The buffer holding keys [..., L, r] packed (its first ceil(L / PANEL) panels; the rest
        zero), after packing what is new since the last call."""
        length, r = keys.shape[-2], keys.shape[-1]
        need = -(-length // PANEL)
        buf = self.panels
        if buf is not None and (buf.shape[:-4] != keys.shape[:-2] or length < self.length
                                or buf.shape[-3] != r // 2):  # fmt: skip
            buf, self.length = None, 0
        if buf is None or buf.shape[-4] < need:
            cap = need + max(16, need // 4)  # a copy every quarter of the length, not every panel
            grown = keys.new_zeros(*keys.shape[:-2], cap, r // 2, PANEL, 2, dtype=torch.bfloat16)
            if buf is not None:
                grown[..., : buf.shape[-4], :, :, :] = buf
            buf = self.panels = grown
        p0 = self.length // PANEL
        if length > p0 * PANEL and not _pack_vnni_c(keys, p0 * PANEL, buf):
            buf[..., p0:need, :, :, :] = pack_keys_vnni(keys[..., p0 * PANEL : length, :])
        self.length = length
        return buf


def _unpack_vnni(panels: torch.Tensor) -> torch.Tensor:
    """pack_keys_vnni's keys back as [..., n * PANEL, r]."""
    return panels.transpose(-3, -2).flatten(-2, -1).flatten(-3, -2)


def scored_block_mass(
    q: torch.Tensor,
    panels: torch.Tensor,
    lo: torch.Tensor | int,
    hi: torch.Tensor | int,
    block_size: int,
    width: int,
) -> torch.Tensor:
    """block_softmax_sums(q @ k[..., :width, :].T, lo, hi, block_size) for q [..., R, r] and the
    keys k packed by pack_keys (float32 q) or pack_keys_vnni (bfloat16 q; the products summed in
    float32), their first `width` seen. On CPU the C kernel scores a few rows at a time into a
    buffer that stays in cache and takes their block mass at once, without the [R, width] score
    matrix (block_softmax.c, "scores and block mass in one call"; bfloat16 on AMX tiles where
    the CPU has them); elsewhere the product and block_softmax_sums."""
    lib = library() if q.device.type == "cpu" else None
    *lead, rows, r = q.shape
    if q.dtype == torch.bfloat16:  # keys [..., n, r / 2, PANEL, 2]
        fits = panels.shape[:-4] == q.shape[:-2] and panels.shape[-3:] == (r // 2, PANEL, 2)
        np_ = panels.shape[-4]
        if lib is not None:
            _check_packing(fits, np_, width, panels, q)
            out = _fused(lib.scored_block_mass_amx, q, panels, np_, lo, hi, block_size, width)
            if out is not None:
                return out
        kt = _unpack_vnni(panels)[..., :width, :].transpose(-1, -2)
        return block_softmax_sums(q.float() @ kt.float(), lo, hi, block_size)  # as the tiles sum
    if lib is None or q.dtype != torch.float32:
        kt = panels.transpose(-1, -2).flatten(-3, -2)[..., :width, :].transpose(-1, -2)
        return block_softmax_sums(q @ kt.to(q.dtype), lo, hi, block_size)
    np_ = panels.shape[-3]  # keys [..., n, r, PANEL]
    _check_packing(panels.shape[:-3] == q.shape[:-2] and panels.shape[-2:] == (r, PANEL), np_,
                   width, panels, q)  # fmt: skip
    out = _fused(lib.scored_block_mass_f32, q, panels, np_, lo, hi, block_size, width)
    assert out is not None  # the float32 call always runs
    return out


def _check_packing(fits: bool, panels_n: int, width: int, panels, q) -> None:
    if not fits or panels_n * PANEL < width:
        raise ValueError(
            f"keys packed as {tuple(panels.shape)} do not fit queries {tuple(q.shape)}"
        )


def _fused(fn, q, panels, np_: int, lo, hi, block_size: int, width: int):
    """One C call of scored_block_mass_f32's contract (fn: it, or its AMX twin); None where fn
    says it cannot run here (-2)."""
    *lead, rows, r = q.shape
    nb = -(-width // block_size)
    qc, kc = q.contiguous(), panels.contiguous()
    lo_rows = torch.as_tensor(lo, dtype=torch.int64).expand(*lead, rows).contiguous()
    hi_rows = torch.as_tensor(hi, dtype=torch.int64).expand(*lead, rows).contiguous()
    out = torch.empty(*lead, rows, nb, dtype=torch.float32)
    units = qc.numel() // max(rows * r, 1)
    status = fn(qc.data_ptr(), kc.data_ptr(), units, rows, r, np_, width, lo_rows.data_ptr(),
                hi_rows.data_ptr(), block_size, out.data_ptr())  # fmt: skip
    if status == -2:
        return None
    if status != 0:
        raise MemoryError(f"scored_block_mass: no memory for a tile of {width} scores")
    return out
