"""The loop every chapter after the paper shares: Part I's iteration with its pieces exchangeable.

Part I's speculative_step is the paper's iteration, a model draft and the token rule. Each chapter here
changes one piece: the draft (anything with `prefill` and `propose`: ngram.py, adaptive.py, tree.py),
steps 3 and 4 (any function like speculative.accept_or_resample returning a Verdict: verifiers.py),
step 2 (any function like speculative.score: score_first.py), or the whole iteration, built from Part
I's functions (tree_verify.py, several.py, eagle.py). The trace records what each of them decides as well: the
drafts proposed k, the block rule's w and h, the chance beta each judged draft had; and whether every
row of p and q was finite (a float16 model that overflowed samples garbage: the entry points read the
flag once, after the loop, and refuse the result).
A draft that may stop drafting for good says so (`may_stop`, and `stopped(state)`: adaptive.py's k = 0);
the loop then goes on with the target alone, autoregressive steps on the same state (`target_alone`).
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec import speculative
from picospec.autoregressive import buffers, generated, prefill
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import accept_or_resample, score
from picospec.state import SpecState


class Proposal(NamedTuple):  # step 1's result, and how many drafts it holds
    drafted: jax.Array  # int32 [K] d_0..d_{K-1}
    p: jax.Array  # float32 [K, V] p[i], the distribution d_i was drawn from (a row of zeros: not proposed)
    cache: KVCache  # the draft's cache afterwards
    k: jax.Array | int  # int32 []: drafts proposed, K unless a draft stops early (adaptive.py)


class Verdict(NamedTuple):  # steps 3 and 4's result, with what the later rules also decide
    n_accepted: jax.Array  # int32 [] a: the drafts accepted, a leading run
    extra: jax.Array  # int32 []: the token after them, a resample or (after all k) the bonus
    p: jax.Array  # float32 [K] p[i](d_i)
    q: jax.Array  # float32 [K] q[i](d_i)
    u: jax.Array = 0.0  # float32 [K] the uniforms: d_i is accepted iff u_i < q/p (block: iff u_i < h_i stops there)
    w: jax.Array = 0.0  # float32 [K] block rule: the weight w_i of the block d_0..d_{i-1} (verifiers.py)
    h: jax.Array = 0.0  # float32 [K] block rule: the chance h_i to stop after i drafts
    beta: jax.Array = 0.0  # float32 [K] sum_x min(p[i](x), q[i](x)): the chance d_i was accepted (adaptive.py)


class Trace(NamedTuple):
    """Every iteration's proposal and verdict, one row per iteration; rows from n_steps on are unused."""

    drafted: jax.Array  # int32 [R, K] d_0..d_{K-1}
    k: jax.Array  # int32 [R] drafts proposed: drafted[:k] (0: nothing, the target stepped alone)
    n_accepted: jax.Array  # int32 [R], and the Verdict's other fields, each with a leading [R]
    extra: jax.Array
    p: jax.Array
    q: jax.Array
    u: jax.Array
    w: jax.Array
    h: jax.Array
    beta: jax.Array
    n_steps: jax.Array  # int32 [] iterations run = target forward calls
    finite: jax.Array  # bool [2]: every row of the draft's p [0] and the target's q [1] so far was finite

    @property
    def proposed(self):  # bool [R]: the draft proposed something
        return self.k > 0

    @property
    def bonus(self):  # bool [R]: extra is the bonus (all k accepted), not a resample
        return self.proposed & (self.n_accepted == self.k)


def empty_trace(R: int, K: int) -> Trace:
    """Room for R iterations of K drafts."""
    row, rows = jnp.zeros(R, jnp.int32), jnp.zeros((R, K))
    return Trace(jnp.zeros((R, K), jnp.int32), row, row, row, rows, rows, rows, rows, rows, rows, jnp.int32(0),
                 jnp.ones(2, bool))


class ModelDraft(NamedTuple):
    """The paper's draft, a smaller model, behind the two functions every draft offers."""

    model: Model
    may_stop = False  # it drafts until the end

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        return prefill(self.model, tokens, n, prefill_len, max_len)

    def propose(self, state: SpecState, key, K: int, sampling: Sampling) -> Proposal:
        drafted, p, cache = speculative.propose(self.model, state.tokens, state.n, state.draft_cache, key, K, sampling)
        return Proposal(drafted, p, cache, K)


def advance(state: SpecState, proposal: Proposal, verdict, target_cache: KVCache, eos_id: int, p, q) -> SpecState:
    """Step 5 (speculative.advance), the drafts proposed, k, in the trace's row, and whether this
    iteration's p [.., V] and q [.., V] were finite in the trace's flags."""
    state = speculative.advance(state, proposal, verdict, target_cache, eos_id)
    return state._replace(trace=seen(with_k(state.trace, proposal.k), p, q))


