"""EAGLE's trees: the head (eagle.py) grows a token tree (tree.py), and the target scores it in one call.

The head drafts a tree as a model draft does, level by level, each node attending to the sequence and
to its ancestors only (tree attention), with one difference: it feeds features, not just tokens. Node j
is fed (g_parent, token_j), its parent's guessed feature and its own token, and gives g_j, whose law
p_j = softmax(g_j W) its children are chosen from. The target scores the M + 1 nodes in one call, with
the same attention, and hands over its features of every node (`score_tree`). tree_verify.py's rule walks
down the tree unchanged (the rule never asks where p_j came from, so the law stays q), and the features
of the accepted path, true ones, are written in the head's feature rows. The head's cache rolls back to
the true prefix (its tree nodes came from guessed features), and the next catch-up feeds the path's
true features, as after a chain.
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond.eagle import HeadDraft, catch_up, head_forward, target_features
from picospec.beyond.loop import Proposal, advance
from picospec.beyond.tree import Shape, TreeProposal, choose_level, tree_attention
from picospec.beyond.tree_verify import keep_path, verify_tree
from picospec.gpt2 import KVCache, Model
from picospec.sampling import Sampling, logits_to_probs


@partial(jax.tree_util.register_dataclass, data_fields=["draft"], meta_fields=["shape", "children"])
@dataclass(frozen=True)
class HeadTreeDraft:
    """The head's guesses as a tree of `shape`, children chosen by `children` (one of tree.CHILDREN)."""

    draft: HeadDraft
    shape: Shape
    children: str = "iid"
    may_stop = False

    def prefill(self, tokens, n, prefill_len: int, max_len: int):
        return self.draft.prefill(tokens, n, prefill_len, max_len)

    def propose(self, state, key, K: int, sampling: Sampling) -> TreeProposal:
        """Step 1: the tree, level by level, one head call a level (the last level is not fed)."""
        head, shape, base = self.draft, self.shape, state.n - 1
        sampling = Sampling() if self.children == "top" else sampling  # top: ranked by the plain softmax
        g_root, p_root, cache = catch_up(head, state.tokens, state.n, state.draft_cache, K, sampling)  # root: slot base
        tokens = jnp.zeros(shape.M + 1, jnp.int32).at[0].set(state.tokens[base])  # [M+1]
        laws = jnp.zeros((shape.M + 1,) + p_root.shape).at[0].set(p_root)  # [M+1, V]
        g = jnp.zeros((shape.M + 1,) + g_root.shape).at[0].set(g_root)  # [M+1, C]: each node's guessed feature
        keys, parents = jax.random.split(key, shape.M + 1), np.array((0,) + shape.parents)
        for d in range(1, shape.D + 1):
            tokens = choose_level(tokens, laws, shape, d, keys, self.children)
            fed = shape.level(d)[shape.expanded[shape.level(d)]]  # this level's nodes that have children
            if len(fed):
                g_fed, logits, after = head_forward(head, g[parents[fed]], tokens[fed], cache,
                                                    attend=tree_attention(base, fed, shape))  # [T, C], [T, V]
                cache = after._replace(length=cache.length)  # the nodes sit at slots base + j, past the length
                g, laws = g.at[fed].set(g_fed), laws.at[fed].set(logits_to_probs(logits, sampling))
        return TreeProposal(tokens, laws, cache._replace(length=state.n), shape)  # the true prefix: n slots


def score_tree(target: Model, tokens, cache: KVCache, base, shape: Shape, sampling: Sampling):
    """Step 2 on a tree, keeping the features: q [M+1, V], f [M+1, C], and the target's cache holding the
    nodes at slots base + j (its length unchanged; tree.feed's, with the features)."""
    everything = np.arange(shape.M + 1)
    f, logits, scored = target_features(target, tokens, cache, attend=tree_attention(base, everything, shape),
                                        positions=base + jnp.asarray(shape.depth))
    return logits_to_probs(logits, sampling), f, scored._replace(length=cache.length)


def head_tree_step(draft: HeadTreeDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int,
                   verify=verify_tree):
    """tree_verify.tree_step with the head: the accepted path's true features handed over."""
    base = state.n - 1
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    tree = draft.propose(state, key_draft, K, sampling)  # Step 1
    q, f, target_cache = score_tree(target, tree.tokens, state.target_cache, base, tree.shape, sampling)  # Step 2
    path, verdict = verify(key_accept, key_extra, tree.shape, draft.children, tree, q, sampling.greedy)  # Steps 3, 4
    # Step 5: the path's features, f[s] = f_{s-1} for s = n, n + 1, ...: the next catch-up reads them.
    a, shape, pad = verdict.n_accepted, tree.shape, lambda x: jnp.zeros(K, x.dtype).at[:tree.shape.D].set(x)  # noqa: E731
    head_cache = tree.cache._replace(f=jax.lax.dynamic_update_slice(tree.cache.f, f[path], (state.n, 0)))
    shown = jnp.where(jnp.arange(shape.D) == a, tree.tokens[jnp.asarray(shape.first_child)[path[a]]],
                      tree.tokens[path[1:]])  # [D]: the path, then the child tried and rejected at its end
    kept = Proposal(pad(shown), None, head_cache, jnp.where(jnp.asarray(shape.expanded)[path[a]], shape.D, a))
    verdict = verdict._replace(p=pad(verdict.p), q=pad(verdict.q))
    return advance(state._replace(key=key), kept, verdict, keep_path(target_cache, base, path), eos_id, tree.laws, q)
