"""Token trees: the draft's guesses as a tree, verified by the target in one call.

A chain of K drafts bets everything on one guess per position. A tree keeps several: node 0 is the
newest token x[n-1], and every other node j is a drafted token whose parent is an earlier node, at the
depth of its path (SpecInfer, Miao et al. 2023; Sequoia, Chen et al. 2024). One chain is the tree with
one child per node; N chains, the tree with N branches from the root (several.py). The shape is static (`Shape`:
each node's parent, level by level), so the whole iteration compiles once.

  1. the draft grows the tree level by level: one call feeds a level's nodes, each attending to the
     cache and to its own ancestors only (`feed`, tree attention), and gives the law p_j of node j's
     children; the children are then chosen from p_j by one of three ways (`CHILDREN`);
  2. the target scores all M + 1 nodes in one call with the same attention: q_j after each node;
  3. verification walks down from the root. At node j with law r <- q_j, each child c in turn is a
     one-token proposal drawn from a law g_c, accepted with probability min(1, r(c) / g_c(c)); on a
     rejection r <- norm(max(0, r - g_c)), the residual. An accepted child becomes the node; when
     every child is rejected the extra token comes from r; at a leaf, the bonus from q_j;
  4. the accepted path's keys and values move to consecutive cache slots (one gather), the rest is
     left beyond the length, and the loop goes on as after a chain (speculative.advance).

Why it is lossless: every trial is speculative.py's one-position step against the current r, so
the token leaving node j follows q_j, provided g_c is the law child c really was drawn from given what
the verifier has seen so far. That decides the rule for each way of choosing children:
  "iid"      each child drawn independently from p_j: g_c = p_j (SpecInfer's multi-step speculative
             sampling).
  "top"      the b most probable tokens of p_j, chosen deterministically: g_c = the one-hot of c, so
             the trial accepts c with probability r(c) and a rejection removes c from r. They rank by
             the draft's plain softmax, so that at T = 0 (where p_j is one-hot) the siblings are its
             next-best guesses; any rule that is a function of the draft alone would be as exact.
  "distinct" drawn without replacement from p_j: g_c = p_j renormalized over the siblings not yet tried.
Verifying children of one way as if they came from another breaks the law (tests/test_tree.py shows
"top" children verified as "iid"). At temperature 0 q is one-hot, and the walk follows the target's
argmax as long as a child holds it: the output is the target's greedy output.
"""

from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from picospec.gpt2 import KVCache, Model, attention, transformer
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import advance, catch_up, residual
from picospec.state import Proposal, Verdict

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
    if children == "distinct":
        return sample(key, jnp.where(tried, 0.0, law))
    return sample(key, law)


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
            for parent in shape.level(d - 1):
                tried = jnp.zeros(p_root.shape, bool)  # [V]: its children drafted so far
                for rank, j in enumerate(shape.children(parent)):
                    token = choose(keys[j], laws[parent], rank, tried, self.children)
                    tokens, tried = tokens.at[j].set(token), tried.at[token].set(True)
            fed = shape.level(d)[shape.expanded[shape.level(d)]]  # this level's nodes that have children
            if len(fed):
                logits, cache = feed(model, tokens[fed], cache, base, fed, shape)  # [T, V]
                laws = laws.at[fed].set(logits_to_probs(logits, sampling))
        return TreeProposal(tokens, laws, cache, shape, jnp.arange(shape.M + 1), jnp.asarray(shape.expanded))


def trial_law(children: str, law, token, tried):  # g_c [V]: the law child `token` was drawn from
    if children == "top":
        return jax.nn.one_hot(token, law.shape[0], dtype=law.dtype)
    if children == "distinct":
        untried = jnp.where(tried, 0.0, law)
        return untried / jnp.maximum(untried.sum(), 1e-30)
    return law


