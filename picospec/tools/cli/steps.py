"""What one iteration added to one row, as the CLI, pictures and notebooks show it: a Step, read from a Trace's row."""

from dataclasses import dataclass, field

import jax

from picospec.beyond.loop import Trace


@dataclass
class Step:
    """What one iteration added to one row. For a speculative iteration, `drafted[:accepted]` were
    accepted and `tokens[-1]` is the resample or bonus; an autoregressive step has only `tokens`."""

    tokens: list[int]  # the tokens appended, cut at n_tokens (and after <|endoftext|> when stopping there)
    drafted: list[int] = field(default_factory=list)
    accepted: int = 0
    bonus: bool = False
    p: list[float] = field(default_factory=list)  # p[i](d_i), the draft's probability of d_i
    q: list[float] = field(default_factory=list)  # q[i](d_i), the target's
    u: list[float] = field(default_factory=list)  # the uniforms: accept iff u < q / p (block: stop iff u < h)
    w: list[float] = field(default_factory=list)  # block rule: the weights w_1..w_K (other rules: none)
    h: list[float] = field(default_factory=list)  # block rule: the stop chances h_1..h_K
    proposed: bool = True  # False: the draft proposed nothing and the target stepped alone
    k: int = 0  # drafts proposed (fewer than K when a policy stopped the draft early)
    finished: bool = False  # the row's last step
    seconds: float = 0.0  # from the first iteration (prefill included) to the end of this one


def extra_kind(step: Step) -> str:
    """How the token after the accepted drafts came: the bonus, a resample, or (nothing proposed) a target step."""
    return "bonus" if step.bonus else ("resample" if step.proposed else "target")


def cut(tokens: list[int], n_left: int, eos_id: int) -> list[int]:
    """The tokens still wanted: at most n_left, and none after <|endoftext|> (eos_id -1: no stop)."""
    tokens = tokens[:n_left]
    return tokens[:tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def trace_row(trace: Trace, i) -> Trace:
    """Row i of every field of a Trace (n_steps and finite, the loop's own, stay as they are)."""
    return trace._replace(**{name: getattr(trace, name)[i] for name in Trace._fields
                             if name not in ("n_steps", "finite")})


def step_from_row(row: Trace, n_left: int, eos_id: int = -1) -> Step:
    """One row of a Trace as a Step, its tokens cut to the n_left still wanted."""
    tokens = cut([int(t) for t in row.drafted[:row.n_accepted]] + [int(row.extra)], n_left, eos_id)
    if not row.proposed:
        return Step(tokens, proposed=False)
    weighed, k = bool(row.w.any()), int(row.k)  # only the block rule records weights; the others leave zeros
    return Step(tokens, row.drafted[:k].tolist(), int(row.n_accepted), bool(row.bonus), row.p[:k].tolist(),
                row.q[:k].tolist(), row.u[:k].tolist(), row.w[:k].tolist() if weighed else [],
                row.h[:k].tolist() if weighed else [], k=k)


def trace_steps(trace: Trace, n_tokens: int) -> list[Step]:
    """Every iteration of a Trace (from speculative_sample) as Steps, cut at n_tokens in all."""
    trace, steps = jax.device_get(trace), []
    for i in range(int(trace.n_steps)):
        steps.append(step_from_row(trace_row(trace, i), n_tokens - sum(len(s.tokens) for s in steps)))
    return steps
