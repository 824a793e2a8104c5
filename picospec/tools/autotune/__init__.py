"""`--K auto`'s tuner: the policy (picospec/beyond/policy.py) made for this machine, pair, batch and run.
The CLI compiles its iterations, then hands them here (cli/stream.py calls `tune`): their costs are
laps of those very programs (laps.py), timed once for the machine and kept in costs.json (jit_cache.py);
the prior is the acceptance a lap of the same program sees after the run's own prompts, with keys of its own,
taken anew every run. A fixed K needs none of it."""

import dataclasses
import time

import jax
import numpy as np

from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.policy import Policy, fixed
from picospec.gpt2 import Model
from picospec.tools import samplers
from picospec.tools.autotune import laps
from picospec.tools.cli import options
from picospec.tools.jit_cache import remembered
from picospec.tools.memory import run_device
from picospec.tools.programs import source_digest


def make_policy(args):
    """The policy.Policy the flags ask for: --K auto, one that `tune` fills in once the programs are compiled
    (it knows each row's --n-tokens: a batch waits for its slowest row); --confidence alone cuts a
    fixed K short; neither: None, always K drafts."""
    if args.K == "auto":
        return untuned(options.AUTO_K_MAX, args.n_tokens, args.confidence)
    return fixed(args.K, args.confidence) if args.confidence > 0 else None


def untuned(K_max: int, n_tokens: int, threshold: float = 0.0) -> Policy:
    """Auto's policy before `tune`: every field the compiled program takes, as data of its final shapes."""
    return Policy(np.float32(0), np.ones(K_max + 1, np.float32), np.float32(threshold),  # numpy's: nothing compiled
                  prior=np.zeros(2, np.float32), horizon=np.float32(n_tokens), prefill=np.float32(0))


def tune(step, alone, models, init, tokens, n_prompt, keys, n_end, sampling):
    """(the draft with its policy tuned, what it was tuned from): `step` and `alone` are the run's compiled
    iterations (drafting, and the target alone), `init` its compiled start, the rest its arguments."""
    (draft, target), K = models, models[0].policy.v.shape[0] - 1
    others = jax.random.wrap_key_data(np.asarray(jax.random.key_data(keys)) ^ np.uint32(0xFFFFFFFF))  # the laps'
    # own keys, never the run's: its bits flipped (fold_in would compile a program of its own on a first run, 0.1 s)
    n_end, n_prompt = np.asarray(n_end), np.asarray(n_prompt)  # on the host: nothing more to compile
    start = init(laps.force(draft, K), target, tokens, np.ones_like(n_prompt), others)  # from each first token,
    lap_end = (n_end - n_prompt + 1).reshape(n_end.shape)  # so that every lap has room: the run's n_tokens and more
    found = remembered(kept_as(draft, target, tokens.shape, sampling), lambda: laps.costs(
        lambda k: laps.lap(step, alone, draft, target, start, lap_end, sampling, k)[0], K))
    own = init(laps.force(draft, K), target, tokens, n_prompt, others)  # the prior's lap: after the prompts
    ran, _, rows = laps.lap(step, alone, draft, target, own, n_end, sampling, K)[1]
    prior = laps.evidence(ran, rows)
    policy = jax.device_put(dataclasses.replace(draft.policy, v=np.float32(found["v"]), prior=np.float32(prior),
                                                prefill=np.float32(found["prefill"])))  # moved once, not each call
    return dataclasses.replace(draft, policy=policy), found | {"prior": prior}


