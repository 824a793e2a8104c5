"""The analysis of Leviathan et al. 2022 (§3 and Appendix A.5), as code next to what it predicts.

Notation as in speculative.py: p is the draft's distribution, q the target's (Leviathan et al. write
them the other way round). alpha is the probability that one drafted token is accepted, taken as the
same at every position (the paper's simplifying assumption). c is the cost of one draft step over one
target step; v(K) the cost of the target scoring K + 1 tokens in one call over the cost of scoring one
(the paper takes v = 1: on memory-bound hardware a few more tokens cost almost nothing).
"""

import numpy as np


def alpha_exact(p, q) -> float:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance one draft token is accepted
    (Leviathan et al. Definition 3.1 and Corollary 3.6). p, q: [V] or [..., V]; averages over rows."""
    return float(np.mean(np.minimum(p, q).sum(axis=-1)))


def alpha_from_trace(n_accepted, K: int) -> float:
    """Estimate alpha from a trace's accepted counts (one per iteration, 0..K).

    Each iteration is a run of Bernoulli(alpha) trials that stops at the first failure or after K
    successes, so the maximum-likelihood estimate is successes / (successes + failures).
    """
    n_accepted = np.asarray(n_accepted)
    successes = n_accepted.sum()
    failures = np.sum(n_accepted < K)
    return float(successes / max(successes + failures, 1))


def alpha_by_position(n_accepted, K: int):
    """Test the paper's assumption that alpha is the same at every position, on a fixed-K trace:
    alpha_i for the i-th draft (i = 1..K) is accepted / reached, where an iteration reaches draft i
    when drafts 1..i-1 were accepted, and accepts it when it kept at least i.
    Returns (alpha_i [K], reached [K])."""
    n_accepted = np.asarray(n_accepted)[:, None]  # [R, 1]
    i = np.arange(1, K + 1)  # [K]
    reached, accepted = np.sum(n_accepted >= i - 1, axis=0), np.sum(n_accepted >= i, axis=0)  # [K], [K]
    return accepted / np.maximum(reached, 1), reached


def expected_tokens_per_call(alpha, K: int):
    """E[tokens per target call] = (1 - alpha^(K+1)) / (1 - alpha), Leviathan et al. Eq. 1: the mean
    of a geometric variable capped at K + 1 (the accepted run, plus one resample or bonus)."""
    alpha = np.asarray(alpha, np.float64)
    safe = np.where(alpha < 1, alpha, 0.5)
    return np.where(alpha < 1, (1 - safe ** (K + 1)) / (1 - safe), K + 1.0)


def accepted_length_law(alpha, K: int) -> np.ndarray:
    """P(a accepted drafts) for a = 0..K: alpha^a (1 - alpha), and alpha^K for a full accept."""
    a = np.arange(K + 1)
    law = alpha ** a * (1 - alpha)
    law[K] = alpha ** K
    return law


def walltime_improvement(alpha, K: int, c: float, v: float = 1.0):
    """Expected speedup over autoregressive decoding, Leviathan et al. Theorem 3.8 with a verification
    cost: (1 - alpha^(K+1)) / ((1 - alpha) (K c + v(K))). An iteration costs K draft steps and one
    K+1-token target call, and yields expected_tokens_per_call tokens; v = 1 is the paper's formula."""
    return expected_tokens_per_call(alpha, K) / (K * c + v)


def alpha_from_speedup(speedup: float, K: int, c: float, v: float = 1.0) -> float:
    """The alpha at which walltime_improvement(alpha, K, c, v) equals `speedup`: what a published
    speedup implies about its pair, given its costs. walltime_improvement rises with alpha, so
    bisection finds it; a speedup out of reach at any alpha raises ValueError."""
    lo, hi = 0.0, 1.0
    if not walltime_improvement(lo, K, c, v) <= speedup <= walltime_improvement(hi, K, c, v):
        raise ValueError(f"a speedup of {speedup} is out of reach with K={K}, c={c}, v={v}")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if walltime_improvement(mid, K, c, v) < speedup else (lo, mid)
    return (lo + hi) / 2


def optimal_K(alpha: float, c: float, v=lambda K: 1.0, K_max: int = 32, K_min: int = 1) -> int:
    """The K in K_min..K_max that maximizes walltime_improvement; v maps K to v(K). K = 0 is not
    drafting at all: one token per call of cost v(0), whatever alpha is."""
    gains = [float(walltime_improvement(alpha, K, c, v(K))) for K in range(K_min, K_max + 1)]
    return int(np.argmax(gains)) + K_min


# ---- Lenience (Leviathan et al., Appendix A.5) ----
# Trading exactness for speed: accept a draft token x with probability min(1, q(x) / (l p(x))) for
# a lenience l in (0, 1], and on rejection resample from norm(max(0, q - l p)). l = 1 is the exact
# algorithm; smaller l accepts more, and the output drifts from q toward p.


def lenient_alpha(p, q, l: float) -> float:  # noqa: E741 (the paper's l)
    """The acceptance probability with lenience l: sum_x p(x) min(1, q(x) / (l p(x)))."""
    return float(np.mean(np.minimum(p, np.asarray(q) / l).sum(axis=-1)))


def lenient_output_law(p, q, l: float) -> np.ndarray:  # noqa: E741
    """The exact law of one emitted token under lenience l (equal to q when l = 1). p, q: [V]."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    accepted = np.minimum(p, q / l)  # P(draft x and accept it)
    residual = np.maximum(q - l * p, 0.0)
    residual = residual / residual.sum() if residual.sum() > 0 else q
    return accepted + (1 - accepted.sum()) * residual


# ---- Several drafts (picospec/beyond/several.py) ----


def alpha_several(p, q, N: int) -> float:
    """The chance that one of N independent drafts from p is accepted at a position by recursive
    rejection sampling: candidate m is accepted with probability sum_x min(p(x), r_m(x)), where
    r_0 = q and r_{m+1} = norm(max(0, r_m - p)). p, q: [V] or [..., V]; averages over rows.
    alpha_several(p, q, 1) is alpha_exact(p, q)."""
    p, r = np.asarray(p, np.float64), np.asarray(q, np.float64)
    rejected = np.ones(r.shape[:-1])
    for _ in range(N):
        rejected = rejected * (1 - np.minimum(p, r).sum(-1))
        residual = np.maximum(r - p, 0)
        total = residual.sum(-1, keepdims=True)
        r = np.where(total > 0, residual / np.where(total > 0, total, 1), r)
    return float(np.mean(1 - rejected))
