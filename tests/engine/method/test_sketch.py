import math

import pytest
import torch

from sketchwalk.engine.method.sketch import (
    aggregate_heads,
    block_means,
    block_pool,
    causal_block_softmax,
    fwht,
    make_srht,
)
from sketchwalk.kernels.pooling import pool_into


def hadamard(m: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < m:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(m)


@pytest.mark.parametrize("m", [1, 2, 8, 64, 128])
def test_fwht_matches_explicit_hadamard(m):
    x = torch.randn(3, 5, m, dtype=torch.float64)
    assert torch.allclose(fwht(x), x @ hadamard(m).double().T, atol=1e-10)


def test_fwht_rejects_non_power_of_two():
    with pytest.raises(ValueError):
        fwht(torch.randn(4, 6))


@pytest.mark.parametrize("d, r", [(64, 32), (64, 128), (80, 16), (128, 128)])
def test_srht_inner_products_are_unbiased_over_seeds(d, r):
    torch.manual_seed(1)
    x, y = torch.randn(d), torch.randn(d)
    est = torch.stack(
        [(s(x) * s(y)).sum() for s in (make_srht(d, r, seed, 0) for seed in range(3000))]
    )
    exact = float(x @ y)
    se = float(est.std()) / math.sqrt(len(est))
    assert abs(float(est.mean()) - exact) < 4 * se + 1e-4
    if r >= 1 << (d - 1).bit_length():  # nothing dropped: exact for every seed (orthonormal)
        assert torch.allclose(est, torch.full_like(est, exact), atol=1e-3)


def test_srht_matrix_equals_the_fast_transform():
    for d, r in [(64, 32), (80, 128), (128, 64)]:
        s = make_srht(d, r, 3, 1)
        x = torch.randn(7, d)
        assert torch.allclose(s(x), s.transform(x), atol=1e-5)


@pytest.mark.parametrize("d, r, pad", [(64, 128, 0), (64, 32, 5), (80, 64, 0)])
def test_srht_of_many_rows_and_their_block_sums_equal_the_product(d, r, pad):
    """Past _FAST_ROWS rows the sketch runs the fast transform in C (kernels/hadamard.py);
    pooled() adds the block sums of the sketches and of their squares over real rows."""
    g = torch.Generator().manual_seed(d + r)
    s = make_srht(d, r, 5, 2)
    x = torch.randn(2, 3, 400, d, generator=g)
    valid = torch.ones(2, 400, dtype=torch.bool)
    valid[1, :pad] = False
    want = x @ s.matrix
    assert torch.allclose(s(x), want, atol=1e-4)
    xs, sums, squares = s.pooled(x, 32, valid)
    assert torch.allclose(xs, want, atol=1e-4)
    assert torch.allclose(sums, block_pool(want, 32, valid)[0], atol=1e-3)
    assert torch.allclose(squares, block_pool(want * want, 32, valid)[0], atol=1e-3)


@pytest.mark.parametrize(
    "index",
    [
        torch.arange(922) // 4,  # 4 sampled queries per block, a partial last run
        3 + torch.arange(9) // 4,
        torch.arange(6) // 2,
        torch.tensor([0, 0, 2, 2, 3]),  # not runs of one length: the scatter
        torch.tensor([1, 0, 0, 1]),
        torch.tensor([2]),
    ],
)
@pytest.mark.parametrize("pool", ["max", "mean"])
def test_pool_into_runs_equal_the_scatter(index, pool):
    g = torch.Generator().manual_seed(index.numel())
    src = torch.rand(2, 3, index.numel(), 5, generator=g)
    out = torch.rand(2, 3, int(index.max()) + 2, 5, generator=g)
    want = out.clone()
    if pool == "max":
        want.index_reduce_(2, index, src, "amax")
    else:
        want.index_add_(2, index, src)
    assert pool_into(out, 2, index, src, pool) is out
    assert torch.allclose(out, want, atol=1e-6)


def test_srht_is_reproducible_and_differs_by_layer():
    a, b, c = make_srht(64, 16, 7, 3), make_srht(64, 16, 7, 3), make_srht(64, 16, 7, 4)
    assert torch.equal(a.signs, b.signs) and torch.equal(a.keep, b.keep)
    assert not (torch.equal(a.signs, c.signs) and torch.equal(a.keep, c.keep))
    assert a.keep.shape == (16,) and a(torch.randn(2, 64)).shape == (2, 16)


def test_block_pool_ignores_padding_and_partial_blocks():
    x = torch.randn(2, 3, 10, 4)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False  # left padding of 3 in sequence 1
    sums, counts = block_pool(x, 4, valid)
    means = block_means(sums, counts)
    assert counts.tolist() == [[4, 4, 2], [1, 4, 2]]
    assert torch.allclose(
        means[0, :, 2], x[0, :, 8:10].mean(1)
    )  # partial last block: real tokens only
    assert torch.allclose(means[1, :, 0], x[1, :, 3])  # only the real token of a padded block


def test_block_pool_with_offset_aligns_to_absolute_blocks():
    x = torch.randn(1, 1, 5, 2)
    sums, counts = block_pool(x, 4, offset=6)  # positions 6..10
    assert counts.tolist() == [[0, 2, 3]]
    assert torch.allclose(sums[0, 0, 1], x[0, 0, :2].sum(0))


@pytest.mark.parametrize("seed", range(12))
def test_block_pool_equals_a_token_by_token_sum(seed):
    """Partial first and last blocks, offsets, padding, strided input: each token lands in
    block (offset + t) // b, weighted by its realness."""
    gen = torch.Generator().manual_seed(seed)
    b = [1, 3, 4, 16, 32][seed % 5]
    length, offset = int(torch.randint(1, 90, (1,), generator=gen)), seed * 7 % 50
    x = torch.randn(2, length, 3, 5, generator=gen).transpose(1, 2)  # [B, H, L, d], strided
    valid = torch.rand(2, length, generator=gen) > 0.3 if seed % 2 else None
    sums, counts = block_pool(x, b, valid, offset)
    n = -(-(offset + length) // b)
    want_s, want_c = torch.zeros(2, 3, n, 5), torch.zeros(2, n)
    for t in range(length):
        w = torch.ones(2) if valid is None else valid[:, t].float()
        want_s[:, :, (offset + t) // b] += x[:, :, t] * w[:, None, None]
        want_c[:, (offset + t) // b] += w
    assert torch.allclose(sums, want_s, atol=1e-5) and torch.equal(counts, want_c)


def test_causal_block_softmax_rows_sum_to_one_and_are_causal():
    logits = torch.randn(2, 3, 2, 6, 6)
    valid = torch.ones(2, 6, dtype=torch.bool)
    p = causal_block_softmax(logits, valid, torch.arange(6))
    assert torch.allclose(p.sum(-1), torch.ones(2, 3, 2, 6))
    assert torch.all(p.triu(1) == 0)
    a = aggregate_heads(p, per_group=False)
    assert a.shape == (2, 1, 6, 6) and torch.allclose(a.sum(-1), torch.ones(2, 1, 6))
    assert aggregate_heads(p, per_group=True).shape == (2, 3, 6, 6)


@pytest.mark.parametrize("per_group", [True, False])
def test_heads_pool_by_mean_or_max_into_row_distributions(per_group):
    """A group's (or the layer's) row is its heads' summed masses, or their largest per block,
    scaled to sum to 1; an all-zero row (no visible block) stays zero."""
    torch.manual_seed(int(per_group))
    p = torch.softmax(torch.randn(2, 3, 2, 5, 7), -1)
    p[:, :, :, 0] = 0.0
    for pool in ("mean", "max"):
        got = aggregate_heads(p, per_group, pool)
        heads = p.flatten(1, 2) if not per_group else p  # [B, H, ...] or [B, Hkv, G, ...]
        dim = 1 if not per_group else 2
        pooled = heads.amax(dim) if pool == "max" else heads.sum(dim)
        if not per_group:
            pooled = pooled.unsqueeze(1)
        total = pooled.sum(-1, keepdim=True)
        want = torch.where(total > 0, pooled / total.clamp(min=1e-30), pooled)
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.all(got[:, :, 0] == 0)
        assert torch.allclose(got[:, :, 1:].sum(-1), torch.ones(1), atol=1e-5)
    assert not torch.allclose(aggregate_heads(p, per_group, "max"), aggregate_heads(p, per_group))


def test_causal_block_softmax_masks_before_normalising():
    """Future blocks must get no probability mass (the reference code leaks it)."""
    logits = torch.zeros(1, 1, 1, 4, 4)
    logits[..., 3] = 100.0  # a huge future logit
    p = causal_block_softmax(logits, torch.ones(1, 4, dtype=torch.bool), torch.arange(4))
    assert torch.allclose(p[0, 0, 0, 0], torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(p[0, 0, 0, 1], torch.tensor([0.5, 0.5, 0, 0]))


def test_causal_block_softmax_zeroes_rows_that_see_no_real_block():
    """Left padding: rows whose visible blocks hold no real key are all zero, not NaN, and the
    other rows are the softmax over their real causal blocks alone."""
    torch.manual_seed(0)
    logits = torch.randn(2, 1, 1, 5, 5)
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    p = causal_block_softmax(logits, valid, torch.arange(5))
    assert not torch.isnan(p).any()
    assert torch.all(p[0, ..., :2, :] == 0)
    for row in range(2, 5):
        want = torch.softmax(logits[0, 0, 0, row, 2 : row + 1], -1)
        assert torch.allclose(p[0, 0, 0, row, 2 : row + 1], want)
        assert torch.all(p[0, 0, 0, row, :2] == 0) and torch.all(p[0, 0, 0, row, row + 1 :] == 0)
    assert torch.allclose(p[1].sum(-1), torch.ones(1, 1, 5))


@pytest.mark.parametrize(
    "t, b, pad, samples, r", [(96, 16, 0, 4, 16), (77, 8, 5, 2, 8), (50, 8, 3, 0, 32)]
)
def test_token_sketch_pools_then_sketches_queries_and_sketches_only_the_scored_ones(
    t, b, pad, samples, r
):
    """sketch_blocks for the token estimators: the same block sums as sketching every token and
    pooling (the sketch is linear; float rounding apart), the scored queries those picked from
    every sketched query, the keys' sums and squared sums from the sketched keys. Where the
    sketch keeps every coordinate (r >= d here: a rotation) the scored queries and the keys are
    the raw ones, and their inner products those of the sketched ones."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import QueryTokens, sketch_blocks
    from sketchwalk.engine.method.sketch import block_pool

    g = torch.Generator().manual_seed(t)
    q, k = torch.randn(2, 4, t, 16, generator=g), torch.randn(2, 2, t, 16, generator=g)
    valid = torch.ones(2, t, dtype=torch.bool)
    valid[1, :pad] = False
    srht = make_srht(16, r, 0, 3)
    cfg = SketchWalkConfig(block_size=b, estimator="sampled", query_samples=samples)
    sk, tokens = sketch_blocks(q, k, srht, b, valid, token_cfg=cfg)
    qs, ks = srht(q), srht(k)
    want_q, want_count = block_pool(qs, b, valid)
    assert torch.allclose(sk.q_sum, want_q, atol=1e-5) and torch.equal(sk.q_count, want_count)
    assert torch.allclose(sk.k_sum, block_pool(ks, b, valid)[0], atol=1e-5)
    assert torch.allclose(sk.k_sq, block_pool(ks * ks, b, valid)[0], atol=1e-5)
    want = QueryTokens.sampled(qs, valid, 0, cfg)
    assert srht.rotation == (r >= 16)
    if srht.rotation:
        raw = QueryTokens.sampled(q, valid, 0, cfg)
        assert torch.equal(tokens.qs, raw.qs) and torch.equal(tokens.keys, k)
        scores, sketched = (
            tokens.qs @ k.repeat_interleave(2, 1).mT,
            want.qs @ ks.repeat_interleave(2, 1).mT,
        )
        assert torch.allclose(scores, sketched, atol=1e-4)
    else:
        assert torch.allclose(tokens.qs, want.qs, atol=1e-6)
        assert torch.allclose(tokens.keys, ks, atol=1e-5)
    assert torch.equal(tokens.pos, want.pos) and torch.equal(tokens.valid, want.valid)


@pytest.mark.parametrize("t,b,offset_pad", [(96, 16, 0), (100, 32, 0), (77, 8, 5)])
@pytest.mark.parametrize("pool", ["mean", "max"])
def test_token_estimator_is_exact_when_every_block_holds_one_repeated_key(t, b, offset_pad, pool):
    """Keys repeated inside each block have zero variance, so each query's log-sum-exp over a
    block is exactly log(visible keys) + q . k: the token estimator must equal the exact mass
    (causal diagonal, partial last block and left padding included), pooled the same way."""
    from sketchwalk.engine.method.blockstats import exact_block_mass
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import sketch_blocks, transition

    g = torch.Generator().manual_seed(t)
    n = -(-t // b)
    q = torch.randn(1, 4, t, 16, generator=g)
    kb = torch.randn(1, 2, n, 16, generator=g)
    k = kb.repeat_interleave(b, dim=2)[:, :, :t].contiguous()
    valid = torch.ones(1, t, dtype=torch.bool)
    valid[0, :offset_pad] = False
    srht = make_srht(16, 16, 0, 3)  # r = m: the sketch is an exact rotation
    cfg = SketchWalkConfig(
        block_size=b, estimator="query", per_group=True, query_samples=0, pool=pool
    )
    sk, tokens = sketch_blocks(q, k, srht, b, valid, token_cfg=cfg)
    est = transition(sk, torch.arange(n), 16, cfg, tokens)
    exact = exact_block_mass(q, k, 16**-0.5, b, valid, groups=2, pool=pool)
    assert torch.allclose(est, exact, atol=1e-5)


def test_token_estimator_sees_a_key_block_that_each_query_finds_alone():
    """Copy-head pattern: each query of the last block matches a different key of block 2; the
    block-mean query matches none of them, the token estimator ranks block 2 first."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import sketch_blocks, transition

    g = torch.Generator().manual_seed(0)
    b, n, d = 16, 6, 32
    k = torch.randn(1, 1, n * b, d, generator=g) * 0.3
    q = torch.randn(1, 1, n * b, d, generator=g) * 0.3
    basis = torch.linalg.qr(torch.randn(d, d, generator=g))[0][:b]  # orthonormal rows
    dirs = (basis - basis.mean(0)) * 6  # zero mean: the block means carry nothing of it
    k[0, 0, 2 * b : 3 * b] = dirs
    q[0, 0, 5 * b : 6 * b] = dirs  # query t of block 5 matches key t of block 2 only
    valid = torch.ones(1, n * b, dtype=torch.bool)
    srht = make_srht(d, d, 0, 0)
    rows = torch.arange(n)
    est = {}
    for estimator in ("query", "mean"):
        cfg = SketchWalkConfig(block_size=b, estimator=estimator, per_group=True)
        sk, tokens = sketch_blocks(q, k, srht, b, valid, cfg if estimator == "query" else None)
        est[estimator] = transition(sk, rows, d, cfg, tokens)[0, 0, 5]
    others = [0, 1, 3, 4]
    assert est["query"][2] > 1.5 * est["query"][others].max()
    assert est["mean"][2] < 1.2 * est["mean"][others].max()


@pytest.mark.parametrize("length,b,samples,offset", [(64, 16, 4, 0), (70, 16, 2, 0), (40, 8, 0, 5),
                                                     (33, 16, 16, 7)])  # fmt: skip
def test_sampled_positions_are_evenly_spaced_and_keep_each_block_end(length, b, samples, offset):
    from sketchwalk.engine.method.sketch import sample_positions

    pos = sample_positions(length, b, samples, offset)
    assert pos[-1] == offset + length - 1 and torch.all(pos[1:] > pos[:-1])
    if samples in (0, b):
        assert torch.equal(pos, torch.arange(offset, offset + length))
    else:
        full = [p for p in range(offset, offset + length) if p % b == b - 1]
        assert set(full) <= set(pos.tolist())
        per_block = torch.bincount(pos // b)
        assert per_block.max() <= samples + 1


def test_sampled_estimate_is_the_mean_over_the_sampled_queries():
    """query_samples=s scores s queries per block: the same as scoring those queries alone."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import QueryTokens, sketch_blocks, transition
    from sketchwalk.engine.method.sketch import sample_positions

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 4, 96, 16, generator=g), torch.randn(1, 2, 96, 16, generator=g)
    valid = torch.ones(1, 96, dtype=torch.bool)
    srht = make_srht(16, 16, 0, 1)
    cfg = SketchWalkConfig(block_size=16, estimator="query", query_samples=4)
    sk, tokens = sketch_blocks(q, k, srht, 16, valid, cfg)
    sampled = transition(sk, torch.arange(6), 16, cfg, tokens)
    pos = sample_positions(96, 16, 4)
    by_hand = QueryTokens(srht(q)[:, :, pos], valid[:, pos], pos)
    assert torch.allclose(sampled, transition(sk, torch.arange(6), 16, cfg, by_hand), atol=1e-6)
    every = transition(
        sk,
        torch.arange(6),
        16,
        cfg,
        QueryTokens.sampled(srht(q), valid, 0, cfg.with_(query_samples=0)),
    )
    assert not torch.allclose(sampled, every, atol=1e-4)  # fewer queries: a different estimate


def test_score_dtype_auto_follows_the_c_kernels_amx_and_onednn(monkeypatch):
    from sketchwalk.engine.method.estimators import sampled
    from sketchwalk.engine.method.estimators.sampled import score_dtype

    assert score_dtype("float32", "cpu") == torch.float32
    assert score_dtype("bfloat16", "cpu") == torch.bfloat16
    assert score_dtype("auto", "cuda") == torch.bfloat16
    for built, tiles, native, want in (
        (True, False, True, torch.float32),  # the fused C kernel runs in float32
        (True, True, False, torch.bfloat16),  # ... and in bfloat16 on AMX tiles
        (False, False, True, torch.bfloat16),
        (False, False, False, torch.float32),
    ):
        monkeypatch.setattr(sampled, "library", lambda b=built: object() if b else None)
        monkeypatch.setattr(sampled, "amx", lambda t=tiles: t)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda n=native: n)
        assert score_dtype("auto", "cpu") == want
    monkeypatch.setattr(torch.ops, "mkldnn", object())  # a build without the private probe
    monkeypatch.setattr(sampled, "library", lambda: None)
    assert score_dtype("auto", "cpu") == torch.float32


@pytest.mark.parametrize(
    "d, r, samples, pad, all_valid",
    [(16, 16, 4, 0, False), (16, 16, 4, 0, True), (16, 8, 2, 3, False), (12, 32, 0, 0, True),
     (16, 8, 2, 0, True), (64, 64, 4, 3, False), (64, 32, 0, 0, True)],
)  # fmt: skip
@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_sampled_estimate_scores_the_last_window_queries_against_every_key(
    d, r, samples, pad, all_valid, pool, dtype
):
    """Decode's sampled estimate: the last `samples` sketched window queries, each scored against
    every real key in the sketched space ((S q).(S k), the sketch of any r), block masses
    averaged over the real ones (pool "max": their largest). all_valid: the one-row path without
    padding (a partial last block: 45 keys in blocks of 8). bfloat16 (score_dtype): the scores'
    inputs rounded, over keys a PackedKeys keeps (the fused call where the CPU has AMX tiles
    and d is 64), within bfloat16's rounding of the float32 reference."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.estimators.sampled import decode_sampled_mass
    from sketchwalk.engine.method.sketch import make_srht
    from sketchwalk.kernels.block_softmax import PackedKeys

    torch.manual_seed(d + r + samples)
    h, hkv, lk, b, w = 4, 2, 45, 8, 6
    srht = make_srht(d, r, 0, 3)
    window = srht(torch.randn(2, h, w, d) * 2)
    keys = torch.randn(2, hkv, lk, d) * 2
    valid = torch.ones(2, lk, dtype=torch.bool)
    valid[1, :pad] = False
    cfg = SketchWalkConfig(block_size=b, query_samples=samples, sketch_dim=r, pool=pool,
                           score_dtype=dtype)  # fmt: skip
    packed = PackedKeys()
    got = decode_sampled_mass(
        window, srht, keys[:, :, :40], valid[:, :40], cfg, d, all_valid, packed
    )
    assert got.shape[-1] == 5  # the cache grows by 5 keys between two re-selections
    got = decode_sampled_mass(window, srht, keys, valid, cfg, d, all_valid, packed)
    used = window[:, :, -(samples or w) :]
    sk = srht(keys)
    n = -(-lk // b)
    want = torch.zeros(2, hkv, h // hkv, 1, n)
    for bi in range(2):
        seen = [j for j in range(lk) if valid[bi, j]]
        for hi in range(h):
            for qi in range(used.shape[2]):
                logits = torch.stack([used[bi, hi, qi] @ sk[bi, hi // 2, j] for j in seen])
                probs = torch.softmax(logits / d**0.5, 0)
                mass = torch.zeros(n).index_add_(0, torch.tensor(seen) // b, probs)
                row = want[bi, hi // 2, hi % 2, 0]
                row.copy_(torch.maximum(row, mass) if pool == "max" else row + mass / used.shape[2])
    assert torch.allclose(got, want, atol=1e-4 if dtype == "float32" else 1.5e-2)


def test_raw_scored_queries_of_a_bfloat16_model_are_float32_and_only_the_kept_ones():
    """A rotation hands the estimator raw queries: from a bfloat16 model, the kept ones in float32
    (what the sketch gave before), the keys in float32."""
    from sketchwalk.engine.method.config import SketchWalkConfig
    from sketchwalk.engine.method.pipeline import QueryTokens, sketch_blocks

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 64, 16, generator=g).bfloat16()
    k = torch.randn(1, 2, 64, 16, generator=g).bfloat16()
    valid = torch.ones(1, 64, dtype=torch.bool)
    cfg = SketchWalkConfig(block_size=16, estimator="sampled", query_samples=4)
    _, tokens = sketch_blocks(q, k, make_srht(16, 16, 0, 3), 16, valid, token_cfg=cfg)
    want = QueryTokens.sampled(q.float(), valid, 0, cfg)
    assert tokens.qs.dtype == tokens.keys.dtype == torch.float32
    assert torch.equal(tokens.qs, want.qs) and torch.equal(tokens.keys, k.float())
    assert tokens.qs.shape[2] == 16  # 4 of every 16 queries
