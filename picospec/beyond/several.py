"""Several drafts: N independent chains of K drafts, all scored by the target in one call.

SpecInfer (Miao et al. 2023, "multi-step speculative sampling") verifies several candidates for the
same position with recursive rejection sampling. At depth i every chain still alive (its drafts so far
equal the tokens accepted so far) shares the same prefix, so the same draft law p and target law q
there, and its token d^j_i is an independent draw from p:
  r <- q; for each alive chain j in turn: accept d^j_i with probability min(1, r(d)/p(d));
          on a rejection, r <- norm(max(0, r - p));
  a chain accepted: keep its token, and only the chains that drafted it stay alive for depth i + 1;
  none accepted: draw the extra token from r and stop. After K depths, the bonus token from q[K].
Lossless: each candidate is one speculative step against the current r, so the token that leaves
depth i follows r = q (speculative.py's proof, once per candidate). The proof needs the candidates
to be independent draws from p: N copies of one chain, or chains made unlike on purpose (deduplicated),
are not, and their output law is off (tests/test_several.py's enumeration: a sequence's probability off by
0.050 and 0.043 for two pairs of laws). Chains whose first drafts are chosen another way (distinct, or
the most probable) are verified by the tree's rule for them instead (branches_rule). SpecTr (Sun et al.
2023) verifies several candidates differently: K-SEQ tests each against the same scaled target, never
updated, accepting with min(1, q/(rho p)) for a rho in [1, N], and only when all N are rejected draws
from one residual that accounts for the chance of that.
Where tree_verify.verify_tree follows the one node accepted, this rule keeps every chain that drafted the
accepted prefix alive, so a second chain's next draft is still tried after the first chain's equal
token was the one accepted: more drafts kept, the same law.
The match rule has a several-draft form too: the target samples t_i ~ q and any alive chain that
drafted it keeps going. Block verification judges one chain at a time, so it is not offered with N > 1.

N chains are the tree with N branches from the root (tree.branches): the draft grows them together,
one call a depth, and the target scores all N K + 1 nodes in one call, each chain seeing only its own
tokens (tree attention). One cache serves every chain; the chain kept moves to consecutive slots as
a tree's accepted path does. Run them as tree.TreeDraft(draft, tree.branches(N, K), "iid") with
tree_verify.tree_step and branches_rule's rule.
"""

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond.loop import Verdict
from picospec.beyond.tree import Shape
from picospec.beyond.tree_verify import verify_tree
from picospec.beyond.verifiers import match_rule
from picospec.sampling import sample
from picospec.speculative import accept_or_resample, at, residual


def token_chains(key_accept, key_extra, drafted, p, q, greedy: bool = False):
    """Recursive rejection sampling. drafted: int32 [N, K]; p: [N, K, V]; q: [N, K+1, V].
    Returns j, the chain kept, and the Verdict on it."""
    N, K = drafted.shape
    u = jax.random.uniform(key_accept, (K, N))  # [K, N]
    alive, a, stopped, extra_law = jnp.ones(N, bool), jnp.int32(0), jnp.array(False), q[0, K]
    for i in range(K):
        j0 = jnp.argmax(alive)  # any alive chain: they share the prefix, so p[j, i] and q[j, i]
        p_i, r = p[j0, i], q[j0, i]  # [V], [V]
        taken = jnp.array(False)
        token = jnp.int32(0)
        for j in range(N):  # the candidates in order, each against the current residual r
            d = drafted[j, i]
            trial = alive[j] & ~taken
            accept = trial & (u[i, j] < r[d] / p_i[d])
            token, taken = jnp.where(accept, d, token), taken | accept
            r = jnp.where(trial & ~accept, residual(r, p_i), r)
        running = ~stopped
        extra_law = jnp.where(running & ~taken, r, extra_law)  # every candidate rejected: draw from r
        a = a + (running & taken)
        alive = jnp.where(running & taken, alive & (drafted[:, i] == token), alive)
        stopped = stopped | ~taken
    j = jnp.argmax(alive)
    extra_law = jnp.where(stopped, extra_law, q[j, K])  # all K accepted: the bonus from q[K]
    return j, Verdict(a, sample(key_extra, extra_law, greedy), at(p[j], drafted[j]), at(q[j], drafted[j]))


def match_chains(key_accept, key_extra, drafted, p, q, greedy: bool = False):
    """The target samples t_i ~ q at each depth; the alive chains that drafted t_i go on."""
    N, K = drafted.shape
    keys = jax.random.split(key_extra, K + 1)
    alive, a, stopped, extra = jnp.ones(N, bool), jnp.int32(0), jnp.array(False), jnp.int32(0)
    for i in range(K + 1):
        t = sample(keys[i], q[jnp.argmax(alive), i], greedy)
        matched = alive & (drafted[:, min(i, K - 1)] == t) & (i < K)  # [N]
        running = ~stopped
        extra = jnp.where(running & ~matched.any(), t, extra)
        a = a + (running & matched.any())
        alive = jnp.where(running & matched.any(), matched, alive)
        stopped = stopped | ~matched.any()
    j = jnp.argmax(alive)
    return j, Verdict(a, extra, at(p[j], drafted[j]), at(q[j], drafted[j]))


CHAINS = {accept_or_resample: token_chains, match_rule: match_chains}  # each one-chain rule's N-chain form


def chain_nodes(shape: Shape) -> np.ndarray:  # int [N, K+1]: chain j's nodes, from the root
    N, K = len(shape.children(0)), shape.D
    return np.concatenate([np.zeros((N, 1), int), 1 + np.arange(K)[None, :] * N + np.arange(N)[:, None]], 1)


def on_branches(rule, key_accept, key_extra, shape: Shape, tree, q, greedy: bool):
    """A rule of CHAINS on a tree of branches: chain j's drafts, their laws p and the target's q read
    from the tree's nodes; returns the path of the chain kept (as tree_verify.verify_tree does) and the Verdict."""
    nodes = chain_nodes(shape)  # [N, K+1]
    j, verdict = rule(key_accept, key_extra, tree.tokens[nodes[:, 1:]], tree.laws[nodes[:, :-1]], q[nodes], greedy)
    return jnp.asarray(nodes)[j], verdict


def token_branches(key_accept, key_extra, shape: Shape, children: str, tree, q, greedy: bool = False):
    return on_branches(token_chains, key_accept, key_extra, shape, tree, q, greedy)


def match_branches(key_accept, key_extra, shape: Shape, children: str, tree, q, greedy: bool = False):
    return on_branches(match_chains, key_accept, key_extra, shape, tree, q, greedy)


BRANCHES = {accept_or_resample: token_branches, match_rule: match_branches}  # each rule's form for tree_step


def branches_rule(rule, children: str = "iid"):
    """The form of `rule` (accept_or_resample or match_rule) for tree_step on N chains whose first drafts,
    the root's children, were chosen as `children` says (tree.CHILDREN; each chain goes on one draft a node).
    Recursive rejection sampling needs the N first drafts to be independent draws from p ("iid"). N
    drafts drawn without replacement ("distinct") or the N most probable ("top") are a tree's children,
    verified exactly by the tree's own rule for them (tree_verify.verify_tree): recursive rejection
    sampling over them is off (tests/test_several.py). The match rule never reads how the drafts were
    chosen, only whether they equal the target's own samples, so it takes any."""
    if children == "iid" or rule is match_rule:
        return BRANCHES[rule]
    return verify_tree
