"""Autoregressive sampling with a KV cache: the baseline speculative sampling must match, and its state.

Both samplers, autoregressive and speculative, keep the same explicit state: a token buffer whose
first n slots are the sequence so far, and caches holding positions [0, n - 1). The newest token is
not in the cache yet: the next step feeds it, and the logits it returns are the next token's.
Buffers and caches are sized in powers of two, so prompts of any length compile few shapes.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from picospec.gpt2 import KVCache, Model, forward, init_cache, transformer
from picospec.sampling import Sampling, logits_to_probs, sample


def bucket(n: int, cap: int) -> int:
    """The power of two >= n (at least 16), at most cap."""
    return min(max(16, 1 << (n - 1).bit_length()), cap)


def buffers(prompt_tokens, n_tokens: int, lookahead: int, config) -> tuple[np.ndarray, int, int]:
    """A token buffer [L] holding the prompt, with room for n_tokens plus `lookahead` scratch slots;
    the padded prompt length to prefill; and the cache capacity S."""
    P = len(prompt_tokens)
    L = bucket(P + n_tokens + lookahead, cap=1 << 30)
    tokens = np.zeros(L, np.int32)  # built on the host: no compiled op per prompt length
    tokens[:P] = prompt_tokens
    max_len = min(L, config.n_positions)
    return tokens, bucket(P, cap=max_len), max_len


def prefill(model: Model, tokens, n, prefill_len: int, max_len: int) -> KVCache:
    """A cache of capacity max_len holding tokens[:n - 1], the prompt but its newest token.
    tokens: int32 [L]; n: int32 [] the prompt's length; prefill_len >= n: the padded length fed."""
    cache = init_cache(model.config, max_len, model.params["wte"]["weight"].dtype)
    _, k_all, v_all = transformer(model, tokens[:prefill_len], cache)  # unused logits: jit never computes them
    return KVCache(k_all, v_all, n - 1)  # the padding's slots are stale from here on


class DecodeState(NamedTuple):
    tokens: jax.Array  # int32 [L]: tokens[:n] is the sequence; later slots are scratch
    n: jax.Array  # int32 []: the sequence length
    cache: KVCache  # holds positions [0, n - 1)
    key: jax.Array  # the key the next step splits
    done: jax.Array  # bool []: <|endoftext|> was generated (only when stopping at it)


def autoregressive_step(model: Model, state: DecodeState, sampling: Sampling, eos_id: int) -> DecodeState:
    """One token: feed the newest token, sample the next from the standardized distribution."""
    key, key_sample = jax.random.split(state.key)
    newest = jax.lax.dynamic_slice(state.tokens, (state.n - 1,), (1,))  # [1]
    logits, cache = forward(model, newest, state.cache)  # [1, V]
    token = sample(key_sample, logits_to_probs(logits[0], sampling), sampling.greedy)
    tokens = state.tokens.at[state.n].set(token)
    return DecodeState(tokens, state.n + 1, cache, key, token == eos_id)


def autoregressive_start(model: Model, tokens, n_prompt, key, prefill_len: int, max_len: int) -> DecodeState:
    """The state before the first step: the cache prefilled with the prompt but its last token."""
    n_prompt = jnp.asarray(n_prompt, jnp.int32)
    return DecodeState(tokens, n_prompt, prefill(model, tokens, n_prompt, prefill_len, max_len), key, jnp.array(False))


@partial(jax.jit, static_argnames=("n_tokens", "prefill_len", "max_len", "eos_id"))
def autoregressive_loop(model, tokens, n_prompt, key, n_tokens, sampling, prefill_len, max_len, eos_id):
    state = autoregressive_start(model, tokens, n_prompt, key, prefill_len, max_len)
    state = jax.lax.while_loop(
        lambda s: (s.n < n_prompt + n_tokens) & ~s.done,
        lambda s: autoregressive_step(model, s, sampling, eos_id),
        state)
    return generated(state.tokens, n_prompt, n_tokens, eos_id)


def autoregressive_sample(model: Model, prompt_tokens, n_tokens: int, key, *, temperature=1.0,
                          top_k=0, top_p=1.0, stop_at_eos=False) -> jax.Array:
    """Sample n_tokens from `model` one at a time, with its KV cache.

    Args:
      model: the Model to sample from.
      prompt_tokens: int [P], P >= 1.
      n_tokens: how many tokens to generate (>= 1); P + n_tokens - 1 must fit in n_positions.
      key: a jax.random key; the same key gives the same tokens.
      temperature, top_k, top_p: see Sampling. temperature=0 is greedy.
      stop_at_eos: stop at <|endoftext|>; the slots after it are filled with <|endoftext|>.
    Returns:
      int32 [n_tokens], the generated tokens (not the prompt).
    """
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, 0, model.config)
    eos_id = model.config.eos_token_id if stop_at_eos else -1  # -1: no token, never stop
    return autoregressive_loop(model, tokens, len(prompt_tokens), key, n_tokens,
                               Sampling(temperature, top_k, top_p), prefill_len, max_len, eos_id)


def generated(tokens, n_prompt, n_tokens: int, eos_id: int):
    """The n_tokens after the prompt, int32 [n_tokens]; every slot after the first eos becomes eos."""
    out = jax.lax.dynamic_slice(tokens, (n_prompt,), (n_tokens,))  # [N]
    is_eos = out == eos_id
    return jnp.where(jnp.cumsum(is_eos) - is_eos > 0, eos_id, out)
