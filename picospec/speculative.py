"""Speculative sampling: a small draft proposes K tokens, the target checks them all in one call.

Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2;
Leviathan et al. 2022, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1.

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
The output then follows q exactly; at temperature 0 (one-hot p and q) it is the target's greedy output.

Why, at one position: x comes out either as an accepted draft or from the residual after a rejection,
  P(x) = p(x) min(1, q(x)/p(x)) + (1 - sum_y min(p(y), q(y))) * max(0, q(x) - p(x)) / sum_y max(0, q(y) - p(y))
       = min(p(x), q(x)) + max(0, q(x) - p(x)) = q(x),
because the rejection mass 1 - sum_y min(p, q) equals sum_y max(0, q - p) (p and q both sum to 1).
theory.lenient_output_law computes the first line; notebook 4 draws it at a real position.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec.errors import PicospecError
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, buffers, eos_to_stop_at, generated, logits_to_probs, prefill, sample


class Trace(NamedTuple):
    """Every accept/reject decision, one row per iteration; rows from n_steps on are unused."""

    drafted: jax.Array  # int32 [R, K] the draft's tokens d_0..d_{K-1}
    n_accepted: jax.Array  # int32 [R] how many of them were accepted (a leading run)
    extra: jax.Array  # int32 [R] the token added after them: a resample, or the bonus
    bonus: jax.Array  # bool [R] True if extra is the bonus (all K accepted), else a resample
    p: jax.Array  # float32 [R, K] p[i](d_i), the draft's probability of each drafted token
    q: jax.Array  # float32 [R, K] q[i](d_i), the target's probability of the same token
    u: jax.Array  # float32 [R, K] the uniforms: d_i is accepted iff u_i < q/p
    proposed: jax.Array  # bool [R] False: the n-gram draft found nothing, a plain target step ran
    n_steps: jax.Array  # int32 [] iterations run = target forward calls


class SpecState(NamedTuple):
    tokens: jax.Array  # int32 [L]: tokens[:n] is the sequence; later slots are scratch
    n: jax.Array  # int32 []: the sequence length
    draft_cache: KVCache | None  # positions [0, n - 1), or [0, n - 2) after a full accept (see propose);
    #                             None for the n-gram draft
    target_cache: KVCache  # positions [0, n - 1)
    key: jax.Array  # the key the next iteration splits
    done: jax.Array  # bool []: <|endoftext|> was generated (only when stopping at it)
    trace: Trace  # rows [0, trace.n_steps) are filled


def propose(draft: Model, tokens, n, cache: KVCache, key, K: int, sampling: Sampling):
    """Step 1: the draft samples K tokens after tokens[:n], one forward call each.

    After a full accept the draft never saw the last accepted token, so its cache may lag one behind
    (length m = n - 2 instead of n - 1). The first call therefore feeds two tokens from position m:
    (x[n-2], x[n-1]) when lagging, else (x[n-1], a scratch slot that stays beyond the length).
    Returns drafted int32 [K], p float32 [K, V], and the cache holding positions [0, n + K - 1): the
    sequence and d_0..d_{K-2} (d_{K-1} is not fed).
    """
    keys, greedy = jax.random.split(key, K), sampling.temperature == 0
    m = cache.length
    logits, cache = forward(draft.params, jax.lax.dynamic_slice(tokens, (m,), (2,)), cache, draft.config)
    p_first = logits_to_probs(logits[n - 1 - m], sampling)  # [V] the row after x[n-1]
    cache = cache._replace(length=n)  # drop the scratch slot, if it was written

    def draft_step(carry, key_i):  # feed the previous draft token, sample the next
        cache, p_prev, _ = carry
        token = sample(key_i, p_prev, greedy)
        logits, cache = forward(draft.params, token[None], cache, draft.config)  # [1, V]
        return (cache, logits_to_probs(logits[0], sampling), token), (token, p_prev)

    init = (cache, p_first, jnp.int32(0))
    (cache, p_last, _), (drafted, p) = jax.lax.scan(draft_step, init, keys[:K - 1])
    last = sample(keys[K - 1], p_last, greedy)  # d_{K-1} is sampled but not fed: it may be rejected
    return jnp.concatenate([drafted, last[None]]), jnp.concatenate([p, p_last[None]]), cache


def score(target: Model, tokens, n, drafted, cache: KVCache, sampling: Sampling):
    """Step 2: the target scores x[n-1], d_0, ..., d_{K-1} in ONE forward call; q[i] predicts the slot
    of d_i and q[K] the slot after them. Returns q float32 [K+1, V] and the target's cache."""
    block = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), drafted])  # [K+1]
    logits, cache = forward(target.params, block, cache, target.config)  # [K+1, V]
    return logits_to_probs(logits, sampling), cache


