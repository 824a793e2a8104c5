"""Adaptive K: a draft that proposes k <= K tokens, k decided every iteration instead of fixed in advance.

An AdaptiveDraft wraps any draft; two rules decide k, both inside the compiled loop (shapes stay those of K):
  theory      before drafting, the policy's k in 0..K (policy.py): the most expected tokens per unit of
              time, k = 0 not drafting at all. Nothing is judged after k = 0, so the choice stays: the
              draft has stopped for good (`stopped`), and the loop goes on with the target alone, one
              autoregressive step an iteration (loop.target_alone);
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

from picospec.beyond.loop import ModelDraft, Proposal, Trace, Verdict, speculative_step
from picospec.beyond.policy import Policy, choose_k, evidence
from picospec.beyond.score_first import own, score_first
from picospec.fastpath import branch_on_cpu
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import catch_up


@partial(jax.tree_util.register_dataclass, data_fields=["draft", "policy"], meta_fields=["agree", "pool"])
@dataclass(frozen=True)
class AdaptiveDraft:
    """A draft that proposes k <= K tokens, k chosen by `policy`. Run it with `adaptive_step`."""

    draft: object  # a ModelDraft, or a draft with nothing to save by stopping (ngram.NGramDraft)
    policy: Policy
    agree: Callable = own  # in a batch, the largest over the rows: they draft and are scored as far as the furthest
    # needs, and choose the k that finishes the slowest soonest (choose_k)
    pool: Callable = own  # in a batch, the sum over the rows: the evidence they judged together (choose_k)

    def choose_k(self, trace: Trace):  # choose_k from the policy's prior and the trace's evidence so far
        successes, failures = evidence(trace)
        first = self.pool(successes + failures) == 0  # nothing judged yet: the draft has not run
        made = jnp.sum(trace.n_accepted) + trace.n_steps  # tokens: each iteration's accepted and one more
        return choose_k(self.policy, successes + self.policy.prior[0], failures + self.policy.prior[1], self.pool,
                        made, first, self.agree)

    @property
    def least(self) -> int:  # the fewest drafts it proposes: a model drafts one at least, a lookup may find none
        return 1 if isinstance(self.draft, ModelDraft) else 0

    @property
    def may_stop(self) -> bool:  # a policy that weighs k = 0 may choose it, for good
        return self.policy.auto

    def stopped(self, state):  # bool []: theory chose k = 0, final since nothing more is judged
        return self.choose_k(state.trace) == 0

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        """The draft's prefill, skipped when the prior alone already chooses k = 0: the draft never runs,
        and its cache stays empty (a batch decides this together, as it chooses every k)."""
        prefill = partial(self.draft.prefill, tokens, n, prefill_len, max_len)
        if not self.policy.auto:
            return prefill()
        empty = lambda: jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(prefill))  # noqa: E731
        return jax.lax.cond(self.stops_at_once(), empty, prefill)

    def stops_at_once(self):  # bool []: the prior alone chooses k = 0, so the draft never runs
        return choose_k(self.policy, *self.policy.prior, self.pool, first=True, slowest=self.agree) == 0

    def propose(self, state, key, K: int, sampling: Sampling) -> Proposal:
        """Step 1 with the stopping rules: up to K drafts; p's rows past the last one proposed are zero."""
        k = self.choose_k(state.trace) if self.policy.auto else jnp.int32(K)
        if isinstance(self.draft, ModelDraft):  # a model stops drafting, and saves its calls
            return propose_up_to(self.draft.model, state.tokens, state.n, state.draft_cache, key, K, k,
                                 self.policy.threshold, sampling, self.agree)
        up_to = dict(k=k) if getattr(self.draft, "stops_at_k", False) else {}  # a draft that can stop at k does
        proposal = self.draft.propose(state, key, K, sampling, **up_to)  # a lookup costs nothing: just cut it
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
    verdict = branch_on_cpu(lambda: jax.lax.cond(agree(proposed.astype(jnp.int32)) > 0, either, lambda: alone),
                            either)  # elsewhere, judged either way
    beta = jnp.minimum(p, q[:-1]).sum(-1)  # [K]: zero past the last proposed
    return Verdict(**verdict._asdict())._replace(beta=beta)  # a rule of Part I's gives Part I's Verdict


def adaptive_step(draft: AdaptiveDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int, verify):
    """speculative_step for a draft that proposes k <= K tokens: the target scores only the k + 1
    positions it needs, and an iteration with nothing proposed is one autoregressive step of the target."""
    return speculative_step(draft, target, state, K, sampling, eos_id, partial(or_target_alone, verify, draft.agree),
                            partial(score_first, agree=draft.agree, least=draft.least))
