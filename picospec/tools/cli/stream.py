"""Running the samplers one iteration at a time, so the CLI and notebooks can show each as it happens.

One path for one prompt or many: the state is batched (one prompt a batch of one, held as its row), and every
iteration steps all rows with the very step functions that `speculative_sample` and
`autoregressive_sample` loop over, vmapped as picospec.beyond.batch vmaps them, keeping what the finished
rows produced. Each row's tokens are therefore exactly those of the single-prompt samplers. The
programs (iterations.py) are compiled ahead of time, so that compile time is measured apart; a dispatch
runs several iterations, and one small read per dispatch comes back to the host.
"""

import dataclasses
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import jax
import numpy as np

from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.batch import batch_buffers
from picospec.beyond.score_first import score_sizes
from picospec.gpt2 import Model
from picospec.sampling import Sampling
from picospec.tools import checks, draft_checks
from picospec.tools.cli import iterations as on_device
from picospec.tools.cli.steps import Step, cut, step_from_row
from picospec.tools.memory import check_memory, compiled_need, run_device
from picospec.tools.programs import compiled
from picospec.tools.samplers import as_tree, plug_in


@dataclass
class Timing:
    compile_seconds: float = 0.0  # ahead-of-time compilation of prefill and step (and tuning --K auto)
    seconds: float = 0.0  # running them: prefill and every iteration
    tuned: dict | None = None  # what it was tuned from (autotune.tune)


def compile_now(fn, *args, donate=(), B=1, warm=True, **static):
    """(`fn` compiled for these arguments (programs.py), seconds it took), refused if B rows would not fit in
    memory, and (warm) run once on copies of the donated ones: XLA:CPU's kernel library finishes preparing a
    program on its first run (tens of ms on the bundled pair), start-up counted with compiling."""
    t0 = time.perf_counter()
    donated = tuple(i for i, name in enumerate(inspect.signature(fn).parameters) if name in donate)
    program = compiled(fn, args, static, donated)
    copies = sum(x.nbytes for i in donated for x in jax.tree_util.tree_leaves(args[i]))
    check_memory(compiled_need(program) + copies, B)
    if warm:  # copy: a buffer copy, no small program compiled per shape
        jax.block_until_ready(program(*[jax.tree_util.tree_map(copy, a) if i in donated else a
                                        for i, a in enumerate(args)]))
    return program, time.perf_counter() - t0


def force(draft, k: int):
    """The AdaptiveDraft whose Policy chooses k whatever alpha is (the same program: a policy is data). Made
    with numpy: jnp's operations would each compile a small program on a first run (~0.05 s each)."""
    v = np.where(np.arange(draft.policy.v.shape[0]) == k, 1.0, np.inf).astype(np.float32)
    return dataclasses.replace(draft, policy=dataclasses.replace(draft.policy, v=v))


def warm(step, draft, target, state, n_end, sampling):
    """Run the compiled iteration once for every block size the target may score (score_first's
    lax.switch) on copies of the state. XLA:CPU prepares each branch on its first run, ~25 ms a branch on
    the bundled pair: start-up work, left out it lands in the first iteration that drafts that many."""
    for size in score_sizes(draft.policy.v.shape[0] - 1, least=1):  # k = size - 1 >= 1 drafts
        jax.block_until_ready(step((force(draft, size - 1), target), jax.tree_util.tree_map(copy, state), n_end,
                                   sampling))


copy = partial(jax.device_put, may_alias=False)  # a buffer copy: the programs donate their state


WARM_TOKENS = 4096  # a larger prefill is not run first to warm it: there it would cost more than it spares


