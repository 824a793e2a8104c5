"""`--K auto`'s tuner: the policy (picospec/beyond/policy.py) made for this machine, pair and batch. Its
costs are timed here once and kept (costs.py, the shape of an iteration's time in cost_model.py), its
prior starts from the pair on the target's own text (typical.py) and the prompts' own tokens. A run's own
times never change them: deleting costs.json (jit_cache.py) has them timed again. A fixed K needs none of it."""

import dataclasses
import sys

import jax.numpy as jnp
import numpy as np

from picospec.beyond.batch import batch_buffers
from picospec.beyond.policy import ALIKE, Policy, fixed
from picospec.gpt2 import Model
from picospec.sampling import Sampling
from picospec.tools import checks
from picospec.tools.autotune import typical
from picospec.tools.autotune.costs import TIMED_ROWS, auto_policy, kept_as
from picospec.tools.cli import options
from picospec.tools.jit_cache import is_kept


def make_policy(args, draft, target, prompts):
    """The policy.Policy the flags ask for: --K auto times this machine's iterations (costs.py, saying so the
    first time), starts from a prior (prompt_prior: the pair on the target's own text, then the prompts'
    tokens), and knows each row's --n-tokens (a batch waits for its slowest row); --confidence alone cuts
    a fixed K short; neither: None, always K drafts."""
    if args.K == "auto":
        capacity, sampling = auto_sizes(args, target, prompts)
        timed = min(len(prompts), TIMED_ROWS)
        if not is_kept(kept_as(draft, target, options.AUTO_K_MAX, capacity, sampling, timed, True)):
            print("picospec: note: --K auto first times this machine's iterations (once for this pair, batch "
                  "size and sampling; about a minute on the bundled pair)", file=sys.stderr, flush=True)
        policy = auto_policy(draft, target, options.AUTO_K_MAX, capacity, sampling, args.confidence, len(prompts), True)
        policy = dataclasses.replace(policy, horizon=jnp.float32(args.n_tokens))
        return prompt_prior(policy, draft, target, prompts, sampling)
    return fixed(args.K, args.confidence) if args.confidence > 0 else None


def auto_sizes(args, target, prompts) -> tuple[int, Sampling]:
    """What --K auto's costs are timed for, besides the pair and the batch: the cache capacity, the sampling."""
    return (batch_buffers(prompts, args.n_tokens, options.AUTO_K_MAX, target.config)[3],
            checks.sampling(args.temperature, args.top_k, args.top_p))


def prompt_prior(policy: Policy, draft, target, prompts, sampling: Sampling) -> Policy:
    """The policy with its prior evidence, a row's share: the pair's alpha on the target's own text
    (typical.py) as policy.ALIKE judged drafts, and then the beta at the prompts' positions, every one
    but each prompt's first, whose context is one token. There both models' laws are their flattest,
    and greedy, whether their top choices agree is a coin toss (on the bundled pair, 2 of 24 held-out
    verses, against 71-92% at every later position), while every draft the loop judges follows a
    whole prompt. A batch of more than PRIOR_PROMPTS prompts is judged by its first PRIOR_PROMPTS, their
    evidence counted for all. A draft that is not a model: no prior."""
    if not isinstance(draft, Model):
        return policy
    alpha = typical.alpha(draft, target, sampling)
    evidence = ALIKE * np.float32([alpha, 1 - alpha])  # (successes, failures)
    judged = prompts[:PRIOR_PROMPTS]
    later = np.concatenate([np.arange(len(prompt)) > 0 for prompt in judged])  # [positions]: all but the first
    if later.any():
        p, q = options.prompt_laws(draft, target, judged, sampling, sampling, least=1)
        beta = np.minimum(p, q).sum(-1)[later]  # each prompt token's chance, had the draft proposed it
        evidence += np.float32([beta.sum(), (1 - beta).sum()]) * (len(prompts) / len(judged))
    return dataclasses.replace(policy, prior=jnp.float32(evidence) / len(prompts))


PRIOR_PROMPTS = 256  # the prompts whose positions the prior reads (two forward passes each)


def explain(policy: Policy, steps, B: int) -> dict:
    """What --K auto decided and why, for --json: the k it drafted (iterations of each, all rows), the
    acceptance it saw (accepted over judged drafts: those up to the first rejection), the prior it started
    from (alpha and how many judged drafts it counts for, the batch's), and the iteration times it weighed
    (ms drafting k = 0..K_max on this machine, timed once and kept); stopped: drafting ended for good (k = 0)."""
    ks = [s.k if s.proposed else 0 for s in steps]
    judged = sum(min(s.accepted + 1, s.k) for s in steps if s.proposed)
    prior = np.asarray(policy.prior, np.float64)
    return {"k_chosen": {str(k): ks.count(k) for k in sorted(set(ks))},
            "acceptance_seen": sum(s.accepted for s in steps) / judged if judged else None,
            "prior": {"alpha": float(prior[0] / max(prior.sum(), 1e-9)), "drafts": float(prior.sum() * B)},
            "iteration_ms": [round(float(v), 4) for v in np.asarray(policy.v)], "stopped": 0 in ks}
