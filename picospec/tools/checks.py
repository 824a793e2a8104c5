"""Every check of what a user asks for, in one place: the CLI and the public entry points call these
before anything runs, and the lesson assumes valid input, as picoGPT does. Each failure is one
PicospecError whose message says what is wrong and what to do (the CLI prints it and exits with 2)."""

import numbers

import jax
import jax.numpy as jnp

from picospec.beyond.dynamic import Grown
from picospec.beyond.eagle import HeadDraft
from picospec.beyond.several import CHAINS
from picospec.beyond.tree import CHILDREN, Shape
from picospec.beyond.verifiers import RULES
from picospec.errors import NonFiniteLogits, PicospecError
from picospec.gpt2 import Model
from picospec.sampling import Sampling


def whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def sampling(temperature=1.0, top_k=0, top_p=1.0) -> Sampling:
    """The Sampling these ask for, each number in one type, so that new values compile nothing."""
    if not temperature >= 0:
        raise PicospecError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if not (whole(top_k) and top_k >= 0):
        raise PicospecError(f"top-k must be a whole number >= 0 (0 keeps all), got {top_k}")
    if not 0 < top_p <= 1:
        raise PicospecError(f"top-p must be in (0, 1] (1 keeps all), got {top_p}")
    return Sampling(float(temperature), int(top_k), float(top_p))


def positive(name: str, value: int):
    if not value >= 1:
        raise PicospecError(f"{name} must be >= 1, got {value}")


def prompt(tokens, n: int, lookahead: int, config):
    """A prompt of at least one token that fits the context with n tokens (and K drafts) after it."""
    positive("n-tokens", n)
    P = len(tokens)
    if P < 1:
        raise PicospecError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    if P + n + lookahead - 1 > config.n_positions:
        extra = f" + K={lookahead}" if lookahead else ""
        raise PicospecError(f"prompt ({P} tokens) + n-tokens ({n}){extra} exceeds the model's "
                            f"context of {config.n_positions}; shorten the prompt or ask for fewer tokens")


def prompts(rows, n: int, lookahead: int, config):
    """`prompt` for each of a batch's prompts, naming the one at fault."""
    if len(rows) == 0:
        raise PicospecError("no prompts: give at least one")
    for b, tokens in enumerate(rows):
        try:
            prompt(tokens, n, lookahead, config)
        except PicospecError as e:
            raise PicospecError(f"prompt {b + 1} of {len(rows)}: {e}" if len(rows) > 1 else str(e)) from None


def eos(model: Model, stop_at_eos: bool) -> int:
    """The token id to stop at, or -1 (no token) when not stopping."""
    if not stop_at_eos:
        return -1
    if model.config.eos_token_id is None:
        raise PicospecError("stop_at_eos needs the model's eos_token_id in its config.json")
    return model.config.eos_token_id


def context(tokens, model: Model):
    """1 to n_positions tokens: past the context there is no position embedding."""
    if not 1 <= len(tokens) <= model.config.n_positions:
        raise PicospecError(f"logits takes 1 to {model.config.n_positions} tokens (the model's context), "
                            f"got {len(tokens)}")


def K(value):
    if not (whole(value) and value >= 1):
        raise PicospecError(f"K must be a whole number >= 1, got {value}")


def confidence(value: float):
    if not 0 <= value < 1:
        raise PicospecError(f"confidence must be in [0, 1), got {value}")


