"""What the CPU prefill and decode paths share: one SDPA call with its log-sum-exp, the cached
causal tail mask, and views of K/V token rows and full blocks that index_select copies as memcpy
rows. kernels/cpu.py says how the CPU kernels fit together."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


FOLD_MAX_ROWS = 1024  # longer queries already get the kernel's largest query split


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    tail: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, natural-log LSE [N, H, L]) of softmax attention; K/V may have fewer heads (GQA).
    tail: the queries are the last L keys' positions (causal aligned to the end: a row's diagonal
    blocks after its other blocks), as one cached mask.

    Short query tiles run the CPU flash kernel with small query splits (32 rows below 192 queries),
    and an explicit mask costs ~45% more there, so without a causal flag the query heads that share
    a KV head are folded into one longer query (a view of contiguous q): ~1.4x faster on masked
    windows.
    """
    n, h, lq, d = q.shape
    rep = h // k.shape[1]
    if rep > 1 and not causal and lq * rep <= FOLD_MAX_ROWS:
        qf = q.reshape(n, k.shape[1], rep * lq, d)
        if tail:  # the folded mask is cached too (repeating it was ~2% of a 4k-token layer)
            mf = tail_triangle(lq, k.shape[2], q.dtype, rep)
        else:
            mf = None if mask is None else mask.repeat(1, 1, rep, 1)
        o, lse = attend(qf, k, v, scale, mask=mf)
        return o.reshape(n, h, lq, d), lse.reshape(n, h, lq)
    if tail:
        mask = tail_triangle(lq, k.shape[2], q.dtype)
    try:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale
        )
        return out, lse
    except (RuntimeError, AttributeError):  # older torch: no native GQA or no such op
        rep = q.shape[1] // k.shape[1]
        kf = k.float().repeat_interleave(rep, dim=1)
        vf = v.float().repeat_interleave(rep, dim=1)
        s = (q.float() @ kf.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), NEG_INF)
        if mask is not None:
            s = s + mask.float()
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        return (p @ vf).to(q.dtype), lse


@functools.lru_cache(maxsize=64)
def tail_triangle(rows: int, cols: int, dtype: torch.dtype, rep: int = 1) -> torch.Tensor:
    """[1, 1, rep * rows, cols] additive mask: zero except the causal triangle over the last rows
    columns, stacked rep times (query heads folded into one query, see attend).

    Cached and never written to: a real layer asks for a few shapes in dozens of window calls,
    and building one (zeros, full, triu) cost ~0.35 ms a call on the shared 2-core machine."""
    m = torch.zeros(1, 1, rows, cols, dtype=dtype)
    m[..., cols - rows :] = torch.full((rows, rows), NEG_INF, dtype=dtype).triu(1)
    return m.repeat(1, 1, rep, 1) if rep > 1 else m


def block_view(rows: torch.Tensor, b: int) -> torch.Tensor:
    """Token rows [R, D] (a view) -> overlapping [R - b + 1, b*D] view: row p = tokens p..p+b-1.

    Lets index_select copy whole key blocks as memcpy rows without padding x to a block multiple.
    """
    n, d = rows.shape
    if n < b:
        return F.pad(rows.reshape(-1), (0, (b - n) * d)).view(1, b * d)
    return rows.as_strided((n - b + 1, b * d), (d, 1))


def rows_contiguous(x: torch.Tensor) -> bool:
    """[..., L, d] whose token rows follow one another within each head: a contiguous cache, or
    the filled part of a cache with room (engine/hf/cache.py), whose heads are further apart."""
    return x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]


def full_blocks(x: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """[Hkv, L, d] -> [Hkv, n, b * d]: the first n full blocks as rows, for index_select. A view
    when rows are contiguous per head: reshaping the slice copied the whole cache whenever L is
    not a multiple of b (~1 ms a layer per decode step at 7k tokens)."""
    hkv, _, d = x.shape
    if rows_contiguous(x):
        return x.as_strided((hkv, n, b * d), (x.stride(0), b * d, 1))
    return x[:, : n * b].reshape(hkv, n, b * d)


def token_rows(
    k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """K, V [B, Hkv, L, d] as [R, d] views of their token rows (one index_select then reads any
    head's rows), and the rows from one sequence and from one head to the next; None unless
    each head's rows are contiguous and K and V are laid out alike (a contiguous tensor, the
    filled part of a cache with room, a prefix of either)."""

    def layout(x: torch.Tensor) -> tuple[int, int] | None:
        d = x.shape[-1]
        seq, head = (x.stride(i) if x.shape[i] > 1 else 0 for i in (0, 1))
        if not rows_contiguous(x) or seq % d or head % d:
            return None
        return seq // d, head // d

    steps = layout(k)
    if steps is None or layout(v) != steps:
        return None
    bsz, hkv, length, d = k.shape
    seq, head = steps
    n = (bsz - 1) * seq + (hkv - 1) * head + length
    return k.as_strided((n, d), (d, 1)), v.as_strided((n, d), (d, 1)), seq, head
