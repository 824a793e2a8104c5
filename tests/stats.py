"""Pearson's chi-square test, shared by the distribution tests."""

import numpy as np
from scipy.special import chdtrc  # the chi-square law's upper tail (scipy.stats takes ~1 s to import)

# A law passes when p > PASS; the wrong-sampler controls must fall below FAIL. With fixed seeds the
# outcome is deterministic; the gap between the two thresholds leaves room for noise in either.
PASS = 1e-3
FAIL = 1e-6


def chi_square_p(samples, probs) -> float:
    """p-value that integer `samples` were drawn from `probs`. Outcomes of probability 0 must never
    occur (that is asserted, not tested); cells expecting fewer than 5 counts are pooled."""
    probs = np.asarray(probs, np.float64)
    counts = np.bincount(np.asarray(samples).ravel(), minlength=probs.size)
    assert counts[probs == 0].sum() == 0, "a sample of probability 0 occurred"
    expected = counts.sum() * probs / probs.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(chdtrc(len(obs) - 1, np.sum((obs - exp) ** 2 / exp)))  # Pearson's statistic, k - 1 degrees