def verify_tree(key_accept, key_extra, shape: Shape, children: str, tree: TreeProposal, q, greedy: bool = False):
    """Steps 3 and 4 on a tree: walk down from the root, each node's children tried in turn against
    the residual r. q: [M+1, V]. Returns the path (int32 [D+1] node ids, from the root; past the
    accepted depth a it repeats the last node) and the Verdict (a, extra, and p, q of the path's drafts)."""
    parents = jnp.asarray(shape.parents)
    u = jax.random.uniform(key_accept, (shape.M + 1,))  # [M+1] one uniform per node
    node, going, a, extra_law = jnp.int32(0), jnp.array(True), jnp.int32(0), q[0]
    path = [node]
    for d in range(1, shape.D + 1):
        r, tried, taken, next_node = q[node], jnp.zeros(q.shape[1], bool), jnp.array(False), node
        for j in shape.level(d):
            trial = going & ~taken & (parents[j - 1] == node)
            token = tree.tokens[j]
            g = trial_law(children, tree.laws[node], token, tried)
            accept = trial & (u[j] < r[token] / g[token])
            next_node, taken = jnp.where(accept, j, next_node), taken | accept
            r = jnp.where(trial & ~accept, residual(r, g), r)
            tried = tried.at[token].set(tried[token] | trial)
        extra_law = jnp.where(going & ~taken, r, extra_law)  # all rejected (r), or a leaf (r = q[node])
        a, going, node = a + (going & taken), going & taken, next_node
        path.append(node)
    extra_law = jnp.where(going, q[node], extra_law)  # down to the deepest level: the bonus
    path = jnp.stack(path)  # [D+1]
    drafted = tree.tokens[path[1:]]  # [D]
    p_x = tree.laws[path[:-1], drafted] * (jnp.arange(shape.D) < a)
    q_x = q[path[:-1], drafted] * (jnp.arange(shape.D) < a)
    return path, Verdict(a, sample(key_extra, extra_law, greedy), p_x, q_x)


def keep_path(cache: KVCache, base, path) -> KVCache:
    """The path's keys and values (slots base + path[i]) moved to slots base + i: one gather a buffer."""
    move = lambda buffer: jax.lax.dynamic_update_slice(  # noqa: E731  [H, S, D]
        buffer, jnp.take(buffer, base + path, axis=1), (0, base, 0))
    return KVCache([move(b) for b in cache.k], [move(b) for b in cache.v], cache.length)


def tree_step(draft: TreeDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int, verify=verify_tree):
    """One iteration with a tree: draft it, score its M + 1 nodes in one target call, keep the accepted
    path and one more token. K: the loop's lookahead, M (the tree's nodes). verify: verify_tree, or a
    rule of the same form (several.py's)."""
    base = state.n - 1
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    tree = draft.propose(state, key_draft, K, sampling)  # Step 1
    shape = tree.shape
    everything = np.arange(shape.M + 1)
    logits, target_cache = feed(target, tree.tokens, state.target_cache, base, everything, shape)  # Step 2
    q = logits_to_probs(logits, sampling)  # [M+1, V]
    path, verdict = verify(key_accept, key_extra, shape, draft.children, tree, q, sampling.greedy)  # Steps 3, 4
    # Step 5: the path to consecutive slots; the draft holds it up to its last fed node.
    a, pad = verdict.n_accepted, lambda x: jnp.zeros(K, x.dtype).at[:shape.D].set(x)  # noqa: E731
    fed = tree.fed[path[a]]
    draft_cache = keep_path(tree.cache, base, tree.slots[path])._replace(length=state.n + a - 1 + fed)
    # The trace shows the accepted path, then the first child tried and rejected at its end (as a chain shows
    # its rejected draft); k = a when the path ended at a leaf, whose extra token is the bonus.
    shown = jnp.where(jnp.arange(shape.D) == a, tree.tokens[jnp.asarray(shape.first_child)[path[a]]],
                      tree.tokens[path[1:]])  # [D]
    kept = Proposal(pad(shown), None, draft_cache, jnp.where(jnp.asarray(shape.expanded)[path[a]], shape.D, a))
    verdict = verdict._replace(p=pad(verdict.p), q=pad(verdict.q))
    return advance(state._replace(key=key), kept, verdict, keep_path(target_cache, base, path), eos_id)
