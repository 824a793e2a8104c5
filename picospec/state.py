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
    k: jax.Array | int  # int32 []: drafts proposed, K here (fewer when a draft stops early, adaptive.py)


class Verdict(NamedTuple):  # steps 3 and 4's result: the trace records it as it is
    n_accepted: jax.Array  # int32 [] a: the drafts accepted, a leading run
    extra: jax.Array  # int32 []: the token after them, a resample or (after all k) the bonus
    p: jax.Array  # float32 [K] p[i](d_i), the draft's probability of each drafted token
    q: jax.Array  # float32 [K] q[i](d_i), the target's
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

    @property
    def proposed(self):  # bool [R]: the draft proposed something
        return self.k > 0

    @property
    def bonus(self):  # bool [R]: extra is the bonus (all k accepted), not a resample
        return self.proposed & (self.n_accepted == self.k)


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
    return Trace(jnp.zeros((R, K), jnp.int32), row, row, row, rows, rows, rows, rows, rows, rows, jnp.int32(0))
