"""The ladder of verifiers: three lossless ways to run steps 3 and 4 (see speculative.py).

Each takes the same inputs as `accept_or_resample` (the token rule, in speculative.py): the drafted
tokens d_0..d_{K-1} (int32 [K]), the draft's p [K, V] they were drawn from, the target's q [K+1, V],
and two keys; each returns a Verdict: a, the number of drafts kept, the extra token after them, and
what the trace records. A row of p that is all zero marks a draft that was not proposed (adaptive.py):
each rule keeps none from there on, and draws its extra token from q. All three emit tokens whose
law is exactly q's; they differ in how many drafts they keep, and in expectation match <= token <= block.

  match  keep d_i while it equals a token the target samples itself at that position
         (acceptance sum_x p(x) q(x): the weakest rule, the contrast for min(1, q/p));
  token  keep d_i with probability min(1, q/p), resample a rejection from norm(max(0, q - p))
         (Leviathan et al. 2022, Chen et al. 2023);
  block  judge the drafts as one block (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh,
         "Block Verification Accelerates Speculative Decoding", 2024, Algorithm 2).
"""

import jax
import jax.numpy as jnp

from picospec.beyond.loop import Verdict
from picospec.sampling import sample
from picospec.speculative import accept_or_resample, at, residual


def match_rule(key_accept, key_extra, drafted, p, q, greedy: bool = False) -> Verdict:
    """Keep d_i while d_i == t_i, where t_i ~ q[i] is the target's own sample; the extra token is the
    target's sample at the first mismatch (t_K, from q[K], after K matches).

    Lossless: every emitted token is a target sample t_i given the prefix before it (a kept d_i
    equals t_i), so the law is q's; the draft only decides how many of them one call yields."""
    K = drafted.shape[0]
    t = jax.vmap(lambda key, q_i: sample(key, q_i, greedy))(jax.random.split(key_extra, K + 1), q)  # [K+1]
    p_x, q_x = at(p, drafted), at(q, drafted)  # [K]
    a = jnp.sum(jnp.cumprod((t[:K] == drafted) & (p_x > 0)))  # int32 []: the leading run of proposed matches
    return Verdict(a, t[a], p_x, q_x)


def block_rule(key_accept, key_extra, drafted, p, q, greedy: bool = False) -> Verdict:
    """Block verification. With w_0 = 1 and w_i = min(1, w_{i-1} q[i-1](d_{i-1}) / p[i-1](d_{i-1})),
    the residual after i kept drafts is max(0, w_i q[i] - p[i]) with mass r_i, and the chance to stop
    there is h_i = r_i / (r_i + 1 - w_i) (h_K = w_K: p has a zero row at K, so r_K = w_K). Draw
    u_1..u_K; keep tau drafts, tau the largest i with u_i < h_i (0 if none), then one token from the
    normalized residual at tau (q[K] itself when tau = K).

    Lossless: the paper proves the emitted tokens follow q (tests/test_verifiers.py enumerates it);
    it never keeps fewer drafts in expectation than the token rule, which decides each draft alone."""
    K = drafted.shape[0]
    w, h, _ = block_residuals(drafted, p, q)  # [K+1], [K+1]
    u = jax.random.uniform(key_accept, (K,))  # [K] u_1..u_K
    tau = jnp.max(jnp.where(u < h[1:], jnp.arange(1, K + 1), 0))  # int32 []
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])  # [K+1, V]
    extra_law = residual(w[tau] * q[tau], p_padded[tau])  # [V]
    return Verdict(tau, sample(key_extra, extra_law, greedy), at(p, drafted), at(q, drafted), u, w[1:], h[1:])


def block_residuals(drafted, p, q):
    """Block verification's weights w_0..w_K, stop chances h_0..h_K, and residuals [K+1, V] (unnormalized)."""
    K = drafted.shape[0]
    p_x = at(p, drafted)  # [K]; 0 where d_i was not proposed (adaptive.py): its weight is 0
    ratio = jnp.where(p_x > 0, at(q, drafted) / jnp.where(p_x > 0, p_x, 1.0), 0.0)  # [K] q/p of each
    w = [jnp.float32(1.0)]
    for i in range(K):  # the weight of the block d_0..d_i: how far q has kept up with p so far
        w.append(jnp.minimum(1.0, w[-1] * ratio[i]))
    w = jnp.stack(w)  # [K+1] w_0..w_K
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])  # [K+1, V]
    left = jnp.maximum(w[:, None] * q - p_padded, 0.0)  # [K+1, V]
    r = left.sum(-1)  # [K+1]
    # Where w_i = 1 and r_i = 0 (q[i] == p[i]) there is nothing to resample: never stop there.
    h = jnp.where(r + 1 - w > 0, r / jnp.where(r + 1 - w > 0, r + 1 - w, 1.0), 0.0)  # [K+1]
    return w, h, left


RULES = {"match": match_rule, "token": accept_or_resample, "block": block_rule}  # steps 3 and 4, by name
