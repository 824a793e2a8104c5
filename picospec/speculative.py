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

One iteration (indices are 0-based here, where the papers count from 1), `speculative_step`:
  1. the draft samples d_i ~ p[i] for i = 0..K-1, one forward call each (`propose`);
  2. the target feeds (x[n-1], d_0..d_{K-1}) in ONE call, giving q[0..K] (`score`);
  3. d_i is accepted with probability min(1, q[i](d_i) / p[i](d_i)), stopping at the first rejection;
  4. at a rejection at i, one token is drawn from norm(max(0, q[i] - p[i])); after K accepts, a bonus
     token from q[K]. Padding p with a zero row p[K] makes both the same draw (`accept_or_resample`);
  5. both caches roll back to the accepted length (`advance`).
The output then follows q exactly; at temperature 0 (one-hot p and q) it is the target's greedy output.

Why, at one position: x comes out either as an accepted draft or from the residual after a rejection,
  P(x) = p(x) min(1, q(x)/p(x)) + (1 - sum_y min(p(y), q(y))) * max(0, q(x) - p(x)) / sum_y max(0, q(y) - p(y))
       = min(p(x), q(x)) + max(0, q(x) - p(x)) = q(x),
because the rejection mass 1 - sum_y min(p, q) equals sum_y max(0, q - p) (p and q both sum to 1).

Part II (picospec/beyond/) builds its chapters from these functions, with a loop of its own (loop.py).
"""

from functools import partial

import jax
import jax.numpy as jnp

from picospec.autoregressive import buffers, generated, prefill
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.state import Proposal, SpecState, Trace, Verdict, empty_trace


def propose(draft: Model, tokens, n, cache: KVCache, key, K: int, sampling: Sampling) -> Proposal:
    """Step 1: the draft samples d_0..d_{K-1} after tokens[:n], one forward call each: the plain idea
    feeds x[n-1] for p[0], then each d_i for p[i+1] (a scan). Its first call is `catch_up`, a speed trick
    below. Returns d [K], p float32 [K, V], and the draft's cache holding positions [0, n + K - 1): the
    sequence and d_0..d_{K-2} (d_{K-1} is sampled but not fed: it may be rejected)."""
    keys, greedy = jax.random.split(key, K), sampling.greedy
    p_first, cache = catch_up(draft, tokens, n, cache, sampling)

    def draft_step(carry, key_i):  # sample d_i from p[i], feed it, get p[i+1]
        cache, p_i = carry
        d_i = sample(key_i, p_i, greedy)
        logits, cache = forward(draft, d_i[None], cache)  # [1, V]
        return (cache, logits_to_probs(logits[0], sampling)), (d_i, p_i)

    (cache, p_last), (drafted, p) = jax.lax.scan(draft_step, (cache, p_first), keys[:K - 1])
    d_last = sample(keys[K - 1], p_last, greedy)
    return Proposal(jnp.concatenate([drafted, d_last[None]]), jnp.concatenate([p, p_last[None]]), cache)


def catch_up(draft: Model, tokens, n, cache: KVCache, sampling: Sampling):
    """A speed trick, the draft's first call of an iteration: bring its cache to n - 1 positions, and
    return p[0].

    After a rejection the draft's cache holds x[:n-1], like the target's. After a full accept it lags
    one behind: the last draft token d_{K-1} was never fed, so it holds x[:n-2]. Rather than spend a
    call catching up, the first call always feeds two tokens from m = cache.length: (x[n-2], x[n-1])
    when lagging, else (x[n-1], a scratch slot that stays beyond the length). Two tokens cost about
    one on memory-bound hardware, so the catch-up is nearly free. Returns p[0] [V] and the cache."""
    m = cache.length
    logits, cache = forward(draft, jax.lax.dynamic_slice(tokens, (m,), (2,)), cache)  # [2, V]
    p_first = logits_to_probs(logits[n - 1 - m], sampling)  # [V] the row after x[n-1]
    return p_first, cache._replace(length=n)  # drop the scratch slot, if it was written


def score(target: Model, tokens, n, proposal: Proposal, cache: KVCache, sampling: Sampling):
    """Step 2: the target scores x[n-1], d_0, ..., d_{K-1} in ONE forward call; q[i] predicts the slot
    of d_i and q[K] the slot after them. Returns q float32 [K+1, V] and the target's cache."""
    scored = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), proposal.drafted])  # [K+1]
    logits, cache = forward(target, scored, cache)  # [K+1, V]
    return logits_to_probs(logits, sampling), cache


def at(probs, drafted):  # [K or K+1, V], int32 [K] -> [K]: probs[i](d_i)
    return probs[jnp.arange(len(drafted)), drafted]


def residual(q, p):  # [V], [V] -> [V]: norm(max(0, q - p)), or q where that is all zero (never drawn from)
    r = jnp.maximum(q - p, 0.0)
    total = r.sum()
    return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), q)


