"""Token trees: the draft's guesses as a tree, scored by the target in one call.

A chain of K drafts bets everything on one guess per position. A tree keeps several: node 0 is the
newest token x[n-1], and every other node j is a drafted token whose parent is an earlier node, at the
depth of its path (SpecInfer, Miao et al. 2023; Sequoia, Chen et al. 2024). One chain is the tree with
one child per node; N chains, the tree with N branches from the root (several.py). The shape is static
(`Shape`: each node's parent, level by level), so the whole iteration compiles once.

  1. the draft grows the tree level by level: one call feeds a level's nodes, each attending to the
     cache and to its own ancestors only (`feed`, tree attention), and gives the law p_j of node j's
     children; the children are then chosen from p_j by one of three ways (`CHILDREN`): drawn
     independently ("iid"), the most probable ("top", ranked by the draft's plain softmax, so that at
     T = 0, where p_j is one-hot, the siblings are its next-best guesses), or drawn without
     replacement ("distinct"; a child past p_j's support is an untried token of probability 0);
  2. the target scores all M + 1 nodes in one call with the same attention: q_j after each node.
Verifying the tree, each way of choosing children by its own exact rule, is tree_verify.py.
"""

from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from picospec.gpt2 import KVCache, Model, attention, transformer
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import catch_up

CHILDREN = ("iid", "top", "distinct")


@dataclass(frozen=True)
class Shape:
    """A static tree: parents[j - 1] is node j's parent (node 0, the root, is x[n-1]); nodes are listed
    level by level, so a parent always comes before its children."""

    parents: tuple[int, ...]

    @cached_property
    def depth(self) -> np.ndarray:  # int [M+1]: node j sits at position n - 1 + depth[j]
        depth = np.zeros(len(self.parents) + 1, int)
        for j, parent in enumerate(self.parents, 1):
            depth[j] = depth[parent] + 1
        return depth

    @cached_property
    def ancestors(self) -> np.ndarray:  # bool [M+1, M+1]: [j, i] node i is node j or one of its ancestors
        anc = np.eye(len(self.parents) + 1, dtype=bool)
        for j, parent in enumerate(self.parents, 1):
            anc[j] |= anc[parent]
        return anc

    def level(self, d: int) -> np.ndarray:  # the nodes at depth d
        return np.flatnonzero(self.depth == d)

    @property
    def M(self) -> int:  # drafted nodes
        return len(self.parents)

    @property
    def D(self) -> int:  # the deepest level
        return int(self.depth.max())

    def children(self, j: int) -> list[int]:  # node j's children, in the order they are drafted and tried
        return [c for c, parent in enumerate(self.parents, 1) if parent == j]

    @cached_property
    def expanded(self) -> np.ndarray:  # bool [M+1]: nodes with children (the draft feeds only those)
        return np.isin(np.arange(self.M + 1), self.parents)

    @cached_property
    def first_child(self) -> np.ndarray:  # int [M+1]: each node's first child (0 where it has none)
        return np.array([(self.children(j) or [0])[0] for j in range(self.M + 1)])


def chain(K: int) -> Shape:
    return Shape(tuple(range(K)))


def branches(N: int, K: int) -> Shape:
    """N chains of K from the root, as one tree (listed level by level)."""
    return Shape(tuple(0 if d == 0 else 1 + (d - 1) * N + b for d in range(K) for b in range(N)))


def tree_attention(base, nodes: np.ndarray, shape: Shape):
    """gpt2.cached_attention for tree nodes: node j's keys and values go to slot base + j, and it sees
    the slots before base (the sequence) and its ancestors' slots, not its siblings' or cousins'."""
    rows, M = jnp.asarray(shape.ancestors[nodes]), shape.M  # [T, M+1]

    def attend(q, k, v, k_cache, v_cache, q_pos):
        slots = base + jnp.asarray(nodes)  # [T]
        k_cache, v_cache = k_cache.at[:, slots].set(k), v_cache.at[:, slots].set(v)  # [H, S, D]
        rel = jnp.arange(k_cache.shape[1]) - base  # [S]
        inside = (rel >= 0) & (rel <= M)
        visible = jnp.where(inside[None, :], rows[:, jnp.clip(rel, 0, M)], rel[None, :] < 0)  # [T, S]
        return attention(q, k_cache, v_cache, visible), k_cache, v_cache
    return attend


