"""The benchmark's batch rows: throughput and latency for B prompts at once, B = 1, 2, 4, 8, 16.

For each B, raced in one loop: picospec's batched autoregressive and speculative sampling (greedy, K
drafts, n tokens after each of B prompts of different lengths), and transformers' batched `generate`
(left-padded, greedy, use_cache=True). transformers' assisted generation takes one prompt only
(batch size 1), so it has no row here. Beside them, the verification cost at this batch size,
v_B(K) = the target's time for B x (K + 1) tokens over its time for B x 1: as B grows, the one-token
call stops being memory-bound, the spare compute that made verification nearly free is used by the
batch itself, and v_B(K) (and so the iteration's cost) rises towards K + 1.
"""

import jax
import jax.numpy as jnp
from timing import race

from picospec.beyond import theory
from picospec.gpt2 import Model, forward, init_cache
from picospec.tools.samplers import autoregressive_sample_batch, speculative_sample_batch


def ragged_prompts(B: int) -> list[list[int]]:
    """B prompts of 5 to 12 token ids, valid in every vocabulary here."""
    return [list(range(100, 105 + (7 * b) % 8)) for b in range(B)]


def batched_forward_time(model: Model, B: int, T: int, calls=8) -> float:
    """Seconds per forward call of B rows x T tokens after 32 cached positions, as `calls` calls in
    one compiled loop (the cache rolled back after each)."""
    dtype = model.params["wte"]["weight"].dtype

    @jax.jit
    def loop(model, caches):
        def call(_, carry):
            tokens, caches = carry
            logits, new = jax.vmap(lambda t, c: forward(model, t, c))(tokens, caches)
            return jnp.argmax(logits, -1).astype(jnp.int32), new._replace(length=caches.length)
        return jax.lax.fori_loop(0, calls, call, (jnp.zeros((B, T), jnp.int32), caches))[0]

    cache = init_cache(model.config, 64, dtype)._replace(length=jnp.int32(32))
    caches = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (B,) + x.shape), cache)
    t, _ = race(rounds=3, run=lambda: loop(model, caches).block_until_ready())
    return t["run"] / calls


def batch_report(name: str, draft: Model, target: Model, folders, K: int, n: int, Bs, with_transformers) -> dict:
    """Throughput (tokens/s) and latency (s for the whole batch) for each B; speedups; v_B(K)."""
    from bench_reference import transformers_batch_generate
    rows = []
    for B in Bs:
        prompts, keys = ragged_prompts(B), jax.random.split(jax.random.key(0), B)
        runs = dict(
            ar=lambda: autoregressive_sample_batch(target, prompts, n, keys, temperature=0).block_until_ready(),
            spec=lambda: speculative_sample_batch(draft, target, prompts, n, keys, K=K, temperature=0)[0]
            .block_until_ready())
        if with_transformers and (hf := transformers_batch_generate(folders[1], prompts, n)):
            runs["transformers"] = hf
        t, _ = race(rounds=2, **runs)
        trace = speculative_sample_batch(draft, target, prompts, n, keys, K=K, temperature=0)[1]
        alpha = theory.alpha_from_trace(jnp.concatenate([trace.n_accepted[b, :int(trace.n_steps[b])]
                                                         for b in range(B)]), K)
        one_token = batched_forward_time(target, B, 1)  # timed once, shared by v and c
        v = batched_forward_time(target, B, K + 1) / one_token
        c = batched_forward_time(draft, B, 1) / one_token
        row = {"B": B, "alpha": float(alpha), "c": c, "v": v,
               "predicted_speedup": float(theory.walltime_improvement(alpha, K, c, v))}
        for name_, seconds in t.items():
            row[f"{name_}_seconds"] = seconds
            row[f"{name_}_tokens_per_second"] = B * n / seconds
        row["speedup"] = t["ar"] / t["spec"]
        rows.append(row)
        print(f"batch {name} B={B}: {row}", flush=True)
    return {"pair": name, "K": K, "n_tokens": n, "rows": rows}
