"""The CPU launcher of the sampled estimator's block mass (kernels/cpu_block_mass.py) against
brute force, in C and in torch, and the launchers of the other ops against the reference backend."""

import pytest
import torch


@pytest.mark.parametrize(
    "t, b, samples, pad, chunk, parts",
    [(70, 16, 4, 0, 1 << 21, 1), (64, 16, 1, 5, 1 << 21, 2), (33, 8, 8, 3, 1 << 21, 1),
     (70, 16, 4, 3, 600, 2), (45, 8, 2, 0, 1, 3), (90, 8, 8, 7, 1, 2),
     (256, 8, 2, 5, 1 << 21, 1), (160, 8, 8, 2, 1 << 21, 2)],
)  # fmt: skip
@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("native", ["1", "0"])
def test_sampled_estimator_equals_brute_force_block_mass(
    monkeypatch, t, b, samples, pad, chunk, parts, pool, native
):
    """Per scored query: the exact softmax over the real keys up to it, summed per key block;
    a row is the mean over its scored real queries (pool "max": per key block, the largest of
    their masses). chunk: score matrix elements per pass (small:
    many chunks, of different widths; long texts: chunks capped by their span); parts: threads
    the queries are cut over (kernels/parts.py, only where each part gets enough queries); native:
    the block softmax in C (kernels/block_softmax.c) or its torch reference."""
    from sketchwalk.engine.method.sketch import sample_positions
    from sketchwalk.kernels import cpu_block_mass as sampled

    monkeypatch.setenv("SKETCHWALK_NATIVE", native)
    monkeypatch.setattr(sampled, "workers", lambda: parts)
    split, real = [], sampled.run_in_parts
    monkeypatch.setattr(
        sampled, "run_in_parts", lambda fn, cuts: (split.append(cuts), real(fn, cuts))
    )

    torch.manual_seed(t + b)
    h, hkv, r = 4, 2, 8
    qs, ks = torch.randn(2, h, t, r) * 2, torch.randn(2, hkv, t, r) * 2
    valid = torch.ones(2, t, dtype=torch.bool)
    valid[1, :pad] = False  # left padding in the second sequence
    pos = sample_positions(t, b, samples)
    got = sampled.sampled_block_mass(
        qs[:, :, pos], valid[:, pos], pos, ks, valid, b, r, 1.0, chunk, pool=pool
    )
    n = -(-t // b)
    want = torch.zeros(2, hkv, h // hkv, n, n)
    count = torch.zeros(2, n)
    for bi in range(2):
        for p in pos.tolist():
            if not valid[bi, p]:
                continue
            count[bi, p // b] += 1
            for hi in range(h):
                seen = [j for j in range(p + 1) if valid[bi, j]]
                logits = torch.stack([qs[bi, hi, p] @ ks[bi, hi // 2, j] for j in seen]) / r**0.5
                mass = torch.zeros(n).index_add_(
                    0, torch.tensor(seen) // b, torch.softmax(logits, 0)
                )
                row = want[bi, hi // 2, hi % 2, p // b]
                row.copy_(torch.maximum(row, mass) if pool == "max" else row + mass)
    if pool == "mean":
        want = want / count.clamp(min=1)[:, None, None, :, None]
    assert torch.allclose(got, want, atol=1e-5)
    assert bool(split) == (parts > 1 and pos.numel() >= parts * sampled._PART_QUERIES)
    if pool == "mean":  # every scored row is a distribution
        rows = got.sum(-1)
        scored = (count > 0)[:, None, None, :].expand_as(rows)
        assert torch.allclose(rows[scored], torch.ones(1), atol=1e-5)


@pytest.mark.parametrize("t, b, samples, pad", [(96, 16, 4, 0), (200, 32, 4, 7), (77, 8, 2, 3)])
def test_sampled_estimator_in_bfloat16_stays_close_to_float32(t, b, samples, pad):
    """score_dtype bfloat16 rounds the score product only: the masses (float32) stay within
    bfloat16's rounding of the float32 estimate, every scored row still sums to 1, and
    padding stays 0."""
    from sketchwalk.engine.method.sketch import sample_positions
    from sketchwalk.kernels.cpu_block_mass import sampled_block_mass

    torch.manual_seed(t + b + pad)
    h, hkv, r = 6, 2, 16
    qs, ks = torch.randn(2, h, t, r) * 2, torch.randn(2, hkv, t, r) * 2
    valid = torch.ones(2, t, dtype=torch.bool)
    valid[1, :pad] = False
    pos = sample_positions(t, b, samples)
    args = (qs[:, :, pos], valid[:, pos], pos, ks, valid, b, r, 1.0, 1 << 12)
    ref = sampled_block_mass(*args)
    got = sampled_block_mass(*args, dtype=torch.bfloat16)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert (got - ref).abs().max() < 0.03
    assert (got - ref).abs().mean() < 2e-3
    rows = got.sum(-1)
    assert torch.allclose(rows[rows > 0], torch.ones(1), atol=1e-5)
    assert torch.equal(got == 0, ref == 0)  # the same keys seen: causality and padding


@pytest.mark.parametrize(
    "length, b, samples, parts", [(700, 16, 4, 2), (700, 16, 16, 3), (64, 8, 1, 2)]
)
def test_work_cuts_end_at_query_blocks_with_about_equal_work(length, b, samples, parts):
    from sketchwalk.engine.method.sketch import sample_positions
    from sketchwalk.kernels.cpu_block_mass import _cuts_by_work

    pos = sample_positions(length, b, samples)
    cuts = _cuts_by_work(pos, b, parts, 2)
    assert cuts[0] == 0 and cuts[-1] == pos.numel() and cuts == sorted(set(cuts))
    assert len(cuts) == parts + 1
    blk = pos // b
    for c in cuts[1:-1]:  # no query block is split between two parts
        assert blk[c] != blk[c - 1]
    work = [float((pos[a:e] + 1).sum()) for a, e in zip(cuts, cuts[1:], strict=False)]
    assert max(work) - min(work) <= 2 * min(samples, b) * length  # a block's queries at most
    assert _cuts_by_work(pos, b, parts, pos.numel()) == [0, pos.numel()]  # parts too short


@pytest.mark.parametrize("lk, samples", [(2048, 4), (7376, 4), (512, 16), (40000, 1)])
def test_estimator_chunks_stay_short_against_the_context(lk, samples):
    """A chunk's queries score the keys up to its last query, so its span is masked waste: at
    most lk / 16 positions (or 16 queries), and never more score elements than the budget."""
    from sketchwalk.engine.method.sketch import sample_positions
    from sketchwalk.kernels.cpu_block_mass import _CHUNK_SPAN, _chunk_queries

    pos = sample_positions(lk, 16, samples)
    row = 9 * lk
    step = _chunk_queries(pos, lk, row, 1 << 21)
    assert step * row <= 1 << 21 or step == 1
    spans = [int(pos[min(s + step, pos.numel()) - 1] - pos[s]) for s in range(0, pos.numel(), step)]
    assert step == 16 or max(spans) <= lk / _CHUNK_SPAN
    assert step >= 16 or step * row * 2 > 1 << 21  # only the element budget makes it shorter
