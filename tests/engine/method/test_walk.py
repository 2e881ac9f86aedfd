import torch

from sketchwalk.engine.method.walk import walk, walk_row


def random_transition(n: int, batch: int = 2) -> torch.Tensor:
    a = torch.rand(batch, 1, n, n, dtype=torch.float64).tril()
    return a / a.sum(-1, keepdim=True)


def test_beta_zero_is_the_per_layer_estimate():
    a, prev = random_transition(7), random_transition(7)
    assert torch.equal(walk(a, prev, 0.0, 3), a)
    r = torch.rand(2, 1, 7, dtype=torch.float64)
    assert torch.equal(walk_row(r, a, 0.0, 3), r)


def test_walk_matches_closed_form():
    """s_K = (1-b) A sum_{i<K} (bA)^i + b^K P A^K for s_0 = P."""
    a, p = random_transition(6), random_transition(6)
    beta, k = 0.3, 4
    expected = sum((1 - beta) * a @ torch.linalg.matrix_power(beta * a, i) for i in range(k))
    expected = expected + beta**k * p @ torch.linalg.matrix_power(a, k)
    assert torch.allclose(walk(a, p, beta, k), expected, atol=1e-12)
    # the first sparse layer starts from A itself
    assert torch.allclose(walk(a, None, beta, 1), (1 - beta) * a + beta * a @ a)


def test_walk_stays_row_stochastic_and_causal():
    a, p = random_transition(9), random_transition(9)
    w = walk(a, p, 0.25, 3)
    assert torch.allclose(w.sum(-1), torch.ones(2, 1, 9, dtype=torch.float64))
    assert torch.all(w.triu(1) == 0)


def test_walk_row_matches_recurrence():
    a = random_transition(5)
    r = torch.rand(2, 1, 5, dtype=torch.float64)
    s = r
    for _ in range(3):
        s = 0.75 * r + 0.25 * (s.unsqueeze(-2) @ a).squeeze(-2)
    assert torch.allclose(walk_row(r, a, 0.25, 3), s)


def test_lower_matmul_equals_the_full_product():
    """The walk's products of lower-triangular matrices from their nonzero quarters: the full
    product, odd and even sizes, batched; the walk equals the walk by full products."""
    from sketchwalk.engine.method.walk import lower_matmul

    for n in (1, 2, 7, 8, 33):
        x, a = random_transition(n, batch=3), random_transition(n, batch=3)
        assert torch.allclose(lower_matmul(x, a, min_n=2), x @ a, atol=1e-12)
        assert torch.all(lower_matmul(x, a, min_n=2).triu(1) == 0)
    a, p = random_transition(400), random_transition(400)  # above the default split size
    s = p
    for _ in range(3):
        s = torch.lerp(a, s @ a, 0.25)
    assert torch.allclose(walk(a, p, 0.25, 3), s, atol=1e-12)
