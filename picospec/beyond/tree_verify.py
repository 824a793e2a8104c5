"""Verifying a token tree (tree.py's steps 3 to 5), lossless for each way of choosing children.

  3. verification walks down from the root. At node j with law r <- q_j, each child c in turn is a
     one-token proposal drawn from a law g_c, accepted with probability min(1, r(c) / g_c(c)); on a
     rejection r <- norm(max(0, r - g_c)), the residual. An accepted child becomes the node; when
     every child is rejected the extra token comes from r; at a leaf, the bonus from q_j;
  4. the accepted path's keys and values move to consecutive cache slots (one gather), the rest is
     left beyond the length, and the loop goes on as after a chain (loop.advance).

Why it is lossless: every trial is speculative.py's one-position step against the current r, so
the token leaving node j follows q_j, provided g_c is the law child c really was drawn from given what
the verifier has seen so far. That decides the rule for each way of choosing children:
  "iid"      each child drawn independently from p_j: g_c = p_j (SpecInfer's multi-step speculative
             sampling).
  "top"      the b most probable tokens, chosen deterministically: g_c = the one-hot of c, so the
             trial accepts c with probability r(c) and a rejection removes c from r (any choice that
             is a function of the draft alone is as exact).
  "distinct" drawn without replacement from p_j: g_c = p_j renormalized over the siblings not yet tried
             (Recursive Speculative Decoding, Jeon et al. 2024). Once p_j's support is spent (T = 0,
             top-k, top-p, or float32 underflow at a low temperature) g_c is all zero: the child was
             not drawn, so it is never accepted and leaves r as it was, as the chain's rule treats a
             draft of p = 0.
Verifying children of one way as if they came from another breaks the law (tests/test_tree.py shows
"top" children verified as "iid"). At temperature 0 q is one-hot, and the walk follows the target's
argmax as long as a child holds it: the output is the target's greedy output.
"""

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond.loop import Proposal, Verdict, advance
from picospec.beyond.tree import Shape, TreeDraft, TreeProposal, feed
from picospec.gpt2 import KVCache, Model
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import residual


def trial_law(children: str, law, token, tried):  # g_c [V]: the law child `token` was drawn from
    if children == "top":
        return jax.nn.one_hot(token, law.shape[0], dtype=law.dtype)
    if children == "distinct":  # all zero once p_j's support is spent: that child was not drawn (tree.choose)
        untried = jnp.where(tried, 0.0, law)
        mass = untried.sum()
        return jnp.where(mass > 0, untried / jnp.where(mass > 0, mass, 1.0), 0.0)
    return law


def acceptance(r, g, token):  # min(1, r(c) / g(c)) as the uniform's bound; 0 where g(c) = 0: c was never drawn
    return jnp.where(g[token] > 0, r[token] / jnp.where(g[token] > 0, g[token], 1.0), 0.0)


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
            accept = trial & (u[j] < acceptance(r, g, token))
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
    return advance(state._replace(key=key), kept, verdict, keep_path(target_cache, base, path), eos_id, tree.laws, q)
