"""Timing on a shared, noisy machine: contenders raced in turn, forward calls timed in a compiled loop.

Every number that enters a ratio in the benchmark comes from `race`, so a slow spell slows both sides
of the ratio alike; each contender keeps its fastest call. Start-up is timed apart, in fresh processes.
"""

import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp

from picospec.gpt2 import KVCache, Model, forward, init_cache


def race_laps(rounds=3, *, warm=True, first=0, **contenders) -> tuple[list, dict]:
    """The contenders called in turn, round after round, so that a slow spell on a shared machine slows
    them alike, and every other round (counted from `first`) in the reverse order: a place in the round
    tells on a time (the same program raced against itself, always second, ran ~2% slower). Returns
    ([{name: seconds} for each round], {name: first call, which warms up and compiles; none when not `warm`})."""
    def seconds(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    warmup = {name: seconds(fn) for name, fn in contenders.items()} if warm else {}
    names = list(contenders)
    return [{name: seconds(contenders[name]) for name in (names if (first + r) % 2 == 0 else names[::-1])}
            for r in range(rounds)], warmup


def race(rounds=3, **contenders) -> tuple[dict, dict]:
    """({name: fastest of `rounds` timed calls}, {name: its first call}), the contenders called in
    turn, round after round, so that a slow spell on a shared machine slows them alike. The first
    call warms up and compiles: its excess over the fastest call is the compile time."""
    laps, warmup = race_laps(rounds, **contenders)
    return {name: min(lap[name] for lap in laps) for name in contenders}, warmup


def best(fn, rounds=3) -> float:
    """The fastest of `rounds` timed calls, after one warm-up call."""
    return race(rounds, fn=fn)[0]["fn"]


def stream_1GiB(calls=8):
    """`calls` matrix-vector products over a 1 GiB matrix, larger than any cache, in one compiled
    loop (each product feeds the next, so none is skipped): the time of a call gives the memory read
    bandwidth (a decode step is mostly matrix-vector products). One call alone would time a GPU's
    launch and the host's round trip as much as its memory."""
    w, x = jnp.ones((1 << 14, 1 << 14), jnp.float32), jnp.ones(1 << 14, jnp.float32)
    loop = jax.jit(lambda w, x: jax.lax.fori_loop(0, calls, lambda _, x: (w @ x) * 2.0 ** -14, x))
    return lambda: loop(w, x).block_until_ready()


@partial(jax.jit, static_argnames=("T",))
def _forward_calls(model: Model, T: int, calls, cache: KVCache):
    """`calls` forward calls of T tokens as one compiled loop (so no dispatch cost is counted):
    each feeds the previous call's argmaxes, then rolls the cache back."""
    def call(_, carry):
        tokens, cache = carry
        logits, cache = forward(model, tokens, cache)  # [T, V]
        return jnp.argmax(logits, -1).astype(jnp.int32), cache._replace(length=cache.length - T)
    return jax.lax.fori_loop(0, calls, call, (jnp.zeros(T, jnp.int32), cache))[0]


@partial(jax.jit, static_argnames=("K",))
def iteration_calls(draft: Model, target: Model, K: int, calls, draft_cache: KVCache, target_cache: KVCache):
    """`calls` speculative iterations' forward calls and nothing else, as one compiled loop: K one-token
    draft calls, each feeding the previous argmax, then one (K+1)-token target call; then both caches
    roll back. No sampling, no verification arithmetic: only the calls theory counts, as they alternate."""
    def draft_call(carry, _):
        token, cache = carry
        logits, cache = forward(draft, token, cache)  # [1, V]
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        return (token, cache), token[0]

    def iteration(_, carry):
        token, draft_cache, target_cache = carry
        (_, draft_cache), drafted = jax.lax.scan(draft_call, (token, draft_cache), length=K)  # [K]
        logits, target_cache = forward(target, jnp.concatenate([token, drafted]), target_cache)
        return (jnp.argmax(logits[-1:], -1).astype(jnp.int32), draft_cache._replace(length=draft_cache.length - K),
                target_cache._replace(length=target_cache.length - K - 1))
    return jax.lax.fori_loop(0, calls, iteration, (jnp.zeros(1, jnp.int32), draft_cache, target_cache))[0]


def forward_times(calls: dict, capacity=128, others=None, min_seconds=0.25, rounds=5) -> dict:
    """{name: seconds per forward call} for each name: (model, T), a call feeding T tokens after 32
    cached positions (fewer in a cache under 48 slots); or (draft, target, K), one iteration's calls
    (see iteration_calls). The caches have `capacity` slots: pass the capacity of the runs being
    predicted (autoregressive.buffers), since attention reads every slot (the bundled target's one-token
    call costs ~20% more with 256 than with 128). Each is timed as n calls in one compiled loop, n
    doubled until they take `min_seconds` (a tiny model's call is tens of microseconds), and all are
    raced together, so a slow spell hits both sides of v(K) and c alike. `others`, {name: function},
    are raced in the same rounds (the runs these times predict, say); their entries are seconds per
    call of the function."""
    def cached(model):
        dtype = model.params["wte"]["weight"].dtype
        filled = jnp.zeros(max(1, min(32, capacity - 16)), jnp.int32)  # leaves room for 15-16 tokens a call
        return forward(model, filled, init_cache(model.config, capacity, dtype))[1]

    runs, n_calls = {}, {}
    for name, call in calls.items():
        if len(call) == 2:
            model, T = call
            run = lambda n, model=model, T=T, cache=cached(model): lambda: _forward_calls(  # noqa: E731
                model, T, jnp.int32(n), cache).block_until_ready()
        else:
            draft, target, K = call
            run = lambda n, draft=draft, target=target, K=K, caches=(cached(draft), cached(target)): lambda: (  # noqa: E731
                iteration_calls(draft, target, K, jnp.int32(n), *caches).block_until_ready())
        n = 1
        while best(run(n), rounds=1) < min_seconds:
            n *= 2
        runs[name], n_calls[name] = run(n), n
    others = others or {}
    t, _ = race(rounds, **runs, **others)
    return {name: t[name] / n_calls[name] for name in calls} | {name: t[name] for name in others}


FIRST_TOKEN = """
import sys, jax
from picospec.sampling import Sampling
from picospec.tools.jit_cache import use_persistent_cache
from picospec.tools.cli.stream import stream
from picospec.tools.checkpoints.weights import load_model
use_persistent_cache()
draft, target, K = load_model(sys.argv[1]), load_model(sys.argv[2]), int(sys.argv[3])
next(stream(draft, target, [[1, 2, 3]], 16, jax.random.split(jax.random.key(0), 1), K=K, sampling=Sampling(0.0)))
print("first token", flush=True)
"""


def first_token_seconds(draft: str, target: str, K: int, jit_cache: Path) -> float:
    """Wall time from launching a fresh Python process to its first streamed speculative iteration:
    imports, loading both models, compiling (or loading from `jit_cache`), prefill, one iteration."""
    env = {**os.environ, "PICOSPEC_JIT_CACHE": str(jit_cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", FIRST_TOKEN, draft, target, str(K)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []  # the child's log lines, until the first token (or its end)
    while (line := child.stdout.readline()) and line.strip() != "first token":
        lines.append(line)
    seconds = time.perf_counter() - t0
    child.communicate()
    if not line:
        raise RuntimeError(f"the start-up run failed: {''.join(lines).strip().splitlines()[-1:]}")
    return seconds


def startup_times(draft: str, target: str, K: int = 4) -> dict:
    """Seconds to the first token, cold (an empty compilation cache) and warm (the same cache again)."""
    with tempfile.TemporaryDirectory() as folder:
        cold = first_token_seconds(draft, target, K, Path(folder))
        warm = min(first_token_seconds(draft, target, K, Path(folder)) for _ in range(2))
    return {"cold_seconds": cold, "warm_seconds": warm}
