"""The shape timed iteration costs must have, imposed on a noisy timing (laps.py).

An iteration that drafts k >= 1 tokens runs k draft steps, each the same forward call on one token, and
one target call on the smallest block of score_first.score_sizes that holds k + 1 positions. So within
one block size, v(k) grows by the same c for each draft: v(k) = v_block + k c. A timing fits that
(least squares, one c, one v_block per block size), and then never falls as k grows. On a shared
2-core machine one lap can be 10% off; the fit spreads it over the block's other k, where it would
otherwise have auto draft 5 rather than 7 a call for a lap that timed 7 too slow.
"""

import numpy as np

from picospec.beyond.score_first import score_sizes


def blocks(K: int) -> list[int]:
    """[K]: for k = 1..K, the index in score_sizes(K) of the block the target scores."""
    return [next(b for b, size in enumerate(score_sizes(K)) if size >= k + 1) for k in range(1, K + 1)]


def worth_timing(K: int) -> list[int]:
    """The k a timing needs: 0, each block's most drafts, and the fewest of the last block holding two k or more
    (K = 7: 0, 3, 4, 7): one v_block each, and c from two k of one block. The k between follow from the
    fit and take as long to time."""
    b = blocks(K)  # b[k - 1]: the block of k drafts
    ends = {k for k in range(1, K + 1) if k == K or b[k] != b[k - 1]}
    wide = [x for x in b if b.count(x) > 1]
    return sorted({0} | ends | ({b.index(wide[-1]) + 1} if wide else set()))


def fit(v: list) -> tuple[np.ndarray, np.ndarray]:
    """The design [K, 1 + blocks] (columns: k, then one indicator per block size) and the least-squares
    coefficients (c, then each v_block) of v[1:] = v_block(size(k)) + k c, over the k timed (not NaN)."""
    K = len(v) - 1
    X = np.zeros((K, 1 + len(score_sizes(K))))  # columns: c, then one v_block per block size
    X[:, 0] = np.arange(1, K + 1)
    X[np.arange(K), 1 + np.array(blocks(K))] = 1.0
    timed = ~np.isnan(np.asarray(v[1:], float))
    return X, np.linalg.lstsq(X[timed], np.asarray(v[1:], float)[timed], rcond=None)[0]


def per_block(v: list) -> list:
    """v [K+1] (k = 0: the target alone, kept as timed; NaN: not timed) fitted to v_block(size(k)) + k c
    for k >= 1."""
    X, coef = fit(v)
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
