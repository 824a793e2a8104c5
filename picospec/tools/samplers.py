"""The public entry points (`picospec.speculative_sample` and the rest): the lesson's samplers with their
input checked (tools/checks.py), their options named (`verify="block"`, `drafts=2`, a `policy`) and turned
into the lesson's plug-ins, for batches the memory checked and the rows placed on devices, and the
trace's non-finite flags read after the loop."""


import jax
import jax.numpy as jnp

from picospec import autoregressive, gpt2
from picospec.beyond import loop
from picospec.beyond.adaptive import AdaptiveDraft, adaptive_step
from picospec.beyond.batch import autoregressive_batch, batch_buffers, speculative_batch
from picospec.beyond.dynamic import DynamicDraft, Grown
from picospec.beyond.eagle import HeadDraft, adaptive_head_step, head_step
from picospec.beyond.eagle_tree import HeadTreeDraft, head_tree_step
from picospec.beyond.loop import ModelDraft, speculative_step
from picospec.beyond.ngram import NGramDraft
from picospec.beyond.policy import fixed
from picospec.beyond.several import branches_rule
from picospec.beyond.tree import TreeDraft, branches, chain
from picospec.beyond.tree_verify import tree_step, verify_tree
from picospec.beyond.verifiers import RULES
from picospec.gpt2 import Model
from picospec.tools import checks, draft_checks
from picospec.tools.memory import check_memory, memory_per_row
from picospec.tools.sharding import place


def plug_in(draft, target: Model, K: int, rule: str = "token", drafts: int = 1, policy=None, tree=None,
            children: str = "iid"):
    """The lesson's (draft, step, verify) for these options: the draft a Model or an NGramDraft, the
    rule a name of verifiers.RULES, drafts the chains per call, policy a policy.Policy or None,
    tree a tree.Shape (its children chosen by `children`; the tree's own rule verifies it, or with
    several drafts, the tree of their branches (as_tree), the rule's form for chains whose first drafts
    are chosen by `children`)."""
    verify = RULES[rule]
    draft = ModelDraft(draft) if isinstance(draft, Model) else draft.for_target(target)
    if isinstance(draft, HeadDraft):  # EAGLE: its own iterations hand it the target's features
        if policy is not None:
            return AdaptiveDraft(draft, policy), adaptive_head_step, verify
        if tree is None or (tree == chain(K) and children != "top" and drafts == 1):
            return draft, head_step, verify
        return HeadTreeDraft(draft, tree, children), head_tree_step, (branches_rule(verify, children) if drafts > 1
                                                                      else verify_tree)
    if isinstance(tree, Grown):  # EAGLE-2's dynamic tree
        table = None if tree.calibration is None else jnp.float32(tree.calibration)  # data, not the program
        return DynamicDraft(draft, tree._replace(calibration=None), table), tree_step, verify_tree
    if tree == chain(K) and children != "top" and drafts == 1:  # a chain drawn from p (one child a node: iid
        return draft, speculative_step, verify  # is distinct): run it on speculative.py's step, less machinery
    if tree is not None:
        rule = branches_rule(verify, children) if drafts > 1 else verify_tree
        return TreeDraft(draft, tree, children), tree_step, rule
    if policy is None and isinstance(draft, NGramDraft):
        policy = fixed(K)  # a lookup may find nothing: it runs as a draft that proposes fewer than K
    if policy is not None:
        return AdaptiveDraft(draft, policy), adaptive_step, verify
    return draft, speculative_step, verify


def as_tree(K: int, drafts: int, tree):
    """Several drafts run as the tree of their branches (several.py): the loop's lookahead, and the tree."""
    return (drafts * K, branches(drafts, K)) if drafts > 1 else (K, tree)


def speculative_sample(draft, target: Model, prompt_tokens, n_tokens: int, key, *, K=4, temperature=1.0,
                       top_k=0, top_p=1.0, stop_at_eos=False, verify="token", policy=None, drafts=1, tree=None,
                       children="iid"):
    """Sample n_tokens from `target`, with `draft` proposing K tokens per target call.

    A pure function of its inputs: jax.jit and jax.vmap (over key) both work.
    Args:
      draft, target: Models sharing a vocabulary; or draft=picospec.NGramDraft(max_n) to look up n-grams.
      prompt_tokens: int [P], P >= 1.
      n_tokens: tokens to generate; P + n_tokens + K - 1 must fit in the target's n_positions.
      key: a jax.random key; the same key gives the same tokens.
      K: tokens drafted per iteration (>= 1).
      temperature, top_k, top_p: see sampling.Sampling; both models are standardized alike.
      stop_at_eos: stop at <|endoftext|>; the slots after it are filled with <|endoftext|>.
      verify: steps 3 and 4's rule, "match", "token" or "block" (verifiers.py); all three are lossless.
      policy: a policy.Policy: draft up to K tokens, fewer when its rules say so (None: always K).
      drafts: N independent draft chains verified together (several.py; match or token, no policy).
      tree: a tree.Shape: the draft's guesses as a tree of that shape, scored in one call (K is then
        its number of nodes M); children: how they are chosen, "iid", "top" or "distinct" (tree.py).
    Returns:
      tokens: int32 [n_tokens], distributed exactly as target's autoregressive samples.
      trace: Trace of every iteration (the last one may run past n_tokens; tokens are cut there).
    """
    sampling = checks.sampling(temperature, top_k, top_p)
    K = draft_checks.tree(tree, children, draft, target, verify, drafts, policy) or K
    draft_checks.pair(draft, target, K, verify, drafts, policy is not None, draft_checks.confident(policy))
    K, tree = as_tree(K, drafts, tree)
    checks.prompt(prompt_tokens, n_tokens, K, target.config)
    checks.eos(target, stop_at_eos)
    pair, (draft, step, verify) = (draft, target), plug_in(draft, target, K, verify, drafts, policy, tree, children)
    out, trace = loop.speculative_sample(draft, target, prompt_tokens, n_tokens, key, K=K,
                                         temperature=sampling.temperature, top_k=sampling.top_k,
                                         top_p=sampling.top_p, stop_at_eos=stop_at_eos, verify=verify, step=step)
    checks.finite(trace, *pair)
    return out, trace


