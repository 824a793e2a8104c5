"""picospec.beyond.theory against the statements of Leviathan et al. 2022."""

import numpy as np
import pytest

from picospec.beyond import theory


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9, 0.99])
@pytest.mark.parametrize("K", [1, 2, 4, 7])
def test_tokens_per_call_is_the_capped_geometric_mean(alpha, K):
    law = theory.accepted_length_law(alpha, K)
    assert law.sum() == pytest.approx(1.0)
    assert theory.expected_tokens_per_call(alpha, K) == pytest.approx((law * (np.arange(K + 1) + 1)).sum())


def test_tokens_per_call_limits():
    assert theory.expected_tokens_per_call(0.0, 5) == 1.0  # every draft rejected: one token per call
    assert theory.expected_tokens_per_call(1.0, 5) == 6.0  # every draft accepted, plus the bonus
    assert theory.expected_tokens_per_call(0.999999, 5) == pytest.approx(6.0, rel=1e-5)


@pytest.mark.parametrize("alpha, c", [(0.5, 0.1), (0.8, 0.05), (0.3, 0.5)])
def test_K1_improvement_is_one_plus_alpha_over_one_plus_c(alpha, c):
    assert theory.walltime_improvement(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))


# With c = 0 the improvement is the expected tokens per call; values worked by hand from Eq. 1.
@pytest.mark.parametrize("alpha, K, expected", [
    (0.5, 1, 1.5), (0.5, 2, 1.75), (0.5, 3, 1.875), (0.8, 5, 3.68928), (0.9, 10, 6.86189), (0.6, 4, 2.3056),
])
def test_c0_table_values(alpha, K, expected):
    assert theory.walltime_improvement(alpha, K, 0.0) == pytest.approx(expected, rel=1e-5)


def test_speedup_whenever_alpha_exceeds_c():
    # Corollary 3.9: if alpha > c there is a K with an improvement > 1 (K = 1 gives (1+alpha)/(1+c)).
    for alpha in np.linspace(0.05, 0.95, 10):
        for c in np.linspace(0.0, alpha - 0.01, 5):
            assert max(theory.walltime_improvement(alpha, K, c) for K in range(1, 20)) > 1


def test_optimal_K():
    assert theory.optimal_K(0.8, 0.0, K_max=16) == 16  # free drafts: draft as far as allowed
    assert theory.optimal_K(0.1, 0.05) == 1
    assert theory.optimal_K(0.9, 0.05) > theory.optimal_K(0.7, 0.05)  # better drafts go further
    # A verification cost that grows with K pulls the optimum back.
    assert theory.optimal_K(0.9, 0.02, v=lambda K: 1 + 0.2 * K) < theory.optimal_K(0.9, 0.02)
    K = theory.optimal_K(0.8, 0.1)
    assert all(theory.walltime_improvement(0.8, K, 0.1) >= theory.walltime_improvement(0.8, j, 0.1)
               for j in range(1, 33))


def test_alpha_exact_is_one_minus_total_variation():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(10)), rng.dirichlet(np.ones(10))
    assert theory.alpha_exact(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())
    assert theory.alpha_exact(p, p) == pytest.approx(1.0)
    assert theory.alpha_exact(np.eye(3)[0], np.eye(3)[1]) == 0.0


def test_alpha_from_trace_recovers_a_known_alpha():
    rng = np.random.default_rng(1)
    K, alpha = 4, 0.7
    trials = rng.random((20000, K)) < alpha
    n_accepted = np.cumprod(trials, axis=1).sum(axis=1)  # the leading run of successes
    assert theory.alpha_from_trace(n_accepted, K) == pytest.approx(alpha, abs=0.01)
    assert theory.alpha_from_trace(n_accepted, K) != pytest.approx(n_accepted.mean() / K, abs=0.01)


def test_alpha_by_position_recovers_each_positions_alpha():
    rng = np.random.default_rng(3)
    alphas = np.array([0.9, 0.5, 0.7])  # not geometric: the second draft is accepted less often
    n_accepted = np.cumprod(rng.random((20000, 3)) < alphas, axis=1).sum(axis=1)
    alpha_i, reached = theory.alpha_by_position(n_accepted, 3)
    np.testing.assert_allclose(alpha_i, alphas, atol=0.015)
    assert reached[0] == 20000 and reached[1] == np.sum(n_accepted >= 1)
    naive = [np.mean(n_accepted >= i) for i in (1, 2, 3)]  # unconditional: the survival, not alpha_i
    assert abs(naive[2] - alphas[2]) > 0.2
    # a geometric run gives the same alpha at every position, the one alpha_from_trace estimates
    geometric = np.cumprod(rng.random((20000, 3)) < 0.7, axis=1).sum(axis=1)
    np.testing.assert_allclose(theory.alpha_by_position(geometric, 3)[0], 0.7, atol=0.015)


def test_lenience_is_exact_at_one_and_accepts_more_below():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    np.testing.assert_allclose(theory.lenient_output_law(p, q, 1.0), q, atol=1e-12)
    assert theory.lenient_alpha(p, q, 1.0) == pytest.approx(theory.alpha_exact(p, q))
    alphas = [theory.lenient_alpha(p, q, l) for l in (1.0, 0.7, 0.4, 0.1)]
    assert alphas == sorted(alphas) and alphas[-1] > alphas[0]
    for l in (0.7, 0.3):
        law = theory.lenient_output_law(p, q, l)
        assert law.sum() == pytest.approx(1.0) and (law >= 0).all()
        assert np.abs(law - q).sum() > 0.01  # no longer exact


@pytest.mark.parametrize("alpha, K, c, v", [(0.73, 4, 0.08, 1.0), (0.5, 2, 0.2, 1.3), (0.95, 8, 0.01, 1.9)])
def test_alpha_from_speedup_inverts_walltime_improvement(alpha, K, c, v):
    speedup = float(theory.walltime_improvement(alpha, K, c, v))
    assert theory.alpha_from_speedup(speedup, K, c, v) == pytest.approx(alpha, abs=1e-9)


def test_alpha_from_speedup_refuses_an_impossible_speedup():
    with pytest.raises(ValueError):  # even alpha = 1 gives at most 5 / (4 * 0.08 + 1) = 3.79
        theory.alpha_from_speedup(4.0, 4, 0.08)
