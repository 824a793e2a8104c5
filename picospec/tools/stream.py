"""Running a sampler one iteration at a time, so the CLI and notebooks can show each as it happens.

The step functions are the very ones `speculative_sample` and `autoregressive_sample` loop over inside
`lax.while_loop`; here a Python loop drives them, compiled ahead of time so that compile time is
measured apart, and reads back one small record per iteration.
"""

import inspect
import time
from dataclasses import dataclass, field
from typing import Iterator

import jax
import jax.numpy as jnp

from picospec.gpt2 import Model
from picospec.sampling import DecodeState, Sampling, autoregressive_step, buffers, prefill
from picospec.speculative import Trace, check_pair, speculative_step, start


@dataclass
class Step:
    """What one iteration added. For a speculative iteration, `drafted[:accepted]` were accepted and
    `tokens[-1]` is the resample or bonus; an autoregressive step has only `tokens`."""

    tokens: list[int]  # the tokens appended, cut at n_tokens
    drafted: list[int] = field(default_factory=list)
    accepted: int = 0
    bonus: bool = False
    p: list[float] = field(default_factory=list)  # p[i](d_i), the draft's probability of d_i
    q: list[float] = field(default_factory=list)  # q[i](d_i), the target's
    u: list[float] = field(default_factory=list)  # the uniforms: accept iff u < q / p
    proposed: bool = True  # False: the n-gram draft found nothing and the target stepped alone


@dataclass
class Timing:
    compile_seconds: float = 0.0  # ahead-of-time compilation of prefill and step
    seconds: float = 0.0  # running them: prefill and every iteration


def _compile(fn, *args, static=(), donate=(), **static_values):
    """jit `fn`, compile it for these arguments, and run it once (on copies of the donated ones);
    returns (compiled, seconds it took). XLA:CPU's kernel library finishes preparing a program on its
    first run: on the bundled pair that run takes 40-70 ms more than the next, which is start-up
    (counted with compiling, and in the benchmark's time to first token), not sampling speed."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn, static_argnames=static, donate_argnames=donate).lower(*args, **static_values).compile()
    names = list(inspect.signature(fn).parameters)
    jax.block_until_ready(compiled(*[jax.tree_util.tree_map(lambda x: x.copy(), a) if names[i] in donate else a
                                     for i, a in enumerate(args)]))
    return compiled, time.perf_counter() - t0


def stream_speculative(draft, target: Model, prompt, n_tokens: int, key, *, K: int,
                       sampling: Sampling, eos_id: int = -1, timing: Timing | None = None) -> Iterator[Step]:
    """Yield one Step per iteration of speculative sampling (the same law as speculative_sample)."""
    timing = timing or Timing()
    check_pair(draft, target, K)
    tokens, prefill_len, max_len = buffers(prompt, n_tokens, K, target.config)
    static = dict(K=K, prefill_len=prefill_len, max_len=max_len)
    init, s1 = _compile(start, draft, target, tokens, len(prompt), key, static=tuple(static), **static)
    t0 = time.perf_counter()
    state = jax.block_until_ready(init(draft, target, tokens, len(prompt), key))
    timing.seconds += time.perf_counter() - t0
    step, s2 = _compile(_speculative_step_and_row, draft, target, state, static=("K", "sampling", "eos_id"),
                        donate=("state",), K=K, sampling=sampling, eos_id=eos_id)
    timing.compile_seconds += s1 + s2
    produced = 0
    while produced < n_tokens:
        t0 = time.perf_counter()
        state, row = step(draft, target, state)
        record = step_from_row(jax.device_get(row), n_tokens - produced)  # one small read per iteration
        timing.seconds += time.perf_counter() - t0
        produced += len(record.tokens)
        yield record
        if eos_id in record.tokens:
            break


def _speculative_step_and_row(draft, target, state, K, sampling, eos_id):
    """One iteration, and its row of the trace: the host then reads a few numbers, not the trace."""
    state = speculative_step(draft, target, state, K, sampling, eos_id)
    return state, trace_row(state.trace, state.trace.n_steps - 1)


def trace_row(trace: Trace, i) -> Trace:
    """Row i of every field of a Trace (n_steps stays as it is)."""
    return trace._replace(**{name: getattr(trace, name)[i] for name in Trace._fields if name != "n_steps"})


def step_from_row(row: Trace, n_left: int) -> Step:
    """One row of a Trace as a Step, its tokens cut to the n_left still wanted."""
    tokens = [int(t) for t in row.drafted[:row.n_accepted]] + [int(row.extra)]
    if not row.proposed:
        return Step(tokens[:n_left], proposed=False)
    return Step(tokens[:n_left], row.drafted.tolist(), int(row.n_accepted), bool(row.bonus), row.p.tolist(),
                row.q.tolist(), row.u.tolist())


def trace_steps(trace: Trace, n_tokens: int) -> list[Step]:
    """Every iteration of a Trace (from speculative_sample) as Steps, cut at n_tokens in all."""
    trace, steps = jax.device_get(trace), []
    for i in range(int(trace.n_steps)):
        steps.append(step_from_row(trace_row(trace, i), n_tokens - sum(len(s.tokens) for s in steps)))
    return steps


def stream_autoregressive(model: Model, prompt, n_tokens: int, key, *, sampling: Sampling,
                          eos_id: int = -1, timing: Timing | None = None) -> Iterator[Step]:
    """Yield one Step per token of plain autoregressive sampling."""
    timing = timing or Timing()
    tokens, prefill_len, max_len = buffers(prompt, n_tokens, 0, model.config)
    n = jnp.int32(len(prompt))
    fill, s1 = _compile(prefill, model, tokens, n, static=("prefill_len", "max_len"),
                        prefill_len=prefill_len, max_len=max_len)
    t0 = time.perf_counter()
    state = DecodeState(jnp.asarray(tokens), n, jax.block_until_ready(fill(model, tokens, n)), key,
                        jnp.array(False))
    timing.seconds += time.perf_counter() - t0
    step, s2 = _compile(_autoregressive_step_and_token, model, state, static=("sampling", "eos_id"),
                        donate=("state",), sampling=sampling, eos_id=eos_id)
    timing.compile_seconds += s1 + s2
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        state, token = step(model, state)
        token = int(token)
        timing.seconds += time.perf_counter() - t0
        yield Step([token])
        if token == eos_id:
            break


def _autoregressive_step_and_token(model, state, sampling, eos_id):
    state = autoregressive_step(model, state, sampling, eos_id)
    return state, state.tokens[state.n - 1]
