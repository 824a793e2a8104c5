"""Several drafts: N independent chains of K drafts, all scored by the target in one call.

SpecInfer (Miao et al. 2023, "multi-step speculative sampling") and SpecTr (Sun et al. 2023) verify
several candidates for the same position with recursive rejection sampling. At depth i every chain
still alive (its drafts so far equal the tokens accepted so far) shares the same prefix, so the same
draft law p and target law q there, and its token d^j_i is an independent draw from p:
  r <- q; for each alive chain j in turn: accept d^j_i with probability min(1, r(d)/p(d));
          on a rejection, r <- norm(max(0, r - p));
  a chain accepted: keep its token, and only the chains that drafted it stay alive for depth i + 1;
  none accepted: draw the extra token from r and stop. After K depths, the bonus token from q[K].
Lossless: each candidate is one speculative step against the current r, so the token that leaves
depth i follows r = q (speculative.py's proof, once per candidate). The match rule has a several-draft
form too: the target samples t_i ~ q and any alive chain that drafted it keeps going. Block
verification judges one chain at a time, so it is not offered with N > 1.

The N chains are the draft's and the target's batch dimension: each chain writes its own copy of
the caches, and the chosen chain's copy is kept.
"""

import jax
import jax.numpy as jnp

from picospec.gpt2 import forward
from picospec.sampling import logits_to_probs, normalized, sample
from picospec.state import SpecState, advance, record


def token_rule(key_accept, key_extra, drafted, p, q, greedy: bool = False):
    """Recursive rejection sampling. drafted: int32 [N, K]; p: [N, K, V]; q: [N, K+1, V].
    Returns j, the chain kept; a, its drafts accepted; and the extra token."""
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
            r = jnp.where(trial & ~accept, normalized(jnp.maximum(r - p_i, 0.0), r), r)
        running = ~stopped
        extra_law = jnp.where(running & ~taken, r, extra_law)  # every candidate rejected: draw from r
        a = a + (running & taken)
        alive = jnp.where(running & taken, alive & (drafted[:, i] == token), alive)
        stopped = stopped | ~taken
    j = jnp.argmax(alive)
    extra_law = jnp.where(stopped, extra_law, q[j, K])  # all K accepted: the bonus from q[K]
    return j, a, sample(key_extra, extra_law, greedy)


def match_rule(key_accept, key_extra, drafted, p, q, greedy: bool = False):
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
    return jnp.argmax(alive), a, extra


RULES = {"match": match_rule, "token": token_rule}


def several_step(draft, target, state: SpecState, K: int, N: int, sampling, eos_id: int, rule: str) -> SpecState:
    """One iteration with N draft chains: draft them, score all N (K + 1) positions in one target call,
    keep one chain's accepted drafts and one more token."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    tokens, n = state.tokens, state.n
    chains = jax.vmap(lambda key: draft.propose(tokens, n, state.draft_cache, key, K, sampling))(
        jax.random.split(key_draft, N))  # drafted [N, K], p [N, K, V], N draft caches

    def score(drafted):  # x[n-1], d_0..d_{K-1} of one chain -> q [K+1, V]
        logits, cache = forward(target, jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), drafted]),
                                state.target_cache)
        return logits_to_probs(logits, sampling), cache

    q, target_caches = jax.vmap(score)(chains.drafted)  # [N, K+1, V], N target caches
    j, a, extra = RULES[rule](key_accept, key_extra, chains.drafted, chains.p, q, sampling.greedy)
    chosen = lambda tree: jax.tree_util.tree_map(lambda x: x[j], tree)  # noqa: E731  chain j's
    drafted, p_j, q_j = chosen((chains.drafted, chains.p, q))
    p_x, q_x = p_j[jnp.arange(K), drafted], q_j[jnp.arange(K), drafted]  # [K]
    zeros = jnp.zeros(K)
    trace = record(state.trace, drafted, a, extra, a == K, p_x, q_x, zeros, zeros, zeros, True, K)
    return advance(state._replace(key=key), drafted, a, extra, chosen(chains.cache), chosen(target_caches), trace,
                   eos_id)