def accept_or_resample(key_accept, key_extra, drafted, p, q, greedy: bool = False):
    """Steps 3 and 4, the rejection sampler. drafted: int32 [K], d_i ~ p[i]; p: [K, V]; q: [K+1, V].
    greedy: temperature 0, so p and q are one-hot and the extra token is an argmax.

    Returns a, the number of drafts accepted (int32 []); extra, the token after them; and the
    p[i](d_i), q[i](d_i) and uniforms u_i behind each decision ([K] each).
    """
    K = drafted.shape[0]
    # Step 3: accept d_i with probability min(1, q/p), up to the first rejection.
    p_x = p[jnp.arange(K), drafted]  # [K] p[i](d_i) > 0, since d_i was sampled from p[i]
    q_x = q[jnp.arange(K), drafted]  # [K]
    u = jax.random.uniform(key_accept, (K,))  # [K] in [0, 1), so u < q/p is u < min(1, q/p)
    accepted = u < q_x / p_x  # [K]
    a = jnp.sum(jnp.cumprod(accepted))  # int32 []: the leading run of accepts

    # Step 4: one more token, from norm(max(0, q[a] - p[a])). p has a zero row at K, so after K
    # accepts this is the bonus q[K]. Where q == p the residual is all zero, and a rejection there
    # has probability 0; fall back to q[a] rather than divide by zero.
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])  # [K+1, V]
    residual = jnp.maximum(q[a] - p_padded[a], 0.0)  # [V]
    total = residual.sum()
    residual = jnp.where(total > 0, residual / jnp.where(total > 0, total, 1.0), q[a])
    return a, sample(key_extra, residual, greedy), p_x, q_x, u


