"""Adaptive K: how many tokens to draft, decided every iteration instead of fixed in advance.

Two rules decide when the draft stops, both inside the compiled loop (shapes stay those of K_max):
  theory      before drafting, pick the k in 1..K_max that maximizes the expected tokens per unit
              of time, E[1 + alpha + ... + alpha^k] / (k c + v(k)) (theory.walltime_improvement),
              with the costs measured on this machine (tools/costs.py) and the expectation taken
              over what the iterations so far say of alpha (a Beta posterior: few iterations, a
              wide one, which favours drafting more than its mean alone would);
  confidence  while drafting, stop after a token the draft itself gave probability < threshold
              (SpecDec++, Huang et al. 2024, with a fixed threshold in place of its trained head;
              Hugging Face's `assistant_confidence_threshold`).
The target then scores only the k + 1 positions it needs (speculative.score_first).

Why it stays lossless: both rules look only at what was drafted so far, never at a verification
coin. Stopping after k drafts is the draft proposing, at position k, a "stop" token the target gives
probability 0: every verifier rejects it and draws the next token from q itself. So the verifiers
run unchanged; a draft that stopped leaves rows of p at zero, which they read as "not proposed".
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.sampling import Sampling
from picospec.state import Proposal, Trace


@partial(jax.tree_util.register_dataclass, data_fields=["c", "v", "threshold"], meta_fields=["auto", "rows"])
@dataclass(frozen=True)
class Policy:
    # An iteration that drafts k costs k c + v(k), in any unit: in the theory's terms c is a draft
    # call over a target call and v(k) the target's block over one token; tools/costs.py times whole
    # iterations in place, so it gives c = 0 and v(k) = an iteration's time.
    c: jax.Array  # float32 []
    v: jax.Array  # float32 [K_max], for k = 1..K_max
    threshold: jax.Array  # float32 []: stop after a draft token of probability below it (0: never)
    auto: bool = True  # choose k from the theory each iteration; False: always K_max (the threshold still stops)
    rows: str | None = None  # the vmapped axis when a batch steps its rows together (picospec.batch sets it)


def fixed(K: int, threshold: float = 0.0) -> Policy:
    """Always K drafts, cut short only by the confidence threshold."""
    return Policy(jnp.float32(0), jnp.ones(K, jnp.float32), jnp.float32(threshold), auto=False)


def evidence(trace: Trace):
    """(successes, failures) so far: drafts accepted, and drafts rejected. A draft that stopped
    itself is not a failure. theory.alpha_from_trace is successes / (successes + failures)."""
    return trace.n_accepted.sum(), jnp.sum(trace.proposed & (trace.n_accepted < trace.k))


def alpha_estimate(trace: Trace):
    """alpha's posterior mean: a uniform prior, then the trace's evidence (1/2 before any)."""
    successes, failures = evidence(trace)
    return (successes + 1.0) / (successes + failures + 2.0)


def choose_k(policy: Policy, successes, failures):
    """The k in 1..K_max with the most expected tokens per unit of time (Leviathan et al. Theorem 3.8
    with measured costs: theory.optimal_K), the expectation over alpha ~ Beta(successes + 1,
    failures + 1), where E[alpha^j] = prod_{i<j} (successes + 1 + i) / (successes + failures + 2 + i).
    With much evidence this is theory.optimal_K at alpha = successes / (successes + failures)."""
    k = jnp.arange(1, policy.v.shape[0] + 1)  # [K_max]
    moments = jnp.cumprod((successes + k) / (successes + failures + 1.0 + k))  # [K_max] E[alpha^k]
    tokens = 1 + jnp.cumsum(moments)  # [K_max] expected tokens per target call, 1 + E[alpha] + ... + E[alpha^k]
    return jnp.argmax(tokens / (k * policy.c + policy.v)).astype(jnp.int32) + 1


def rows_max(x, policy: Policy):
    """x's largest value over the rows of a batch (x itself for one sequence): in a batch the rows
    draft, and the target scores, as far as the row that goes furthest needs."""
    return jax.lax.pmax(x, policy.rows) if policy.rows else x


def propose_up_to(draft, tokens, n, cache, key, K: int, sampling: Sampling, policy: Policy, trace: Trace) -> Proposal:
    """Step 1 with the stopping rules: up to K drafts; p's rows past the last one proposed are zero."""
    k = choose_k(policy, *evidence(trace)) if policy.auto else jnp.int32(K)
    if hasattr(draft, "propose_until"):  # a model: stop drafting, and save its calls
        return draft.propose_until(tokens, n, cache, key, K, k, policy.threshold, sampling,
                                   lambda x: rows_max(x, policy))
    proposal = draft.propose(tokens, n, cache, key, K, sampling)  # a lookup costs nothing: just cut it
    return proposal._replace(p=jnp.where(jnp.arange(K)[:, None] < k, proposal.p, 0.0))
