"""The CLI's choices made from its flags: the prompts, the device, and what K means (a number,
or `auto` with the policy behind it)."""

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np

from picospec.beyond import tree_theory
from picospec.beyond.batch import batch_buffers
from picospec.beyond.dynamic import Grown, calibration, grown
from picospec.beyond.policy import ALIKE, Policy, fixed
from picospec.beyond.tree import Shape
from picospec.errors import PicospecError
from picospec.gpt2 import Model, logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools import checks
from picospec.tools.cli import typical
from picospec.tools.cli.cost_model import SAME_STATE, off_by
from picospec.tools.cli.costs import TIMED_ROWS, auto_policy, kept_as
from picospec.tools.cli.jit_cache import forget, is_kept
from picospec.tools.cli.programs import compiled

AUTO_K_MAX = 7  # --K auto compiles for this many drafts (the target scores <= 8 rows), stops earlier when it pays


def k_value(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a whole number or auto, not {text!r}") from None


def K_max(args) -> int:  # the loop's lookahead
    if args.tree and args.children == "dynamic":  # the budget's; before it is chosen, the most any may need
        chosen = getattr(args, "shape", None)
        return chosen.lookahead if chosen else max(grown(args.tree, D).lookahead for D in range(1, args.tree + 1))
    if args.tree:
        return args.tree
    return AUTO_K_MAX if args.K == "auto" else args.K


def prompt_laws(draft, target, prompts, p_sampling: Sampling, q_sampling: Sampling, least: int = 4):
    """(p, q) [positions, V]: the draft's and the target's laws at every position of the prompts (one
    forward pass of each model a prompt), what the CLI measures acceptance from before it generates;
    (None, None) with fewer than `least` positions, or a draft that is not a model."""
    if not isinstance(draft, Model) or sum(len(prompt) for prompt in prompts) < least:
        return None, None
    return tuple(np.concatenate(law(model, prompts, how)) for model, how in ((draft, p_sampling),
                                                                                (target, q_sampling)))


CHUNK = 64  # prompts a call at most: [64, L, V] at a time


def law(model: Model, prompts, sampling: Sampling) -> list[np.ndarray]:
    """[len(prompt), V] for each prompt: the model's law after each of its tokens, from a saved program
    (programs.py: a repeated run traces nothing) that runs the prompts of one padded length (a power of
    two; causal attention leaves the rows of a prompt's own tokens as they are) one after another in one
    call, CHUNK at most, each exactly as a call of its own would."""
    out = [None] * len(prompts)
    by_length = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(min(max(8, 1 << (len(prompt) - 1).bit_length()), model.config.n_positions), []).append(i)
    for L, rows in by_length.items():
        for first in range(0, len(rows), CHUNK):
            chunk = rows[first:first + CHUNK]
            padded = np.zeros((min(CHUNK, 1 << (len(chunk) - 1).bit_length()), L), np.int32)  # [N, L]
            for row, i in enumerate(chunk):
                padded[row, :len(prompts[i])] = prompts[i]
            laws_of = np.asarray(compiled(each_laws, (model, padded, sampling), {})(model, padded, sampling))
            for row, i in enumerate(chunk):
                out[i] = laws_of[row, :len(prompts[i])]
    return out


def each_laws(model: Model, tokens, sampling: Sampling):  # int32 [N, L] -> [N, L, V], row by row
    return jax.lax.map(lambda row: laws(model, row, sampling), tokens)


def laws(model: Model, tokens, sampling: Sampling):  # int32 [L] -> [L, V]
    return logits_to_probs(logits(model, tokens), sampling)


TREE_ALPHA = 0.8  # the acceptance a tree's shape is chosen for when the prompts are too short to measure it


def tree_shape(args, draft=None, target=None, prompts=(), sampling=None) -> Shape | Grown | None:
    """--tree M: theory's best tree of M nodes (tree_theory.optimal_tree) under the rank law measured at
    start-up on the prompts themselves (tree_theory.rank_law for the children asked for, from p and q at
    each of their positions, one forward call of each model a prompt); without models, or with fewer
    than 4 positions, the constant-alpha law at TREE_ALPHA. --children dynamic: grown each call, as deep
    as that best tree of top children, its confidence calibrated on the same positions (dynamic.calibration)."""
    if args.tree is None:
        return None
    checks.positive("tree", args.tree)
    ranked = Sampling() if args.children in ("top", "dynamic") else sampling  # these rank by the plain softmax
    p, q = prompt_laws(draft, target, prompts, ranked, sampling)
    measured = p is not None
    if args.children == "dynamic":  # grown each call (dynamic.py) as deep as theory's tree of top children,
        law = (tree_theory.rank_law("top", p, q, args.tree) if measured
               else tree_theory.rank_acceptance(TREE_ALPHA, args.tree))
        budget = grown(args.tree, Shape(tree_theory.optimal_tree(args.tree, law)).D)
        return budget._replace(calibration=calibration(p, q, budget.W)) if measured else budget  # and calibrated
    if not measured:
        return Shape(tree_theory.optimal_tree(args.tree, tree_theory.rank_acceptance(TREE_ALPHA, args.tree)))
    return Shape(tree_theory.optimal_tree(args.tree, tree_theory.rank_law(args.children, p, q, args.tree)))


def make_policy(args, draft, target, prompts):
    """The policy.Policy the flags ask for: --K auto times this machine's iterations (costs.py, saying so the
    first time), starts from a prior (prompt_prior: the pair on the target's own text, then the prompts'
    tokens), and knows each row's --n-tokens (a batch waits for its slowest row); --confidence alone cuts
    a fixed K short; neither: None, always K drafts."""
    if args.K == "auto":
        capacity, sampling = auto_sizes(args, target, prompts)
        if not is_kept(kept_as(draft, target, AUTO_K_MAX, capacity, sampling, min(len(prompts), TIMED_ROWS), True)):
            print("picospec: note: --K auto first times this machine's iterations (once for this pair, batch "
                  "size and sampling; about a minute on the bundled pair)", file=sys.stderr, flush=True)
        policy = auto_policy(draft, target, AUTO_K_MAX, capacity, sampling, args.confidence, len(prompts), True)
        policy = dataclasses.replace(policy, horizon=jnp.float32(args.n_tokens))
        return prompt_prior(policy, draft, target, prompts, sampling)
    return fixed(args.K, args.confidence) if args.confidence > 0 else None


def auto_sizes(args, target, prompts) -> tuple[int, Sampling]:
    """What --K auto's costs are timed for, besides the pair and the batch: the cache capacity, the sampling."""
    return (batch_buffers(prompts, args.n_tokens, AUTO_K_MAX, target.config)[3],
            checks.sampling(args.temperature, args.top_k, args.top_p))


RECHECK_AFTER = 6  # iterations a run needs before its own times judge the kept costs


def recheck(args, draft, target, prompts, policy: Policy, clock) -> str | None:
    """--K auto's kept costs against this run's iterations, clock [(seconds from the start to the end of
    each, k drafted)] (cost_model.off_by): taken in another state of the machine, they are forgotten, timed
    again by the next run, and the note returned says so; None when they agree (or none were kept)."""
    if args.K != "auto" or len(clock) < RECHECK_AFTER:
        return None
    off = off_by([(t - before, k) for (before, _), (t, k) in zip([(0.0, 0)] + clock, clock)],
                 np.asarray(policy.v) / 1e3)
    capacity, sampling = auto_sizes(args, target, prompts)
    if 1 / SAME_STATE <= off <= SAME_STATE or not forget(
            kept_as(draft, target, AUTO_K_MAX, capacity, sampling, min(len(prompts), TIMED_ROWS), True)):
        return None
    return (f"this run's iterations took {off:.2g}x the time --K auto's kept costs give: they were timed in "
            "another state of this machine (a slow spell, another busy program), and will be timed again next run")


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
        p, q = prompt_laws(draft, target, judged, sampling, sampling, least=1)
        beta = np.minimum(p, q).sum(-1)[later]  # each prompt token's chance, had the draft proposed it
        evidence += np.float32([beta.sum(), (1 - beta).sum()]) * (len(prompts) / len(judged))
    return dataclasses.replace(policy, prior=jnp.float32(evidence) / len(prompts))


PRIOR_PROMPTS = 256  # the prompts whose positions the prior reads (two forward passes each)


def k_used(steps) -> dict:
    """The drafts the target checked per call, on average (K itself unless a policy stopped early)."""
    proposed = [s.k for s in steps if s.proposed]
    return {"K_used": sum(proposed) / len(proposed) if proposed else 0.0}


def read_prompts(args) -> list[str]:
    """The --prompt flags, then the --prompt-file's lines (`-` reads stdin); blank lines are skipped."""
    texts = list(args.prompt or [])
    if args.prompt_file:
        name = "standard input" if args.prompt_file == "-" else args.prompt_file
        try:
            raw = sys.stdin.read() if args.prompt_file == "-" else open(args.prompt_file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise PicospecError(f"cannot read the prompt file {name}: {getattr(e, 'strerror', None) or e}; "
                                f"give a UTF-8 text file with one prompt a line") from None
        lines = [line for line in raw.splitlines() if line.strip()]
        if not lines:
            raise PicospecError(f"the prompt file {name} has no prompts: write one prompt a line")
        texts += lines
    return texts or [""]


def use_platform(name: str | None):
    """The device to run on: the first of `name`'s, made JAX's default, or JAX's own choice."""
    if name is None:
        return jax.devices()[0]
    try:
        device = jax.devices(name)[0]
    except RuntimeError as e:
        extra = {"gpu": "cuda", "tpu": "tpu"}.get(name)
        install = f"install JAX for it (pip install -e \".[{extra}]\") or " if extra else ""
        raise PicospecError(f"no {name} here ({str(e).splitlines()[0]}); {install}leave --platform out") from None
    jax.config.update("jax_default_device", device)
    return device


def describe(device) -> dict:
    """The device in the summary and the JSON: its platform and kind (a GPU's model name)."""
    return {"platform": device.platform, "kind": device.device_kind, "name": str(device)}
