"""Dynamic token trees (EAGLE-2, Li et al. 2024): the tree grown each call where the draft is confident.

A static tree (tree.py) spends its M nodes in the same places every call. EAGLE-2 spends them where the
draft's own probabilities say a guess is likely. Each node's confidence is the product of the draft's
probabilities along its path from the root, c_j = c_parent(j) * p_parent(j)(x_j); with a width W and
a depth D:
  expand: at each depth, each of the W frontier nodes offers its W most probable children; of those
          W^2 candidates, the W with the highest c form the next depth's frontier, fed to the draft
          in one call (tree attention, as in tree.py);
  rerank: of the W D nodes grown, the M with the highest c are the tree the target scores. A child's
          c is at most its parent's, so every kept node's ancestors are kept.
Every child is chosen deterministically from the draft's probabilities, so it is verified as tree_verify.py's
"top" children are: a one-hot proposal against the residual, exact at every temperature, and at T = 0
the walk follows the target's argmax (its greedy output). The confidence ranks by the draft's plain
softmax (temperature 1): at T = 0 its sampling law is one-hot and would rank only the first guess.
Unlike a Shape, the tree is data, different each call: `Layout` holds its parents as an array and
builds its depths and mask on the device. The step is tree_verify.tree_step.

Calibrated confidence. A draft's probability is not the chance its guess is accepted: the bundled draft
gives its first guess ~0.5 and the target agrees with it ~88% of the time at T = 0, so the product of
raw probabilities spends the budget on siblings near the root where depth would pay. A `calibration`,
a(c) = E[q(x) | p(x) = c] measured on some text (`calibration`: how often, or with what probability,
the target takes a guess the draft gave probability c), ranks paths by the product of a(p) instead,
which is the chance the path is accepted when the guesses are independent (Sequoia's value of a node).
Still a function of the draft's probabilities alone, so every tree stays exact.
"""

from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond.tree import TreeProposal, feed
from picospec.sampling import Sampling, logits_to_probs
from picospec.speculative import catch_up


class Grown(NamedTuple):
    """A dynamic tree's budget: M nodes kept, of W a depth grown D deep (D <= M <= W D)."""

    M: int
    W: int
    D: int
    calibration: tuple | None = None  # a(c) at the centres of equal bins of c in [0, 1] (`calibration`); None: c

    @property
    def lookahead(self) -> int:  # the cache slots a call writes past the sequence: the grown nodes, or M
        return max(self.M, self.W * self.D)


