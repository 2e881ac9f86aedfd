import math

import pytest
import torch

from sketchwalk.engine.select import select_blocks, selection_mask


def run_select(n=40, b=16, density=0.2, sink=0.05, window=0.05, groups=1, batch=1, seed=0, **kw):
    torch.manual_seed(seed)
    scores = torch.rand(batch, groups, n, n)
    start = kw.pop("start", torch.zeros(batch, dtype=torch.long))
    end = kw.pop("end", torch.full((batch,), n * b))
    sel = select_blocks(scores, torch.arange(n), b, density, start, end, sink, window, **kw)
    return scores, sel, selection_mask(sel, n)


@pytest.mark.parametrize("density", [0.05, 0.2, 0.5, 1.0])
def test_plain_rule_keeps_the_row_share(density):
    n = 40
    _, sel, mask = run_select(n=n, density=density, sink=0.0, window=0.0, calibrate=False)
    counts = mask.sum(-1)[0, 0]
    for i in range(n):
        assert counts[i] == max(1, math.ceil(density * (i + 1) - 1e-9))  # diagonal always forced
    assert torch.equal(counts.int(), sel.block_count[0, 0])
    assert abs(sel.density - density) < 0.05 + 1.0 / n


@pytest.mark.parametrize("density", [0.1, 0.2, 0.3, 0.6])
@pytest.mark.parametrize("n", [17, 64, 200])
def test_calibrated_selection_lands_on_the_target_density(density, n):
    dense = torch.arange(n) >= n - 4
    _, sel, mask = run_select(n=n, density=density, sink=0.025, window=0.05, dense_rows=dense)
    _, plain, _ = run_select(
        n=n, density=density, sink=0.025, window=0.05, dense_rows=dense, calibrate=False
    )
    forced_only = run_select(n=n, density=1e-6, sink=0.025, window=0.05, dense_rows=dense)[
        1
    ].density
    assert sel.density <= plain.density
    if forced_only < density:
        assert density - 1.0 / n <= sel.density <= density + 1e-9  # within one row's block
    else:
        assert sel.density == pytest.approx(forced_only)
    counts = mask.sum(-1)[0, 0]
    assert torch.all(counts[-4:] == torch.arange(n - 3, n + 1))  # dense tail still complete


def test_never_selects_future_blocks_and_lists_are_sorted():
    _, sel, mask = run_select(n=33, density=0.3, groups=2, batch=2)
    assert not mask.triu(1).any()
    for b in range(2):
        for g in range(2):
            for i in range(33):
                c = int(sel.block_count[b, g, i])
                ids = sel.block_index[b, g, i, :c]
                assert torch.all(ids[1:] > ids[:-1]) and int(ids.max()) <= i


def test_sink_window_and_diagonal_always_kept_and_top_scores_fill_the_rest():
    n, b = 64, 16
    scores, sel, mask = run_select(n=n, b=b, density=0.25, sink=0.05, window=0.1)
    t = n * b
    n_sink = math.ceil(0.05 * t / b)
    w_tok = math.ceil(0.1 * t)
    for i in range(n):
        row = mask[0, 0, i]
        assert row[: min(n_sink, i + 1)].all()
        first = max(0, (i * b + b - 1) - w_tok + 1) // b
        assert row[first : i + 1].all()
        forced = set(range(min(n_sink, i + 1))) | set(range(first, i + 1))
        rest = [j for j in range(i + 1) if j not in forced]
        chosen = [j for j in rest if row[j]]
        dropped = [j for j in rest if not row[j]]
        if chosen and dropped:
            assert min(scores[0, 0, i, chosen]) >= max(scores[0, 0, i, dropped])


def test_dense_rows_keep_every_candidate():
    n = 20
    dense = torch.arange(n) >= n - 3
    _, _, mask = run_select(n=n, density=0.1, dense_rows=dense)
    for i in range(n - 3, n):
        assert mask[0, 0, i, : i + 1].all()


def test_padding_blocks_are_never_candidates():
    n, b = 12, 8
    start = torch.tensor([0, 20])  # sequence 1 starts at block 2 (left padding)
    _, sel, mask = run_select(n=n, b=b, batch=2, density=0.5, start=start, sink=0.1)
    assert not mask[1, 0, :, :2].any()
    assert mask[1, 0, 5:, 2].all()  # its sink is its own first real block
