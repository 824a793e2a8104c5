"""The real speculative loop against its forward calls alone, and what two of its chores cost.

    python benchmarks/loop_work.py 4        # K = 4 (any K >= 2)

On the bundled pair, float32, temperature 0.8, 128 tokens (caches of 256 slots, as notebook 3's runs):
the real loop (`speculative._speculative`), and variants of it for timing only, which are NOT correct
samplers: the draft's first call feeding one token instead of two (`propose` feeds two so that a draft
one behind after a full accept catches up), no trace written, both; against `timing._iteration_calls`,
the iteration's forward calls alone as they alternate. Milliseconds per iteration, fastest of 7 rounds
raced in turn; the real loop's time includes its prefill, spread over its iterations.
"""

import sys

import jax
import jax.numpy as jnp

import picospec
import picospec.speculative as spec
from picospec.gpt2 import forward, init_cache
from picospec.sampling import Sampling, buffers, logits_to_probs, sample
from picospec.tools.timing import _iteration_calls, race

N_TOKENS, PROMPT = 128, "And the LORD spake unto Moses, saying"


def propose_one_token(draft, tokens, n, cache, key, K, sampling):
    """`speculative.propose` with a one-token first call: wrong after a full accept; for timing only."""
    keys, greedy = jax.random.split(key, K), sampling.temperature == 0
    cache = cache._replace(length=n - 1)
    logits, cache = forward(draft.params, jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), cache, draft.config)

    def draft_step(carry, key_i):
        cache, p_prev, _ = carry
        token = sample(key_i, p_prev, greedy)
        logits, cache = forward(draft.params, token[None], cache, draft.config)
        return (cache, logits_to_probs(logits[0], sampling), token), (token, p_prev)

    init = (cache, logits_to_probs(logits[0], sampling), jnp.int32(0))
    (cache, p_last, _), (drafted, p) = jax.lax.scan(draft_step, init, keys[:K - 1])
    last = sample(keys[K - 1], p_last, greedy)
    return jnp.concatenate([drafted, last[None]]), jnp.concatenate([p, p_last[None]]), cache


def no_trace(t, *_):
    return t._replace(n_steps=t.n_steps + 1)


def main():
    K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    prompt = picospec.load_tokenizer("tiny-target").encode(PROMPT).ids
    tokens, prefill_len, max_len = buffers(prompt, N_TOKENS, K, target.config)
    args = (draft, target, tokens, len(prompt), jax.random.key(0), N_TOKENS, K, Sampling(0.8), prefill_len, max_len, -1)
    variants = {"the real loop": (spec.propose, spec.record), "first call one token": (propose_one_token, spec.record),
                "no trace": (spec.propose, no_trace), "both": (propose_one_token, no_trace)}
    runs, steps, real = {}, {}, (spec.propose, spec.record)
    for name, (propose, record) in variants.items():
        spec.propose, spec.record = propose, record  # the loop below is traced now, with these
        loop = jax.jit(spec._speculative.__wrapped__, static_argnums=range(5, 11))
        steps[name] = int(loop(*args)[1].n_steps)
        runs[name] = lambda loop=loop: loop(*args)[0].block_until_ready()
    spec.propose, spec.record = real

    def cached(model):  # 32 positions in a cache the size the runs use
        return forward(model.params, jnp.zeros(32, jnp.int32), init_cache(model.config, max_len), model.config)[1]
    caches, n = (cached(draft), cached(target)), steps["the real loop"]
    runs["its calls alone"] = lambda: _iteration_calls(draft, target, K, jnp.int32(n), *caches).block_until_ready()
    steps["its calls alone"] = n
    seconds, _ = race(7, **runs)
    for name, s in seconds.items():
        print(f"K = {K}  {name:22s} {s / steps[name] * 1e3:6.3f} ms an iteration ({steps[name]} iterations)")


if __name__ == "__main__":
    main()