def policy_for(draft, target: Model, prompts, n_tokens: int, sampling, keys=None) -> Policy:
    """The policy --K auto gives the library's samplers for these prompts (speculative_sample, or _batch for
    several), from laps of those very loops, as `tune` laps the CLI's programs (whose iterations carry the
    stream's reports, and cost otherwise): whole runs, the policy forced to each k (k = 0: it stops at once,
    the target alone), kept in costs.json; the prior from a run drafting K_max, with keys of its own."""
    K, B = options.AUTO_K_MAX, len(prompts)
    keys = jax.random.split(jax.random.key(0), B) if keys is None else keys
    policy, flags = untuned(K, n_tokens), dict(K=K, temperature=sampling.temperature, top_k=sampling.top_k,
                                               top_p=sampling.top_p)

    def run(k, keys):  # (seconds an iteration, the trace, fields [B, R, ...]) drafting k
        forced = dict(flags, policy=laps.force(AdaptiveDraft(draft, policy), k).policy)
        t0 = time.perf_counter()
        trace = (samplers.speculative_sample_batch(draft, target, prompts, n_tokens, keys, **forced)[1] if B > 1 else
                 jax.tree_util.tree_map(lambda x: x[None], samplers.speculative_sample(
                     draft, target, prompts[0], n_tokens, keys[0], **forced)[1]))
        trace = jax.device_get(trace)  # the host's read, when the run is done
        return (time.perf_counter() - t0) / int(trace.n_steps.max()), trace

    key = kept_as(AdaptiveDraft(draft, policy), target, (B, n_tokens), sampling)  # prompts of any length alike
    found = remembered(f"{key}:library", lambda: laps.costs(lambda k: run(k, keys)[0], K))
    trace = run(K, jax.vmap(lambda key: jax.random.fold_in(key, 1))(keys))[1]  # a row's fields [B, R, ...]
    ran = np.arange(trace.k.shape[1])[:, None] < trace.n_steps  # [R, B], as a lap's report has them
    rows = trace._replace(**{name: getattr(trace, name).swapaxes(0, 1) for name in ("beta", "n_accepted", "k")})
    prior = laps.evidence(ran, rows)
    return dataclasses.replace(policy, v=np.float32(found["v"]), prior=np.float32(prior),
                               prefill=np.float32(found["prefill"]))


def kept_as(draft, target: Model, shape, sampling) -> str:
    """The key in costs.json of these costs: the machine, the pair, K_max, the rows and their buffers, how
    tokens are sampled, and picospec's source (an edit may change what an iteration costs)."""
    device, K = run_device(), draft.policy.v.shape[0] - 1
    describe = lambda m: type(m).__name__ if not isinstance(m, Model) else (  # noqa: E731
        f"L{m.config.n_layer}H{m.config.n_head}C{m.config.n_embd}V{m.config.vocab_size}P{m.config.n_positions}"
        f"-{m.params['wte']['weight'].dtype}")
    mode = "greedy" if sampling.greedy else f"sampled-k{sampling.top_k > 0:d}-p{sampling.top_p < 1:d}"
    inner = getattr(draft.draft, "model", draft.draft)
    return (f"{device.platform}:{device.device_kind}:{describe(inner)}:{describe(target)}:K{K}:B{shape[0]}"
            f"S{shape[-1]}:{mode}:src{source_digest()[:16]}:laps")


def explain(tuned: dict, steps) -> dict:
    """What --K auto decided and why, for --json: the k it drafted (iterations of each, all rows), the acceptance
    it saw (accepted over judged drafts: those up to the first rejection), and what it decided from: the prior (a
    row's share of judged drafts, successes and failures), the iteration costs weighed (k = 0..K_max, in units of
    k = 0's, which took `ms`), the spread added to them; stopped: drafting ended for good (k = 0)."""
    ks = [s.k if s.proposed else 0 for s in steps]
    judged = sum(min(s.accepted + 1, s.k) for s in steps if s.proposed)
    return {"k_chosen": {str(k): ks.count(k) for k in sorted(set(ks))},
            "acceptance_seen": sum(s.accepted for s in steps) / judged if judged else None,
            "prior": [round(float(x), 4) for x in np.asarray(tuned["prior"])], "costs": tuned["v"],
            "spread": tuned["spread"], "ms": tuned["ms"], "stopped": 0 in ks}
