"""From logits to tokens: the standardized distribution, and plain autoregressive sampling.

Both samplers, autoregressive and speculative, keep the same explicit state: a token buffer whose first
n slots are the sequence so far, and caches holding positions [0, n - 1). The newest token is not in
the cache yet: the next step feeds it, and the logits it returns are the next token's.
"""

import numbers
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from picospec.errors import PicospecError
from picospec.gpt2 import KVCache, Model, forward, init_cache, transformer


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class Sampling:
    """How logits become a distribution: temperature, then top-k, then top-p.

    Under jit the three numbers are traced values, so a new temperature, top-k or top-p runs the
    program already compiled; only `greedy` (temperature 0: an exact argmax) is static."""

    temperature: float = 1.0  # 0 means argmax exactly: a one-hot distribution
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # then keep the fewest most likely tokens whose mass reaches top_p

    def __post_init__(self):
        if isinstance(self.top_k, numbers.Integral) and not isinstance(self.top_k, bool):
            object.__setattr__(self, "top_k", int(self.top_k))  # numpy integers too
        if not self.temperature >= 0:
            raise PicospecError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise PicospecError(f"top-k must be a whole number >= 0 (0 keeps all), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise PicospecError(f"top-p must be in (0, 1] (1 keeps all), got {self.top_p}")
        object.__setattr__(self, "temperature", float(self.temperature))  # one dtype per leaf: one compile
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "greedy", self.temperature == 0)

    def tree_flatten(self):  # the numbers are leaves (traced); greedy is static
        return (self.temperature, self.top_k, self.top_p), self.greedy

    @classmethod
    def tree_unflatten(cls, greedy, leaves):  # traced leaves skip the checks, done when it was made
        sampling = object.__new__(cls)
        for name, value in zip(("temperature", "top_k", "top_p", "greedy"), (*leaves, greedy)):
            object.__setattr__(sampling, name, value)
        return sampling


@jax.jit  # compiled once when called on its own; inside another jitted function, inlined
def logits_to_probs(logits, sampling: Sampling):  # [..., V] -> [..., V]
    if sampling.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
    logits = logits / sampling.temperature
    logits = jax.lax.cond(sampling.top_k > 0, keep_top_k, lambda logits, k: logits, logits, sampling.top_k)
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.lax.cond(sampling.top_p < 1, keep_top_p, lambda probs, p: probs, probs, sampling.top_p)


def keep_top_k(logits, k):  # [..., V], int32 [] k >= 1 -> [..., V]: the k largest (and ties with the k-th)
    desc = -jnp.sort(-logits, axis=-1)  # [..., V] largest first
    kth = jax.lax.dynamic_slice_in_dim(desc, jnp.minimum(k, logits.shape[-1]) - 1, 1, axis=-1)  # [..., 1]
    return jnp.where(logits < kth, -jnp.inf, logits)


def keep_top_p(probs, top_p):  # [..., V], float [] in (0, 1) -> [..., V] renormalized
    desc = -jnp.sort(-probs, axis=-1)  # [..., V] most likely first
    mass_before = jnp.cumsum(desc, axis=-1) - desc  # [..., V]
    # The smallest probability still kept; ties with it are kept too.
    cutoff = jnp.min(jnp.where(mass_before < top_p, desc, 1.0), axis=-1, keepdims=True)
    probs = jnp.where(probs >= cutoff, probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)


@partial(jax.jit, static_argnames="greedy")  # compiled once when called on its own (paper.py); inlined under jit
def sample(key, probs, greedy: bool = False):  # [V] -> int32 []
    """One token drawn from probs; with greedy (temperature 0, a one-hot probs), its argmax."""
    if greedy:
        return jnp.argmax(probs).astype(jnp.int32)
    # Inverse CDF: the first token whose cumulative probability exceeds u ~ U[0, 1). One uniform
    # rather than jax.random.categorical's Gumbel per vocabulary entry (on CPU at V = 50257, 8 us
    # a draw against 2.3 ms). A token of probability 0 adds nothing to the CDF, so it is never drawn. The binary search
    # is unrolled: 16 steps in one kernel on a GPU rather than a loop of 16 launches, as fast on CPU.
    cdf = jnp.cumsum(probs)  # [V]
    u = jax.random.uniform(key) * cdf[-1]
    return jnp.searchsorted(cdf, u, side="right", method="scan_unrolled").astype(jnp.int32)


def normalized(r, fallback):  # [V] -> [V]: r / r.sum(); fallback for an all-zero residual (never drawn from)
    total = r.sum()
    return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), fallback)


def bucket(n: int, cap: int) -> int:
    """The power of two >= n (at least 16), at most cap: prompts of any length compile few shapes."""
    return min(max(16, 1 << (n - 1).bit_length()), cap)


def buffers(prompt_tokens, n_tokens: int, lookahead: int, config) -> tuple[jax.Array, int, int]:
    """Check the run fits in the context, and size it. Returns a token buffer [L] holding the prompt,
    with room for n_tokens plus `lookahead` scratch slots; the padded prompt length to prefill; and
    the cache capacity S. All three are powers of two (or the context), so few shapes compile."""
    P = len(prompt_tokens)
    if P < 1:
        raise PicospecError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    if n_tokens < 1:
        raise PicospecError(f"n-tokens must be >= 1, got {n_tokens}")
    if P + n_tokens + lookahead - 1 > config.n_positions:
        extra = f" + K={lookahead}" if lookahead else ""
        raise PicospecError(f"prompt ({P} tokens) + n-tokens ({n_tokens}){extra} exceeds the model's "
                            f"context of {config.n_positions}; shorten the prompt or ask for fewer tokens")
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


def autoregressive_step(model: Model, state: DecodeState, sampling: Sampling, eos_id: int):
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
      n_tokens: how many tokens to generate; P + n_tokens - 1 must fit in n_positions.
      key: a jax.random key; the same key gives the same tokens.
      temperature, top_k, top_p: see Sampling. temperature=0 is greedy.
      stop_at_eos: stop at <|endoftext|>; the slots after it are filled with <|endoftext|>.
    Returns:
      int32 [n_tokens], the generated tokens (not the prompt).
    """
    sampling = Sampling(temperature, top_k, top_p)
    tokens, prefill_len, max_len = buffers(prompt_tokens, n_tokens, 0, model.config)
    eos_id = eos_to_stop_at(model, stop_at_eos)
    return autoregressive_loop(model, tokens, len(prompt_tokens), key, n_tokens, sampling, prefill_len,
                           max_len, eos_id)


def eos_to_stop_at(model: Model, stop_at_eos: bool) -> int:
    """The token id to stop at, or -1 (no token) when not stopping."""
    if not stop_at_eos:
        return -1
    if model.config.eos_token_id is None:
        raise PicospecError("stop_at_eos needs the model's eos_token_id in its config.json")
    return model.config.eos_token_id


def generated(tokens, n_prompt, n_tokens: int, eos_id: int):
    """The n_tokens after the prompt, int32 [n_tokens]; every slot after the first eos becomes eos."""
    out = jax.lax.dynamic_slice(tokens, (n_prompt,), (n_tokens,))  # [N]
    is_eos = out == eos_id
    return jnp.where(jnp.cumsum(is_eos) - is_eos > 0, eos_id, out)
