"""The shape timed iteration costs must have, imposed on a noisy timing (costs.py).

An iteration that drafts k >= 1 tokens runs k draft steps, each the same forward call on one token, and
one target call on the smallest block of score_first.score_sizes that holds k + 1 positions. So within
one block size, v(k) grows by the same c for each draft: v(k) = v_block + k c. A timing fits that
(least squares, one c, one v_block per block size), and then never falls as k grows. On a shared
2-core machine one lap can be 10% off; the fit spreads it over the block's other k, where it would
otherwise have auto draft 5 rather than 7 a call for a lap that timed 7 too slow.
"""

import numpy as np

from picospec.score_first import score_sizes


def per_block(v: list) -> list:
    """v [K+1] (k = 0: the target alone, kept as timed) fitted to v_block(size(k)) + k c for k >= 1."""
    K = len(v) - 1
    sizes = score_sizes(K)
    block = [next(b for b, size in enumerate(sizes) if size >= k + 1) for k in range(1, K + 1)]  # [K]
    X = np.zeros((K, 1 + len(sizes)))  # columns: c, then one v_block per block size
    X[:, 0] = np.arange(1, K + 1)
    X[np.arange(K), 1 + np.array(block)] = 1.0
    coef = np.linalg.lstsq(X, np.asarray(v[1:], float), rcond=None)[0]
    return [float(v[0])] + (X @ coef).tolist()


def never_less(v: list) -> list:
    """The closest v (least squares) in which drafting more never costs less (pool adjacent violators): a
    noisy lap that times k = 6 below k = 5 would make auto draft 6 for less than it pays for 5."""
    blocks = []  # [mean, count] of runs of k pooled together
    for x in v:
        blocks.append([x, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, m), (b, n) = blocks.pop(-2), blocks.pop()
            blocks.append([(a * m + b * n) / (m + n), m + n])
    return [mean for mean, count in blocks for _ in range(count)]
