"""The CLI's choices made from its flags: the prompts, the device, what K means (a number, or `auto`:
tools/autotune/), and a tree's shape from the laws measured on the prompts."""

import argparse
import sys

import jax
import numpy as np

from picospec.beyond import tree_theory
from picospec.beyond.dynamic import Grown, calibration, grown
from picospec.beyond.tree import Shape
from picospec.errors import PicospecError
from picospec.gpt2 import Model, logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools import checks
from picospec.tools.programs import compiled

AUTO_K_MAX = 7  # --K auto compiles for this many drafts (the target scores <= 8 rows), stops earlier when it pays


def k_value(text: str):
    try:
        return text if text == "auto" else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a whole number or auto, not {text!r}") from None


def K_max(args) -> int:  # the loop's lookahead
    if args.tree and args.children == "dynamic":  # the budget's; before it is chosen, the most any may need
        chosen = getattr(args, "shape", None)
        return chosen.lookahead if chosen else max(grown(args.tree, D).lookahead for D in range(1, args.tree + 1))
    if args.tree:
        return args.tree
    return AUTO_K_MAX if args.K == "auto" else args.K


CHUNK = 64  # prompts a call at most: [64, L, V] at a time


def law(model: Model, prompts, sampling: Sampling) -> list[np.ndarray]:
    """[len(prompt), V] for each prompt: the model's law after each of its tokens, from a saved program (programs.py: a
    repeated run traces nothing) that runs the prompts of one padded length (a power of two; causal attention leaves the
    rows of a prompt's own tokens as they are) in turn in one call, CHUNK at most, each as a call of its own would."""
    out, by_length = [None] * len(prompts), {}
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
    return jax.lax.map(lambda row: logits_to_probs(logits(model, row), sampling), tokens)  # [L] -> [L, V]


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
    p = q = None  # the draft's and the target's laws at every position of the prompts [positions, V], if measured
    if isinstance(draft, Model) and sum(len(prompt) for prompt in prompts) >= 4:
        ranked = Sampling() if args.children in ("top", "dynamic") else sampling  # these rank by the plain softmax
        p, q = np.concatenate(law(draft, prompts, ranked)), np.concatenate(law(target, prompts, sampling))
    children = "top" if args.children == "dynamic" else args.children
    by_rank = (tree_theory.rank_acceptance(TREE_ALPHA, args.tree) if p is None
               else tree_theory.rank_law(children, p, q, args.tree))
    best = Shape(tree_theory.optimal_tree(args.tree, by_rank))
    if args.children != "dynamic":
        return best
    budget = grown(args.tree, best.D)  # grown each call (dynamic.py) as deep as theory's tree of top children,
    return budget if p is None else budget._replace(calibration=calibration(p, q, budget.W))  # and calibrated


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
