"""Speculative sampling on a GPU, in one command that fits the minutes a GPU is at hand: what compiling
costs, what speculative sampling gains on the bundled pair, what GPT-2 124M -> 1558M's shapes cost, and
whether the CLI runs as fast as the library.

    python benchmarks/gpu.py                 # about 5 minutes on one H200, compiling included (--budget)
    python benchmarks/gpu.py --quick         # about 2: B = 1, K = 4, the head at K = 4, no --K auto
    python benchmarks/gpu.py --cpu           # small settings on the CPU: the same code, run by the tests

Each part prints its table as it completes; a part that would start after --budget seconds is skipped
with a line saying so, so the run ends in time whatever a compile costs.
1. Compiling: the CLI's first run on the bundled pair (200 tokens, T = 0.8, K = 4; a fresh process, an empty
   cache folder: the compile seconds it reports, and its wall time), and (not --quick) a GPT-2 124M -> 1558M-shaped
   speculative sampler, K = 4, lowered and compiled.
2. The bundled pair, B rows, T = 0 and 0.8 (top-k 20, top-p 0.9 when sampled): tokens/s of autoregressive
   decoding, each fixed K, --K auto and (B = 1) the EAGLE head tiny-head, each the median over --rounds
   rounds in which all run in turn on the same prompts and keys; each fixed K's iteration against its
   floor (K draft steps and one (K+1)-token target call, each timed alone, no call waiting for the host).
3. GPT-2 124M -> 1558M's shapes, random weights, float32 and bfloat16: the target's ms per token, c (a
   draft step over a target step), v(K) (a (K+1)-token target call over a one-token call), and the
   speedup theory (Leviathan et al., Theorem 3.8 with v(K)) predicts from them at alpha = 0.6..0.9. The
   target is timed at two depths and extrapolated to its 48 layers (its layers are alike: a call's time
   is a + b x layers), so no 48-layer program is compiled per K; not --quick, a 48-layer one-token call
   checks the extrapolation.
4. The CLI against the library (cli_library.py): the bundled pair, one prompt, 200 tokens, T = 0.8.
5. (not --quick) Greedy speculative output against greedy autoregressive output, in the platform's dtype:
   the bundled pair, 16 prompts, K = 4, 48 tokens.
The bundled pair loads in the platform's dtype (bfloat16 on a GPU). Writes every figure to --json.
"""

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_report import cpu_name

import picospec
from picospec.beyond import theory
from picospec.beyond.batch import batch_buffers
from picospec.fastpath import fast
from picospec.gpt2 import GPT2Config, Model, forward, init_cache, init_params
from picospec.sampling import Sampling
from picospec.tools.autotune import policy_for
from picospec.tools.cli.options import AUTO_K_MAX

sys.path.insert(0, str(Path(__file__).parent))
import cli_library  # noqa: E402
import gpu_flags  # noqa: E402
from never_slower import bundled_prompts  # noqa: E402
from timing import race_laps  # noqa: E402

GPT2 = dict(draft=dict(n_layer=12, n_head=12, n_embd=768), target=dict(n_layer=48, n_head=25, n_embd=1600))
SETTINGS = {  # what each form runs
    "full": dict(batches=(1, 4), temperatures=(0.0, 0.8), fixed=(2, 4, 7), head=(4, 7), auto=True, n_tokens=64,
                 rounds=5, calls=64, Ks=range(1, 9), depths=(4, 12), check_depth=True, sampler=True,
                 cli_rounds=3, greedy_rows=16, budget=300, **GPT2),
    "quick": dict(batches=(1,), temperatures=(0.0, 0.8), fixed=(4,), head=(4,), auto=False, n_tokens=64, rounds=3,
                  calls=32, Ks=(1, 2, 4, 7), depths=(4, 12), check_depth=False, sampler=False, cli_rounds=3,
                  greedy_rows=0, budget=120, **GPT2),
    "cpu": dict(batches=(1,), temperatures=(0.0, 0.8), fixed=(2,), head=(2,), auto=True, n_tokens=16, rounds=2,
                calls=8, Ks=range(1, 3), depths=(2, 4), check_depth=True, sampler=True, cli_rounds=1, greedy_rows=2,
                budget=600,
                draft=dict(n_layer=2, n_head=2, n_embd=64), target=dict(n_layer=4, n_head=4, n_embd=128)),
}
ALPHAS = (0.6, 0.7, 0.8, 0.9)


