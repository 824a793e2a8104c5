"""Speculative sampling: a small draft proposes K tokens, the target checks them all in one call.

Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2;
Leviathan et al. 2022, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1
(picospec/paper.py is that algorithm without a cache; this file is the same loop, fast).

Notation (Chen et al., and jaymody/speculative-sampling):
  p      the draft's distribution (GPT-2 124M); p[i] is its next-token distribution at draft step i
  q      the target's distribution (GPT-2 1558M); q[i] scores the same position as p[i]
  K      tokens drafted per iteration; the target scores K + 1 positions in one forward call
  x      the sequence so far, n tokens long (x[n-1] is the newest token)
  d      the drafted tokens d_0..d_{K-1} (Chen et al.'s x~_1..x~_K, Leviathan et al.'s x_1..x_gamma)
  Leviathan et al. swap the letters: their p is the target and q the draft, and their K is gamma.
Both p and q are *standardized* the same way (temperature, top-k, top-p; see sampling.py), and the
draft's tokens are sampled from exactly the p used below.

One iteration (indices are 0-based here, where the papers count from 1):
  1. the draft samples d_i ~ p[i] for i = 0..K-1, one forward call each;
  2. the target feeds (x[n-1], d_0..d_{K-1}) in ONE call, giving q[0..K];
  3. d_i is accepted with probability min(1, q[i](d_i) / p[i](d_i)), stopping at the first rejection;
  4. at a rejection at i, one token is drawn from norm(max(0, q[i] - p[i])); after K accepts, a bonus
     token from q[K]. Padding p with a zero row p[K] makes both the same draw;
  5. both caches roll back to the accepted length.
Step 1 is the draft's (draft.py for a model, ngram.py for a lookup); steps 2 to 5 are below.
The output then follows q exactly; at temperature 0 (one-hot p and q) it is the target's greedy output.

Why, at one position: x comes out either as an accepted draft or from the residual after a rejection,
  P(x) = p(x) min(1, q(x)/p(x)) + (1 - sum_y min(p(y), q(y))) * max(0, q(x) - p(x)) / sum_y max(0, q(y) - p(y))
       = min(p(x), q(x)) + max(0, q(x) - p(x)) = q(x),
because the rejection mass 1 - sum_y min(p, q) equals sum_y max(0, q - p) (p and q both sum to 1).
"""

from functools import partial

import jax
import jax.numpy as jnp

from picospec.adaptive import propose_up_to, rows_max, score_first
from picospec.draft import as_draft, check_pair
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import (DecodeState, Sampling, autoregressive_step, buffers, eos_to_stop_at, generated,
                               logits_to_probs, normalized, prefill, sample)
from picospec.several import several_step
from picospec.state import SpecState, advance, empty_trace, record, rollback
from picospec.verifiers import block_rule, match_rule


def score(target: Model, tokens, n, drafted, cache: KVCache, sampling: Sampling):
    """Step 2: the target scores x[n-1], d_0, ..., d_{K-1} in ONE forward call; q[i] predicts the slot
    of d_i and q[K] the slot after them. Returns q float32 [K+1, V] and the target's cache."""
    block = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), drafted])  # [K+1]
    logits, cache = forward(target, block, cache)  # [K+1, V]
    return logits_to_probs(logits, sampling), cache


