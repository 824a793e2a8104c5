"""Adaptive K: how many tokens to draft, decided every iteration instead of fixed in advance.

An AdaptiveDraft wraps any draft and proposes k <= K tokens; two rules decide k, both inside the
compiled loop (shapes stay those of K):
  theory      before drafting, pick the k in 0..K that maximizes the expected tokens per unit of
              time, E[1 + alpha + ... + alpha^k] / (k c + v(k)) (theory.walltime_improvement),
              with the costs measured on this machine (tools/cli/costs.py) and the expectation taken
              over what the iterations so far say of alpha (a Beta posterior over each judged
              draft's chance of acceptance, `evidence`: few iterations, a wide one, which favours
              drafting more than its mean alone would); given the tokens each row makes, per unit of
              time to finish them (a longer draft overshoots the end further, and a batch waits for
              its slowest row). k = 0 is not drafting at all. It judges no drafts, so the evidence and
              the choice stay: the draft has stopped for good (`stopped`), and the loop goes on with
              the target alone, one autoregressive step an iteration (speculative.target_alone);
  confidence  while drafting, stop after a token the draft itself gave probability < threshold
              (SpecDec++, Huang et al. 2024, with a fixed threshold in place of its trained head;
              Hugging Face's `assistant_confidence_threshold`).
`adaptive_step` has the target score only the k + 1 positions it needs (score_first.py); a draft that
proposes nothing (the n-gram lookup that finds nothing) costs one plain step.

Why it stays lossless: both rules look only at what was drafted so far, never at a verification coin.
Stopping after k drafts is proposing, at position k, a "stop" token the target gives probability 0:
every verifier rejects it and draws from q itself, so they run unchanged (zero rows of p: not proposed).
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.score_first import own, score_first
from picospec.speculative import ModelDraft, catch_up, speculative_step
from picospec.state import Proposal, Trace, Verdict

EVIDENCE_TO_STOP = 64  # judged drafts (a batch: all its rows') before k = 0 may be chosen: it is final


@partial(jax.tree_util.register_dataclass, data_fields=["c", "v", "threshold", "evidence_to_stop", "prior",
                                                         "horizon"], meta_fields=["auto"])
@dataclass(frozen=True)
class Policy:
    # An iteration that drafts k costs k c + v(k) in any unit (theory.py's c and v(K)); tools/cli/costs.py
    # times whole iterations in place, so it gives c = 0 and v(k) = an iteration's time.
    c: jax.Array  # float32 []
    v: jax.Array  # float32 [K+1], for k = 0..K (k = 0: the target alone; inf: never choose it)
    threshold: jax.Array  # float32 []: stop after a draft token of probability below it (0: never)
    evidence_to_stop: jax.Array | int = EVIDENCE_TO_STOP  # int32 []: judged drafts before k = 0 is allowed
    auto: bool = True  # choose k from the theory each iteration; False: always K (the threshold still stops)
    prior: jax.Array | tuple = (0.0, 0.0)  # (successes, failures) before any iteration: one row's share of
    # the beta measured on the prompts (tools/cli/options.py), or none
    horizon: jax.Array | float = float("inf")  # float32 []: the tokens each row generates (choose_k), or unknown


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


def choose_k(policy: Policy, successes, failures, pool=own):
    """The k in 0..K with the most expected tokens per unit of time (Leviathan et al. Theorem 3.8
    with measured costs: theory.optimal_K), the expectation over alpha ~ Beta(successes + 1,
    failures + 1), where E[alpha^j] = prod_{i<j} (successes + 1 + i) / (successes + failures + 2 + i).
    With much evidence this is theory.optimal_K at alpha = successes / (successes + failures).
    k = 0 only once the evidence allows it (may_stop): nothing is judged after it, so the evidence,
    and with it the choice, stays. pool: in a batch, the sum over the rows stepped together:
    their k is the one with the most tokens per unit of time for them all, and their drafts judged
    count together.
    With a horizon of R tokens a row, it weighs the time to finish them rather than the rate alone. A
    call gives a row t tokens, E[t] = mu = sum_{j<=k} E[alpha^j] and E[t^2] = m2 = sum_{j<=k} (2j + 1) E[alpha^j];
    R tokens take about R / mu calls, (m2 - mu) / (2 mu^2) more for the last one's overshoot (renewal
    theory), and a batch of B rows runs until its slowest row is done: z_B sqrt(R (m2 - mu^2) / mu^3)
    more, z_B the mean of the largest of B standard normals. The longer the draft, the wider t spreads."""
    K = policy.v.shape[0] - 1
    j = jnp.arange(K + 1)  # [K+1]
    moments = jnp.cumprod(jnp.where(j > 0, (successes + j) / (successes + failures + 1.0 + j), 1.0))  # E[alpha^j]
    mu, m2 = jnp.cumsum(moments), jnp.cumsum((2 * j + 1) * moments)  # [K+1] E[t], E[t^2], k = 0..K
    B, R = pool(1.0), policy.horizon
    z_B = jnp.sqrt(2.0) * jax.lax.erf_inv(2 * (B - 0.375) / (B + 0.25) - 1)  # Blom's; 0 for one row
    slower = 1 + (m2 - mu) / (2 * R * mu) + z_B * jnp.sqrt(jnp.maximum(m2 - mu**2, 0.0) / (R * mu))  # [K+1]; 1: R = inf
    rate = mu / ((j * policy.c + policy.v) * slower)  # [K+1] tokens per unit of time, to the end
    rate = rate.at[0].set(jnp.where(may_stop(policy, pool(successes), pool(failures)), rate[0], -jnp.inf))
    return jnp.argmax(pool(rate)).astype(jnp.int32)


def may_stop(policy: Policy, successes, failures):
    """bool []: k = 0 may be chosen. It is final, so it waits for policy.evidence_to_stop judged drafts,
    or fewer once even an optimistic alpha, the posterior mean plus two standard deviations, would make
    no k >= 1 pay: a draft the target almost never agrees with stops after a few rejections."""
    a, b = successes + 1.0, failures + 1.0  # alpha ~ Beta(a, b)
    high = jnp.minimum(a / (a + b) + 2 * jnp.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))), 1 - 1e-6)
    k = jnp.arange(1, policy.v.shape[0])  # [K]
    tokens = (1 - high ** (k + 1)) / (1 - high)  # [K] tokens per call at alpha = high
    hopeless = jnp.max(tokens / (k * policy.c + policy.v[1:])) < 1 / policy.v[0]
    return (successes + failures > policy.evidence_to_stop - 0.5) | hopeless  # a count of drafts, summed in floats


@partial(jax.tree_util.register_dataclass, data_fields=["draft", "policy"], meta_fields=["agree", "pool"])
@dataclass(frozen=True)
class AdaptiveDraft:
    """A draft that proposes k <= K tokens, k chosen by `policy`. Run it with `adaptive_step`."""

    draft: object  # a ModelDraft, or a draft with nothing to save by stopping (ngram.NGramDraft)
    policy: Policy
    agree: Callable = own  # in a batch, rows draft and are scored as far as the furthest needs
    pool: Callable = own  # in a batch, the rows choose one k together (choose_k)

    def evidence(self, state):  # (successes, failures): the policy's prior, then the trace's
        successes, failures = evidence(state.trace)
        return successes + self.policy.prior[0], failures + self.policy.prior[1]

    @property
    def may_stop(self) -> bool:  # a policy that weighs k = 0 may choose it, for good
        return self.policy.auto

    def stopped(self, state):  # bool []: theory chose k = 0, final since nothing more is judged
        return choose_k(self.policy, *self.evidence(state), self.pool) == 0

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        """The draft's prefill, skipped when the prior alone already chooses k = 0: the draft never runs,
        and its cache stays empty (a batch decides this together, as it chooses every k)."""
        prefill = partial(self.draft.prefill, tokens, n, prefill_len, max_len)
        if not self.policy.auto:
            return prefill()
        empty = lambda: jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(prefill))  # noqa: E731
        return jax.lax.cond(choose_k(self.policy, *self.policy.prior, self.pool) == 0, empty, prefill)

    def propose(self, state, key, K: int, sampling: Sampling) -> Proposal:
        """Step 1 with the stopping rules: up to K drafts; p's rows past the last one proposed are zero."""
        k = choose_k(self.policy, *self.evidence(state), self.pool) if self.policy.auto else jnp.int32(K)
        if isinstance(self.draft, ModelDraft):  # a model stops drafting, and saves its calls
            return propose_up_to(self.draft.model, state.tokens, state.n, state.draft_cache, key, K, k,
                                 self.policy.threshold, sampling, self.agree)
        proposal = self.draft.propose(state, key, K, sampling)  # a lookup costs nothing: just cut it
        k = jnp.minimum(k, proposal.k)
        return proposal._replace(p=jnp.where(jnp.arange(K)[:, None] < k, proposal.p, 0.0), k=k)


