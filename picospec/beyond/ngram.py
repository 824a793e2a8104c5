"""The n-gram draft: propose what followed the last time the context's tail occurred.

A draft does not have to be a model. Prompt lookup decoding (Saxena 2023), LLMA (Yang et al. 2023) and
the n-gram approximation models of Leviathan et al. (§3.6) all propose the K tokens that followed the
latest earlier occurrence of the sequence's last n tokens. The target verifies them in the same loop as
a model's drafts: the proposal is a one-hot p, so a drafted token d is accepted with probability
min(1, q(d) / 1) = q(d), and a rejection resamples from norm(max(0, q - onehot(d))) — still exactly q.
At temperature 0 that is an exact match against the target's argmax. Text that quotes, repeats or edits
its input is full of such matches, and a lookup costs next to nothing (c ≈ 0).

When nothing matches, the lookup proposes nothing (k = 0). Run it as a draft that may propose fewer
than K, `adaptive.AdaptiveDraft(NGramDraft(max_n).for_target(target), policy.fixed(K))` with
`adaptive.adaptive_step`: an iteration with nothing proposed is then one plain target step, so that a
lookup that finds nothing costs no more than autoregressive decoding.
"""

import dataclasses
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from picospec.beyond.loop import Proposal
from picospec.gpt2 import KVCache


@partial(jax.tree_util.register_dataclass, data_fields=[], meta_fields=["max_n", "vocab_size"])
@dataclass(frozen=True)
class NGramDraft:
    """The draft that looks up n-grams in the sequence so far (no weights, no cache). Static under jit."""

    max_n: int = 3  # the longest tail tried; then max_n - 1, ..., 1
    vocab_size: int | None = None  # V of the one-hot p: the target's (for_target sets it)
    may_stop = False  # it looks up until the end

    def for_target(self, target) -> "NGramDraft":
        return dataclasses.replace(self, vocab_size=target.config.vocab_size)

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> KVCache:
        return KVCache([], [], n - 1)  # no layers: every lookup reads the sequence itself

    def propose(self, state, key, K: int, sampling) -> Proposal:
        """Step 1 as a lookup: d_0..d_{K-1} with a one-hot p, or nothing (k = 0) when nothing matches."""
        drafted, found = lookup(state.tokens, state.n, self.max_n, K)
        p = jax.nn.one_hot(drafted, self.vocab_size) * found  # [K, V]
        return Proposal(jnp.where(found, drafted, 0), p, state.draft_cache, jnp.where(found, K, 0))


def lookup(tokens, n, max_n: int, K: int):
    """Propose K tokens after tokens[:n] by n-gram lookup. tokens: int32 [L]; n: int32 [].

    For g = max_n down to 1, find the latest start j < n - g with tokens[j:j+g] == tokens[n-g:n]; the
    longest g that matches wins. The proposal is what followed, tokens[j+g:], continued periodically when
    it runs into the end of the sequence (an overlapping match such as "a b a b" then repeats). Returns
    drafted int32 [K] and found bool [] (False: nothing matched, take a plain target step).
    """
    L = tokens.shape[0]
    starts = jnp.arange(L)  # [L] candidate start j of an earlier occurrence
    found, shift = jnp.array(False), jnp.int32(1)
    for g in range(1, max_n + 1):  # longer tails overwrite shorter ones: the longest match wins
        tail = jax.lax.dynamic_slice(tokens, (jnp.maximum(n - g, 0),), (g,))  # [g]
        windows = jnp.stack([jnp.roll(tokens, -i) for i in range(g)])  # [g, L]: windows[i, j] = tokens[j + i]
        match = jnp.all(windows == tail[:, None], axis=0) & (starts <= n - g - 1)  # [L], ends before n - 1
        j = jnp.max(jnp.where(match, starts, -1))  # the latest occurrence, or -1
        hit = (j >= 0) & (n > g)
        found, shift = found | hit, jnp.where(hit, n - g - j, shift)
    # What followed the occurrence starts at n - shift; beyond n it repeats with period `shift`.
    drafted = jnp.take(tokens, n - shift + jnp.arange(K) % shift)  # [K]
    return drafted, found