def accept_or_resample(key_accept, key_extra, drafted, p, q, greedy: bool = False) -> Verdict:
    """Steps 3 and 4, the rejection sampler. drafted: int32 [K], d_i ~ p[i]; p: [K, V]; q: [K+1, V].
    greedy: temperature 0, so p and q are one-hot and the extra token is an argmax. Rows of p that are
    all zero were not proposed (a draft that stopped early): none is accepted, and after the last
    proposed one the extra token comes from q, a bonus."""
    K = drafted.shape[0]
    # Step 3: accept d_i with probability min(1, q/p), up to the first rejection.
    p_x, q_x = at(p, drafted), at(q, drafted)  # [K] each; p[i](d_i) > 0, since d_i was sampled from p[i]
    u = jax.random.uniform(key_accept, (K,))  # [K] in [0, 1), so u < q/p is u < min(1, q/p)
    accepted = (p_x > 0) & (u < q_x / p_x)  # [K]
    a = jnp.sum(jnp.cumprod(accepted))  # int32 []: the leading run of accepts

    # Step 4: one more token, from norm(max(0, q[a] - p[a])). p has a zero row at K, so after K
    # accepts this is the bonus q[K]. Where q == p the residual is all zero, and a rejection there
    # has probability 0: residual falls back to q[a] rather than divide by zero.
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])  # [K+1, V]
    return Verdict(a, sample(key_extra, residual(q[a], p_padded[a]), greedy), p_x, q_x, u)


def advance(state: SpecState, proposal: Proposal, verdict: Verdict, target_cache: KVCache, eos_id: int) -> SpecState:
    """Step 5: append d_0..d_{a-1} and the extra token, then roll both caches back to the new length
    minus one (rollback is moving a length back); done if <|endoftext|> (eos_id) was appended."""
    drafted, a, n = proposal.drafted, verdict.n_accepted, state.n
    new = jnp.concatenate([drafted, drafted[:1]]).at[a].set(verdict.extra)  # [K+1]; slots after a: scratch
    n_new = n + a + 1
    done = jnp.any((new == eos_id) & (jnp.arange(new.shape[0]) <= a))
    draft_cache = proposal.cache._replace(length=jnp.minimum(proposal.cache.length, n_new - 1))
    return SpecState(jax.lax.dynamic_update_slice(state.tokens, new, (n,)), n_new, draft_cache,
                     target_cache._replace(length=n_new - 1), state.key, done, record(state.trace, proposal, verdict))


def record(trace: Trace, proposal: Proposal, verdict: Verdict) -> Trace:
    row = {"drafted": proposal.drafted, **verdict._asdict()}  # written at row n_steps
    return trace._replace(**{name: getattr(trace, name).at[trace.n_steps].set(value) for name, value in row.items()},
                          n_steps=trace.n_steps + 1)


def speculative_step(draft: Model, target: Model, state: SpecState, K: int, sampling: Sampling,
                     eos_id: int) -> SpecState:
    """One iteration of Chen et al., Algorithm 2: draft K, verify K + 1, keep 1 to K + 1 tokens."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    # Step 1: the draft proposes d_0..d_{K-1}, each drawn from its p[i].
    proposal = propose(draft, state.tokens, state.n, state.draft_cache, key_draft, K, sampling)
    # Step 2: the target scores them, and the position after them, in one call: q[0..K].
    q, target_cache = score(target, state.tokens, state.n, proposal, state.target_cache, sampling)
    # Steps 3 and 4: a leading run of drafts accepted, then one token more.
    verdict = accept_or_resample(key_accept, key_extra, proposal.drafted, proposal.p, q, sampling.greedy)
    # Step 5: append them, and roll the caches back to the accepted length.
    return advance(state._replace(key=key), proposal, verdict, target_cache, eos_id)


def start(draft: Model, target: Model, tokens, n_prompt, key, K: int, prefill_len: int, max_len: int) -> SpecState:
    """The state before the first iteration: both caches prefilled with the prompt but its last token."""
    n_prompt = jnp.asarray(n_prompt, jnp.int32)
    return SpecState(tokens, n_prompt, prefill(draft, tokens, n_prompt, prefill_len, max_len),
                     prefill(target, tokens, n_prompt, prefill_len, max_len), key, jnp.array(False),
                     empty_trace(tokens.shape[0], K))  # each iteration adds >= 1 token: at most L of them


@partial(jax.jit, static_argnames=("n_tokens", "K", "prefill_len", "max_len", "eos_id"))
def speculative_loop(draft, target, tokens, n_prompt, key, n_tokens, K, sampling, prefill_len, max_len, eos_id):
    state = start(draft, target, tokens, n_prompt, key, K, prefill_len, max_len)
    state = jax.lax.while_loop(lambda s: (s.n < n_prompt + n_tokens) & ~s.done,
                               lambda s: speculative_step(draft, target, s, K, sampling, eos_id), state)
    return generated(state.tokens, n_prompt, n_tokens, eos_id), state.trace


def speculative_sample(draft: Model, target: Model, prompt_tokens, n_tokens: int, key, *, K=4, temperature=1.0,
                       top_k=0, top_p=1.0, stop_at_eos=False):
    """Sample n_tokens from `target`, with `draft` proposing K tokens per target call. A pure function
    of its inputs: jax.jit and jax.vmap (over key) both work.
    Args:
      draft, target: Models sharing a vocabulary.
      prompt_tokens: int [P], P >= 1.
      n_tokens: tokens to generate (>= 1); P + n_tokens + K - 1 must fit in the target's n_positions.
      key: a jax.random key (the same key, the same tokens); K: tokens drafted per iteration (>= 1).
      temperature, top_k, top_p: see sampling.Sampling; both models are standardized alike.
      stop_at_eos: stop at <|endoftext|>; the slots after it are filled with <|endoftext|>.
    Returns:
      tokens: int32 [n_tokens], distributed exactly as target's autoregressive samples.
      trace: Trace of every iteration (the last one may run past n_tokens; tokens are cut there).
    """
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, K, target.config)
    eos_id = target.config.eos_token_id if stop_at_eos else -1  # -1: no token, never stop
    return speculative_loop(draft, target, tokens, len(prompt_tokens), key, n_tokens, K,
                            Sampling(temperature, top_k, top_p), prefill_len, max_len, eos_id)