def stream(draft, target: Model, prompts, n_tokens: int, keys, *, K: int = 4, sampling: Sampling = Sampling(),
           eos_id: int = -1, timing: Timing | None = None, verify: str = "token",
           policy=None, drafts: int = 1, tree=None, children: str = "iid", tune=None) -> Iterator[list[Step | None]]:
    """Yield, every iteration, one Step per row (None for a row already finished). draft=None runs
    autoregressive sampling of the target. prompts: B token lists; keys: [B] (row b samples as the
    single-prompt call with keys[b] would). policy: a policy.Policy (K is then K_max); drafts: N
    chains a call (several.py); tree, children: a tree.Shape of K nodes and how they are chosen (tree.py);
    tune: autotune.tune, which fills in the policy from the compiled iterations (--K auto)."""
    timing, pair = timing or Timing(), (draft, target)
    if draft is not None:
        draft_checks.pair(draft, target, K, verify, drafts, policy is not None)
        K, tree = as_tree(K, drafts, tree)
        draft, step, rule = plug_in(draft, target, K, verify, drafts, policy, tree, children)
    checks.prompts(prompts, n_tokens, 0 if draft is None else K, target.config)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, 0 if draft is None else K, target.config)
    sizes = dict(prefill_len=prefill_len, max_len=max_len)
    n_end = n_prompt + n_tokens if len(prompts) > 1 else n_prompt[0] + n_tokens  # [B], a lone row's []
    tokens, n_prompt, n_end = jax.device_put((tokens, n_prompt, n_end))  # from the host, as they are
    if draft is None:
        models, iteration, options = (target,), on_device.autoregressive_iteration, dict(eos_id=eos_id)
        begin, begin_options = on_device.autoregressive_starts, sizes
    else:
        models, iteration = (draft, target), on_device.speculative_iteration
        options = dict(K=K, eos_id=eos_id, verify=rule, step=step)
        begin, begin_options = on_device.speculative_starts, dict(K=K, **sizes)
    t_compiling = time.perf_counter()  # compiling, and (--K auto) tuning: all but the prefill the clock starts from
    init, _ = compile_now(begin, *models, tokens, n_prompt, keys, B=len(prompts), **begin_options,
                          warm=len(prompts) * prefill_len <= WARM_TOKENS)

    def started(models):  # (every row's state before its first iteration, the seconds the prefill took)
        t0 = time.perf_counter()
        return jax.block_until_ready(init(*models, tokens, n_prompt, keys)), time.perf_counter() - t0
    state, prefill_seconds = started(models)
    platform = run_device().platform
    n = on_device.run_ahead_for(on_device.weights_read(models, 0 if draft is None else K), platform)

    def program(models, state, iteration, options, n=n):  # n iterations a dispatch, compiled: (it, seconds)
        return compile_now(on_device.run_ahead, models, state, n_end, sampling, donate=("state",), B=len(prompts),
                           each=iteration, n=n, **options)

    n_alone = on_device.run_ahead_for(on_device.weights_read((target,), 0), platform)

    def alone_program():  # the target's own steps, once the draft has stopped for good (k = 0)
        return program((target,), on_device.as_decode(state), on_device.autoregressive_iteration,
                       dict(eos_id=eos_id), n=n_alone)
    if tune is not None:  # auto times k = 0 too, the target's own program, compiled beside the other (XLA lets go
        alone_compiled = ThreadPoolExecutor(1).submit(alone_program)  # of the GIL: the two compile on two cores)
    step, _ = program(models, state, iteration, options)
    if isinstance(models[0], AdaptiveDraft) and models[0].policy.auto:  # each block size auto may score, prepared
        warm(step, *models, state, n_end, sampling)  # (tuned or not: kept costs run no laps that would)
    if tune is not None:  # time the compiled iterations, and start again with the policy they tune
        alone = alone_compiled.result()[0]
        alone_step = lambda models, state, *rest: alone((models[-1],), on_device.as_decode(state), *rest)  # noqa: E731
        draft, timing.tuned = tune(step, alone_step, models, init, tokens, n_prompt, keys, n_end, sampling)
        models = (draft, target)
        state, prefill_seconds = started(models)
    timing.compile_seconds += time.perf_counter() - t_compiling - prefill_seconds
    t_start = time.perf_counter() - prefill_seconds  # the clock runs from the prefill, compiling left out
    produced, most = np.zeros(len(prompts), int), n * ((0 if draft is None else K) + 1)  # tokens n iterations add
    state, report = step(models, state, n_end, sampling)
    while True:
        # Dispatch the next n iterations before reading these (one transfer), for the device to run while the
        # host reads and prints; only when some row surely wants more than these can add (no idle dispatch).
        ahead = (n_tokens - produced).max() > most
        if ahead:
            state, next_report = step(models, state, n_end, sampling)
        drafting = iteration is on_device.speculative_iteration
        ran, running, rows = jax.device_get(report)  # [n, B] each; rows: a Trace of [n, B] fields, or tokens
        for i in np.flatnonzero(ran.any(-1)):
            if drafting and not rows.finite[i].all():  # nothing sampled from a model that overflowed
                checks.finite(jax.tree_util.tree_map(lambda x: x[i], rows), *pair)  # is shown: this raises
            seconds = time.perf_counter() - t_start
            steps = [None] * len(prompts)
            for b in np.flatnonzero(ran[i]):
                row = jax.tree_util.tree_map(lambda x: x[i, b], rows)
                steps[b] = (step_from_row(row, n_tokens - produced[b], eos_id) if drafting
                            else Step(cut([int(row)], n_tokens - produced[b], eos_id), proposed=draft is None))
                steps[b].finished, steps[b].seconds = not running[i, b], seconds
                produced[b] += len(steps[b].tokens)
            yield steps
        if not running[-1].any():
            break
        if drafting and not ran[-1].any():  # the draft stopped for good (no row stepped): the target's own program
            (step, spent), models, state = alone_program(), (target,), on_device.as_decode(state)  # from here on
            timing.compile_seconds, t_start, most = timing.compile_seconds + spent, t_start + spent, n_alone
            iteration = on_device.autoregressive_iteration
            state, next_report = step(models, state, n_end, sampling)  # (a dispatch ahead stepped no row)
        elif not ahead:
            state, next_report = step(models, state, n_end, sampling)
        report = next_report
    timing.seconds += seconds
