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
The target then scores only the k + 1 positions it needs (score_first, below).

Why it stays lossless: both rules look only at what was drafted so far, never at a verification
coin. Stopping after k drafts is the draft proposing, at position k, a "stop" token the target gives
probability 0: every verifier rejects it and draws the next token from q itself. So the verifiers
run unchanged; a draft that stopped leaves rows of p at zero, which they read as "not proposed".
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.gpt2 import KVCache, Model, append, peek
from picospec.sampling import Sampling, logits_to_probs
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


def block_sizes(K: int) -> list[int]:
    """The blocks score_first compiles for up to K drafts: 2, 4, 8, ... rows, and K + 1 at the top."""
    return [rows for rows in (2 ** i for i in range(1, K.bit_length() + 1)) if rows < K + 1] + [K + 1]


def score_first(target: Model, tokens, n, drafted, k, cache: KVCache, sampling: Sampling):
    """Step 2 when only d_0..d_{k-1} were proposed (adaptive.py): score the smallest block of
    block_sizes(K) that holds those k + 1 positions (lax.switch runs one compiled branch per size;
    a few sizes, since every branch costs a little even when it does not run). Returns q [K+1, V]
    with zero rows past k. The branches only read the cache (gpt2.peek) and it is written once
    after them: a branch that wrote it would make XLA copy every cache buffer on each call."""
    K, sizes = drafted.shape[0], block_sizes(drafted.shape[0])

    def first(rows):  # x[n-1], d_0..d_{rows-2}: the drafts past k are padding, after every real one
        def run(cache):
            block = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), drafted[:rows - 1]])  # [rows]
            logits, keys, values = peek(target, block, cache)  # [rows, V], n_layer x [H, rows, D]
            q = jnp.pad(logits_to_probs(logits, sampling), ((0, K + 1 - rows), (0, 0)))  # [K+1, V]
            pad = lambda x: jnp.pad(x, ((0, 0), (0, K + 1 - rows), (0, 0)))  # noqa: E731  [H, K+1, D]
            return q, [pad(x) for x in keys], [pad(x) for x in values]
        return run

    branch = jnp.sum(jnp.array(sizes) < k + 1)  # the first size that holds k + 1 rows
    q, keys, values = jax.lax.switch(branch, [first(rows) for rows in sizes], cache)  # [K+1, V], ...
    q = jnp.where(jnp.arange(K + 1)[:, None] <= k, q, 0.0)  # the rows of d_k.. were not proposed
    return q, append(cache, keys, values)  # rows past k + 1 lie beyond the length the loop keeps
