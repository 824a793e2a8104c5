"""The costs `--K auto` weighs (picospec/beyond/policy.py): the time of one speculative iteration that
drafts k tokens, for k = 0..K_max (k = 0: the target steps alone), for a batch of B rows, and of the
draft's prefill (what a first look at alpha pays beyond its iteration; a policy that stops at once skips it).

They depend on the machine, the pair, the batch size and how tokens are sampled, not on the prompt,
so they are timed once, at start-up, and kept in costs.json in the compile cache's folder (jit_cache.py),
keyed by the device, both models' shapes and dtypes, K_max, the cache capacity, B, the sampling
mode and picospec's source (an edit may change what an iteration costs). Deleting the file only costs
the timing again. A batch makes the target's call compute-bound
sooner, so v(k) climbs with B and k = 0 wins more often.

They are timed in place: auto's own compiled iteration (adaptive_step with the policy), with k
forced, run over and over from one state; for k = 0 the iteration the loop runs once the draft has
stopped for good (loop.target_alone). The theory's k c + v(k) counts forward calls only; in
place, the sampling, the verifier and the bookkeeping count too (on the bundled pair a draft step
costs ~0.3 of a target call in place, against ~0.22 for its forward call alone), and so does every
block size of score_first. So the Policy gets c = 0 and v(k) = that iteration's time.

The CLI streams (stream.py): it calls the iteration once per iteration and reads its report, where
speculative_sample runs every iteration inside one call. `streamed` costs add what that does to each
iteration, the same for every k (~0.5 ms on the bundled pair, a tenth of an iteration drafting 6);
left out, they undercount the fixed part of every iteration and auto drafts too little.
"""

import dataclasses
import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond import adaptive
from picospec.beyond.batch import ROWS, in_batch
from picospec.beyond.loop import start, target_alone
from picospec.beyond.policy import Policy
from picospec.beyond.score_first import score_sizes
from picospec.beyond.verifiers import accept_or_resample
from picospec.gpt2 import Model
from picospec.sampling import Sampling
from picospec.tools.autotune.cost_model import never_less, per_block, settled, worth_timing
from picospec.tools.jit_cache import remembered
from picospec.tools.memory import run_device
from picospec.tools.programs import source_digest
from picospec.tools.samplers import plug_in


def describe(model) -> str:
    if not isinstance(model, Model):
        return type(model).__name__
    c = model.config
    return (f"L{c.n_layer}H{c.n_head}C{c.n_embd}V{c.vocab_size}P{c.n_positions}"
            f"-{model.params['wte']['weight'].dtype}")


@partial(jax.jit, static_argnames=("K", "step"), donate_argnames=("state",))
def _iterations(draft, target, state, K: int, sampling: Sampling, calls, step):
    """`calls` iterations of `step` on every row of `state` [B, ...], each from the rows' sequences
    again (the keys, the buffers and the traces carry over, so nothing is computed for nothing)."""
    draft = in_batch(draft)

    def one(_, s):
        after = jax.vmap(lambda row: step(draft, target, row, K, sampling, -1, accept_or_resample), axis_name=ROWS)(s)
        return after._replace(n=state.n, done=state.done,
                              draft_cache=after.draft_cache._replace(length=state.draft_cache.length),
                              target_cache=after.target_cache._replace(length=state.target_cache.length))
    return jax.lax.fori_loop(0, calls, one, state)


