"""Many prompts at once: one loop over a batch of rows, each row stepped by the single-prompt step.

Each row is its own sequence, with its own prompt length, key, sequence length n and cache lengths.
An iteration runs the step the single-prompt loop runs (`speculative_step`, a later chapter's, or
`autoregressive_step`), vmapped over the rows: every weight product becomes one product over all B x T rows (one
GEMM per weight, not B of them), and each row's cache write lands at its own position. The loop goes
on while any row is unfinished; rows accept different numbers of drafts per iteration, reach n_tokens
after different numbers of iterations, or stop at <|endoftext|>.

Why not vmap the single-prompt loop itself? Under vmap, a `while_loop` whose condition differs per
row keeps each finished row's state with a select over the whole loop state: every KV cache copied,
every iteration. Here the loop has one condition for the batch, and `keep_finished` selects only
the small part of a finished row's state; its caches take the step's writes, which land beyond
the row's length (stale slots) and are never read again.

So row b of the batch is `speculative_sample(draft, target, prompts[b], n_tokens, keys[b])`: the same
tokens and the same decisions; the recorded probabilities agree to float32 rounding (a batched product
may add in another order). The one exception is by design: `--K auto` chooses one k for all the rows,
the one that finishes the batch soonest rather than the best for each row alone. Only the buffers are padded to
the longest row; the padding is never read.
(picospec.tools.samplers holds the entry points that check the inputs, memory and devices first.)
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from picospec.autoregressive import autoregressive_start, autoregressive_step, buffers, generated
from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.loop import drafting, speculative_step, start, target_alone
from picospec.speculative import accept_or_resample


def batch_buffers(prompts, n_tokens: int, lookahead: int, config) -> tuple[np.ndarray, np.ndarray, int, int]:
    """`autoregressive.buffers` for B prompts of different lengths: token buffers int32 [B, L] (row b
    holds prompt b), prompt lengths int32 [B], and the longest row's prefill length and cache capacity."""
    rows = [buffers(prompt, n_tokens, lookahead, config) for prompt in prompts]
    L = max(len(tokens) for tokens, _, _ in rows)
    tokens = np.zeros((len(prompts), L), np.int32)  # [B, L]
    for b, (row, _, _) in enumerate(rows):
        tokens[b, :len(row)] = row
    n_prompt = np.array([len(p) for p in prompts], np.int32)  # [B]
    return tokens, n_prompt, max(r[1] for r in rows), max(r[2] for r in rows)


def unfinished(state, n_end):  # [B]: rows still short of n_end tokens and not stopped at eos
    return (state.n < n_end) & ~state.done


def keep_finished(active, new, old):
    """The batch after a step: rows where active [B] is False keep their tokens, length, key, done
    and trace count and flags. Everything else takes the step's writes, which for a finished row land where
    nothing is read: cache slots beyond its length, the trace row past its count."""
    def keep(n, o):  # [B, ...]
        return jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
    kept = {name: keep(getattr(new, name), getattr(old, name)) for name in ("tokens", "n", "key", "done")}
    if hasattr(new, "trace"):
        kept["trace"] = new.trace._replace(n_steps=keep(new.trace.n_steps, old.trace.n_steps),
                                           finite=keep(new.trace.finite, old.trace.finite))
    return new._replace(**kept)


ROWS = "rows"  # the vmapped axis's name


def furthest(k):
    """The largest k of the rows stepped together: in a batch, an AdaptiveDraft drafts, and the target
    scores, as far as the row that goes furthest needs (each row keeps its own drafts); and `--K auto`
    weighs each k by the time its slowest row would take, the batch's."""
    return jax.lax.pmax(k, ROWS)


def together(x):
    """The sum over the rows stepped together: in a batch, `--K auto` counts the drafts all rows judged
    (before k = 0, final, may be chosen)."""
    return jax.lax.psum(x, ROWS)


def in_batch(draft):
    """The draft as the rows stepped together run it."""
    return dataclasses.replace(draft, agree=furthest, pool=together) if isinstance(draft, AdaptiveDraft) else draft


def over_rows(f, state):
    """f, one row's function, vmapped over the rows, named ROWS so that they can agree. A batch of one
    may be held as the row itself (n: int32 []): f then takes it as it is, the vmap only naming the
    axis. (XLA:CPU writes a cache of a batch of one at two shapes and so copies every cache buffer
    each step: the tiny pair's 5 MB a token, 124M's 24 MB; a row held as itself copies none.)"""
    if state.n.ndim == 0:
        return jax.vmap(lambda _: f(state), axis_name=ROWS, out_axes=None)(jnp.zeros(1))
    return jax.vmap(f, axis_name=ROWS)(state)


def batch_step(step, state, n_end):
    """One iteration of every unfinished row: `step` (one row's iteration) vmapped. n_end: int32 [B]."""
    return keep_finished(unfinished(state, n_end), over_rows(step, state), state)


def batch_loop(step, state, n_end, going=lambda s: True):
    """batch_step while any row is unfinished (and `going`)."""
    return jax.lax.while_loop(lambda s: jnp.any(unfinished(s, n_end)) & going(s), lambda s: batch_step(step, s, n_end),
                              state)


def batch_start(draft, target, tokens, n_prompt, keys, K: int, prefill_len: int, max_len: int):
    """loop.start for every row, the rows deciding together (whether the draft runs at all)."""
    row = lambda x, n, key: start(in_batch(draft), target, x, n, key, K, prefill_len, max_len)  # noqa: E731
    return jax.vmap(row, axis_name=ROWS)(tokens, n_prompt, keys)


def batch_drafting(draft, state):  # bool []: the rows' draft has not stopped for good (they stop together)
    return jnp.all(over_rows(lambda row: drafting(draft, row), state))


@partial(jax.jit, static_argnames=("n_tokens", "K", "prefill_len", "max_len", "eos_id", "verify", "step"))
def speculative_batch(draft, target, tokens, n_prompt, keys, n_tokens, K, sampling, prefill_len, max_len, eos_id,
                      verify=accept_or_resample, step=speculative_step):
    """speculative_loop for every row: tokens [B, L], n_prompt [B], keys [B] -> ([B, n_tokens], Trace [B, ...])."""
    state = batch_start(draft, target, tokens, n_prompt, keys, K, prefill_len, max_len)
    draft, n_end = in_batch(draft), n_prompt + n_tokens
    state = batch_loop(lambda row: step(draft, target, row, K, sampling, eos_id, verify), state, n_end,
                       partial(batch_drafting, draft))
    if draft.may_stop:  # what is left after it stopped: the target alone
        state = batch_loop(lambda row: target_alone(draft, target, row, K, sampling, eos_id), state, n_end)
    return jax.vmap(lambda x, n: generated(x, n, n_tokens, eos_id))(state.tokens, n_prompt), state.trace


@partial(jax.jit, static_argnames=("n_tokens", "prefill_len", "max_len", "eos_id"))
def autoregressive_batch(model, tokens, n_prompt, keys, n_tokens, sampling, prefill_len, max_len, eos_id):
    """autoregressive_loop for every row: tokens [B, L], n_prompt [B], keys [B] -> [B, n_tokens]."""
    state = jax.vmap(lambda x, n, key: autoregressive_start(model, x, n, key, prefill_len, max_len))(
        tokens, n_prompt, keys)
    state = batch_loop(lambda s: autoregressive_step(model, s, sampling, eos_id), state, n_prompt + n_tokens)
    return jax.vmap(lambda x, n: generated(x, n, n_tokens, eos_id))(state.tokens, n_prompt)