def accept_or_resample(key_accept, key_extra, drafted, p, q, greedy: bool = False):
    """Steps 3 and 4, the rejection sampler. drafted: int32 [K], d_i ~ p[i]; p: [K, V]; q: [K+1, V].
    greedy: temperature 0, so p and q are one-hot and the extra token is an argmax.

    Returns a, the number of drafts accepted (int32 []); extra, the token after them; and the
    p[i](d_i), q[i](d_i) and uniforms u_i behind each decision ([K] each). Rows of p that are all
    zero were not proposed (a draft that stopped early): none is accepted, and after the last
    proposed one the extra token comes from q, a bonus.
    """
    K = drafted.shape[0]
    # Step 3: accept d_i with probability min(1, q/p), up to the first rejection.
    p_x = p[jnp.arange(K), drafted]  # [K] p[i](d_i) > 0, since d_i was sampled from p[i]
    q_x = q[jnp.arange(K), drafted]  # [K]
    u = jax.random.uniform(key_accept, (K,))  # [K] in [0, 1), so u < q/p is u < min(1, q/p)
    accepted = (p_x > 0) & (u < q_x / p_x)  # [K]; p[i] = 0: d_i was not proposed (adaptive.py)
    a = jnp.sum(jnp.cumprod(accepted))  # int32 []: the leading run of accepts

    # Step 4: one more token, from norm(max(0, q[a] - p[a])). p has a zero row at K, so after K
    # accepts this is the bonus q[K]. Where q == p the residual is all zero, and a rejection there
    # has probability 0; fall back to q[a] rather than divide by zero.
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])  # [K+1, V]
    residual = normalized(jnp.maximum(q[a] - p_padded[a], 0.0), q[a])  # [V]
    return a, sample(key_extra, residual, greedy), p_x, q_x, u


def verifier(rule: str):
    """Steps 3 and 4 as `rule` runs them: the token rule above, or verifiers.py's match or block."""
    return {"match": match_rule, "token": accept_or_resample, "block": block_rule}[rule]


def verify(target: Model, state: SpecState, drafted, p, key_accept, key_extra, sampling, eos_id,
           rule: str = "token", policy=None) -> SpecState:
    """Steps 2 to 5 for drafts d_0..d_{K-1} (int32 [K]) drawn from p (float32 [K, V]); with a policy
    (adaptive.py) only the first k were proposed, and p's other rows are zero."""
    K, n = drafted.shape[0], state.n
    k = jnp.sum(jnp.any(p > 0, axis=-1)).astype(jnp.int32)  # drafts proposed: K, or fewer with a policy
    if policy is None:  # Step 2
        q, target_cache = score(target, state.tokens, n, drafted, state.target_cache, sampling)
    else:
        q, target_cache = score_first(target, state.tokens, n, drafted, rows_max(k, policy),
                                      state.target_cache, sampling)

    # Steps 3 and 4: accept a leading run of drafts, then add one token.
    decision = verifier(rule)(key_accept, key_extra, drafted, p, q, sampling.greedy)
    a, extra, p_x, q_x, u = decision[:5]
    w, h = decision[5:] or (jnp.zeros(K), jnp.zeros(K))  # the block rule's weights and stop chances

    # Step 5: append d_0..d_{a-1} and the extra token; roll the caches back (state.advance).
    trace = record(state.trace, drafted, a, extra, a == k, p_x, q_x, u, w, h, True, k)
    return advance(state, drafted, a, extra, state.draft_cache, target_cache, trace, eos_id)


def target_step(target: Model, state: SpecState, key, sampling: Sampling, eos_id: int) -> SpecState:
    """An iteration with nothing proposed: one token from the target, as autoregressive sampling takes it."""
    decoded = autoregressive_step(target, DecodeState(state.tokens, state.n, state.target_cache, key, state.done),
                                  sampling, eos_id)
    K = state.trace.drafted.shape[1]
    zeros = jnp.zeros(K)
    trace = record(state.trace, jnp.zeros(K, jnp.int32), jnp.int32(0), decoded.tokens[state.n], False, zeros, zeros,
                   zeros, zeros, zeros, False, 0)
    return SpecState(decoded.tokens, decoded.n, rollback(state.draft_cache, decoded.n - 1), decoded.cache, state.key,
                     decoded.done, trace)