def speculative_step(draft: Model, target: Model, state: SpecState, K: int, sampling: Sampling,
                     eos_id: int) -> SpecState:
    """One iteration of Chen et al., Algorithm 2: draft K, verify K + 1, keep 1 to K + 1 tokens."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    state = state._replace(key=key)
    if not isinstance(draft, Model):  # the n-gram draft: a lookup, with its own no-match fallback (ngram.py)
        return draft.speculative_step(target, state, K, sampling, eos_id, key_accept, key_extra)

    # Step 1: the draft proposes d_0..d_{K-1}, sampled from its standardized p.
    drafted, p, draft_cache = propose(draft, state.tokens, state.n, state.draft_cache, key_draft, K, sampling)
    return verify(target, state._replace(draft_cache=draft_cache), drafted, p, key_accept, key_extra, sampling,
                  eos_id)


def verify(target: Model, state: SpecState, drafted, p, key_accept, key_extra, sampling, eos_id) -> SpecState:
    """Steps 2 to 5 for drafts d_0..d_{K-1} (int32 [K]) drawn from p (float32 [K, V])."""
    K, n = drafted.shape[0], state.n
    q, target_cache = score(target, state.tokens, n, drafted, state.target_cache, sampling)  # Step 2

    # Steps 3 and 4: accept a leading run of drafts, then add one token.
    a, extra, p_x, q_x, u = accept_or_resample(key_accept, key_extra, drafted, p, q, sampling.temperature == 0)

    # Step 5: append d_0..d_{a-1} and the extra token; roll the caches back to n_new - 1.
    new = jnp.concatenate([drafted, drafted[:1]]).at[a].set(extra)  # [K+1]; slots after a: scratch
    tokens = jax.lax.dynamic_update_slice(state.tokens, new, (n,))
    n_new = n + a + 1
    target_cache = target_cache._replace(length=n_new - 1)
    draft_cache = state.draft_cache
    if draft_cache is not None:
        draft_cache = draft_cache._replace(length=jnp.minimum(draft_cache.length, n_new - 1))
    done = jnp.any((new == eos_id) & (jnp.arange(K + 1) <= a))
    trace = record(state.trace, drafted, a, extra, a == K, p_x, q_x, u, True)
    return SpecState(tokens, n_new, draft_cache, target_cache, state.key, done, trace)


def record(t: Trace, drafted, a, extra, bonus, p_x, q_x, u, proposed) -> Trace:
    """The trace with this iteration written at row n_steps."""
    i = t.n_steps
    return Trace(t.drafted.at[i].set(drafted), t.n_accepted.at[i].set(a), t.extra.at[i].set(extra),
                 t.bonus.at[i].set(bonus), t.p.at[i].set(p_x), t.q.at[i].set(q_x), t.u.at[i].set(u),
                 t.proposed.at[i].set(proposed), i + 1)


def start(draft, target: Model, tokens, n_prompt, key, K: int, prefill_len: int, max_len: int,
          ) -> SpecState:
    """The state before the first iteration: both caches prefilled with the prompt but its last token."""
    n_prompt = jnp.asarray(n_prompt, jnp.int32)
    R = tokens.shape[0]  # each iteration adds >= 1 token, so the buffer length bounds the iterations
    trace = Trace(jnp.zeros((R, K), jnp.int32), jnp.zeros(R, jnp.int32), jnp.zeros(R, jnp.int32),
                  jnp.zeros(R, bool), jnp.zeros((R, K)), jnp.zeros((R, K)), jnp.zeros((R, K)),
                  jnp.zeros(R, bool), jnp.int32(0))
    # A model draft keeps a cache like the target's; the n-gram draft has none.
    draft_cache = prefill(draft, tokens, n_prompt, prefill_len, max_len) if isinstance(draft, Model) else None
    return SpecState(tokens, n_prompt, draft_cache, prefill(target, tokens, n_prompt, prefill_len, max_len),
                     key, jnp.array(False), trace)


@partial(jax.jit, static_argnames=("n_tokens", "K", "sampling", "prefill_len", "max_len", "eos_id"))
def _speculative(draft, target, tokens, n_prompt, key, n_tokens, K, sampling, prefill_len, max_len, eos_id):
    state = start(draft, target, tokens, n_prompt, key, K, prefill_len, max_len)
    state = jax.lax.while_loop(
        lambda s: (s.n < n_prompt + n_tokens) & ~s.done,
        lambda s: speculative_step(draft, target, s, K, sampling, eos_id),
        state)
    return generated(state.tokens, n_prompt, n_tokens, eos_id), state.trace


def speculative_sample(draft, target: Model, prompt_tokens, n_tokens: int, key, *, K=4,
                       temperature=1.0, top_k=0, top_p=1.0, stop_at_eos=False):
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
    Returns:
      tokens: int32 [n_tokens], distributed exactly as target's autoregressive samples.
      trace: Trace of every iteration (the last one may run past n_tokens; tokens are cut there).
    """
    sampling = Sampling(temperature, top_k, top_p)
    check_pair(draft, target, K)
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, K, target.config)
    eos_id = eos_to_stop_at(target, stop_at_eos)
    return _speculative(draft, target, tokens, len(prompt_tokens), key, n_tokens, K, sampling,
                        prefill_len, max_len, eos_id)


def check_pair(draft, target: Model, K: int):
    """A model draft must share the target's vocabulary and context; K >= 1."""
    if not (isinstance(K, int) and K >= 1):
        raise PicospecError(f"K must be a whole number >= 1, got {K}")
    if not isinstance(draft, Model):  # the n-gram draft checked itself when it was made
        return
    if draft.config.vocab_size != target.config.vocab_size:
        raise PicospecError(f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the "
                            f"target's ({target.config.vocab_size}); pick a draft with the target's tokenizer")
    if draft.config.n_positions < target.config.n_positions:
        raise PicospecError(f"the draft's context ({draft.config.n_positions}) is shorter than the "
                            f"target's ({target.config.n_positions}); pick a draft with at least as long a context")
