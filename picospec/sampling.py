"""From logits to a token: the standardized distribution (temperature, top-k, top-p), and one draw.

Both models of speculative sampling are standardized the same way, and the draft's tokens are drawn
from exactly the distribution the acceptance rule then uses (see speculative.py).
"""

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

SHARED_K = 64  # every top-k up to this shares one program; larger ones, one per power of two


@partial(jax.tree_util.register_dataclass, data_fields=["temperature", "top_k", "top_p"],
         meta_fields=["greedy", "k_bound", "cuts_p"])
@dataclass(frozen=True)
class Sampling:
    """Logits to a distribution: temperature, then top-k, then top-p. Under jit the numbers are traced (a new one
    runs the program already compiled; a top-k, up to SHARED_K); only whether each applies is static (`greedy`,
    `k_bound`, `cuts_p`): the program never branches on a value at run time (on a GPU that waits for the host)."""

    temperature: float = 1.0  # 0 means argmax exactly: a one-hot distribution
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # then keep the fewest most likely tokens whose mass reaches top_p
    greedy: bool | None = None  # temperature == 0; set when made (jax rebuilds it with the traced numbers)
    k_bound: int | None = None  # top-k's lax.top_k size: 0 (off), SHARED_K, or the power of two >= top_k
    cuts_p: bool | None = None  # top_p < 1, likewise

    def __post_init__(self):
        if self.greedy is None:
            object.__setattr__(self, "greedy", self.temperature == 0)
        if self.k_bound is None:
            k = int(self.top_k)
            object.__setattr__(self, "k_bound", max(SHARED_K, 1 << (k - 1).bit_length()) if k > 0 else 0)
        if self.cuts_p is None:
            object.__setattr__(self, "cuts_p", self.top_p < 1)


@jax.jit  # compiled once when called on its own; inside another jitted function, inlined
def logits_to_probs(logits, sampling: Sampling):  # [..., V] -> [..., V]
    if sampling.greedy:  # one-hot; a row holding NaN or Inf stays NaN, as softmax below leaves it
        one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
        return jnp.where(jnp.isfinite(logits).all(axis=-1, keepdims=True), one_hot, jnp.nan)
    logits = logits / sampling.temperature
    if sampling.k_bound:
        logits = keep_top_k(logits, sampling.top_k, sampling.k_bound)
    probs = jax.nn.softmax(logits, axis=-1)
    return keep_top_p(probs, sampling.top_p, sampling.k_bound) if sampling.cuts_p else probs


def largest(x, n: int):  # [..., V] -> [..., min(n, V)], largest first (n = 0: all V sorted)
    # Not a sort of the vocabulary: XLA:CPU sorts GPT-2's 50,257 logits in 14.5 ms, finds the 64 largest in 0.15.
    return jax.lax.top_k(x, min(n, x.shape[-1]))[0] if n else -jnp.sort(-x, axis=-1)


def keep_top_k(logits, k, k_bound: int):  # [..., V], 1 <= k <= k_bound -> [..., V]: the k largest, ties kept
    top = largest(logits, k_bound)  # [..., k_bound]
    kth = jnp.take(top, jnp.minimum(k, top.shape[-1]) - 1, axis=-1)[..., None]  # [..., 1]
    return jnp.where(logits < kth, -jnp.inf, logits)


def keep_top_p(probs, top_p, k_bound: int = 0):  # [..., V], float [] in (0, 1) -> [..., V] renormalized
    # After top-k the nucleus lies in the k_bound largest (ties past them give the same cutoff below).
    desc = largest(probs, k_bound)  # [..., k_bound or V] most likely first
    mass_before = jnp.cumsum(desc, axis=-1) - desc  # [..., k_bound or V]
    cutoff = jnp.min(jnp.where(mass_before < top_p, desc, 1.0), axis=-1, keepdims=True)  # least kept; ties too
    probs = jnp.where(probs >= cutoff, probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)


@partial(jax.jit, static_argnames="greedy")  # compiled once when called on its own (paper.py); inlined under jit
def sample(key, probs, greedy: bool = False):  # [V] -> int32 []
    """One token drawn from probs; with greedy (temperature 0, a one-hot probs), its argmax."""
    if greedy:
        return jnp.argmax(probs).astype(jnp.int32)
    # Inverse CDF: the first token whose cumulative probability exceeds u ~ U[0, 1), i.e. the number of
    # tokens whose cumulative probability is at most u (a token of probability 0 is never drawn).
    # The cumulative sum as a sum over a sliding window: what jnp.cumsum lowers to on CPU, and a loop-free
    # kernel on a GPU too, where newer JAX lowers jnp.cumsum to a scan whose portable form is a loop.
    V = probs.shape[0]
    cdf = jax.lax.reduce_window(probs, 0.0, jax.lax.add, (V,), (1,), [(V - 1, 0)])  # [V]
    u = jax.random.uniform(key) * cdf[-1]
    return jnp.sum(cdf <= u).astype(jnp.int32)
