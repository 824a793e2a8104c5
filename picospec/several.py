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
are not, and their output law is off (by up to 0.06 in tests/test_several.py's enumeration). SpecTr
(Sun et al. 2023) verifies several candidates differently: K-SEQ accepts each against one fixed
residual with min(1, q/(rho p)).
The match rule has a several-draft form too: the target samples t_i ~ q and any alive chain that
drafted it keeps going. Block verification judges one chain at a time, so it is not offered with N > 1.

The N chains are the draft's and the target's batch dimension: each chain writes its own copy of the
caches, and the chosen chain's copy is kept. Run SeveralDrafts with `several_step` and a rule of CHAINS.
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.sampling import sample
from picospec.speculative import accept_or_resample, advance, at, residual, score
from picospec.state import Proposal, Verdict
from picospec.verifiers import match_rule


@partial(jax.tree_util.register_dataclass, data_fields=["draft"], meta_fields=["N"])
@dataclass(frozen=True)
class SeveralDrafts:
    """N chains from one draft, each with its own key."""

    draft: object  # a ModelDraft
    N: int
    may_stop = False  # they draft until the end

    def prefill(self, tokens, n, prefill_len: int, max_len: int):
        return self.draft.prefill(tokens, n, prefill_len, max_len)

    def propose(self, state, key, K: int, sampling) -> Proposal:  # drafted [N, K], p [N, K, V], N draft caches
        return jax.vmap(lambda key: self.draft.propose(state, key, K, sampling))(jax.random.split(key, self.N))


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


def several_step(draft: SeveralDrafts, target, state, K: int, sampling, eos_id: int, verify):
    """One iteration with N draft chains: draft them, score all N (K + 1) positions in one target call,
    keep one chain's accepted drafts and one more token. verify: a rule of CHAINS."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    chains = draft.propose(state, key_draft, K, sampling)  # Step 1, N times
    q, target_caches = jax.vmap(lambda chain: score(target, state.tokens, state.n, chain, state.target_cache,
                                                    sampling))(chains)  # Step 2: [N, K+1, V], N target caches
    j, verdict = verify(key_accept, key_extra, chains.drafted, chains.p, q, sampling.greedy)  # Steps 3, 4
    chosen = lambda tree: jax.tree_util.tree_map(lambda x: x[j], tree)  # noqa: E731  chain j's
    return advance(state._replace(key=key), chosen(chains), verdict, chosen(target_caches), eos_id)  # Step 5