class Drafting(NamedTuple):  # propose_up_to's loop state
    i: jax.Array  # int32 []: the newest draft d_i
    k: jax.Array  # int32 []: drafts this row proposed (in a batch it stops growing when the row stops)
    cache: KVCache  # the draft's
    drafted: jax.Array  # int32 [K]: rows past the last draft are zero
    p: jax.Array  # float32 [K, V]: likewise
    going: jax.Array  # bool []: this row drafts another


def propose_up_to(draft: Model, tokens, n, cache: KVCache, key, K: int, k, threshold, sampling: Sampling,
                  agree) -> Proposal:
    """Step 1, stopping early: draft d_0, d_1, ... while fewer than k (int32 [], <= K) are drafted and
    the newest had p[i](d_i) >= threshold. The same keys as speculative.propose, so with k = K and
    threshold 0 it drafts the same tokens."""
    keys, greedy = jax.random.split(key, K), sampling.greedy
    p_0, cache = catch_up(draft, tokens, n, cache, sampling)
    d_0 = sample(keys[0], p_0, greedy)

    def go_on(i, d_i, p_i):  # after d_i: draft another?
        return (i + 1 < k) & (p_i[d_i] >= threshold)

    def draft_step(s: Drafting) -> Drafting:  # feed d_i, sample d_{i+1} from p[i+1]; a row that stopped drops it
        logits, cache = forward(draft, s.drafted[s.i][None], s.cache)  # [1, V]
        p_next = logits_to_probs(logits[0], sampling)
        d_next = sample(keys[s.i + 1], p_next, greedy)
        return Drafting(s.i + 1, s.k + s.going, cache, s.drafted.at[s.i + 1].set(jnp.where(s.going, d_next, 0)),
                        s.p.at[s.i + 1].set(jnp.where(s.going, p_next, 0.0)), s.going & go_on(s.i + 1, d_next, p_next))

    start = Drafting(jnp.int32(0), jnp.int32(1), cache, jnp.zeros(K, jnp.int32).at[0].set(d_0),
                     jnp.zeros((K,) + p_0.shape, p_0.dtype).at[0].set(p_0), go_on(0, d_0, p_0))
    s = jax.lax.while_loop(lambda s: agree(s.going.astype(jnp.int32)) > 0, draft_step, start)
    return Proposal(s.drafted, s.p, s.cache, s.k)