def plot(path: str | None, mode: str):
    """--plot draws speculative decisions, with matplotlib (the plot extra), into a PNG file."""
    if path is None:
        return
    if mode == "autoregressive":
        raise PicospecError("--plot draws the speculative run's decisions; use --mode speculative or compare")
    if not path.lower().endswith(".png"):
        raise PicospecError(f"--plot writes a PNG: give a file name ending in .png, not {path!r}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PicospecError('--plot needs matplotlib: pip install -e ".[plot]" (or leave --plot out)') from None


def ngram_max(value):
    if not (whole(value) and value >= 1):
        raise PicospecError(f"the n-gram draft's max n must be a whole number >= 1, got {value}")


def pair(draft, target: Model, K_max: int, rule: str = "token", drafts: int = 1, adaptive: bool = False,
         confident: bool = False):
    """A model draft must share the target's vocabulary and context; K >= 1; a known verifier; several
    drafts come from a model, with a fixed K and a rule that takes several (match, token)."""
    K(K_max)
    if rule not in RULES:
        raise PicospecError(f"unknown verifier {rule!r}; use one of {', '.join(RULES)}")
    if not (whole(drafts) and drafts >= 1):
        raise PicospecError(f"drafts must be a whole number >= 1, got {drafts}")
    if drafts > 1 and (RULES[rule] not in CHAINS or adaptive or not isinstance(draft, (Model, HeadDraft))):
        raise PicospecError("several drafts need a draft model or head, a fixed K and --verify match or token "
                            "(block verification judges one chain; the n-gram lookup has only one)")
    if isinstance(draft, HeadDraft):
        return head(draft, target, confident)
    if not isinstance(draft, Model):  # the n-gram draft
        return ngram_max(draft.max_n)
    if draft.config.vocab_size != target.config.vocab_size:
        raise PicospecError(f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the "
                            f"target's ({target.config.vocab_size}); pick a draft with the target's tokenizer")
    if draft.config.n_positions < target.config.n_positions:
        raise PicospecError(f"the draft's context ({draft.config.n_positions}) is shorter than the "
                            f"target's ({target.config.n_positions}); pick a draft with at least as long a context")


def confident(policy) -> bool:  # the policy stops on a confidence threshold (one traced under an outer jit: unknown)
    return policy is not None and not isinstance(policy.threshold, jax.core.Tracer) and float(policy.threshold) > 0


def head(draft, target: Model, confident: bool):  # an EAGLE head, for a target of its shape
    if (draft.config.n_embd, draft.config.vocab_size) != (target.config.n_embd, target.config.vocab_size):
        raise PicospecError("the EAGLE head reads features of another shape than this target's: use the target it "
                            "was trained against")
    if confident:
        raise PicospecError("the EAGLE head drafts K tokens, or --K auto's k: --confidence needs a draft model")


def tree(shape, children: str, draft, target: Model, rule: str, drafts: int, policy) -> int | None:
    """A tree needs a draft model, its own rule (the default verifier), one tree a call and no policy;
    children one of tree.CHILDREN, and no more siblings than tokens when they must differ; a dynamic
    tree (dynamic.Grown), D <= M <= W D and W below the vocabulary. Returns the loop's lookahead (a
    Shape's nodes M, a Grown's lookahead), or None without a tree."""
    if shape is None:
        return several_children(children, drafts, target)
    if isinstance(shape, Grown):
        if not all(whole(x) and x >= 1 for x in shape[:3]) or not shape.D <= shape.M <= shape.W * shape.D:
            raise PicospecError(f"a dynamic tree needs whole numbers with D <= M <= W D, got {shape}")
        table = shape.calibration
        if table is not None and not (len(table) and all(0 <= a <= 1 for a in table)):
            raise PicospecError("a dynamic tree's calibration is a(c) at equal bins of c: numbers in [0, 1]")
        if shape.W > target.config.vocab_size:
            raise PicospecError(f"a dynamic tree's width W = {shape.W} exceeds the vocabulary; use a narrower one")
        children = "top"
    elif not isinstance(shape, Shape) or shape.M < 1:
        raise PicospecError("tree must be a picospec.beyond.tree.Shape with at least one node, e.g. "
                            "tree.branches(2, 3), or a picospec.beyond.dynamic.Grown")
    if children not in CHILDREN:
        raise PicospecError(f"unknown way to choose a tree's children {children!r}; use one of {', '.join(CHILDREN)}")
    if not isinstance(draft, (Model, HeadDraft)) or rule != "token" or drafts != 1 or policy is not None:
        raise PicospecError("a tree needs a draft model or head and is verified by its own rule: leave --verify, "
                            "--drafts and --K auto out")
    if isinstance(draft, HeadDraft) and isinstance(shape, Grown):
        raise PicospecError("the EAGLE head grows static trees (--children iid, top or distinct), not dynamic ones")
    if isinstance(shape, Grown):
        return shape.lookahead
    if children == "distinct" and max(shape.parents.count(j) for j in set(shape.parents)) > target.config.vocab_size:
        raise PicospecError("a node has more children than the vocabulary has tokens; use a narrower tree")
    return shape.M


def several_children(children: str, drafts: int, target: Model) -> None:
    """Without a tree, children choose several drafts' first tokens (several.branches_rule): one of
    tree.CHILDREN, with --drafts, and no more distinct first tokens than the vocabulary has."""
    if children == "iid":
        return None
    if children not in CHILDREN:
        raise PicospecError(f"--children {children} needs --tree M" if children == "dynamic" else
                            f"unknown way to choose a tree's children {children!r}; use one of {', '.join(CHILDREN)}")
    if not (whole(drafts) and drafts > 1):
        raise PicospecError(f"--children {children} chooses the children of a tree or of several drafts' root: "
                            "give --tree M or --drafts N (N >= 2), or leave --children out")
    if children == "distinct" and drafts > target.config.vocab_size:
        raise PicospecError(f"{drafts} distinct first drafts need as many tokens; the vocabulary has "
                            f"{target.config.vocab_size}: ask for fewer drafts")
    return None


def keys(value, B: int):
    """One jax.random key per prompt."""
    value = jnp.asarray(value) if not isinstance(value, jax.Array) else value
    if not jnp.issubdtype(value.dtype, jax.dtypes.prng_key) or value.shape != (B,):
        raise PicospecError(f"give one jax.random key per prompt: {B} keys, e.g. jax.random.split(key, {B}); "
                            f"got {value.dtype} {tuple(value.shape)}")
    return value


def finite(trace, draft, target):
    """Refuse what a loop sampled if a model's logits held NaN or Inf (the trace's `finite` flags,
    read once, after the loop). Under an outer jax.jit they cannot be read: the trace carries them."""
    flags = [] if isinstance(trace.finite, jax.core.Tracer) else jnp.reshape(trace.finite, (-1, 2)).all(axis=0)
    for ok, which, model in zip(flags, ("draft", "target"), (draft, target)):
        if not ok:
            raise NonFiniteLogits(which, jax.tree.leaves(model.params)[0].dtype)