def autoregressive_sample(model: Model, prompt_tokens, n_tokens: int, key, *, temperature=1.0, top_k=0,
                          top_p=1.0, stop_at_eos=False) -> jax.Array:
    """Sample n_tokens from `model` one at a time (autoregressive.autoregressive_sample, checked)."""
    sampling = checks.sampling(temperature, top_k, top_p)
    checks.prompt(prompt_tokens, n_tokens, 0, model.config)
    checks.eos(model, stop_at_eos)
    return autoregressive.autoregressive_sample(model, prompt_tokens, n_tokens, key, temperature=sampling.temperature,
                                                top_k=sampling.top_k, top_p=sampling.top_p, stop_at_eos=stop_at_eos)


def logits(model: Model, tokens) -> jax.Array:
    """gpt2.logits, checked: a full forward pass over 1 to n_positions tokens -> float32 logits [T, V]."""
    checks.context(tokens, model)
    return gpt2.logits(model, tokens)


def speculative_sample_batch(draft, target: Model, prompts, n_tokens: int, keys, *, K=4, temperature=1.0,
                             top_k=0, top_p=1.0, stop_at_eos=False, verify="token", policy=None, drafts=1,
                             tree=None, children="iid", mesh=None):
    """`speculative_sample` for B prompts at once: prompts is a list of B token lists (any lengths),
    keys a [B] array of keys (e.g. jax.random.split(key, B)). Returns tokens int32 [B, n_tokens] and a
    Trace whose every field has a leading [B]; row b is exactly what the single-prompt call gives.
    policy, drafts, tree, children: as for `speculative_sample`.
    mesh: a jax.sharding.Mesh (picospec.tools.sharding.make_mesh) to split the rows, and the target's
    weights, across devices."""
    sampling = checks.sampling(temperature, top_k, top_p)
    K = draft_checks.tree(tree, children, draft, target, verify, drafts, policy) or K
    draft_checks.pair(draft, target, K, verify, drafts, policy is not None, draft_checks.confident(policy))
    K, tree = as_tree(K, drafts, tree)
    checks.prompts(prompts, n_tokens, K, target.config)
    eos_id = checks.eos(target, stop_at_eos)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, K, target.config)
    models, pair = [m for m in (draft, target) if isinstance(m, Model)], (draft, target)
    draft, step, verify = plug_in(draft, target, K, verify, drafts, policy, tree, children)
    check_memory(len(prompts) * memory_per_row(models, max_len, K + 1), len(prompts))
    args = (tokens, n_prompt, checks.keys(keys, len(prompts)))
    if mesh is not None:
        draft, target, args = place(mesh, draft, target, args)
    out, trace = speculative_batch(draft, target, *args, n_tokens, K, sampling, prefill_len, max_len, eos_id, verify,
                                   step)
    checks.finite(trace, *pair)
    if out.shape[0] == len(prompts):  # no rows added to fill the devices (place)
        return out, trace
    return out[:len(prompts)], jax.tree_util.tree_map(lambda x: x[:len(prompts)], trace)


def autoregressive_sample_batch(model: Model, prompts, n_tokens: int, keys, *, temperature=1.0, top_k=0,
                                top_p=1.0, stop_at_eos=False, mesh=None):
    """`autoregressive_sample` for B prompts at once; returns int32 [B, n_tokens] (see above)."""
    sampling = checks.sampling(temperature, top_k, top_p)
    checks.prompts(prompts, n_tokens, 0, model.config)
    eos_id = checks.eos(model, stop_at_eos)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, 0, model.config)
    check_memory(len(prompts) * memory_per_row([model], max_len, 1), len(prompts))
    args = (tokens, n_prompt, checks.keys(keys, len(prompts)))
    if mesh is not None:
        _, model, args = place(mesh, None, model, args)
    out = autoregressive_batch(model, *args, n_tokens, sampling, prefill_len, max_len, eos_id)
    return out if out.shape[0] == len(prompts) else out[:len(prompts)]
