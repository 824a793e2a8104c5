"""Running the samplers one iteration at a time, so the CLI and notebooks can show each as it happens.

One path for one prompt or many: the state is batched (one prompt a batch of one, held as its row), and every
iteration steps all rows with the very step functions that `speculative_sample` and
`autoregressive_sample` loop over, vmapped as picospec.beyond.batch vmaps them, keeping what the finished
rows produced. Each row's tokens are therefore exactly those of the single-prompt samplers. The
programs are compiled ahead of time, so that compile time is measured apart, and one small read per
iteration comes back to the host.
"""

import inspect
import time
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from picospec.autoregressive import autoregressive_start, autoregressive_step
from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.batch import (
    batch_buffers,
    batch_drafting,
    batch_start,
    batch_step,
    in_batch,
    keep_finished,
    over_rows,
    unfinished,
)
from picospec.beyond.loop import target_alone
from picospec.fastpath import branch_on_cpu
from picospec.gpt2 import Model
from picospec.sampling import Sampling
from picospec.tools import checks
from picospec.tools.autotune.costs import warm
from picospec.tools.cli.steps import Step, cut, step_from_row, trace_row
from picospec.tools.memory import check_memory, compiled_need
from picospec.tools.programs import compiled
from picospec.tools.samplers import as_tree, plug_in, prior_stops, stops_at_once


@dataclass
class Timing:
    compile_seconds: float = 0.0  # ahead-of-time compilation of prefill and step
    seconds: float = 0.0  # running them: prefill and every iteration


def compile_now(fn, *args, donate=(), B=1, warm=True, **static):
    """`fn` compiled for these arguments (programs.py: exported by an earlier run, or traced now), refused
    if B rows of it would not fit in memory, and (warm) run once (on copies of the donated ones); returns
    (compiled, seconds it took). XLA:CPU's kernel library finishes preparing a program on its first run
    (tens of ms on the bundled pair): that is start-up, counted with compiling."""
    t0 = time.perf_counter()
    names = list(inspect.signature(fn).parameters)
    donated = tuple(i for i in range(len(args)) if names[i] in donate)
    program = compiled(fn, args, static, donated)
    copies = sum(x.nbytes for i in donated for x in jax.tree_util.tree_leaves(args[i]))
    check_memory(compiled_need(program) + copies, B)
    copy = partial(jax.device_put, may_alias=False)  # a buffer copy: no small program compiled per shape
    if warm:
        jax.block_until_ready(program(*[jax.tree_util.tree_map(copy, a) if i in donated else a
                                        for i, a in enumerate(args)]))
    return program, time.perf_counter() - t0


def asked(policy, B: int) -> jax.Array:  # samplers.prior_stops, from a saved program: a repeated run traces nothing
    return compiled(prior_stops, (policy,), {"B": B})(policy)


def autoregressive_starts(model, tokens, n_prompt, keys, prefill_len: int, max_len: int):
    """Every row's state before its first step (autoregressive.autoregressive_start, vmapped)."""
    row = lambda x, n, key: autoregressive_start(model, x, n, key, prefill_len, max_len)  # noqa: E731
    return lone(jax.vmap(row)(tokens, n_prompt, keys))


def speculative_starts(draft, target, tokens, n_prompt, keys, K: int, prefill_len: int, max_len: int):
    """Every row's state before its first iteration (batch.batch_start)."""
    return lone(batch_start(draft, target, tokens, n_prompt, keys, K, prefill_len, max_len))


def lone(state):
    """A batch of one held as its row (batch.over_rows says why); larger batches as they are."""
    return jax.tree_util.tree_map(lambda x: x[0], state) if len(state.n) == 1 else state


def as_batch(state, report):  # the host reads [B] arrays, a lone row's as a batch of one
    return report if state.n.ndim else jax.tree_util.tree_map(lambda x: x[None], report)


def speculative_iteration(draft, target, state, n_end, sampling, K, eos_id, verify, step):
    """Every unfinished row's iteration while the draft drafts; returns the state, and the one read the
    host makes: which rows ran, which still run, the trace row each wrote (all [B]), and whether the
    draft still drafts (once it stopped for good, the host runs `target_alone_iteration` instead)."""
    draft = in_batch(draft)
    return rows_iteration(lambda row: step(draft, target, row, K, sampling, eos_id, verify), draft, state, n_end,
                          batch_drafting(draft, state))


def target_alone_iteration(draft, target, state, n_end, sampling, K, eos_id):
    """speculative_iteration once the draft has stopped for good: the target's own steps."""
    draft = in_batch(draft)
    return rows_iteration(lambda row: target_alone(draft, target, row, K, sampling, eos_id), draft, state, n_end, True)


def rows_iteration(one_row, draft, state, n_end, going):
    active = unfinished(state, n_end) & going  # [B]
    state = skip_when_finished(active, lambda s: batch_step(one_row, s, n_end), state)
    rows = over_rows(lambda row: trace_row(row.trace, row.trace.n_steps - 1), state)
    rows = rows._replace(finite=state.trace.finite)  # [B, 2]: the rows' flags so far
    return state, (*as_batch(state, (active, unfinished(state, n_end), rows)), batch_drafting(draft, state))


