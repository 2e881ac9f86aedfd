"""A low-rank basis for the sampled estimator's scores, fitted to the layer's own queries and keys.

Why: the sampled estimator's product (a few queries per block against every sketched key) is most
of the selection's time, and it scales with the sketch's width r. A narrower *random* sketch
loses too much (SmolLM2, GPL-3 6k tokens, density 0.2: r 64 -> 32 took KL 0.030 -> 0.062), but a
layer's attention logits live in far fewer directions than the head dim: the best rank-32 bilinear
form fitted to the layer's queries and keys kept KL at 0.032, and so did rank 24 (the default;
docs/quality.md). So before the product, queries and keys are mapped to `rank` coordinates each,
such that their inner products are the closest rank-`rank` approximation of q . k in expected
square error, up to a constant per query (which the softmax ignores):

    Sq = E[q q^T] over the scored queries, Sk = Cov(k) over the real keys (per KV head),
    V_r = the top `rank` eigenvectors of Sk^(1/2) Sq Sk^(1/2),
    q -> V_r^T Sk^(1/2) q,   k -> V_r^T Sk^(+1/2) k.

Why this is the best rank-r form: the error of q^T A k against q^T k, for independent q and k,
is ||Sq^(1/2) (I - A) Sk^(1/2)||_F^2 with k centred (its mean adds a constant per query); the
truncated SVD of Sq^(1/2) Sk^(1/2) minimises it, and its right singular vectors are V_r, which
gives A = Sk^(1/2) V_r V_r^T Sk^(+1/2). Centring leaves the rank to what ranks keys against
each other. At full rank the scores are exactly q . k (less q . mean k).
"""

from __future__ import annotations

import torch

from sketchwalk.engine.method.sketch import all_on_host

EPS = 1e-7  # eigenvalues below EPS x the largest count as 0 (pseudo-inverse square roots)
# The keys' covariance from every step-th key, at most about this many: an r x r covariance
# needs a few thousand samples, and all 7376 keys' product was a quarter of the fit's time.
COV_KEYS = 2048


def _sqrt_and_pinv_sqrt(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S^(1/2) and the pseudo-inverse of S^(1/2) for symmetric PSD s [..., r, r]."""
    lam, vec = torch.linalg.eigh(s)
    lam = lam.clamp(min=0.0)
    kept = lam > EPS * lam.amax(-1, keepdim=True).clamp(min=torch.finfo(lam.dtype).tiny)
    root = lam.sqrt()
    inv = torch.where(kept, 1.0 / root.clamp(min=torch.finfo(lam.dtype).tiny), 0.0)
    return (vec * root[..., None, :]) @ vec.mT, (vec * inv[..., None, :]) @ vec.mT


def fit_score_basis(
    qs: torch.Tensor,
    q_valid: torch.Tensor,
    ks: torch.Tensor,
    k_valid: torch.Tensor,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence and KV head, the maps (pq, pk), each [B, Hkv, rank, r], fitted on the real
    ones of queries qs [B, H, S, r] (q_valid [B, S]) and keys ks [B, Hkv, L, r] (k_valid [B, L]);
    the query heads of a KV head share them."""
    bsz, hkv, r = ks.shape[0], ks.shape[1], ks.shape[-1]
    q = qs.reshape(bsz, hkv, -1, r).float()  # a KV head's query heads as rows of one matrix
    step = max(1, ks.shape[2] // COV_KEYS)
    k = ks[:, :, ::step].float()
    wq = q_valid.float().repeat(1, qs.shape[1] // hkv)[:, None, :, None]  # [B, 1, G S, 1]
    wk = k_valid[:, ::step].float()[:, None, :, None]  # [B, 1, L / step, 1]
    if not all_on_host(q_valid):
        q = q * wq
    if not all_on_host(k_valid[:, ::step]):
        k = k * wk
    nq = wq.sum(2, keepdim=True).clamp(min=1.0).double()
    nk = wk.sum(2, keepdim=True).clamp(min=1.0).double()
    mean = k.sum(2, keepdim=True).double() / nk  # [B, Hkv, 1, r]
    sq = (q.mT @ q).double() / nq
    sk = (k.mT @ k).double() / nk - mean.mT @ mean  # the covariance, without a centred copy
    sk_half, sk_inv = _sqrt_and_pinv_sqrt(sk)
    _, vec = torch.linalg.eigh(sk_half @ sq @ sk_half)  # ascending: the top ones last
    top = vec[..., -rank:].mT  # [B, Hkv, rank, r]
    return (top @ sk_half).to(qs.dtype), (top @ sk_inv).to(ks.dtype)


def in_score_basis(
    qs: torch.Tensor, q_valid: torch.Tensor, ks: torch.Tensor, k_valid: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries [B, H, S, rank], keys [B, Hkv, L, rank]) whose inner products approximate those
    of qs and ks up to a constant per query (see the module docstring); qs and ks themselves
    where rank is 0 or not below their width r."""
    r = ks.shape[-1]
    if rank <= 0 or rank >= r:
        return qs, ks
    pq, pk = fit_score_basis(qs, q_valid, ks, k_valid, rank)
    bsz, h, s = qs.shape[:3]
    hkv = ks.shape[1]
    q = (qs.reshape(bsz, hkv, -1, r) @ pq.mT).reshape(bsz, h, s, rank)
    return q, ks @ pk.mT
