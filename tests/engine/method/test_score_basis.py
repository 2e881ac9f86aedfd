"""The sampled estimator's fitted low-rank score basis (engine/method/score_basis.py) against brute force."""

import pytest
import torch

from sketchwalk.engine.method.config import SketchWalkConfig, preset
from sketchwalk.engine.method.score_basis import fit_score_basis, in_score_basis
from sketchwalk.errors import ConfigError


def _scores(q, k, hkv):
    """Every query head's scores against its KV head's keys: [B, Hkv, G S, L]."""
    return q.reshape(q.shape[0], hkv, -1, q.shape[-1]) @ k.mT


def _inputs(seed, bsz=2, h=6, hkv=2, s=40, length=300, r=16, rank_of_keys=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, h, s, r, generator=gen) * torch.rand(r, generator=gen)
    k = torch.randn(bsz, hkv, length, rank_of_keys or r, generator=gen)
    if rank_of_keys:  # keys in a subspace of that dimension, plus an offset (their mean)
        k = k @ torch.randn(rank_of_keys, r, generator=gen)
    k = k + 3.0 * torch.randn(r, generator=gen)
    return q, k


def _up_to_row_constants(x):
    """Scores less each row's first column: what a softmax over the row sees."""
    return x - x[..., :1]


@pytest.mark.parametrize("seed", range(4))
def test_full_rank_keeps_every_score_up_to_a_constant_per_query(seed):
    q, k = _inputs(seed)
    qv, kv = torch.ones(2, 40, dtype=torch.bool), torch.ones(2, 300, dtype=torch.bool)
    pq, pk = fit_score_basis(q, qv, k, kv, 16)
    got = _scores(torch.einsum("bhsr,bhnr->bhsn", q, pq.repeat_interleave(3, 1)), k @ pk.mT, 2)
    want = _scores(q, k, 2)
    assert torch.allclose(_up_to_row_constants(got), _up_to_row_constants(want), atol=2e-3)


@pytest.mark.parametrize("seed", range(4))
def test_keys_in_a_subspace_need_only_its_rank(seed):
    """Keys spanning 5 directions (plus their mean): rank 5 reproduces every score."""
    q, k = _inputs(seed, rank_of_keys=5)
    qv, kv = torch.ones(2, 40, dtype=torch.bool), torch.ones(2, 300, dtype=torch.bool)
    q5, k5 = in_score_basis(q, qv, k, kv, 5)
    assert q5.shape == (2, 6, 40, 5) and k5.shape == (2, 2, 300, 5)
    got, want = _scores(q5, k5, 2), _scores(q, k, 2)
    assert torch.allclose(_up_to_row_constants(got), _up_to_row_constants(want), atol=2e-3)


@pytest.mark.parametrize("seed", range(4))
def test_the_fit_is_the_best_rank_r_form(seed):
    """On the fitted samples the mean squared score error (keys centred) is the optimum: the sum
    of the squared singular values of Sq^(1/2) Sk^(1/2) past the rank; and a random
    rank-r sketch of the same width does worse."""
    q, k = _inputs(seed, bsz=1, h=3, hkv=1, s=200, length=400)
    qv, kv = torch.ones(1, 200, dtype=torch.bool), torch.ones(1, 400, dtype=torch.bool)
    rank = 6
    q6, k6 = in_score_basis(q, qv, k, kv, rank)
    kc = k - k.mean(2, keepdim=True)
    exact = _scores(q, kc, 1).double()
    fitted = _scores(q6, k6 - k6.mean(2, keepdim=True), 1).double()
    err = ((fitted - exact) ** 2).mean()
    qq, kk = q.reshape(-1, 16).double(), kc.reshape(-1, 16).double()
    sq, sk = qq.T @ qq / qq.shape[0], kk.T @ kk / kk.shape[0]

    def root(s):
        lam, vec = torch.linalg.eigh(s)
        return (vec * lam.clamp(min=0).sqrt()) @ vec.T

    sv = torch.linalg.svdvals(root(sq) @ root(sk))
    assert err == pytest.approx(float((sv[rank:] ** 2).sum()), rel=1e-3)
    proj = torch.linalg.qr(torch.randn(16, rank, dtype=torch.float64))[0]
    random = ((qq @ proj) @ (kk @ proj).T * (16 / rank) - qq @ kk.T) ** 2
    assert err < random.mean()


def test_padding_does_not_move_the_fit():
    """Padding queries and keys hold garbage: the fit sees only the real ones."""
    q, k = _inputs(0, bsz=1)
    qv = torch.ones(1, 40, dtype=torch.bool)
    kv = torch.ones(1, 300, dtype=torch.bool)
    qv[0, :7], kv[0, :50] = False, False
    bad_q, bad_k = q.clone(), k.clone()
    bad_q[:, :, :7], bad_k[:, :, :50] = 1e3, -1e3
    pq, pk = fit_score_basis(bad_q, qv, bad_k, kv, 4)
    want_q, want_k = fit_score_basis(q[:, :, 7:], qv[:, 7:], k[:, :, 50:], kv[:, 50:], 4)
    # a basis is fixed up to the signs of its vectors: compare the forms they make
    assert torch.allclose(pq.mT @ pk, want_q.mT @ want_k, atol=1e-3)


def test_rank_zero_or_full_width_leaves_the_inputs():
    q, k = _inputs(1)
    qv, kv = torch.ones(2, 40, dtype=torch.bool), torch.ones(2, 300, dtype=torch.bool)
    for rank in (0, 16, 40):
        got_q, got_k = in_score_basis(q, qv, k, kv, rank)
        assert got_q is q and got_k is k


def test_the_knob():
    assert SketchWalkConfig().score_rank == 0  # 16-token blocks: full width (docs/quality.md)
    assert preset("lean").score_rank == 24
    assert preset("fidelity").score_rank == 0  # the exact sketched product
    assert SketchWalkConfig.from_stored({}).score_rank == 0  # runs stored before the knob
    with pytest.raises(ConfigError, match="score rank"):
        SketchWalkConfig(score_rank=-1).validate()


def test_fewer_keys_than_coordinates():
    """A short context: 10 keys of width 16 span 9 directions once centred, so rank 12 keeps
    their scores exactly (a singular covariance: pseudo-inverse, nothing blows up)."""
    q, k = _inputs(5, bsz=1, s=8, length=10)
    qv, kv = torch.ones(1, 8, dtype=torch.bool), torch.ones(1, 10, dtype=torch.bool)
    q12, k12 = in_score_basis(q, qv, k, kv, 12)
    assert torch.isfinite(q12).all() and torch.isfinite(k12).all()
    got, want = _scores(q12, k12, 2), _scores(q, k, 2)
    assert torch.allclose(_up_to_row_constants(got), _up_to_row_constants(want), atol=2e-3)