def seen(trace: Trace, p, q) -> Trace:  # the flags and'ed with this iteration's: no NaN, no Inf in p, in q
    return trace._replace(finite=trace.finite & jnp.stack([jnp.isfinite(p).all(), jnp.isfinite(q).all()]))


def with_k(trace: Trace, k) -> Trace:  # the latest row's k: the drafts its iteration proposed
    return trace._replace(k=trace.k.at[trace.n_steps - 1].set(k))


def speculative_step(draft, target: Model, state: SpecState, K: int, sampling: Sampling, eos_id: int,
                     verify=accept_or_resample, score=score) -> SpecState:
    """Part I's iteration with the draft, step 2 (`score`) and steps 3 and 4 (`verify`) exchangeable."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    proposal = draft.propose(state, key_draft, K, sampling)  # Step 1
    q, target_cache = score(target, state.tokens, state.n, proposal, state.target_cache, sampling)  # Step 2
    verdict = verify(key_accept, key_extra, proposal.drafted, proposal.p, q, sampling.greedy)  # Steps 3, 4
    return advance(state._replace(key=key), proposal, verdict, target_cache, eos_id, proposal.p, q)  # Step 5


def target_alone(draft, target: Model, state: SpecState, K: int, sampling: Sampling, eos_id: int, verify=None):
    """The iteration once the draft has stopped for good: one autoregressive step of the target on the
    same state, recorded as an iteration that drafted nothing (k = 0). The draft's cache stays behind.
    (autoregressive_step's token, with the row q it sampled from kept for the trace's flag.)"""
    key, key_sample = jax.random.split(state.key)
    logits, target_cache = forward(target, jax.lax.dynamic_slice(state.tokens, (state.n - 1,), (1,)),
                                   state.target_cache)  # [1, V]
    q = logits_to_probs(logits[0], sampling)  # [V]
    token = sample(key_sample, q, sampling.greedy)
    nothing, zeros = Proposal(jnp.zeros(K, jnp.int32), None, None, jnp.int32(0)), jnp.zeros(K)
    trace = with_k(speculative.record(state.trace, nothing, Verdict(jnp.int32(0), token, zeros, zeros)), 0)
    return state._replace(tokens=state.tokens.at[state.n].set(token), n=state.n + 1, target_cache=target_cache,
                          key=key, done=token == eos_id, trace=seen(trace, zeros, q))


def drafting(draft, state: SpecState):  # bool []: the draft has not stopped for good
    return ~draft.stopped(state) if draft.may_stop else jnp.array(True)


def start(draft, target: Model, tokens, n_prompt, key, K: int, prefill_len: int, max_len: int) -> SpecState:
    """speculative.start for any draft: both caches prefilled with the prompt but its last token."""
    n_prompt = jnp.asarray(n_prompt, jnp.int32)
    return SpecState(tokens, n_prompt, draft.prefill(tokens, n_prompt, prefill_len, max_len),
                     prefill(target, tokens, n_prompt, prefill_len, max_len), key, jnp.array(False),
                     empty_trace(tokens.shape[0], K))


@partial(jax.jit, static_argnames=("n_tokens", "K", "prefill_len", "max_len", "eos_id", "verify", "step"))
def speculative_loop(draft, target, tokens, n_prompt, key, n_tokens, K, sampling, prefill_len, max_len, eos_id,
                     verify=accept_or_resample, step=speculative_step):
    state = start(draft, target, tokens, n_prompt, key, K, prefill_len, max_len)
    going = lambda s: (s.n < n_prompt + n_tokens) & ~s.done  # noqa: E731
    state = jax.lax.while_loop(lambda s: going(s) & drafting(draft, s),
                               lambda s: step(draft, target, s, K, sampling, eos_id, verify), state)
    if draft.may_stop:  # what is left after it stopped: the target alone
        state = jax.lax.while_loop(going, lambda s: target_alone(draft, target, s, K, sampling, eos_id), state)
    return generated(state.tokens, n_prompt, n_tokens, eos_id), state.trace


def speculative_sample(draft, target: Model, prompt_tokens, n_tokens: int, key, *, K=4, temperature=1.0,
                       top_k=0, top_p=1.0, stop_at_eos=False, verify=accept_or_resample, step=speculative_step):
    """speculative.speculative_sample for any draft (a Model, or a chapter's), verifier and iteration."""
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, K, target.config)
    eos_id = target.config.eos_token_id if stop_at_eos else -1  # -1: no token, never stop
    draft = ModelDraft(draft) if isinstance(draft, Model) else draft
    return speculative_loop(draft, target, tokens, len(prompt_tokens), key, n_tokens, K,
                            Sampling(temperature, top_k, top_p), prefill_len, max_len, eos_id, verify, step)
