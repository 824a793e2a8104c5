"""What the stream runs on the device: every row's state before its first iteration, one iteration of every row
(the state, and the one read the host makes: which rows ran, which still run, what each wrote), and `run_ahead`,
n iterations in one program, with how many a dispatch should hold (`run_ahead_for`)."""

import jax
import jax.numpy as jnp
import numpy as np

from picospec.autoregressive import DecodeState, autoregressive_start, autoregressive_step
from picospec.beyond.batch import (
    batch_drafting,
    batch_start,
    batch_step,
    in_batch,
    keep_finished,
    over_rows,
    unfinished,
)
from picospec.fastpath import branch_on_cpu
from picospec.tools.cli.steps import trace_row


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


def speculative_iteration(draft, target, state, n_end, sampling, idle, K, eos_id, verify, step):
    """Every unfinished row's iteration while the draft drafts; returns the state, and the one read the
    host makes: which rows ran, which still run, the trace row each wrote (all [B]). An iteration where no
    row ran and some still run is one after the draft stopped for good: the host then runs the target's own
    program (`as_decode`) instead. idle: an earlier iteration of this dispatch stepped no row, so none will
    (on the CPU the policy is not asked again: whether it stopped weighs a look's worth, ~50 us a time)."""
    draft = in_batch(draft)
    going = branch_on_cpu(lambda: jax.lax.cond(idle, lambda: jnp.array(False), lambda: batch_drafting(draft, state)),
                          lambda: ~idle & batch_drafting(draft, state))
    state, active = step_rows(lambda row: step(draft, target, row, K, sampling, eos_id, verify), state, n_end, going)
    rows = over_rows(lambda row: trace_row(row.trace, row.trace.n_steps - 1), state)
    rows = rows._replace(finite=state.trace.finite)  # [B, 2]: the rows' flags so far
    return state, as_batch(state, (active, unfinished(state, n_end), rows))


def as_decode(state) -> DecodeState:
    """A speculative state as the target's own (autoregressive_iteration's), for once the draft has stopped for
    good: loop.target_alone's step is autoregressive_step, from the same key, so the tokens are the same."""
    return DecodeState(state.tokens, state.n, state.target_cache, state.key, state.done)


def autoregressive_iteration(model, state, n_end, sampling, idle, eos_id):
    """Every unfinished row's next token; returns the state and (ran, still runs, token), all [B]."""
    state, active = step_rows(lambda row: autoregressive_step(model, row, sampling, eos_id), state, n_end, ~idle)
    newest = over_rows(lambda row: row.tokens[row.n - 1], state)
    return state, as_batch(state, (active, unfinished(state, n_end), newest))


def run_ahead(models, state, n_end, sampling, each, n: int, **options):
    """n iterations of `each` (an iteration above) in one program, their reports stacked [n, ...]: a scan
    of static length, so on an accelerator the device runs all n without waiting for the host, and
    the host pays one dispatch and one read for them. Iterations past the last row's end do nothing, and
    once one steps no row (all finished, or the draft stopped for good) every later one is told so (idle)."""
    def one(carry, _):
        state, idle = carry
        state, report = each(*models, state, n_end, sampling, idle, **options)
        return (state, idle | ~jnp.any(report[0])), report
    (state, _), reports = jax.lax.scan(one, (state, jnp.array(False)), length=n)
    return state, reports


def step_rows(one_row, state, n_end, going):
    """(the state after one_row's step of every unfinished row that is going, those rows [B]). Nothing runs at all
    once none is (a dispatch runs past the last row's end); on an accelerator the step runs all the same,
    branch-free, and keeps every row that was not active as it was."""
    active = unfinished(state, n_end) & going  # [B]
    step = lambda s: batch_step(one_row, s, n_end)  # noqa: E731
    return branch_on_cpu(lambda state: jax.lax.cond(jnp.any(active), step, lambda s: s, state),
                         lambda state: keep_finished(active, step(state), state), state), active


SHOW_EVERY = 0.05  # seconds: a dispatch holds about this much work, at most MOST_AHEAD iterations (run_ahead_for)
MOST_AHEAD = 8
BANDWIDTH = {"cpu": 30e9}  # bytes/s a platform's memory streams (accelerators: 1e12 or more)


def run_ahead_for(read: int, platform: str) -> int:
    """Iterations a dispatch, for an iteration reading `read` bytes of weights: as many as the platform streams in
    SHOW_EVERY, 1 to MOST_AHEAD. A dispatch and a read cost a fixed time (a GPU idles while the host reads) that
    a tiny model's iteration does not hide; GPT-2 1558M's on a CPU (~0.3 s) does, and 8 of them are seconds."""
    return int(np.clip(SHOW_EVERY * BANDWIDTH.get(platform, 1e12) // read, 1, MOST_AHEAD))


def weights_read(models, K: int) -> int:
    """Bytes an iteration reads: a target call, and K draft calls (of an EAGLE head's own weights: the target it
    holds is the target's call's; with it counted, the bundled head's dispatch held 3 iterations, not 8)."""
    *drafts, target = models
    leaves = jax.tree_util.tree_leaves(drafts, is_leaf=lambda x: x is target)  # a head's target: one leaf, left out
    draft = sum(getattr(x, "nbytes", 0) for x in leaves if x is not target)
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(target)) + K * draft