def autoregressive_iteration(model, state, n_end, sampling, eos_id):
    """Every unfinished row's next token; returns the state and (ran, still runs, token), all [B]."""
    active = unfinished(state, n_end)  # [B]
    state = skip_when_finished(active, lambda s: batch_step(
        lambda row: autoregressive_step(model, row, sampling, eos_id), s, n_end), state)
    newest = over_rows(lambda row: row.tokens[row.n - 1], state)
    return state, as_batch(state, (active, unfinished(state, n_end), newest))


def skip_when_finished(active, step, state):
    """step(state), or nothing at all once every row is finished: the stream dispatches one
    iteration ahead of what it has read, and the last of those finds nothing to do. (On an accelerator it
    runs the step all the same, branch-free, and keeps every row that was not active as it was.)"""
    return branch_on_cpu(lambda state: jax.lax.cond(jnp.any(active), step, lambda s: s, state),
                         lambda state: keep_finished(active, step(state), state), state)


WARM_TOKENS = 4096  # a larger prefill is not run first to warm it: there it would cost more than it spares


def stream(draft, target: Model, prompts, n_tokens: int, keys, *, K: int = 4, sampling: Sampling = Sampling(),
           eos_id: int = -1, timing: Timing | None = None, verify: str = "token",
           policy=None, drafts: int = 1, tree=None, children: str = "iid") -> Iterator[list[Step | None]]:
    """Yield, every iteration, one Step per row (None for a row already finished). draft=None runs
    autoregressive sampling of the target. prompts: B token lists; keys: [B] (row b samples as the
    single-prompt call with keys[b] would). policy: a policy.Policy (K is then K_max); drafts: N
    chains a call (several.py); tree, children: a tree.Shape of K nodes and how they are chosen (tree.py)."""
    timing, pair = timing or Timing(), (draft, target)
    if draft is not None:
        checks.pair(draft, target, K, verify, drafts, policy is not None)
        K, tree = as_tree(K, drafts, tree)
    checks.prompts(prompts, n_tokens, 0 if draft is None else K, target.config)
    if draft is not None:
        draft, step, rule = plug_in(draft, target, K, verify, drafts, policy, tree, children)
    alone = draft is not None and stops_at_once(draft, len(prompts), asked)  # the target's steps from the first: its
    if alone:  # own program and buffers (samplers.stops_at_once), shown as the steps the loop would record
        draft = None
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, 0 if draft is None else K, target.config)
    sizes = dict(prefill_len=prefill_len, max_len=max_len)
    n_end = n_prompt + n_tokens if len(prompts) > 1 else n_prompt[0] + n_tokens  # [B], a lone row's []
    tokens, n_prompt, n_end = jax.device_put((tokens, n_prompt, n_end))  # from the host, as they are
    if draft is None:
        models, iteration, options = (target,), autoregressive_iteration, dict(eos_id=eos_id)
        begin, begin_options = autoregressive_starts, sizes
    else:
        models, iteration, options = (draft, target), speculative_iteration, dict(K=K, eos_id=eos_id, verify=rule,
                                                                                  step=step)
        begin, begin_options = speculative_starts, dict(K=K, **sizes)
    init, s1 = compile_now(begin, *models, tokens, n_prompt, keys, B=len(prompts), **begin_options,
                           warm=len(prompts) * prefill_len <= WARM_TOKENS)
    t0 = time.perf_counter()
    state = jax.block_until_ready(init(*models, tokens, n_prompt, keys))
    prefill_seconds = time.perf_counter() - t0
    step, s2 = compile_now(iteration, *models, state, n_end, sampling, donate=("state",), B=len(prompts), **options)
    if isinstance(models[0], AdaptiveDraft) and models[0].policy.auto:  # each block size auto may score, prepared
        s2 += warm(step, *models, state, n_end, sampling)
    timing.compile_seconds += s1 + s2
    t_start = time.perf_counter() - prefill_seconds  # the clock runs from the prefill, compiling left out
    produced = np.zeros(len(prompts), int)
    state, report = step(*models, state, n_end, sampling)
    while True:
        # Dispatch the next iteration before reading this one's report (the one transfer of an
        # iteration): the device runs it while the host reads, decodes and prints.
        state, next_report = step(*models, state, n_end, sampling)
        ran, running, rows, *drafting = jax.device_get(report)
        if draft is not None:  # nothing sampled from a model that overflowed is shown
            checks.finite(rows, *pair)
        if drafting and not drafting[0] and iteration is speculative_iteration:  # the draft stopped for good
            iteration, options = target_alone_iteration, dict(K=K, eos_id=eos_id)
            step, spent = compile_now(iteration, *models, state, n_end, sampling, donate=("state",),
                                      B=len(prompts), **options)
            timing.compile_seconds, t_start = timing.compile_seconds + spent, t_start + spent
        seconds = time.perf_counter() - t_start
        steps = [None] * len(prompts)
        for b in np.flatnonzero(ran):
            row = jax.tree_util.tree_map(lambda x: x[b], rows)
            steps[b] = (step_from_row(row, n_tokens - produced[b], eos_id) if draft is not None
                        else Step(cut([int(row)], n_tokens - produced[b], eos_id), proposed=not alone))
            steps[b].finished, steps[b].seconds = not running[b], seconds
            produced[b] += len(steps[b].tokens)
        yield steps
        if not running.any():
            break
        report = next_report
    timing.seconds += seconds