def race_laps(rounds=3, *, warm=True, first=0, **contenders) -> tuple[list, dict]:
    """The contenders called in turn, round after round, so that a slow spell on a shared machine slows
    them alike, and every other round (counted from `first`) in the reverse order: a place in the round
    tells on a time (the same program raced against itself, always second, ran ~2% slower). Returns
    ([{name: seconds} for each round], {name: first call, which warms up and compiles; none when not `warm`})."""
    def seconds(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    warmup = {name: seconds(fn) for name, fn in contenders.items()} if warm else {}
    names = list(contenders)
    return [{name: seconds(contenders[name]) for name in (names if (first + r) % 2 == 0 else names[::-1])}
            for r in range(rounds)], warmup


def force(draft: adaptive.AdaptiveDraft, k: int) -> adaptive.AdaptiveDraft:
    """The draft whose Policy chooses k whatever alpha is (the same program: a policy is data)."""
    v = jnp.where(jnp.arange(draft.policy.v.shape[0]) == k, 1.0, jnp.inf).astype(jnp.float32)
    return dataclasses.replace(draft, policy=dataclasses.replace(draft.policy, v=v))


def warm(iteration, draft, target, state, n_end, sampling) -> float:
    """Run stream.py's compiled `iteration` once for every block size the target may score (score_first's
    lax.switch) on copies of the state; returns the seconds. XLA:CPU prepares each branch on its first
    run, ~25 ms a branch on the bundled pair: start-up work, left out it lands in the first iteration
    that drafts that many."""
    t0, copy = time.perf_counter(), partial(jax.device_put, may_alias=False)
    for size in score_sizes(draft.policy.v.shape[0] - 1, least=1):  # k = size - 1 >= 1 drafts
        jax.block_until_ready(iteration(force(draft, size - 1), target, jax.tree_util.tree_map(copy, state), n_end,
                                        sampling))
    return time.perf_counter() - t0


LAP_SECONDS = 0.1  # each k's lap of iterations lasts at least this long
ROUNDS = 5, 20  # rounds of laps: at least, and at most while c is not settled to PRECISION
PRECISION = 0.03  # of v(0), the standard error wanted of what a draft adds (cost_model.settled)


def measure(draft, target: Model, K_max: int, capacity: int, sampling: Sampling, B: int = 1,
            streamed: bool = False) -> dict:
    """{"v": [seconds per iteration of B rows that drafts k, for k = 0..K_max], "prefill": seconds of the
    draft's prefill of B prompts of 16 tokens (what a short prompt is padded to)}, timed now: each k worth
    timing (cost_model.worth_timing) runs n iterations a lap (n doubled until a lap takes LAP_SECONDS, so
    the call's own fixed cost, ~4 ms on the bundled pair, hardly counts), all raced in turn, round after
    round, until the rounds settle what a draft adds (cost_model.settled). Returned: the median over the
    rounds of each k's time over k = 0's in the same round, times k = 0's median, and so the prefill's;
    v then given the shape an iteration's time has (cost_model.py), the k not timed included.
    streamed: each plus what a call and a read of its report per iteration add, the k = 0 lap run so
    against in one call."""
    P = max(1, min(32, capacity - K_max - 2))  # a prompt, leaving room for an iteration's tokens

    wrapped, step, _ = plug_in(draft, target, K_max, policy=Policy(jnp.float32(0), jnp.ones(K_max + 1),
                                                                     jnp.float32(0), 0))
    forced = partial(force, wrapped)
    state = jax.vmap(lambda key: start(wrapped, target, jnp.ones(capacity, jnp.int32), P, key, K_max, P, capacity))(
        jax.random.split(jax.random.key(0), B))

    def run(k, n, per=None):  # k = 0: the iteration once the draft stopped for good, the target alone
        iteration, copy = step if k > 0 else target_alone, partial(jax.device_put, may_alias=False)

        def laps():  # n iterations in one call, or (per = 1) one call each, its report read as stream.py does
            s = jax.tree_util.tree_map(copy, state)  # _iterations donates its state
            for _ in range(n // (per or n)):
                s = _iterations(forced(k), target, s, K_max, sampling, per or n, iteration)
                jax.device_get(s.trace.n_steps)
            return jax.block_until_ready(s)
        return laps

    short = min(16, capacity)
    fill = jax.jit(jax.vmap(lambda tokens: wrapped.draft.prefill(tokens, short, short, capacity)))

    def prefills(n):
        return lambda: [jax.block_until_ready(fill(state.tokens)) for _ in range(n)]

    ks = worth_timing(K_max)
    runs, calls = {}, {}
    for name, laps in [(str(k), partial(run, k)) for k in ks] + [("prefill", prefills)]:
        n = 1
        while race_laps(1, once=laps(n))[0][0]["once"] < LAP_SECONDS:
            n *= 2
        runs[name], calls[name] = laps(n), n
    if streamed:  # k = 0 once more, one call an iteration: what streaming adds to every iteration
        runs["per call"], calls["per call"] = run(0, calls["0"], per=1), calls["0"]

    def per_call(laps):
        return [{name: lap[name] / calls[name] for name in runs} for lap in laps]

    def v(t):  # [K_max + 1]: one round's (or the medians') time of each k, NaN for a k left to the fit
        return [t[str(k)] if k in ks else float("nan") for k in range(K_max + 1)]

    laps = race_laps(ROUNDS[0], **runs)[0]
    while len(laps) < ROUNDS[1] and not settled([np.divide(v(t), t["0"]) for t in per_call(laps)], PRECISION):
        laps += race_laps(1, warm=False, first=len(laps), **runs)[0]
    rounds = per_call(laps)
    alone = statistics.median(t["0"] for t in rounds)
    extra = statistics.median(t["per call"] - t["0"] for t in rounds) if streamed else 0.0
    relative = {name: alone * statistics.median(t[name] / t["0"] for t in rounds) for name in runs}
    timed = [extra + x for x in v(relative)]
    return {"v": never_less(per_block(timed)), "prefill": relative["prefill"]}


def costs(draft, target: Model, K_max: int, capacity: int, sampling: Sampling, B: int = 1,
          streamed: bool = False) -> dict:
    """measure(...), or what an earlier run on this machine measured for the same pair and sizes."""
    return remembered(kept_as(draft, target, K_max, capacity, sampling, B, streamed),
                      lambda: measure(draft, target, K_max, capacity, sampling, B, streamed))


def kept_as(draft, target: Model, K_max: int, capacity: int, sampling: Sampling, B: int, streamed: bool) -> str:
    """The key in costs.json of these costs."""
    device = run_device()
    mode = "greedy" if sampling.greedy else f"sampled-k{sampling.top_k > 0:d}-p{sampling.top_p < 1:d}"
    return (f"{device.platform}:{device.device_kind}:{describe(draft)}:{describe(target)}:K{K_max}:S{capacity}"
            f":B{B}:{mode}:src{source_digest()[:16]}:iterations{':streamed' if streamed else ''}")


def auto_policy(draft, target: Model, K_max: int, capacity: int, sampling: Sampling,
                threshold: float = 0.0, B: int = 1, streamed: bool = False) -> Policy:
    """The Policy for `--K auto` on B rows: this machine's iteration times (c = 0, v(k) = an iteration
    drafting k, k = 0..K_max, in milliseconds; streamed: as the CLI runs it), the draft's prefill, and the
    confidence threshold."""
    timed = min(B, TIMED_ROWS)
    seconds = costs(draft, target, K_max, capacity, sampling, timed, streamed)
    scale = 1e3 * B / timed  # milliseconds, and a larger batch's share of the rows timed
    return Policy(jnp.float32(0), jnp.float32(np.asarray(seconds["v"]) * scale), jnp.float32(threshold),
                  prefill=jnp.float32(seconds["prefill"] * scale))


TIMED_ROWS = 64  # a larger batch is timed at this many rows, its costs scaled by its rows (compute-bound there)