def or_target_alone(verify, agree, key_accept, key_extra, drafted, p, q, greedy: bool = False) -> Verdict:
    """`verify`; or with nothing proposed (p all zero), the target's token, as autoregressive_step draws
    it. When no row stepped together proposed anything (k = 0), `verify` is not run at all."""
    proposed = jnp.any(p > 0)
    judge = partial(verify, key_accept, key_extra, drafted, p, q, greedy)
    alone = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(judge))._replace(
        extra=sample(jax.random.split(key_extra)[1], q[0], greedy))
    either = lambda: jax.tree_util.tree_map(lambda mine, its: jnp.where(proposed, mine, its), judge(), alone)  # noqa: E731
    verdict = jax.lax.cond(agree(proposed.astype(jnp.int32)) > 0, either, lambda: alone)
    return verdict._replace(beta=jnp.minimum(p, q[:-1]).sum(-1))  # [K]: zero past the last proposed


def adaptive_step(draft: AdaptiveDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int, verify):
    """speculative_step for a draft that proposes k <= K tokens: the target scores only the k + 1
    positions it needs, and an iteration with nothing proposed is one autoregressive step of the target."""
    return speculative_step(draft, target, state, K, sampling, eos_id, partial(or_target_alone, verify, draft.agree),
                            partial(score_first, agree=draft.agree))
