"""Adaptive K: how many tokens to draft, decided every iteration instead of fixed in advance.

Two rules decide when the draft stops, both inside the compiled loop (shapes stay those of K_max):
  theory      before drafting, pick the k in 1..K_max that maximizes the expected tokens per unit
              of time, (1 - alpha^(k+1)) / ((1 - alpha) (k c + v(k))) (theory.walltime_improvement),
              with c and v(k) measured on this machine (tools/costs.py) and alpha estimated from the
              iterations so far;
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
    c: jax.Array  # float32 []: one draft call's time over one target call's
    v: jax.Array  # float32 [K_max]: v(k), the target scoring k + 1 tokens over scoring one, for k = 1..K_max
    threshold: jax.Array  # float32 []: stop after a draft token of probability below it (0: never)
    auto: bool = True  # choose k from the theory each iteration; False: always K_max (the threshold still stops)
    rows: str | None = None  # the vmapped axis when a batch steps its rows together (picospec.batch sets it)


def fixed(K: int, threshold: float = 0.0) -> Policy:
    """Always K drafts, cut short only by the confidence threshold."""
    return Policy(jnp.float32(0), jnp.ones(K, jnp.float32), jnp.float32(threshold), auto=False)


def alpha_estimate(trace: Trace):
    """alpha from the iterations so far (theory.alpha_from_trace), with one success and one failure
    assumed beforehand (1/2 before any evidence). A draft that stopped itself is not a failure."""
    successes = trace.n_accepted.sum()
    failures = jnp.sum(trace.proposed & (trace.n_accepted < trace.k))
    return (successes + 1.0) / (successes + failures + 2.0)


def choose_k(policy: Policy, alpha):
    """The k in 1..K_max with the most expected tokens per unit of time (Leviathan et al. Theorem 3.8
    with v(k) measured: theory.optimal_K); alpha < 1."""
    k = jnp.arange(1, policy.v.shape[0] + 1)  # [K_max]
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha)  # [K_max] expected tokens per target call
    return jnp.argmax(tokens / (k * policy.c + policy.v)).astype(jnp.int32) + 1


def rows_max(x, policy: Policy):
    """x's largest value over the rows of a batch (x itself for one sequence): in a batch the rows
    draft, and the target scores, as far as the row that goes furthest needs."""
    return jax.lax.pmax(x, policy.rows) if policy.rows else x


def propose_up_to(draft, tokens, n, cache, key, K: int, sampling: Sampling, policy: Policy, trace: Trace) -> Proposal:
    """Step 1 with the stopping rules: up to K drafts; p's rows past the last one proposed are zero."""
    k = choose_k(policy, alpha_estimate(trace)) if policy.auto else jnp.int32(K)
    if hasattr(draft, "propose_until"):  # a model: stop drafting, and save its calls
        return draft.propose_until(tokens, n, cache, key, K, k, policy.threshold, sampling,
                                   lambda x: rows_max(x, policy))
    proposal = draft.propose(tokens, n, cache, key, K, sampling)  # a lookup costs nothing: just cut it
    return proposal._replace(p=jnp.where(jnp.arange(K)[:, None] < k, proposal.p, 0.0))
