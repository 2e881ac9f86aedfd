"""The sampled estimator: a few queries per block scored against every sketched key.

The block-mean and Gaussian summaries miss single keys that stand out inside a block (the
attention of a copying head lands on one token). Scoring a few queries per block against every
sketched key sees them: the block mass of those queries is exact in the sketched space, and
neighbouring queries attend alike, so a block's sampled queries stand for all of its queries.
Cost: (samples / b) of the dense score matrix, without the value product. The block mass is the
kernel backend's block_mass op (kernels/backends.py: C on CPU, one Triton launch on a GPU, plain
torch on the reference backend). Without every sketched key (queries after a cache) it is the
query estimator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sketchwalk.engine.method.estimators import query
from sketchwalk.engine.method.estimators.base import DecodeInputs, Estimator
from sketchwalk.engine.method.score_basis import in_score_basis
from sketchwalk.engine.method.sketch import SRHT, QueryTokens, SketchedBlocks, key_span
from sketchwalk.kernels import kernel
from sketchwalk.kernels.block_softmax import PackedKeys
from sketchwalk.kernels.native import amx, library
from sketchwalk.kernels.pooling import kv_rows

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig


def score_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The dtype of the sampled estimator's score product for knob value `name`: "auto" is
    bfloat16 on CUDA; on a CPU with the C kernels, bfloat16 where it has AMX tiles (the fused
    call on them: one layer's selection at 2k / 7k / 16k tokens 14.7 / 90 / 342 ms against 17.4 /
    118 / 540 in float32), else float32 (the fused float32 call beats a bfloat16 product with the
    softmax apart even on an AMX Xeon: 21 / 148 / 640 ms against 26 / 170 / 860); without the C
    kernels bfloat16 where oneDNN has it natively (AVX-512 and newer; emulated bfloat16 is slower
    than float32). docs/notes/speed-log.md has the measurements."""
    if name != "auto":
        return getattr(torch, name)
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    if library() is not None:
        return torch.bfloat16 if amx() else torch.float32
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)  # private: may go
    return torch.bfloat16 if native is not None and native() else torch.float32


def current_row_mass(  # many parameters: the row's inputs and the estimator's knobs
    qs: torch.Tensor,
    ks: torch.Tensor,
    block_size: int,
    dim: int,
    tau: float,
    pool: str = "mean",
    key_valid: torch.Tensor | None = None,
    q_valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    packed: PackedKeys | None = None,
) -> torch.Tensor:
    """Decode's one row: the queries qs [B, H, s, r] all stand for the newest position, so each
    sees every real key of ks [B, Hkv, Lk, r] (key_valid [B, Lk], one span per sequence; None:
    all real); their block masses [B, Hkv, G, 1, n] are averaged over the real ones (q_valid
    [B, s]; None: all), or with pool "max" each block's largest. No causal mask and no per-row
    scatter: at 7k tokens a per-row path spent a quarter of its time filling a padded copy of
    the scores. The scores and their softmax sums are the backend's row_mass op
    (kernels/backends.py), in `dtype` (score_dtype), over the keys `packed` keeps where it can."""
    bsz, h, s = ks.shape[0], qs.shape[1], qs.shape[2]
    hkv = ks.shape[1]
    gh = h // hkv
    lo, hi = (
        (0, ks.shape[2]) if key_valid is None else (x.view(bsz, 1, 1) for x in key_span(key_valid))
    )
    qg = kv_rows(qs * (dim**-0.5 / tau), hkv)
    mass = kernel("row_mass", qs.device)(qg, ks, lo, hi, block_size, dtype, packed)
    mass = mass.view(bsz, hkv, gh, s, -1)  # [B, Hkv, G * s, n] per query head
    if q_valid is not None:
        mass = mass * q_valid[:, None, None, :, None]
    if pool == "max":
        return mass.amax(3, keepdim=True)
    real = s if q_valid is None else q_valid.sum(1).clamp(min=1).view(bsz, 1, 1, 1, 1)
    return mass.sum(3, keepdim=True) / real


def decode_sampled_mass(  # many parameters: the decode row's inputs and its kept keys
    window: torch.Tensor,
    srht: SRHT,
    keys: torch.Tensor,
    key_valid: torch.Tensor,
    cfg: SketchWalkConfig,
    dim: int,
    all_valid: bool = False,
    packed: PackedKeys | None = None,
) -> torch.Tensor:
    """The sampled estimator in decode, [B, Hkv, G, 1, n]: the last query_samples queries of the
    window (0: all of it) scored against every key in the cache, each seeing all of them (they
    stand for the current row), their block masses pooled (cfg.pool). The window holds sketched
    queries S q; (S q) S^T scored against raw keys is the sketched inner product (S q).(S k) for
    any r, so the cache is never sketched. Cost: samples x H x T x d, once per fresh selection
    (with decode_reselect 0: once per key block), in the prefill's score dtype; packed: the
    layer's keys as the fused call reads them, kept across steps (the decode state's).
    all_valid: no padding (no masks to apply)."""
    lk = keys.shape[2]
    s = cfg.query_samples or window.shape[2]
    qs = window[:, :, -s:] @ srht.matrix.T  # [B, H, s, d]
    s = qs.shape[2]
    dtype = score_dtype(cfg.score_dtype, qs.device)
    if all_valid:
        return current_row_mass(
            qs, keys, cfg.block_size, dim, cfg.tau, cfg.pool, dtype=dtype, packed=packed
        )
    q_valid = key_valid[:, lk - s :].bool()  # the window's queries are the last s tokens
    return current_row_mass(
        qs, keys, cfg.block_size, dim, cfg.tau, cfg.pool, key_valid.bool(), q_valid, dtype, packed
    )


def prefill(
    sk: SketchedBlocks,
    q_blocks: torch.Tensor,
    dim: int,
    cfg: SketchWalkConfig,
    tokens: QueryTokens | None = None,
) -> torch.Tensor:
    if tokens is None or tokens.keys is None:
        return query.prefill(sk, q_blocks, dim, cfg, tokens)
    qs, keys = in_score_basis(
        tokens.qs, tokens.valid, tokens.keys, tokens.key_valid, cfg.score_rank
    )
    dtype = score_dtype(cfg.score_dtype, qs.device)
    block_mass = kernel("block_mass", qs.device)  # C on CPU, one Triton launch on a GPU
    pooled = block_mass(
        qs, tokens.valid, tokens.pos, keys, tokens.key_valid, cfg.block_size, dim, cfg.tau,
        cfg.pool, dtype,
    )  # fmt: skip
    return pooled[:, :, None]  # its query heads pooled already: one head per KV head


def decode(x: DecodeInputs) -> torch.Tensor:
    if x.keys is None:
        return query.decode(x)
    return decode_sampled_mass(
        x.st.window, x.srht, x.keys, x.key_valid, x.cfg, x.dim, x.all_valid, x.st.packed_keys
    )


ESTIMATOR = Estimator(
    "sampled",
    "query_samples queries per block against every sketched key in prefill (the query "
    "estimate after a cache)",
    prefill,
    decode,
    keeps_tokens=True,
    needs_keys=True,
)
