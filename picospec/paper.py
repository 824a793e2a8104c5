"""Speculative sampling exactly as Algorithm 1 of Leviathan et al. 2022 writes it: no cache, no loop
compiled, every call runs the whole sequence through the model. Start reading here.

Notation as in speculative.py: p is the draft's distribution and q the target's (the paper swaps the
letters), K is the paper's gamma, and indices count from 0 where the paper counts from 1.
speculative.py is this algorithm with KV caches, compiled into one loop; given the same key, the two
return the same tokens (tests/test_paper.py).
"""

import jax
import jax.numpy as jnp

from picospec.gpt2 import logits
from picospec.sampling import Sampling, logits_to_probs, sample


def speculative_sampling(draft, target, prompt: list[int], n_tokens: int, key, K=4, temperature=1.0) -> list[int]:
    sampling, greedy, width = Sampling(temperature), temperature == 0, len(prompt) + n_tokens + K

    def probs(model, x):  # the model's next-token distribution after every prefix of x: [len(x), V]
        padded = jnp.array(x + [0] * (width - len(x)))  # one length, one compile; causal: padding unseen
        return logits_to_probs(logits(model, padded)[:len(x)], sampling)

    x = list(prompt)
    while len(x) < len(prompt) + n_tokens:
        key, key_draft, key_accept, key_extra = jax.random.split(key, 4)
        # Step 1: the draft guesses K tokens, one after another: d_i ~ p_i.
        drafted, p = [], []
        for key_i in jax.random.split(key_draft, K):
            p.append(probs(draft, x + drafted)[-1])
            drafted.append(int(sample(key_i, p[-1], greedy)))
        # Step 2: the target scores the K guesses and the position after them in ONE call: q_0..q_K.
        q = probs(target, x + drafted)[len(x) - 1:]
        # Step 3: keep d_i with probability min(1, q_i(d_i) / p_i(d_i)), up to the first rejection.
        u = jax.random.uniform(key_accept, (K,))
        a = 0
        while a < K and u[a] < q[a][drafted[a]] / p[a][drafted[a]]:
            a += 1
        # Step 4: at a rejection, one token from norm(max(0, q_a - p_a)); after K accepts, a bonus from q_K.
        extra = jnp.maximum(q[a] - p[a], 0.0) if a < K else q[K]
        x += drafted[:a] + [int(sample(key_extra, extra / extra.sum(), greedy))]
    return x[len(prompt):len(prompt) + n_tokens]
