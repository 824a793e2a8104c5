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


def lenient_alpha(p, q, l: float) -> float:
    """The acceptance probability with lenience l: sum_x p(x) min(1, q(x) / (l p(x)))."""
    return float(np.mean(np.minimum(p, np.asarray(q) / l).sum(axis=-1)))


def lenient_output_law(p, q, l: float) -> np.ndarray:
    """The exact law of one emitted token under lenience l (equal to q when l = 1). p, q: [V]."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    accepted = np.minimum(p, q / l)  # P(draft x and accept it)
    residual = np.maximum(q - l * p, 0.0)
    residual = residual / residual.sum() if residual.sum() > 0 else q
    return accepted + (1 - accepted.sum()) * residual


# ---- Several drafts (picospec/several.py) ----


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


# Trees (tree.py). A node is kept when every edge on its path to the root is accepted, so the tokens
# per call are one (the extra token) plus, over the drafted nodes, the chance its path is accepted.
# Sequoia (Chen et al. 2024) models the chance that a node's child of rank i (its i-th child tried) is
# the one accepted as a constant p_i: with a constant alpha for every trial, p_i = alpha (1 - alpha)^(i-1);
# rank_law measures p_i from the draft's and target's laws for each way of choosing children.


def rank_acceptance(alpha: float, width: int) -> np.ndarray:
    """[width] p_i: the chance a node's i-th child is the one accepted, each trial accepted with alpha."""
    return alpha * (1 - alpha) ** np.arange(width)


def rank_law(children: str, p, q, width: int, draws: int = 64, seed: int = 0) -> np.ndarray:
    """[width] p_i measured from the laws instead of a constant alpha: the chance a node's i-th child is
    the one accepted, by tree_verify.py's rule for children chosen as `children` says, averaged over the rows
    of p and q ([..., V], one row per position). "iid": exact, a rejected draw leaves the residual
    norm(max(0, r - p)) whatever it drew, so child i is accepted with sum_x min(p, r_i) (the terms of
    alpha_several); "top": exact, the draft's most probable tokens in turn; "distinct": the first child
    exact (it is drawn from p, as an iid one), the others the mean over `draws` orders drawn without
    replacement (a fixed seed). Side children score below alpha (1 - alpha)
    here, because each is tried against a residual that puts little mass where p does."""
    p, q = (np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1]) for x in (p, q))  # [positions, V]
    if children == "iid":
        return -np.diff([1 - alpha_several(p, q, n) for n in range(width + 1)])
    rng, law = np.random.default_rng(seed), np.zeros(width)
    for p_x, q_x in zip(p, q):
        if children == "top":
            law += child_acceptance("top", p_x, q_x, np.argsort(-p_x, kind="stable")[:width])
        else:
            n = min(width, np.count_nonzero(p_x))  # children past p's support are never accepted (T = 0, top-k)
            law[:n] += np.mean([child_acceptance("distinct", p_x, q_x, rng.choice(len(p_x), n, replace=False,
                                                                                  p=p_x / p_x.sum()))
                                for _ in range(draws)], axis=0)
    if children == "distinct":
        law[0] = np.minimum(p, q).sum(-1).sum()
    return law / len(p)


def rank_edges(parents, p) -> np.ndarray:
    """[M] each node's edge under the rank law p: p_i for the i-th child of its parent (0 past p's end)."""
    ranks = [list(parents[:j]).count(parent) for j, parent in enumerate(parents)]
    return np.array([p[r] if r < len(p) else 0.0 for r in ranks])


def child_acceptance(children: str, p, q, tokens) -> np.ndarray:
    """The edges below one node, from the laws: the chance each of its children (tokens, in the order
    tried) is the one accepted, for its draft law p and target law q [V], by tree_verify.py's verification
    for children chosen as `children` says ("iid", "top" or "distinct")."""
    r, tried, edges, left = np.asarray(q, float), [], [], 1.0
    for t in tokens:
        g = {"iid": p, "top": np.eye(len(p))[t],
             "distinct": np.where(np.isin(np.arange(len(p)), tried), 0.0, p)}[children]
        g = g / g.sum()
        accept = min(1.0, r[t] / g[t]) if g[t] > 0 else 0.0
        edges.append(left * accept)
        left *= 1 - accept
        residual = np.maximum(r - g, 0)
        r = residual / residual.sum() if residual.sum() > 0 else r
        tried.append(t)
    return np.array(edges)


def tree_tokens_per_call(parents, edges) -> float:
    """Expected tokens per target call of a tree (tree.Shape's parents, node 0 the root): 1 (the extra
    token) + the sum over the drafted nodes of the chance every edge on its path is accepted.
    edges: [M], node j's at j - 1 (rank_edges, or child_acceptance node by node)."""
    reach = np.ones(len(parents) + 1)
    for j, parent in enumerate(parents, 1):
        reach[j] = reach[parent] * edges[j - 1]
    return float(reach.sum())


def optimal_tree(M: int, p) -> tuple[int, ...]:
    """The tree of M drafted nodes with the most expected tokens per call under the rank law p
    (Sequoia's dynamic program): best(n) = 1 + the best split of n - 1 nodes among the root's children,
    the i-th child's subtree worth p_i best(size). Returned as tree.Shape parents, level by level."""
    p = np.asarray(p, float)
    best, split = [0.0, 1.0], {}

    def children(n, i):  # the best sum_{j >= i} p_j best(n_j) with n nodes in children i, i+1, ...
        if n == 0 or i >= len(p):
            return 0.0, ()
        if (n, i) not in split:
            options = [(p[i] * best[m] + children(n - m, i + 1)[0], m) for m in range(1, n + 1)]
            value, m = max(options)
            split[(n, i)] = (value, (m,) + children(n - m, i + 1)[1])
        return split[(n, i)]
    for n in range(2, M + 2):
        best.append(1 + children(n - 1, 0)[0])

    def subtree(n):  # nested list of the children's subtrees
        return [subtree(m) for m in children(n - 1, 0)[1]]
    parents, level = [], [(0, subtree(M + 1))]  # (node id, its children's subtrees), breadth first
    while level:
        nxt = []
        for node, kids in level:
            for kid in kids:
                parents.append(node)
                nxt.append((len(parents), kid))
        level = nxt
    return tuple(parents)