@partial(jax.jit, static_argnames=("T", "calls"))
def _calls(model: Model, caches, T: int, calls: int):
    """`calls` forward calls of B rows x T tokens (caches: [B]-stacked KVCaches), one after another in
    a scan of static length, each fed the last call's argmaxes, the caches rolled back after each."""
    def call(tokens, _):
        logits, new = jax.vmap(lambda t, c: forward(model, t, c))(tokens, caches)  # [B, T, V]
        return jnp.argmax(logits, -1).astype(jnp.int32), new.length
    B = caches.length.shape[0]
    return jax.lax.scan(call, jnp.zeros((B, T), jnp.int32), length=calls)[0]


def call_times(calls: dict, B: int, capacity: int, n: int, rounds: int) -> dict:
    """{name: seconds per call} for each name: (model, T), B rows x T tokens after 32 cached positions
    in caches of `capacity` slots (attention reads them all), n calls a lap, all raced in turn."""
    def caches(model):
        cache = init_cache(model.config, capacity, model.params["wte"]["weight"].dtype)._replace(length=jnp.int32(32))
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (B,) + x.shape), cache)
    runs = {name: partial(lambda m, c, T: jax.block_until_ready(_calls(m, c, T, n)), model, caches(model), T)
            for name, (model, T) in calls.items()}
    laps, _ = race_laps(rounds, **runs)
    return {name: statistics.median(lap[name] for lap in laps) / n for name in runs}


def sampling_at(T: float) -> dict:
    return dict(temperature=T) if T == 0 else dict(temperature=T, top_k=20, top_p=0.9)


def random_model(shape: dict, seed: int, dtype=jnp.float32) -> Model:
    config = GPT2Config(**shape)
    return fast(Model(config, init_params(config, jax.random.key(seed), dtype=dtype)))


def compiling(s: dict) -> dict:
    """Part 1: the CLI's first run on the bundled pair (gpu_flags.py's, XLA's flags as they are), and a
    GPT-2-shaped sampler's compile."""
    first = gpu_flags.first_run("")
    if "failed" in first:
        raise RuntimeError(f"the CLI failed: {first['failed']}")
    row = dict(cli_compile_s=first["compile_s"], cli_wall_s=first["wall_s"])
    print(f"| the CLI's first run, bundled pair | {row['cli_compile_s']:.1f} | {row['cli_wall_s']:.1f} |", flush=True)
    if s["sampler"]:
        draft, target = random_model(s["draft"], 0), random_model(s["target"], 1)
        run = jax.jit(lambda d, t, key: picospec.speculative_sample(d, t, [1, 2, 3], 64, key, K=4, temperature=0.8,
                                                                   top_k=20, top_p=0.9)[0])
        t0 = time.perf_counter()
        run.lower(draft, target, jax.random.key(0)).compile()
        row["sampler_compile_s"] = time.perf_counter() - t0
        print(f"| a GPT-2 {s['draft']['n_layer']} -> {s['target']['n_layer']}-layer sampler, K = 4, T = 0.8 | "
              f"{row['sampler_compile_s']:.1f} | — |", flush=True)
    return row


def bundled(s: dict, rounds: int, over) -> list[dict]:
    """Part 2: one row per (B, T) with every contender's tokens/s and each fixed K's iteration cost."""
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    head, n, rows = picospec.load_head("tiny-head", target), s["n_tokens"], []
    for B in s["batches"]:
        prompts, keys = bundled_prompts(B), jax.random.split(jax.random.key(0), B)
        capacity = batch_buffers(prompts, n, AUTO_K_MAX, target.config)[3]
        for T in s["temperatures"]:
            if over(f"B = {B}, T = {T}"):
                return rows
            kw = sampling_at(T)
            sampling = Sampling(T, kw.get("top_k", 0), kw.get("top_p", 1.0))

            def spec(d, K, policy=None):
                return lambda: picospec.speculative_sample_batch(d, target, prompts, n, keys, K=K, policy=policy, **kw)
            runs = {"autoregressive": lambda: picospec.autoregressive_sample_batch(target, prompts, n, keys, **kw)}
            runs |= {f"K={K}": spec(draft, K) for K in s["fixed"]}
            if s["auto"]:
                runs["auto"] = spec(draft, AUTO_K_MAX, policy_for(draft, target, prompts, n, sampling, keys))
            if B == 1:  # the EAGLE head, drafting from the target's features
                runs |= {f"head K={K}": spec(head, K) for K in s["head"]}
            runs = {name: (lambda run: lambda: jax.block_until_ready(run()))(run) for name, run in runs.items()}
            traces = {name: run()[1] for name, run in runs.items() if name != "autoregressive"}
            laps, _ = race_laps(rounds, **runs)
            seconds = {name: statistics.median(lap[name] for lap in laps) for name in runs}
            floors = call_times({"draft": (draft, 1)} | {f"target {K + 1}": (target, K + 1) for K in s["fixed"]},
                                B, capacity, s["calls"], rounds)
            row = dict(B=B, T=T, tokens_per_s={name: B * n / t for name, t in seconds.items()},
                       draft_step_ms=1e3 * floors["draft"], iteration={})
            if trace := traces.get("auto"):
                row["auto_k"] = float(np.mean(np.concatenate([np.asarray(trace.k[b, :int(trace.n_steps[b])])
                                                              for b in range(B)])))
            for K in s["fixed"]:
                iterations = int(np.max(traces[f"K={K}"].n_steps))
                floor = K * floors["draft"] + floors[f"target {K + 1}"]
                row["iteration"][K] = dict(ms=1e3 * seconds[f"K={K}"] / iterations, floor_ms=1e3 * floor,
                                           over_floor=seconds[f"K={K}"] / iterations / floor)
            rows.append(row)
            print(bundled_row(row, s), flush=True)
    return rows


