"""From logits to a token: the standardized distribution (temperature, top-k, top-p), and one draw.

Both models of speculative sampling are standardized the same way, and the draft's tokens are drawn
from exactly the distribution the acceptance rule then uses (see speculative.py).
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp


@partial(jax.tree_util.register_dataclass, data_fields=["temperature", "top_k", "top_p"],
         meta_fields=["greedy", "cuts_k", "cuts_p"])
@dataclass(frozen=True)
class Sampling:
    """How logits become a distribution: temperature, then top-k, then top-p. Under jit the three
    numbers are traced, so a new temperature, top-k or top-p runs the program already compiled;
    only whether each applies is static: `greedy` (temperature 0: an exact argmax), `cuts_k` (top-k
    on) and `cuts_p` (top-p on). So the compiled program never branches on a value at run time (on a
    GPU such a branch waits for the host to read it)."""

    temperature: float = 1.0  # 0 means argmax exactly: a one-hot distribution
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # then keep the fewest most likely tokens whose mass reaches top_p
    greedy: bool | None = None  # temperature == 0; set when made (jax rebuilds it with the traced numbers)
    cuts_k: bool | None = None  # top_k > 0, likewise
    cuts_p: bool | None = None  # top_p < 1, likewise

    def __post_init__(self):
        if self.greedy is None:
            object.__setattr__(self, "greedy", self.temperature == 0)
        if self.cuts_k is None:
            object.__setattr__(self, "cuts_k", self.top_k > 0)
        if self.cuts_p is None:
            object.__setattr__(self, "cuts_p", self.top_p < 1)


@jax.jit  # compiled once when called on its own; inside another jitted function, inlined
def logits_to_probs(logits, sampling: Sampling):  # [..., V] -> [..., V]
    if sampling.greedy:  # one-hot; a row holding NaN or Inf stays NaN, as softmax below leaves it
        one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
        return jnp.where(jnp.isfinite(logits).all(axis=-1, keepdims=True), one_hot, jnp.nan)
    logits = logits / sampling.temperature
    if sampling.cuts_k:
        logits = keep_top_k(logits, sampling.top_k)
    probs = jax.nn.softmax(logits, axis=-1)
    return keep_top_p(probs, sampling.top_p) if sampling.cuts_p else probs


def keep_top_k(logits, k):  # [..., V], int32 [] k >= 1 -> [..., V]: the k largest (and ties with the k-th)
    desc = -jnp.sort(-logits, axis=-1)  # [..., V] largest first
    kth = jnp.take(desc, jnp.minimum(k, logits.shape[-1]) - 1, axis=-1)[..., None]  # [..., 1]
    return jnp.where(logits < kth, -jnp.inf, logits)


def keep_top_p(probs, top_p):  # [..., V], float [] in (0, 1) -> [..., V] renormalized
    desc = -jnp.sort(-probs, axis=-1)  # [..., V] most likely first
    mass_before = jnp.cumsum(desc, axis=-1) - desc  # [..., V]
    # The smallest probability still kept; ties with it are kept too.
    cutoff = jnp.min(jnp.where(mass_before < top_p, desc, 1.0), axis=-1, keepdims=True)
    probs = jnp.where(probs >= cutoff, probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)


@partial(jax.jit, static_argnames="greedy")  # compiled once when called on its own (paper.py); inlined under jit
def sample(key, probs, greedy: bool = False):  # [V] -> int32 []
    """One token drawn from probs; with greedy (temperature 0, a one-hot probs), its argmax."""
    if greedy:
        return jnp.argmax(probs).astype(jnp.int32)
    # Inverse CDF: the first token whose cumulative probability exceeds u ~ U[0, 1), which is the
    # number of tokens whose cumulative probability is at most u. A token of probability 0 adds
    # nothing to the CDF, so it is never drawn.
    # The cumulative sum as a sum over a sliding window: what jnp.cumsum lowers to on CPU, and a loop-free
    # kernel on a GPU too, where newer JAX lowers jnp.cumsum to a scan whose portable form is a loop.
    V = probs.shape[0]
    cdf = jax.lax.reduce_window(probs, 0.0, jax.lax.add, (V,), (1,), [(V - 1, 0)])  # [V]
    u = jax.random.uniform(key) * cdf[-1]
    return jnp.sum(cdf <= u).astype(jnp.int32)
