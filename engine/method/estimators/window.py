"""The decode window's estimates over a layer's decode state, kept per block and per slot.

A decode token changes one key block's sums and adds one query to the window, so the block-mean
keys and the window's logits are kept in buffers of the state (engine/method/decode.py
DecodeLayerState) and only what changed is recomputed: the same values a full recomputation
gives, without redoing all n blocks each step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sketchwalk.engine.method.estimators.gaussian import token_keys, token_logits
from sketchwalk.engine.method.sketch import group_queries, key_summary

if TYPE_CHECKING:
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.decode import DecodeLayerState


def key_estimates(
    st: DecodeLayerState, d: int, cfg: SketchWalkConfig, n: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Block-mean keys [B, Hkv, n, r] and, for an estimator that keeps tokens (the token estimators), its key side [B, Hkv, n, f]
    (estimators/query.py token_keys), as views of per-layer buffers. A decode token changes one block's sums,
    so only the blocks whose sums changed since the last call are recomputed, elementwise per
    block: the same values a full recomputation gives, without redoing all n blocks each step."""
    sk = st.sketched
    tok = cfg.estimator_spec.keeps_tokens  # one per layer: the buffers below follow it
    km, keys = st.est_km, st.est_keys
    if km is None or km.shape[2] < n:  # grow with room for the next blocks
        bsz, hkv, _, r = sk.k_sum.shape
        cap, v = n + max(64, n // 4), 0 if km is None else st.est_valid
        grown = sk.k_sum.new_empty(bsz, hkv, cap, r)
        if v:
            grown[:, :, :v] = km[:, :, :v]
        st.est_km, km = grown, grown
        if tok:
            f = r + (r if sk.k_sq is not None else 0) + 1
            grown = sk.k_sum.new_empty(bsz, hkv, cap, f)
            if v:
                grown[:, :, :v] = keys[:, :, :v]
            st.est_keys, keys = grown, grown
        st.est_valid = v
    v = st.est_valid
    if v < n:
        k_sq = sk.k_sq[:, :, v:n] if tok and sk.k_sq is not None else None
        mean, var = key_summary(sk.k_sum[:, :, v:n], k_sq, sk.k_count[:, v:n])
        km[:, :, v:n] = mean
        if tok:
            keys[:, :, v:n] = token_keys(mean, var, sk.k_count[:, v:n], d, cfg.tau)
        st.est_valid = n
    return km[:, :, :n], keys[:, :, :n] if tok else None


def window_logits(st: DecodeLayerState, keys: torch.Tensor, squares: bool) -> torch.Tensor:
    """The token estimator's logits [B, Hkv, H/Hkv, w, n] of the decode window against the key
    side `keys` [B, Hkv, n, f] of every block (sketch.token_logits), kept per window slot.

    A query's logits against the blocks before its own never change (those blocks are final), so
    each slot's row over them is one product when the query first needs it; the blocks from the
    oldest window query's own block on (two or three of them) are recomputed for the whole window
    as an elementwise product and sum, where a query's own and later blocks take the new values.
    Every value is thus made by the same op of the same shape whichever steps ran before (a
    fresh selection after reused steps equals an every-step one bit for bit), and the window no
    longer multiplies against all n blocks each token (w x n x f per head: at 7376 tokens and
    w = 32 four times the FLOPs of dense attention itself)."""
    buf, end = st.window_buf, st.window_end
    w = st.window.shape[2]
    start = end - w
    bsz, hkv, n, f = keys.shape
    gh = buf.shape[1] // hkv
    lg = st.logits_buf
    if lg is None or lg.shape[-1] < n:
        grown = keys.new_empty(bsz, hkv, gh, buf.shape[2], n + max(64, n // 4))
        if lg is not None:
            grown[..., : lg.shape[-1]] = lg
        else:
            st.logit_rows = 0
        st.logits_buf = lg = grown
    blocks = st.window_block
    for slot in range(max(st.logit_rows, start), end):  # rows over the blocks before their own
        a = blocks[slot]
        if a > 0:
            lg[:, :, :, slot : slot + 1, :a] = token_logits(
                buf[:, :, slot : slot + 1], keys[:, :, :a], squares
            )
    st.logit_rows = end
    a_min = min(blocks[start:end])
    qg = group_queries(st.window, hkv)  # [B, Hkv, G, w, r]
    ones = torch.ones(*qg.shape[:-1], 1, device=qg.device, dtype=qg.dtype)
    qf = torch.cat([qg, *([qg * qg] if squares else []), ones], -1)
    tail = (qf.unsqueeze(-2) * keys[:, :, None, None, a_min:n]).sum(-1)  # [B, Hkv, G, w, m]
    own = torch.tensor(blocks[start:end], device=keys.device)
    cols = torch.arange(a_min, n, device=keys.device)
    live = lg[:, :, :, start:end, a_min:n]
    live.copy_(torch.where(cols[None, :] >= own[:, None], tail, live))
    return lg[:, :, :, start:end, :n]