def bundled_row(r: dict, s: dict) -> str:
    tps, ar = r["tokens_per_s"], r["tokens_per_s"]["autoregressive"]
    speeds = " | ".join(f"{tps[name]:.0f} ({tps[name] / ar:.2f})" if name in tps else "—"
                        for name in [f"K={K}" for K in s["fixed"]] + ["auto"])
    costs = "; ".join(f"K={K}: {i['ms']:.3f} / {i['floor_ms']:.3f} = {i['over_floor']:.2f}"
                      for K, i in r["iteration"].items())
    auto_k = f"{r['auto_k']:.2f}" if "auto_k" in r else "—"
    head = ", ".join(f"{tps[name]:.0f} ({tps[name] / ar:.2f})" for name in [f"head K={K}" for K in s["head"]]
                     if name in tps) or "—"
    return f"| {r['B']} | {r['T']} | {ar:.0f} | {speeds} | {auto_k} | {costs} | {head} |"


def gpt2_costs(s: dict, rounds: int, over) -> list[dict]:
    """Part 3: c, v(K) and ms per token for GPT-2's shapes in float32 and bfloat16, theory's speedups."""
    rows, (d1, d2), L = [], s["depths"], s["target"]["n_layer"]
    for dtype in (jnp.float32, jnp.bfloat16):
        if over(jnp.dtype(dtype).name):
            break
        draft = random_model(s["draft"], 0, dtype)
        shallow, deep = (random_model(s["target"] | dict(n_layer=d), 1, dtype) for d in (d1, d2))
        sizes = [1, *(K + 1 for K in s["Ks"])]
        calls = {"draft": (draft, 1)} | {f"{d} {T}": (m, T) for d, m in ((d1, shallow), (d2, deep)) for T in sizes}
        full = s["check_depth"] and random_model(s["target"], 1, dtype)
        t = call_times(calls | ({f"{L} 1": (full, 1)} if full else {}), 1, 256, s["calls"] // 4, rounds)
        at = {T: t[f"{d1} {T}"] + (t[f"{d2} {T}"] - t[f"{d1} {T}"]) * (L - d1) / (d2 - d1) for T in sizes}  # a + b L
        c, v = t["draft"] / at[1], {K: at[K + 1] / at[1] for K in s["Ks"]}
        best = {a: max(s["Ks"], key=lambda K: theory.walltime_improvement(a, K, c, v[K])) for a in ALPHAS}
        row = dict(dtype=jnp.dtype(dtype).name, target_ms_per_token=1e3 * at[1], draft_ms_per_token=1e3 * t["draft"],
                   c=c, v=v, theory={a: dict(K=K, speedup=float(theory.walltime_improvement(a, K, c, v[K])))
                                     for a, K in best.items()})
        if full:
            row["target_ms_per_token_measured"] = 1e3 * t[f"{L} 1"]
        rows.append(row)
        measured = f" (measured {row['target_ms_per_token_measured']:.2f})" if full else ""
        print(f"| {row['dtype']} | {row['target_ms_per_token']:.2f}{measured} | {row['draft_ms_per_token']:.2f} | "
              f"{c:.3f} | " + ", ".join(f"{K}: {x:.2f}" for K, x in v.items()) + " | "
              + " | ".join(f"{x['speedup']:.2f} (K={x['K']})" for x in row["theory"].values()) + " |", flush=True)
        del draft, shallow, deep, full
    return rows


def greedy_identity(rows: int) -> dict:
    """Part 5: greedy speculative against greedy autoregressive output, the bundled pair in its default dtype."""
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    prompts, keys = bundled_prompts(rows), jax.random.split(jax.random.key(0), rows)
    spec = picospec.speculative_sample_batch(draft, target, prompts, 48, keys, K=4, temperature=0)[0]
    ar = picospec.autoregressive_sample_batch(target, prompts, 48, keys, temperature=0)
    same = np.asarray(spec == ar).all(-1)
    row = dict(dtype=str(target.params["wte"]["weight"].dtype), rows=rows, identical_rows=int(same.sum()),
               first_difference=[int(np.argmin(np.asarray(spec[b] == ar[b]))) for b in np.flatnonzero(~same)])
    print(f"| {row['dtype']} | {rows} | {row['identical_rows']} | {row['first_difference'] or '—'} |", flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short form, for the last minutes at a GPU")
    parser.add_argument("--cpu", action="store_true", help="small settings, run on the CPU")
    parser.add_argument("--rounds", type=int, help="rounds of each race (default: 5, --quick 3, --cpu 2)")
    parser.add_argument("--budget", type=float, help="seconds after which no part starts (default: 300, --quick 120)")
    parser.add_argument("--json", default="gpu.json", help="where to write every figure")
    parser.add_argument("--skip", default="", help="parts to leave out, by name: compile,bundled,gpt2,cli,greedy")
    args = parser.parse_args(argv)
    s = SETTINGS["cpu" if args.cpu else "quick" if args.quick else "full"]
    rounds, budget, device = args.rounds or s["rounds"], args.budget or s["budget"], jax.devices()[0]
    if args.cpu:
        device = jax.devices("cpu")[0]
        os.environ["JAX_PLATFORMS"] = "cpu"  # the CLI's own process too
    with jax.default_device(device):
        report = run(args, s, rounds, budget, device)
    Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\n{report['seconds']:.0f} s in all; every figure in {args.json}")


def run(args, s: dict, rounds: int, budget: float, device) -> dict:
    report = dict(device=f"{device.device_kind} ({device.platform})", host=cpu_name(), jax=jax.__version__,
                  settings={k: list(v) if isinstance(v, (tuple, range)) else v for k, v in s.items()}, rounds=rounds,
                  skipped=[])
    t0, skip = time.perf_counter(), args.skip.split(",")

    def over(what: str) -> bool:  # past the budget: say so, and skip it
        if time.perf_counter() - t0 > budget:
            print(f"(skipped, past the {budget:.0f} s budget: {what})", flush=True)
            report["skipped"].append(what)
            return True
        return False
    print(f"Machine: {report['device']}, host {report['host']}; jax {jax.__version__}; median of {rounds} rounds")
    if "compile" not in skip and not over("compiling"):
        print("\nCompiling, seconds\n\n| what | compile | wall |\n|---|---|---|", flush=True)
        report["compile"] = compiling(s)
    if "bundled" not in skip and not over("the bundled pair"):
        print(f"\nBundled pair, {s['n_tokens']} tokens a row: tokens/s (over autoregressive); an iteration's ms "
              "against its floor (K draft steps + one K+1-token target call, each alone)\n")
        ks = ", ".join(map(str, s["head"]))
        print("| B | T | autoregressive | " + " | ".join(f"K = {K}" for K in s["fixed"]) + " | auto | auto's k | "
              f"iteration / floor | tiny-head K = {ks} |\n|" + "---|" * (6 + len(s["fixed"])) + "---|", flush=True)
        report["bundled"] = bundled(s, rounds, over)
    if "gpt2" not in skip and not over("GPT-2's shapes"):
        print(f"\nGPT-2 shapes, draft {s['draft']} -> target {s['target']}, random weights, B = 1: the target's ms "
              f"per token (from {s['depths']} layers), c, v(K), theory's speedup at alpha (best K)\n")
        print("| dtype | target ms/token | draft ms/token | c | v(K) | " + " | ".join(f"alpha {a}" for a in ALPHAS)
              + " |\n|" + "---|" * (5 + len(ALPHAS)), flush=True)
        report["gpt2"] = gpt2_costs(s, rounds, over)
    if "cli" not in skip and not over("the CLI against the library"):
        print("\nThe CLI against the library: bundled pair, one prompt, 200 tokens, T = 0.8, top-k 20, top-p 0.9, "
              f"K = 4, median of {s['cli_rounds']}\n", flush=True)
        report["cli"] = cli_library.race(rounds=s["cli_rounds"])
        print(cli_library.table(report["cli"]), flush=True)
    if s["greedy_rows"] and "greedy" not in skip and not over("greedy identity"):
        print("\nGreedy speculative (K = 4) against greedy autoregressive, bundled pair, 48 tokens\n\n"
              "| dtype | rows | identical rows | first differing position |\n|---|---|---|---|", flush=True)
        report["greedy"] = greedy_identity(s["greedy_rows"])
    report["seconds"] = time.perf_counter() - t0
    return report


if __name__ == "__main__":
    main()
