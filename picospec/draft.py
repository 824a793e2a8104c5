"""Step 1 of speculative sampling (see speculative.py): a draft model proposes K tokens.

Every draft offers the same two functions: `prefill`, its state before the first iteration, and
`propose`, which returns a Proposal (the drafted tokens d_0..d_{K-1}, the distributions p they were
drawn from, and the draft's new state). A model draft is wrapped in ModelDraft; the n-gram draft
(ngram.py) looks its tokens up instead. The speculative loop calls `draft.propose` and never asks
which kind of draft it has.
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.errors import PicospecError
from picospec.gpt2 import KVCache, Model, forward
from picospec.sampling import Sampling, logits_to_probs, prefill, sample
from picospec.state import Proposal


def propose(draft: Model, tokens, n, cache: KVCache, key, K: int, sampling: Sampling) -> Proposal:
    """Step 1: the draft samples d_0..d_{K-1} after tokens[:n], one forward call each.
    Returns them with p float32 [K, V], and the draft's cache holding positions [0, n + K - 1): the
    sequence and d_0..d_{K-2} (d_{K-1} is sampled but not fed: it may be rejected)."""
    keys, greedy = jax.random.split(key, K), sampling.greedy
    p_first, cache = catch_up(draft, tokens, n, cache, sampling)

    def draft_step(carry, key_i):  # sample d_i from p[i], feed it, get p[i+1]
        cache, p_i = carry
        d_i = sample(key_i, p_i, greedy)
        logits, cache = forward(draft, d_i[None], cache)  # [1, V]
        return (cache, logits_to_probs(logits[0], sampling)), (d_i, p_i)

    (cache, p_last), (drafted, p) = jax.lax.scan(draft_step, (cache, p_first), keys[:K - 1])
    d_last = sample(keys[K - 1], p_last, greedy)
    return Proposal(jnp.concatenate([drafted, d_last[None]]), jnp.concatenate([p, p_last[None]]), cache)


def propose_until(draft: Model, tokens, n, cache: KVCache, key, K: int, k, threshold, sampling: Sampling,
                  rows_max=lambda x: x) -> Proposal:
    """Step 1, stopping early (adaptive.py): draft d_0, d_1, ... while fewer than k (int32 [], <= K)
    are drafted and the newest had p[i](d_i) >= threshold. The same keys as `propose`, so with k = K
    and threshold 0 it drafts the same tokens. p's rows past the last draft are zero. rows_max: in a
    batch, every row's draft runs while any row still drafts (the extra drafts are dropped)."""
    keys, greedy = jax.random.split(key, K), sampling.greedy
    p_0, cache = catch_up(draft, tokens, n, cache, sampling)
    d_0 = sample(keys[0], p_0, greedy)
    drafted = jnp.zeros(K, jnp.int32).at[0].set(d_0)  # [K]
    p = jnp.zeros((K,) + p_0.shape, p_0.dtype).at[0].set(p_0)  # [K, V]

    def go_on(i, d_i, p_i):  # after d_i: draft another?
        return (i + 1 < k) & (p_i[d_i] >= threshold)

    def draft_step(carry):  # feed d_i, sample d_{i+1} from p[i+1]
        i, cache, drafted, p, drafting = carry
        logits, cache = forward(draft, drafted[i][None], cache)  # [1, V]
        p_next = logits_to_probs(logits[0], sampling)
        d_next = sample(keys[i + 1], p_next, greedy)
        drafted = drafted.at[i + 1].set(jnp.where(drafting, d_next, 0))
        p = p.at[i + 1].set(jnp.where(drafting, p_next, 0.0))
        return i + 1, cache, drafted, p, drafting & go_on(i + 1, d_next, p_next)

    carry = (jnp.int32(0), cache, drafted, p, go_on(0, d_0, p_0))
    _, cache, drafted, p, _ = jax.lax.while_loop(lambda c: rows_max(c[4].astype(jnp.int32)) > 0, draft_step, carry)
    return Proposal(drafted, p, cache)


def catch_up(draft: Model, tokens, n, cache: KVCache, sampling: Sampling):
    """The draft's first call of an iteration: bring its cache to n - 1 positions, and return p[0].

    After a rejection the draft's cache holds x[:n-1], like the target's. After a full accept it lags
    one behind: the last draft token d_{K-1} was never fed, so it holds x[:n-2]. Rather than spend a
    call catching up, the first call always feeds two tokens from m = cache.length: (x[n-2], x[n-1])
    when lagging, else (x[n-1], a scratch slot that stays beyond the length). Two tokens cost about
    one on memory-bound hardware, so the catch-up is nearly free. Returns p[0] [V] and the cache."""
    m = cache.length
    logits, cache = forward(draft, jax.lax.dynamic_slice(tokens, (m,), (2,)), cache)  # [2, V]
    p_first = logits_to_probs(logits[n - 1 - m], sampling)  # [V] the row after x[n-1]
    return p_first, cache._replace(length=n)  # drop the scratch slot, if it was written


@partial(jax.tree_util.register_dataclass, data_fields=["model"], meta_fields=[])
@dataclass(frozen=True)
class ModelDraft:
    """A draft model behind the interface every draft offers."""

    model: Model

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        return prefill(self.model, tokens, n, prefill_len, max_len)

    def propose(self, tokens, n, cache, key, K: int, sampling: Sampling) -> Proposal:
        return propose(self.model, tokens, n, cache, key, K, sampling)

    def propose_until(self, tokens, n, cache, key, K: int, k, threshold, sampling: Sampling, rows_max) -> Proposal:
        return propose_until(self.model, tokens, n, cache, key, K, k, threshold, sampling, rows_max)


def as_draft(draft, target: Model):
    """The draft as the loop calls it: a Model through ModelDraft; the n-gram draft, told the target's
    vocabulary (its p is one-hot over it)."""
    return ModelDraft(draft) if isinstance(draft, Model) else draft.for_target(target)


RULES = ("match", "token", "block")  # the verifiers (speculative.py, verifiers.py)


def check_pair(draft, target: Model, K: int, rule: str = "token", drafts: int = 1, policy=None):
    """A model draft must share the target's vocabulary and context; K >= 1; a known verifier; several
    drafts come from a model, with a fixed K and a rule that takes several (match, token)."""
    if not (isinstance(K, int) and K >= 1):
        raise PicospecError(f"K must be a whole number >= 1, got {K}")
    if rule not in RULES:
        raise PicospecError(f"unknown verifier {rule!r}; use one of {', '.join(RULES)}")
    if not (isinstance(drafts, int) and drafts >= 1):
        raise PicospecError(f"drafts must be a whole number >= 1, got {drafts}")
    if drafts > 1 and (rule == "block" or policy is not None or not isinstance(draft, Model)):
        raise PicospecError("several drafts need a draft model, a fixed K and --verify match or token "
                            "(block verification judges one chain; the n-gram lookup has only one)")
    if not isinstance(draft, Model):  # the n-gram draft checked itself when it was made
        return
    if draft.config.vocab_size != target.config.vocab_size:
        raise PicospecError(f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the "
                            f"target's ({target.config.vocab_size}); pick a draft with the target's tokenizer")
    if draft.config.n_positions < target.config.n_positions:
        raise PicospecError(f"the draft's context ({draft.config.n_positions}) is shorter than the "
                            f"target's ({target.config.n_positions}); pick a draft with at least as long a context")