def speculative_step(draft, target: Model, state: SpecState, K: int, sampling: Sampling,
                     eos_id: int, rule: str = "token", policy=None, drafts: int = 1) -> SpecState:
    """One iteration of Chen et al., Algorithm 2: draft K, verify K + 1, keep 1 to K + 1 tokens.
    policy: an adaptive.Policy to draft fewer than K when that pays (None: always K).
    drafts: N > 1 draws N chains and verifies them all in one call (several.py)."""
    if drafts > 1:
        return several_step(draft, target, state, K, drafts, sampling, eos_id, rule)
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    # Step 1: the draft proposes d_0..d_{K-1} from its p (a model samples them; the n-gram draft looks
    # them up). A draft may find nothing to propose; then the iteration is one plain target step.
    if policy is None:
        proposal = draft.propose(state.tokens, state.n, state.draft_cache, key_draft, K, sampling)
    else:
        proposal = propose_up_to(draft, state.tokens, state.n, state.draft_cache, key_draft, K, sampling, policy,
                                    state.trace)
    state = state._replace(key=key, draft_cache=proposal.cache)
    return jax.lax.cond(
        proposal.found,
        lambda: verify(target, state, proposal.drafted, proposal.p, key_accept, key_extra, sampling, eos_id, rule,
                       policy),
        lambda: target_step(target, state, key_extra, sampling, eos_id))


def start(draft, target: Model, tokens, n_prompt, key, K: int, prefill_len: int, max_len: int) -> SpecState:
    """The state before the first iteration: both caches prefilled with the prompt but its last token."""
    n_prompt = jnp.asarray(n_prompt, jnp.int32)
    return SpecState(tokens, n_prompt, draft.prefill(tokens, n_prompt, prefill_len, max_len),
                     prefill(target, tokens, n_prompt, prefill_len, max_len), key, jnp.array(False),
                     empty_trace(tokens.shape[0], K))  # each iteration adds >= 1 token: at most L of them


@partial(jax.jit, static_argnames=("n_tokens", "K", "prefill_len", "max_len", "eos_id", "rule", "drafts"))
def speculative_loop(draft, target, tokens, n_prompt, key, n_tokens, K, sampling, prefill_len, max_len, eos_id,
                     rule="token", policy=None, drafts=1):
    state = start(draft, target, tokens, n_prompt, key, K, prefill_len, max_len)
    state = jax.lax.while_loop(
        lambda s: (s.n < n_prompt + n_tokens) & ~s.done,
        lambda s: speculative_step(draft, target, s, K, sampling, eos_id, rule, policy, drafts),
        state)
    return generated(state.tokens, n_prompt, n_tokens, eos_id), state.trace


def speculative_sample(draft, target: Model, prompt_tokens, n_tokens: int, key, *, K=4,
                       temperature=1.0, top_k=0, top_p=1.0, stop_at_eos=False, verify="token", policy=None,
                       drafts=1):
    """Sample n_tokens from `target`, with `draft` proposing K tokens per target call.

    A pure function of its inputs: jax.jit and jax.vmap (over key) both work.
    Args:
      draft, target: Models sharing a vocabulary; or draft=ngram.NGramDraft(max_n) to look up n-grams.
      prompt_tokens: int [P], P >= 1.
      n_tokens: tokens to generate; P + n_tokens + K - 1 must fit in the target's n_positions.
      key: a jax.random key; the same key gives the same tokens.
      K: tokens drafted per iteration (>= 1).
      temperature, top_k, top_p: see sampling.Sampling; both models are standardized alike.
      stop_at_eos: stop at <|endoftext|>; the slots after it are filled with <|endoftext|>.
      verify: steps 3 and 4's rule, "match", "token" or "block" (verifiers.py); all three are lossless.
      policy: an adaptive.Policy: draft up to K tokens, fewer when its rules say so (None: always K).
      drafts: N independent draft chains verified together (several.py; match or token, no policy).
    Returns:
      tokens: int32 [n_tokens], distributed exactly as target's autoregressive samples.
      trace: Trace of every iteration (the last one may run past n_tokens; tokens are cut there).
    """
    sampling = Sampling(temperature, top_k, top_p)
    check_pair(draft, target, K, verify, drafts, policy)
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, K, target.config)
    eos_id = eos_to_stop_at(target, stop_at_eos)
    return speculative_loop(as_draft(draft, target), target, tokens, len(prompt_tokens), key, n_tokens, K, sampling,
                            prefill_len, max_len, eos_id, verify, policy, drafts)