def grown(M: int, D: int | None = None) -> Grown:
    """The budget for M nodes: D deep (by default up to 6: EAGLE-2's trees are 5-6), twice as many grown
    as kept. The CLI takes D from theory's best tree of M nodes for the acceptance it measures."""
    D = min(M, 6) if D is None else min(M, D)
    return Grown(M, max(2, -(-2 * M // D)), D)


@dataclass(frozen=True, eq=False)
class Layout:
    """A tree whose parents are data (int32 [M], level order): what tree.feed, tree_verify.verify_tree
    and tree_verify.tree_step read from a Shape, computed on the device. D: the deepest a node may sit."""

    parents: jax.Array
    D: int

    @property
    def M(self) -> int:
        return self.parents.shape[0]

    @cached_property
    def ancestors(self) -> jax.Array:  # bool [M+1, M+1]: [j, i] node i is node j or one of its ancestors
        anc = jnp.eye(self.M + 1, dtype=bool)
        for j in range(1, self.M + 1):
            anc = anc.at[j].set(anc[j] | anc[self.parents[j - 1]])
        return anc

    @cached_property
    def depth(self) -> jax.Array:  # int32 [M+1]
        return self.ancestors.sum(1).astype(jnp.int32) - 1

    def level(self, d: int) -> np.ndarray:  # any node may sit at any depth: the walk looks at all of them
        return np.arange(1, self.M + 1)

    @cached_property
    def is_parent(self) -> jax.Array:  # bool [M+1, M]: [j, c - 1] node j is node c's parent
        return self.parents[None, :] == jnp.arange(self.M + 1)[:, None]

    @cached_property
    def expanded(self) -> jax.Array:  # bool [M+1]: nodes with children
        return self.is_parent.any(1)

    @cached_property
    def first_child(self) -> jax.Array:  # int32 [M+1]: each node's first child (0 where it has none)
        first = jnp.where(self.is_parent, jnp.arange(1, self.M + 1)[None, :], self.M + 1).min(1)
        return jnp.where(first > self.M, 0, first)


def calibration(p, q, W: int, bins: int = 10) -> tuple:
    """a(c), the chance a guess the draft gives probability c is accepted as a first child: E[q(x) | p(x)]
    over the W most probable draft tokens x at each position. p: the draft's plain softmax [N, V]; q: the
    target's sampling law [N, V] (one-hot at T = 0: a(c) is how often x is the target's argmax). Returned
    at the centres of `bins` equal bins of c, non-decreasing (a running maximum); a bin without a guess: c."""
    top = np.argsort(-p, axis=1, kind="stable")[:, :W]  # [N, W]
    c, accepted = np.take_along_axis(p, top, 1).ravel(), np.take_along_axis(q, top, 1).ravel()
    which, centres = np.minimum((c * bins).astype(int), bins - 1), (np.arange(bins) + 0.5) / bins
    a = [accepted[which == b].mean() if (which == b).any() else centres[b] for b in range(bins)]
    return tuple(float(x) for x in np.maximum.accumulate(a))


def calibrated(table: jax.Array, p):
    """a(p) from a calibration table [bins], interpolated; strictly increasing in p (a tiny slope keeps
    the draft's order among guesses of one bin), in (0, 1) so a child ranks below its parent."""
    centres = (jnp.arange(table.shape[0]) + 0.5) / table.shape[0]
    return jnp.clip(jnp.interp(p, centres, table) + 1e-4 * p, 1e-6, 0.999)


@partial(jax.tree_util.register_dataclass, data_fields=["draft", "calibration"], meta_fields=["budget"])
@dataclass(frozen=True)
class DynamicDraft:
    """A model's guesses as a tree of M nodes grown W wide and D deep, by confidence (EAGLE-2)."""

    draft: object  # a ModelDraft
    budget: Grown  # without its calibration, which is data:
    calibration: jax.Array | None = None  # float32 [bins]: a(c) (`calibration`); None: rank by c itself
    children = "top"  # chosen deterministically: verified as one-hot proposals
    may_stop = False

    def prefill(self, tokens, n, prefill_len: int, max_len: int):
        return self.draft.prefill(tokens, n, prefill_len, max_len)

    def propose(self, state, key, K: int, sampling: Sampling) -> TreeProposal:
        """Step 1: expand W wide for D depths (one draft call a depth), then keep the M most confident."""
        (M, W, D, _), model, base = self.budget, self.draft.model, state.n - 1
        p_root, cache = catch_up(model, state.tokens, state.n, state.draft_cache, Sampling())  # root at slot base
        grown = 1 + W * D  # the root, then W nodes a depth, at draft slots base + 0 .. W D
        tokens = jnp.zeros(grown, jnp.int32).at[0].set(state.tokens[base])  # [1 + W D]
        parents, confidence = jnp.zeros(grown - 1, jnp.int32), jnp.zeros(grown)  # log c
        laws = jnp.zeros((grown,) + p_root.shape).at[0].set(p_root)  # [1 + W D, V]
        frontier = np.array([0])
        for d in range(1, D + 1):
            if d > 1:  # the frontier's laws: one draft call over its W nodes
                logits, cache = feed(model, tokens[frontier], cache, base, frontier, Layout(parents, D))
                laws = laws.at[frontier].set(logits_to_probs(logits, Sampling()))
            p, token = jax.lax.top_k(laws[frontier], W)  # [F, W] each frontier node's W best children
            a = p if self.calibration is None else calibrated(self.calibration, p)  # [F, W]
            c, best = jax.lax.top_k((confidence[frontier][:, None] + jnp.log(a)).ravel(), W)  # the W best paths
            level = 1 + (d - 1) * W + np.arange(W)
            tokens, confidence = tokens.at[level].set(token.ravel()[best]), confidence.at[level].set(c)
            parents = parents.at[level - 1].set(jnp.asarray(frontier)[best // W])
            frontier = level
        kept = jnp.sort(jax.lax.top_k(confidence[1:], M)[1]) + 1  # [M] rerank; level order is slot order
        nodes = jnp.concatenate([jnp.zeros(1, jnp.int32), kept])  # [M+1] node j is grown node nodes[j]
        parent_of = jnp.argmax(parents[kept - 1][:, None] == nodes[None, :], axis=1).astype(jnp.int32)  # [M]
        return TreeProposal(tokens[nodes], laws[nodes], cache, Layout(parent_of, D), nodes, nodes <= W * (D - 1))
