"""`--K auto`'s costs and prior, read off the run's own compiled programs: laps of iterations, k forced.

The CLI compiles the iterations it will run before it runs them (cli/stream.py). Auto times those very
programs, so nothing else is compiled and what is timed is what runs, streaming included: a lap is one
dispatch (n iterations) from a copy of a state, the policy forced to draft k (a policy is data: the same
program), and for k = 0 the program the loop runs once the draft has stopped, the target alone.
Every k of cost_model.worth_timing laps in turn, round after round, so that a slow spell slows them
alike. Each k's fastest lap is kept (a busy machine only ever makes a lap slower), and over k = 0's
fastest: v(k) in units of the target's own iteration. Only these ratios are weighed (a machine twice as
slow today decides alike), given the shape an iteration's time has (cost_model.py), raised by their own
spread (how far half the rounds move them: drafting must win by more than the timing can tell), rounded
up to 1/STEPS and kept, so that the same command on the same machine drafts the same k. Timed anew, in
another process, they may move by more than that spread (by up to a quarter on a busy 2-core machine, whose
speed drifts from minute to minute and slows some programs more than others). Four rounds alone move them
no more, but widen the spread (a median 0.17 against 0.095, six fresh processes each on a 2-core Xeon).

The timed laps start from each prompt's first token (room for every lap). One more lap, from the prompts
themselves with keys of their own, gives the prior the run starts from: its drafts' chance of acceptance
(beta) after the first iteration (the run judges that one itself), worth PRIOR drafts at most. Its text
follows the prompt as the run's will (greedy: the very text; sampled: another draw). From the first token
alone the bundled pair's greedy prior was 0.88 against the 0.91 its runs then saw, and told nothing of
which prompts draft well (12 held-out prompts, a 2-core Xeon).
"""

import time

import jax
import numpy as np

from picospec.beyond.policy import ALIKE
from picospec.tools.autotune.cost_model import never_less, per_block, worth_timing
from picospec.tools.cli.stream import copy, force

SECONDS = 1.5  # the laps run at least MIN_ROUNDS rounds and then until this long has passed
MIN_ROUNDS, MAX_ROUNDS = 4, 12
STEPS = 32  # costs are rounded to 1/32 of the target's own iteration
PRIOR = ALIKE  # judged drafts the laps' evidence counts for at most: text of the same two models, not this one's


def lap(step, alone, draft, target, state, n_end, sampling, k: int):
    """(seconds per iteration that ran, the report) of one dispatch drafting k from a copy of state."""
    state, forced = jax.block_until_ready((jax.tree_util.tree_map(copy, state), force(draft, k)))
    t0 = time.perf_counter()
    _, report = (step if k else alone)((forced, target), state, n_end, sampling)
    report = jax.device_get(report)  # the host's one read, as the stream makes it
    return (time.perf_counter() - t0) / max(int(report[0].any(-1).sum()), 1), report


def costs(timed, K: int) -> dict:
    """{"v": [K + 1] iteration costs in units of k = 0's, "spread": what was added to each k >= 1,
    "prefill": the draft's prefill in those units, "ms": k = 0's fastest lap, milliseconds an iteration}.
    timed(k): seconds an iteration of a lap drafting k took (the CLI's: `lap`; the library's loop: autotune)."""
    ks = worth_timing(K)
    for k in ks + [0]:  # first laps, not counted: a program's first runs (a branch's) prepare it
        timed(k)
    rounds, t0 = [], time.perf_counter()
    while len(rounds) < MAX_ROUNDS and (len(rounds) < MIN_ROUNDS or time.perf_counter() - t0 < SECONDS):
        order = ks[1:] if len(rounds) % 2 == 0 else ks[:0:-1]  # a place in the round tells on a time: alternate
        first = timed(0)  # k = 0 at both ends of the round: its laps are the shortest, and so the noisiest
        rounds.append({k: timed(k) for k in order} | {0: min(first, timed(0))})
    halves = ratios(rounds[0::2], ks, K), ratios(rounds[1::2], ks, K)  # how far the estimate moves with half the
    spread = float(np.nanmedian(np.abs(halves[0] - halves[1])[1:])) / np.sqrt(2)  # rounds, and so with all of them
    v = never_less(per_block(ratios(rounds, ks, K).tolist()))
    rounded = [1.0] + [float(np.ceil((x + spread) * STEPS - 1e-6) / STEPS) for x in v[1:]]  # up, never down
    return {"v": rounded, "spread": round(spread, 4), "prefill": rounded[1] - 1.0,  # about one draft call
            "ms": round(1e3 * min(r[0] for r in rounds), 4), "rounds": len(rounds)}


def ratios(rounds, ks, K: int) -> np.ndarray:
    """[K + 1]: each timed k's fastest lap over k = 0's, NaN for a k left to the fit."""
    fastest = {k: min(r[k] for r in rounds) for k in ks}
    return np.array([fastest[k] / fastest[0] if k in ks else np.nan for k in range(K + 1)])


def evidence(ran, rows) -> tuple[float, float]:
    """(successes, failures), a row's share, from a lap's ran [n, B] and rows (Trace fields [n, B, ...]): every judged
    draft's beta (up to and with the first rejection), after each row's first iteration, capped at PRIOR drafts."""
    K = rows.beta.shape[-1]
    judged = (np.arange(K) <= rows.n_accepted[..., None]) & (np.arange(K) < rows.k[..., None])  # [n, B, K]
    judged &= ran[..., None] & (np.arange(len(ran)) > 0)[:, None, None]
    s, f = (float((judged * x).sum()) / ran.shape[1] for x in (rows.beta, 1 - rows.beta))
    scale = min(1.0, PRIOR / max(s + f, 1e-9))
    return s * scale, f * scale

