"""The checks of what a draft is asked to do, at the boundary as checks.py's are: a model draft against its
target, an EAGLE head, the n-gram lookup, several drafts, a tree and how its children are chosen."""

import jax

from picospec.beyond.dynamic import Grown
from picospec.beyond.eagle import HeadDraft
from picospec.beyond.several import CHAINS
from picospec.beyond.tree import CHILDREN, Shape
from picospec.beyond.verifiers import RULES
from picospec.errors import PicospecError
from picospec.gpt2 import Model
from picospec.tools.checks import whole, whole_positive


def ngram_max(value):
    whole_positive("the n-gram draft's max n", value)


def pair(draft, target: Model, K_max: int, rule: str = "token", drafts: int = 1, adaptive: bool = False,
         confident: bool = False):
    """A model draft must share the target's vocabulary and context; K >= 1; a known verifier; several
    drafts come from a model, with a fixed K and a rule that takes several (match, token)."""
    whole_positive("K", K_max)
    if rule not in RULES:
        raise PicospecError(f"unknown verifier {rule!r}; use one of {', '.join(RULES)}")
    whole_positive("drafts", drafts)
    if drafts > 1 and (RULES[rule] not in CHAINS or adaptive or not isinstance(draft, (Model, HeadDraft))):
        raise PicospecError("several drafts need a draft model or head, a fixed K and --verify match or token "
                            "(block verification judges one chain; the n-gram lookup has only one)")
    if isinstance(draft, HeadDraft):  # an EAGLE head, for a target of its shape
        if (draft.config.n_embd, draft.config.vocab_size) != (target.config.n_embd, target.config.vocab_size):
            raise PicospecError("the EAGLE head reads features of another shape than this target's: use the target "
                                "it was trained against")
        if confident:
            raise PicospecError("the EAGLE head drafts K tokens, or --K auto's k: --confidence needs a draft model")
        return
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


def tree(shape, children: str, draft, target: Model, rule: str, drafts: int, policy) -> int | None:
    """A tree needs a draft model, its own rule (the default verifier), one tree a call and no policy; children one of
    tree.CHILDREN, and no more siblings than tokens when they must differ; a dynamic tree (dynamic.Grown), D <= M <= W D
    and W below the vocabulary. Returns the loop's lookahead (a Shape's M, a Grown's lookahead), None without a tree."""
    unknown = f"unknown way to choose a tree's children {children!r}; use one of {', '.join(CHILDREN)}"
    if shape is None:  # children then choose several drafts' first tokens (several.branches_rule), if not iid
        if children not in CHILDREN:
            raise PicospecError(f"--children {children} needs --tree M" if children == "dynamic" else unknown)
        if children != "iid" and not (whole(drafts) and drafts > 1):
            raise PicospecError(f"--children {children} chooses the children of a tree or of several drafts' root: "
                                "give --tree M or --drafts N (N >= 2), or leave --children out")
        if children == "distinct" and drafts > target.config.vocab_size:
            raise PicospecError(f"{drafts} distinct first drafts need as many tokens; the vocabulary has "
                                f"{target.config.vocab_size}: ask for fewer drafts")
        return None
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
        raise PicospecError(unknown)
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

