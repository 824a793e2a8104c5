"""What flows through the speculative loop (speculative.py): each iteration's proposal (step 1) and
verdict (steps 3 and 4), the loop's state, and the trace of every decision."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec.gpt2 import KVCache


class Proposal(NamedTuple):  # step 1's result
    drafted: jax.Array  # int32 [K] d_0..d_{K-1}
    p: jax.Array  # float32 [K, V] p[i], the distribution d_i was drawn from (a row of zeros: not proposed)
    cache: KVCache  # the draft's cache afterwards


class Verdict(NamedTuple):  # steps 3 and 4's result: the trace records it as it is
    n_accepted: jax.Array  # int32 [] a: the drafts accepted, a leading run
    extra: jax.Array  # int32 []: the token after them, a resample or (after all k) the bonus
    p: jax.Array  # float32 [K] p[i](d_i), the draft's probability of each drafted token
    q: jax.Array  # float32 [K] q[i](d_i), the target's
    u: jax.Array  # float32 [K] the uniforms: d_i is accepted iff u_i < q/p


class Trace(NamedTuple):
    """Every iteration's proposal and verdict, one row per iteration; rows from n_steps on are unused."""

    drafted: jax.Array  # int32 [R, K] d_0..d_{K-1}
    n_accepted: jax.Array  # int32 [R], and the Verdict's other fields, each with a leading [R]
    extra: jax.Array
    p: jax.Array
    q: jax.Array
    u: jax.Array
    n_steps: jax.Array  # int32 [] iterations run = target forward calls


class SpecState(NamedTuple):
    tokens: jax.Array  # int32 [L]: tokens[:n] is the sequence; later slots are scratch
    n: jax.Array  # int32 []: the sequence length
    draft_cache: KVCache  # positions [0, n - 1), or [0, n - 2) after a full accept (see catch_up)
    target_cache: KVCache  # positions [0, n - 1)
    key: jax.Array  # the key the next iteration splits
    done: jax.Array  # bool []: <|endoftext|> was generated (only when stopping at it)
    trace: Trace  # rows [0, trace.n_steps) are filled


def empty_trace(R: int, K: int) -> Trace:
    """Room for R iterations of K drafts."""
    row, rows = jnp.zeros(R, jnp.int32), jnp.zeros((R, K))
    return Trace(jnp.zeros((R, K), jnp.int32), row, row, rows, rows, rows, jnp.int32(0))
