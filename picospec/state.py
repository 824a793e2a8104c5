"""What flows through the speculative loop: the proposal, the loop's state, and the trace it keeps."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec.gpt2 import KVCache


class Proposal(NamedTuple):
    """What a draft proposes in Step 1 (see speculative.py)."""

    drafted: jax.Array  # int32 [K] d_0..d_{K-1}
    p: jax.Array  # float32 [K, V] p[i], the distribution d_i was drawn from
    cache: KVCache | None  # the draft's cache afterwards (None: a draft without one)
    found: jax.Array | bool = True  # bool []: False when there is nothing to propose


class Trace(NamedTuple):
    """Every accept/reject decision, one row per iteration; rows from n_steps on are unused."""

    drafted: jax.Array  # int32 [R, K] the draft's tokens d_0..d_{K-1}
    n_accepted: jax.Array  # int32 [R] how many of them were accepted (a leading run)
    extra: jax.Array  # int32 [R] the token added after them: a resample, or the bonus
    bonus: jax.Array  # bool [R] True if extra is the bonus (all K accepted), else a resample
    p: jax.Array  # float32 [R, K] p[i](d_i), the draft's probability of each drafted token
    q: jax.Array  # float32 [R, K] q[i](d_i), the target's probability of the same token
    u: jax.Array  # float32 [R, K] the uniforms: d_i is accepted iff u_i < q/p (block: iff u_i < h_i stops there)
    w: jax.Array  # float32 [R, K] block rule: the weight w_i of the block d_0..d_{i-1} (other rules: 0)
    h: jax.Array  # float32 [R, K] block rule: the chance h_i to stop after i drafts (other rules: 0)
    proposed: jax.Array  # bool [R] False: the draft proposed nothing, a plain target step ran
    k: jax.Array  # int32 [R] drafts proposed: K, or fewer when a policy stopped the draft (adaptive.py)
    n_steps: jax.Array  # int32 [] iterations run = target forward calls


class SpecState(NamedTuple):
    tokens: jax.Array  # int32 [L]: tokens[:n] is the sequence; later slots are scratch
    n: jax.Array  # int32 []: the sequence length
    draft_cache: KVCache | None  # positions [0, n - 1), or [0, n - 2) after a full accept (see catch_up);
    #                             None for the n-gram draft
    target_cache: KVCache  # positions [0, n - 1)
    key: jax.Array  # the key the next iteration splits
    done: jax.Array  # bool []: <|endoftext|> was generated (only when stopping at it)
    trace: Trace  # rows [0, trace.n_steps) are filled


def empty_trace(R: int, K: int) -> Trace:
    """Room for R iterations of K drafts."""
    return Trace(jnp.zeros((R, K), jnp.int32), jnp.zeros(R, jnp.int32), jnp.zeros(R, jnp.int32), jnp.zeros(R, bool),
                 jnp.zeros((R, K)), jnp.zeros((R, K)), jnp.zeros((R, K)), jnp.zeros((R, K)), jnp.zeros((R, K)),
                 jnp.zeros(R, bool), jnp.zeros(R, jnp.int32), jnp.int32(0))


def record(t: Trace, drafted, a, extra, bonus, p_x, q_x, u, w, h, proposed, k) -> Trace:
    """The trace with this iteration written at row n_steps."""
    i = t.n_steps
    return Trace(t.drafted.at[i].set(drafted), t.n_accepted.at[i].set(a), t.extra.at[i].set(extra),
                 t.bonus.at[i].set(bonus), t.p.at[i].set(p_x), t.q.at[i].set(q_x), t.u.at[i].set(u),
                 t.w.at[i].set(w), t.h.at[i].set(h), t.proposed.at[i].set(proposed), t.k.at[i].set(k), i + 1)


def advance(state: SpecState, drafted, a, extra, draft_cache, target_cache: KVCache, trace: Trace,
            eos_id: int) -> SpecState:
    """Step 5 (speculative.py): append d_0..d_{a-1} (drafted int32 [K]) and the extra token, then roll
    both caches back to the new length minus one; done if <|endoftext|> (eos_id) was appended."""
    K, n = drafted.shape[0], state.n
    new = jnp.concatenate([drafted, drafted[:1]]).at[a].set(extra)  # [K+1]; slots after a: scratch
    tokens = jax.lax.dynamic_update_slice(state.tokens, new, (n,))
    n_new = n + a + 1
    done = jnp.any((new == eos_id) & (jnp.arange(K + 1) <= a))
    return SpecState(tokens, n_new, rollback(draft_cache, n_new - 1), target_cache._replace(length=n_new - 1),
                     state.key, done, trace)


def rollback(cache: KVCache | None, length):
    """A draft's cache cut back to at most `length` positions (the n-gram draft has no cache)."""
    return None if cache is None else cache._replace(length=jnp.minimum(cache.length, length))