def feed(model: Model, tokens, cache: KVCache, base, nodes: np.ndarray, shape: Shape):
    """Feed tree nodes (static indices, tokens [T]) after the sequence's first base positions: logits [T, V]
    and the cache with their keys and values at slots base + nodes (its length unchanged)."""
    positions = base + jnp.asarray(shape.depth[nodes])  # [T]
    logits, k_all, v_all = transformer(model, tokens, cache, attend=tree_attention(base, nodes, shape),
                                       positions=positions)
    return logits, KVCache(k_all, v_all, cache.length)


class TreeProposal(NamedTuple):  # step 1's result for a tree
    tokens: jax.Array  # int32 [M+1]: node 0 is x[n-1], node j the token drafted there
    laws: jax.Array  # float32 [M+1, V]: p_j, the draft's law after node j (zero where it has no children)
    cache: KVCache  # the draft's, with the fed nodes at slots n - 1 + slots[j]
    shape: object = None  # the tree (a Shape; dynamic.py's trees are data)
    slots: jax.Array | None = None  # int32 [M+1]: where node j sits in the draft's cache (past n - 1)
    fed: jax.Array | None = None  # bool [M+1]: node j's keys and values are in the draft's cache


def choose(key, law, rank: int, tried, children: str):  # one child of a node with law p_j [V]
    if children == "top":
        return jnp.argsort(-law)[rank].astype(jnp.int32)
    if children == "distinct":  # once p_j's support is spent (T = 0, top-k, top-p, underflow) there is nothing
        untried = jnp.where(tried, 0.0, law)  # left to draw: the child is the first untried token, of p = 0,
        return jnp.where(untried.sum() > 0, sample(key, untried), jnp.argmin(tried))  # which is never accepted
    return sample(key, law)


def choose_level(tokens, laws, shape: Shape, d: int, keys, children: str):
    """tokens [M+1] with level d's nodes chosen, each parent's children in turn from its law (laws [M+1, V])."""
    for parent in shape.level(d - 1):
        tried = jnp.zeros(laws.shape[1], bool)  # [V]: its children drafted so far
        for rank, j in enumerate(shape.children(parent)):
            token = choose(keys[j], laws[parent], rank, tried, children)
            tokens, tried = tokens.at[j].set(token), tried.at[token].set(True)
    return tokens


@partial(jax.tree_util.register_dataclass, data_fields=["draft"], meta_fields=["shape", "children"])
@dataclass(frozen=True)
class TreeDraft:
    """A model's guesses as a tree of `shape`, children chosen by `children` (one of CHILDREN)."""

    draft: object  # a ModelDraft
    shape: Shape
    children: str = "iid"
    may_stop = False

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        return self.draft.prefill(tokens, n, prefill_len, max_len)

    def propose(self, state, key, K: int, sampling: Sampling) -> TreeProposal:
        """Step 1: the tree, level by level, one draft call a level (the last level is not fed)."""
        model, shape, base = self.draft.model, self.shape, state.n - 1
        sampling = Sampling() if self.children == "top" else sampling  # top: ranked by the plain softmax
        p_root, cache = catch_up(model, state.tokens, state.n, state.draft_cache, sampling)  # root at slot base
        tokens = jnp.zeros(shape.M + 1, jnp.int32).at[0].set(state.tokens[base])  # [M+1]
        laws = jnp.zeros((shape.M + 1,) + p_root.shape).at[0].set(p_root)  # [M+1, V]
        keys = jax.random.split(key, shape.M + 1)
        for d in range(1, shape.D + 1):
            tokens = choose_level(tokens, laws, shape, d, keys, self.children)
            fed = shape.level(d)[shape.expanded[shape.level(d)]]  # this level's nodes that have children
            if len(fed):
                logits, cache = feed(model, tokens[fed], cache, base, fed, shape)  # [T, V]
                laws = laws.at[fed].set(logits_to_probs(logits, sampling))
        return TreeProposal(tokens, laws, cache, shape, jnp.arange(shape.M + 1), jnp.asarray(shape.expanded))
