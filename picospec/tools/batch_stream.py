"""Running a batch one iteration at a time, so the CLI can print each row the moment it finishes.

This is what the batched `lax.while_loop` of picospec.batch does, driven from Python: every iteration
steps all rows (a vmap of the single-row step) and keeps the old state of the rows already finished,
so each row's tokens are exactly those of `speculative_sample_batch` (and of the single-prompt call).
"""

import time
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from picospec.batch import batch_buffers, check_memory
from picospec.gpt2 import Model
from picospec.sampling import DecodeState, Sampling, autoregressive_step, prefill
from picospec.speculative import check_pair, speculative_step, start
from picospec.tools.stream import Timing, _compile


@dataclass
class Row:
    """A finished row: its tokens, and how it got them."""

    index: int  # its place in the batch, from 0
    tokens: list[int]  # the generated tokens (cut at eos when stopping there)
    n_steps: int  # iterations it ran: target calls
    accepted: int  # drafts accepted (speculative only)
    drafted: int  # drafts proposed (speculative only)
    seconds: float  # from the batch's first iteration to this row's last


def keep_finished(active, new, old):
    """The batched while_loop's select: rows where active [B] is False keep their old state."""
    def pick(n, o):
        return jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
    return jax.tree_util.tree_map(pick, new, old)


def _spec_iteration(draft, target, state, n_end, K, sampling, eos_id):
    active = (state.n < n_end) & ~state.done  # [B]
    new = jax.vmap(lambda s: speculative_step(draft, target, s, K, sampling, eos_id))(state)
    state = keep_finished(active, new, state)
    return state, ((state.n < n_end) & ~state.done)


def _ar_iteration(model, state, n_end, sampling, eos_id):
    active = (state.n < n_end) & ~state.done
    state = keep_finished(active, jax.vmap(lambda s: autoregressive_step(model, s, sampling, eos_id))(state), state)
    return state, ((state.n < n_end) & ~state.done)


def _ar_start(model, tokens, n_prompt, keys, prefill_len, max_len):
    def one(tokens, n, key):
        return DecodeState(tokens, n, prefill(model, tokens, n, prefill_len, max_len), key, jnp.array(False))
    return jax.vmap(one)(tokens, n_prompt, keys)


def stream_batch(draft, target: Model, prompts, n_tokens: int, keys, *, K: int, sampling: Sampling,
                 eos_id: int = -1, timing: Timing | None = None) -> Iterator[Row]:
    """Yield each row as it finishes. draft=None runs plain autoregressive sampling of the target."""
    timing = timing or Timing()
    lookahead = 0 if draft is None else K
    if draft is not None:
        check_pair(draft, target, K)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, lookahead, target.config)
    check_memory([m for m in (draft, target) if isinstance(m, Model)], len(prompts), max_len, lookahead + 1)
    sizes = dict(prefill_len=prefill_len, max_len=max_len)
    n_end = jnp.asarray(n_prompt + n_tokens)
    if draft is None:
        init, s1 = _compile(_ar_start, target, tokens, n_prompt, keys, static=tuple(sizes), **sizes)
        state_args = (target, tokens, n_prompt, keys)
    else:
        row_start = partial(start, K=K, **sizes)
        batched_start = lambda d, t, x, n, k: jax.vmap(partial(row_start, d, t))(x, n, k)  # noqa: E731
        init, s1 = _compile(batched_start, draft, target, tokens, n_prompt, keys)
        state_args = (draft, target, tokens, n_prompt, keys)
    t0 = time.perf_counter()
    state = jax.block_until_ready(init(*state_args))
    prefill_seconds = time.perf_counter() - t0
    if draft is None:
        step, s2 = _compile(_ar_iteration, target, state, n_end, static=("sampling", "eos_id"), donate=("state",),
                            sampling=sampling, eos_id=eos_id)
        run = lambda state: step(target, state, n_end)  # noqa: E731
    else:
        step, s2 = _compile(_spec_iteration, draft, target, state, n_end, static=("K", "sampling", "eos_id"),
                            donate=("state",), K=K, sampling=sampling, eos_id=eos_id)
        run = lambda state: step(draft, target, state, n_end)  # noqa: E731
    timing.compile_seconds += s1 + s2
    t0 = time.perf_counter() - prefill_seconds  # the clock counts the prefill and the iterations only
    finished = np.zeros(len(prompts), bool)
    seconds = 0.0
    while not finished.all():
        state, active = run(state)
        now = ~np.asarray(active) & ~finished  # one small read per iteration: which rows just finished
        seconds = time.perf_counter() - t0
        if now.any():
            tokens, trace = jax.device_get((state.tokens, getattr(state, "trace", None)))
            for b in np.flatnonzero(now):
                yield _row(tokens, trace, b, n_prompt[b], n_tokens, eos_id, K, seconds)
            t0 += time.perf_counter() - t0 - seconds  # the reading and printing is not sampling
        finished |= now
    timing.seconds += seconds


def _row(tokens, trace, b, n_prompt, n_tokens, eos_id, K, seconds) -> Row:
    """Row b's generated tokens (cut after its first eos) and its trace's totals, from host arrays."""
    out = tokens[b, n_prompt:n_prompt + n_tokens].tolist()
    if eos_id in out:
        out = out[:out.index(eos_id) + 1]
    if trace is None:  # autoregressive: one call per token
        return Row(int(b), out, len(out), 0, 0, seconds)
    n = int(trace.n_steps[b])
    drafted = K * int(trace.proposed[b, :n].sum())
    return Row(int(b), out, n, int(trace.n_accepted[b, :n].sum()), drafted, seconds)
