"""How many tokens to draft, decided every iteration from theory: the policy `--K auto` runs
(adaptive.py, next, is the draft that follows it).

Before drafting, pick the k in 0..K that maximizes the expected tokens per unit of time,
E[1 + alpha + ... + alpha^k] / (k c + v(k)) (theory.walltime_improvement), with the costs measured on
this machine (tools/autotune/) and the expectation taken over what the iterations so far say of
alpha (a Beta posterior over each judged draft's chance of acceptance, `evidence`: few iterations, a
wide one, which favours drafting more than its mean alone would); given the tokens each row makes,
per unit of time to finish them (a longer draft overshoots the end further, and a batch waits for
its slowest row, `time_per_token`).

k = 0 is not drafting at all. It judges no drafts, so the evidence and the choice stay: the draft has
stopped for good. So k = 0 waits until no number of further looks at alpha would pay for what they
cost (`worth_a_look`); a draft that was never worth a look never runs, not even its prefill.

The policy looks only at what was drafted so far, never at a verification coin: it cannot change
the output's law (adaptive.py says why).
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.beyond.loop import Trace
from picospec.beyond.score_first import own
from picospec.fastpath import branch_on_cpu

EVIDENCE_TO_STOP = 64  # judged drafts (a batch: all its rows') after which k = 0 may be chosen whatever a look
# would tell; before, once no look pays (worth_a_look) or drafting is hopeless
ALIKE = 32  # judged drafts the other rows of a batch count for in a row's evidence (choose_k): texts of the
# same two models, alike but not the same (on the bundled pair, alpha across rows spreads as a Beta of
# concentration ~38 greedy and ~500 at T = 0.8: 16 prompts, 64 tokens each)


@partial(jax.tree_util.register_dataclass, data_fields=["c", "v", "threshold", "evidence_to_stop", "prior",
                                                         "horizon", "prefill"], meta_fields=["auto"])
@dataclass(frozen=True)
class Policy:
    # An iteration that drafts k costs k c + v(k) in any unit (theory.py's c and v(K)); tools/autotune/ times
    # whole iterations in place, so it gives c = 0 and v(k) = an iteration's time over the target's own step.
    c: jax.Array  # float32 []
    v: jax.Array  # float32 [K+1], for k = 0..K (k = 0: the target alone; inf: never choose it)
    threshold: jax.Array  # float32 []: stop after a draft token of probability below it (0: never)
    evidence_to_stop: jax.Array | int = EVIDENCE_TO_STOP  # int32 []: judged drafts before k = 0 is allowed
    auto: bool = True  # choose k from the theory each iteration; False: always K (the threshold still stops)
    prior: jax.Array | tuple = (0.0, 0.0)  # (successes, failures) before any iteration: one row's share of
    # the beta measured on the prompts (tools/autotune/), or none
    horizon: jax.Array | float = float("inf")  # float32 []: the tokens each row generates (choose_k), or unknown
    prefill: jax.Array | float = 0.0  # float32 []: the draft's prefill, in v's unit: the first look pays it too


def fixed(K: int, threshold: float = 0.0) -> Policy:
    """Always K drafts, cut short only by the confidence threshold."""
    return Policy(jnp.float32(0), jnp.ones(K + 1, jnp.float32), jnp.float32(threshold), auto=False)


def evidence(trace: Trace):
    """(successes, failures) so far, one trial for every draft judged (those accepted, and the one
    rejected; not those after it, nor those a stop left out). Each counts its chance to be accepted,
    beta_i = sum_x min(p[i](x), q[i](x)) (Leviathan et al.'s beta, whose mean is alpha), rather than
    whether it was: the same expectation with far less noise at T > 0 (at T = 0 beta_i is 0 or 1, the
    outcome itself), so a few iterations tell alpha well enough to choose k."""
    judged = jnp.arange(trace.beta.shape[-1]) <= trace.n_accepted[..., None]  # [R, K] up to the first rejection
    judged &= jnp.arange(trace.beta.shape[-1]) < trace.k[..., None]  # and proposed
    return jnp.sum(judged * trace.beta), jnp.sum(judged * (1 - trace.beta))


def alpha_estimate(trace: Trace):
    """alpha's posterior mean: a uniform prior, then the trace's evidence (1/2 before any)."""
    successes, failures = evidence(trace)
    return (successes + 1.0) / (successes + failures + 2.0)


def choose_k(policy: Policy, successes, failures, pool=own, made=0.0, first=False, slowest=own):
    """The k in 0..K with the most expected tokens per unit of time (Leviathan et al. Theorem 3.8
    with measured costs: theory.optimal_K), the expectation over alpha ~ Beta(successes + 1,
    failures + 1), where E[alpha^j] = prod_{i<j} (successes + 1 + i) / (successes + failures + 2 + i).
    With much evidence this is theory.optimal_K at alpha = successes / (successes + failures).
    k = 0 only once the evidence allows it (may_stop): nothing is judged after it, so the evidence,
    and with it the choice, stays. In a batch every row weighs its own evidence, and the other rows'
    as ALIKE judged drafts at most (a row's few drafts alone say little, and the largest of several
    rows' noisy guesses is a pessimistic one); the rows draft the k that finishes the slowest of
    them soonest (slowest: the largest over the rows stepped together; a row's time, its tokens to go
    times its time per token); pool: the sum over them, for the evidence k = 0 waits for. made: the
    tokens this row has generated; first: nothing drafted yet (may_stop). With a horizon of R tokens a
    row, it weighs the time to finish them rather than the rate alone."""
    K = policy.v.shape[0] - 1
    j = jnp.arange(K + 1)  # [K+1]
    pooled = pool(successes), pool(failures)  # the batch's evidence (one row: its own)
    others = pooled[0] - successes, pooled[1] - failures
    weight = ALIKE / jnp.maximum(others[0] + others[1], ALIKE)  # they count for ALIKE drafts at most
    s, f = successes + weight * others[0], failures + weight * others[1]  # this row's evidence
    moments = jnp.cumprod(jnp.where(j > 0, (s + j) / (s + f + 1.0 + j), 1.0))  # E[alpha^j]
    B = pool(1.0)  # the rows stepped together
    to_go = jnp.where(jnp.isinf(policy.horizon), 1.0, jnp.maximum(policy.horizon - made, 1.0))  # this row's tokens
    done_in = slowest(to_go * time_per_token(policy, moments, B, policy.horizon))  # [K+1]: when the batch is done
    best, drafting = jnp.argmin(done_in), 1 + jnp.argmin(done_in[1:])
    ask = lambda: may_stop(policy, *pooled, B, policy.horizon - pool(made) / B, first)  # noqa: E731
    stop = branch_on_cpu(lambda: jax.lax.cond(best == 0, ask, lambda: jnp.array(False)),  # asked only then
                         lambda: (best == 0) & ask())  # on an accelerator, asked branch-free
    return jnp.where((best > 0) | stop, best, drafting).astype(jnp.int32)


def time_per_token(policy: Policy, moments, B, R):
    """[..., K+1]: an iteration's time per token of each row, drafting k = 0..K, from E[alpha^j] [..., K+1],
    until each of B rows has R more tokens. A call gives a row t tokens, E[t] = mu = sum_{j<=k} E[alpha^j]
    and E[t^2] = m2 = sum_{j<=k} (2j + 1) E[alpha^j]; R tokens take about R / mu calls, (m2 - mu) / (2 mu^2)
    more for the last one's overshoot (renewal theory), and a batch of B rows runs until its slowest row is
    done: z_B sqrt(R (m2 - mu^2) / mu^3) more, z_B the mean of the largest of B standard normals. The
    longer the draft, the wider t spreads."""
    j = jnp.arange(moments.shape[-1])
    mu, m2 = jnp.cumsum(moments, -1), jnp.cumsum((2 * j + 1) * moments, -1)  # E[t], E[t^2]
    z_B = jnp.sqrt(2.0) * jax.lax.erf_inv(2 * (B - 0.375) / (B + 0.25) - 1)  # Blom's; 0 for one row
    slower = 1 + (m2 - mu) / (2 * R * mu) + z_B * jnp.sqrt(jnp.maximum(m2 - mu**2, 0.0) / (R * mu))  # 1: R = inf
    return (j * policy.c + policy.v) * slower / mu


def may_stop(policy: Policy, successes, failures, B=1.0, R=float("inf"), first=False):
    """bool []: k = 0 may be chosen. It is final, so it waits for policy.evidence_to_stop judged drafts,
    or until no further look at alpha would pay for itself (worth_a_look: a look is weighed against
    what it costs, so where a draft call costs several target steps, as on a GPU, a doubtful prior
    stops the draft before it runs), or until even an optimistic alpha, the posterior mean plus two
    standard deviations, would make no k >= 1 pay: a draft the target almost never agrees with stops
    after a few rejections."""
    a, b = successes + 1.0, failures + 1.0  # alpha ~ Beta(a, b)
    high = jnp.minimum(a / (a + b) + 2 * jnp.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))), 1 - 1e-6)
    k = jnp.arange(1, policy.v.shape[0])  # [K]
    tokens = (1 - high ** (k + 1)) / (1 - high)  # [K] tokens per call at alpha = high
    hopeless = jnp.max(tokens / (k * policy.c + policy.v[1:])) < 1 / policy.v[0]
    judged = successes + failures + 0.5  # a count of drafts, summed in floats
    return (judged > policy.evidence_to_stop) | hopeless | ~worth_a_look(policy, successes, failures, B, R, first)


GRID = 256  # points on [0, 1]: worth_a_look's expectations over alpha are sums over them


def worth_a_look(policy: Policy, successes, failures, B, R, first):
    """bool []: drafting on may pay for what it tells of alpha (a batch: all its rows, R more tokens each).
    k = 0 is final, so it waits until no number m of further looks would pay for itself (the knowledge
    gradient, KG*, of Frazier and Powell): drafted k a call (the posterior's best k >= 1), m looks judge
    about N = m B E[1 + alpha + ... + alpha^(k-1)] drafts, after which alpha's posterior mean is spread
    about today's as a Beta of concentration (a + b + 1)(a + b + N) / N - 1 (its variance, Var(alpha)
    N / (a + b + N)), and the loop drafts (or not) by it: worth E[max(0, T_0 - min_k T_k)] over it,
    T_k the time to finish drafting k a call. Each look costs what its tokens take beyond the target's
    own steps for as many; the first also runs the draft's prefill (policy.prefill). Unknown R: worth it."""
    alpha = (jnp.arange(GRID) + 0.5) / GRID  # [G]: alpha's values, for expectations over its laws
    moments = alpha[:, None] ** jnp.arange(policy.v.shape[0])  # [G, K+1] alpha^j
    tokens = jnp.cumsum(moments, -1)  # [G, K+1] tokens per call drafting k, at each alpha
    R = jnp.maximum(R, 1.0)
    per_token = time_per_token(policy, moments, B, R)  # [G, K+1]
    saving = R * jnp.maximum(per_token[:, 0] - jnp.min(per_token[:, 1:], -1), 0.0)  # [G]: drafting's, at alpha

    def beta(mean, concentration):  # [G]: a Beta's weights on the grid
        return jax.nn.softmax((mean * concentration - 1) * jnp.log(alpha) + ((1 - mean) * concentration - 1) *
                              jnp.log1p(-alpha))
    a, b = successes + 1.0, failures + 1.0
    now = beta(a / (a + b), a + b)  # alpha's posterior
    k = 1 + jnp.argmin(now @ per_token[:, 1:])  # the look
    cost = now @ (tokens[:, k] * (per_token[:, k] - per_token[:, 0]))
    m = 2.0 ** jnp.arange(7)  # [M] looks: 1..64
    N = m * B * (now @ tokens[:, k - 1])  # [M] drafts they judge (to the first rejection)
    later = jax.vmap(lambda N: beta(a / (a + b), (a + b + 1) * (a + b + N) / N - 1))(N)  # [M, G]
    value = jnp.max(later @ saving - m * cost)
    return jnp.isinf(R) | (value > jnp.where(first, policy.prefill, 0.0))
