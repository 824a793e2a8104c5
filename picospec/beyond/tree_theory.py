"""The analysis of token trees (tree.py, tree_verify.py, dynamic.py): what a tree of M drafted nodes
yields per target call, and the best shape.

A node is kept when every edge on its path to the root is accepted, so the tokens per call are one
(the extra token) plus, over the drafted nodes, the chance its path is accepted. Sequoia (Chen et al.
2024) models the chance that a node's child of rank i (its i-th child tried) is the one accepted as a
constant p_i: with a constant alpha for every trial, p_i = alpha (1 - alpha)^(i-1); rank_law measures
p_i from the draft's and target's laws for each way of choosing children. Notation as in theory.py.
"""

import numpy as np

from picospec.beyond.theory import alpha_several


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
            n = min(width, np.count_nonzero(p_x))  # children past p's support are never accepted (tree.choose)
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
        g = g / g.sum() if g.sum() > 0 else g  # all zero: p's support spent, the child was not drawn
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
