"""Where a forward call's time goes: XLA:CPU's own per-operation trace of `gpt2.forward`, grouped.

    python benchmarks/profile_forward.py [--layers 48] [--T 1,2,4,8,16]

Builds a random-weight float32 model of GPT-2 1558M's shape (25 heads of 64, width 1600; 48 layers, or
fewer with --layers), caches 32 positions (cache capacity 128, as the benchmark's v(K) does), then
traces 5 calls of T tokens for each T with jax.profiler and sums each operation's time per call, in
groups: the weight products (by weight), attention's two products, the cache writes, and the rest
(layer norms, GELU, residuals, and the waits on the GEMM library's thread pool).
Durations are summed over threads, so a group's share is of the summed time, not of wall time.
"""

import argparse
import collections
import glob
import re
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.profiler import ProfileData

from picospec.config import GPT2Config
from picospec.gpt2 import forward, init_cache, init_params


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--T", default="1,2,4,8,16")
    args = parser.parse_args()
    config = GPT2Config(n_layer=args.layers, n_head=25, n_embd=1600)
    params = init_params(config, jax.random.key(0))
    C, V = config.n_embd, config.vocab_size
    weights = {3 * C: "c_attn", 4 * C: "mlp.c_fc", V: "lm_head"}  # [out, rows]; out = C is c_proj (both)
    print(f"GPT-2 1558M shape, {args.layers} layers, float32, {jax.devices()[0].device_kind}")
    print(f"{'T':>3} {'wall ms':>8} {'summed ms':>9}   " + "  ".join(f"{g:>14}" for g in GROUPS))
    for T in [int(t) for t in args.T.split(",")]:
        tokens = jnp.zeros(T, jnp.int32)
        cache = forward(params, jnp.zeros(32, jnp.int32), init_cache(config, 128), config)[1]
        shapes = output_shapes(forward.lower(params, tokens, cache, config).compile().as_text())
        state = {"cache": cache}

        def call():  # one forward call of T tokens; the cache (donated) rolls back after it
            logits, cache = forward(params, tokens, state["cache"], config)
            state["cache"] = cache._replace(length=cache.length - T)
            logits.block_until_ready()
        for _ in range(3):  # warm up: the first calls prepare the kernel library
            call()
        wall, ops = traced_ops(call)
        groups = collections.Counter()
        for name, seconds in ops.items():
            groups[group(name, shapes.get(name, ""), C, weights)] += seconds * 1e3
        total = sum(groups.values())
        print(f"{T:3d} {wall * 1e3:8.1f} {total:9.1f}   "
              + "  ".join(f"{groups[g]:6.1f} ({groups[g] / total:4.0%})" for g in GROUPS))


GROUPS = ["c_attn", "c_proj", "mlp.c_fc", "lm_head", "attention", "cache writes", "other"]


def traced_ops(fn, runs: int = 5) -> tuple[float, collections.Counter]:
    """Run fn `runs` times under jax.profiler: (wall seconds per run, {operation: seconds per run}) for every
    operation XLA:CPU executed, summed over threads; containers (loops, calls), which hold others, left out."""
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        wall = (time.perf_counter() - t0) / runs
        jax.profiler.stop_trace()
        trace = ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    ops = collections.Counter()
    for plane in trace.planes:
        for line in plane.lines:
            if re.match(r"tf_XLA(Eigen|PjRtCpuClient)", line.name):
                for event in line.events:
                    if not event.name.startswith(("ThunkExecutor", "end:", "while", "call", "conditional")):
                        ops[event.name] += event.duration_ns * 1e-9 / runs
    return wall, ops


def output_shapes(hlo: str) -> dict:
    """{instruction name: 'f32[...] opcode'} for every instruction of the compiled program."""
    found = re.finditer(r"^\s*(?:ROOT )?%?([\w.-]+) = (\w+\[[\d,]*\])\S* ([\w-]+)\(", hlo, re.M)
    return {name: f"{shape} {op}" for name, shape, op in (m.groups() for m in found)}


def group(name: str, shape: str, C: int, weights: dict) -> str:
    """Which group an executed operation (its name, and 'f32[...] opcode' from output_shapes) is in."""
    if "dynamic-update-slice" in name:
        return "cache writes"
    if not name.startswith(("dot", "ynn_fusion")):  # XLA's own products, and the GEMM library's
        return "other"
    dims = [int(d) for d in re.findall(r"\d+", shape.partition("[")[2].partition("]")[0])]
    if len(dims) == 3:
        return "attention"  # [H, T, S] scores, [H, T, D] values
    return weights.get(dims[0], "c_proj" if dims[0] == C else "other")  # [out, rows]; both c_proj are [C, rows]


if __name__ == "__main__":
    main()
