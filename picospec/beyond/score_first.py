"""Step 2 for a draft that proposed k <= K tokens (adaptive.py, next): the target scores only the k + 1
positions it needs, not K + 1, so an iteration that drafts little costs little.

The shapes stay those of K: `score_first` compiles one branch per block size (score_sizes: 1, 4, 8,
... and K + 1 positions) and runs the smallest that holds k + 1. Its branches leave the cache as it
is (`peek`, attending over the cache and their own keys held apart) and the loop writes it once
after them (`append`): a branch that wrote the cache would make XLA copy every cache buffer each call.
"""

import jax
import jax.numpy as jnp

from picospec.beyond.loop import Proposal
from picospec.fastpath import branch_on_cpu
from picospec.gpt2 import KVCache, Model, precision, transformer
from picospec.sampling import Sampling, logits_to_probs


def own(k):  # one sequence: its own k (batch.py swaps in the largest k over the rows stepped together)
    return k


def attention_apart(q, k, v, k_cache, v_cache, q_pos):
    """gpt2.cached_attention that leaves the cache as it is: attend over its slots before q_pos[0] and,
    causally, over this call's own keys and values k, v [H, T, D], held apart. Returns y [T, H, D], k, v."""
    S, T = k_cache.shape[1], q.shape[0]
    scores = lambda keys: jnp.einsum("thd,hsd->hts", q, keys, precision=precision(q.dtype),  # noqa: E731
                                     preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
    old = jnp.where(jnp.arange(S) < q_pos[0], scores(k_cache), -jnp.inf)  # [H, T, S]
    new = jnp.where(jnp.tri(T, dtype=bool), scores(k), -jnp.inf)  # [H, T, T]
    weights = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1).astype(q.dtype)  # [H, T, S + T]
    mix = lambda w, values: jnp.einsum("hts,hsd->htd", w, values, precision=precision(values.dtype),  # noqa: E731
                                       preferred_element_type=jnp.float32)
    y = mix(weights[..., :S], v_cache) + mix(weights[..., S:], v)  # [H, T, D]
    return y.astype(q.dtype).transpose(1, 0, 2), k, v


def peek(model: Model, tokens, cache: KVCache):
    """gpt2.forward that leaves the cache as it is: logits [T, V], and (keys, values) for `append`."""
    logits, keys, values = transformer(model, tokens, cache, attend=attention_apart)
    return logits, (keys, values)


def append(cache: KVCache, keys, values) -> KVCache:
    """The cache with T keys and values (n_layer x [H, T, D] each, from peek) written at [length, length + T)."""
    write = lambda buffer, new: jax.lax.dynamic_update_slice(buffer, new, (0, cache.length, 0))  # noqa: E731
    return KVCache([write(b, k) for b, k in zip(cache.k, keys)], [write(b, v) for b, v in zip(cache.v, values)],
                   cache.length + keys[0].shape[1])


def score_sizes(K: int, least: int = 0) -> list[int]:
    """The numbers of positions score_first compiles for least..K drafts: 1, 4, 8, 16, ... and K + 1, from
    the first that holds least + 1. No 2: on a CPU a product of 2 rows costs what one of 4 does (one pass
    of the matrix library; the bundled pair's iterations: 1.63 and 1.69 target steps), and each size is a
    target call more to compile (the bundled pair's auto iteration: 9.5 s -> 7.6 s)."""
    sizes = [size for size in (2 ** i for i in range(K.bit_length() + 1)) if size < K + 1 and size != 2] + [K + 1]
    return [size for size in sizes if size >= least + 1]


def score_first(target: Model, tokens, n, proposal: Proposal, cache: KVCache, sampling: Sampling, agree=own,
                least: int = 0, peek=peek):
    """Step 2 when only d_0..d_{k-1} were proposed: score the fewest positions of score_sizes(K, least) that
    hold those k + 1 (lax.switch runs one compiled branch per size; a few, as every branch costs a little
    even when it does not run, and each is compiled: least, the fewest drafts a proposal holds, leaves out
    the sizes no proposal needs). Returns q [K+1, V], zero past row k. The branches only read the cache
    (peek), written once after them: a branch that wrote it would make XLA copy every cache buffer each call.
    A `peek` that returns more per position (eagle.py's features) has them padded and returned last."""
    K = proposal.drafted.shape[0]
    k = agree(proposal.k)

    def first(size):  # x[n-1], d_0..d_{size-2}: the drafts past k are padding, after every real one
        def run(cache):
            scored = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), proposal.drafted[:size - 1]])
            logits, (keys, values), *more = peek(target, scored, cache)  # [size, V], n_layer x [H, size, D]
            q = logits_to_probs(logits, sampling)
            pad = lambda x: jnp.pad(x, ((0, 0), (0, K + 1 - size), (0, 0)))  # noqa: E731  [H, K+1, D]
            rows = lambda x: jnp.pad(x, ((0, K + 1 - size), (0, 0)))  # noqa: E731  [K+1, ...]
            return rows(q), [pad(x) for x in keys], [pad(x) for x in values], [rows(x) for x in more]
        return run

    sizes = score_sizes(K, least)
    branch = jnp.sum(jnp.array(sizes) < k + 1)  # the first size that holds k + 1 positions
    q, keys, values, more = branch_on_cpu(lambda cache: jax.lax.switch(branch, [first(size) for size in sizes], cache),
                                    first(sizes[-1]), cache)  # [K+1, V], ...: elsewhere, all K + 1 scored
    q = jnp.where(jnp.arange(K + 1)[:, None] <= k, q, 0.0)  # the rows of d_k.. were not proposed
    return q, append(cache, keys, values), *more  # rows past k + 1 lie beyond the length the loop keeps
