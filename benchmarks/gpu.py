"""Speculative sampling on a GPU, in one command: what it gains on the bundled pair, what an iteration
costs against its floor, and what GPT-2 124M -> 1558M's shapes cost there.

    python benchmarks/gpu.py                 # on a GPU: about 6 minutes on one H100, compiling included
    python benchmarks/gpu.py --cpu           # small settings on the CPU: the same code, run by the tests

1. The bundled pair, B = 1 and 4 rows, T = 0 and 0.8 (top-k 20, top-p 0.9 when sampled): tokens/s of
   autoregressive decoding, fixed K = 2, 4, 7, --K auto and (B = 1) the EAGLE head tiny-head at each fixed
   K, each contender's median over --rounds
   rounds in which all run in turn on the same prompts and keys. For each fixed K, an iteration's time
   (the run's time over its loop's iterations, prefill included) against its floor: K draft steps and
   one (K+1)-token target call, each timed alone (B rows, a static number of calls in one program,
   so no call waits for the host).
2. GPT-2 124M -> 1558M's shapes with random weights (speed does not depend on the values), float32
   and bfloat16: the target's ms per token (a one-token call), c (a draft step over a target step),
   v(K) for K = 1..8 (a (K+1)-token target call over a one-token call), and the speedup the theory
   (Leviathan et al., Theorem 3.8 with v(K)) predicts from them at alpha = 0.6..0.9, at its best K.
Prints Markdown tables, and writes everything to --json.
"""

import argparse
import dataclasses
import json
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
from picospec.tools.autotune import prompt_prior
from picospec.tools.autotune.costs import auto_policy, race_laps
from picospec.tools.cli.options import AUTO_K_MAX

sys.path.insert(0, str(Path(__file__).parent))
from never_slower import bundled_prompts  # noqa: E402

SETTINGS = {  # what each platform runs: the GPU's in about 6 minutes, the CPU's in about 1
    "gpu": dict(batches=(1, 4), temperatures=(0.0, 0.8), fixed=(2, 4, 7), n_tokens=64, rounds=5, calls=64,
                draft=dict(n_layer=12, n_head=12, n_embd=768), target=dict(n_layer=48, n_head=25, n_embd=1600),
                Ks=range(1, 9)),
    "cpu": dict(batches=(1,), temperatures=(0.0, 0.8), fixed=(2,), n_tokens=16, rounds=2, calls=8,
                draft=dict(n_layer=2, n_head=2, n_embd=64), target=dict(n_layer=4, n_head=4, n_embd=128),
                Ks=range(1, 3)),
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


def bundled(s: dict, rounds: int, auto: bool) -> list[dict]:
    """Section 1: one row per (B, T) with every contender's tokens/s and each fixed K's iteration cost."""
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    head, n, rows = picospec.load_head("tiny-head", target), s["n_tokens"], []
    for B in s["batches"]:
        prompts, keys = bundled_prompts(B), jax.random.split(jax.random.key(0), B)
        capacity = batch_buffers(prompts, n, AUTO_K_MAX, target.config)[3]
        for T in s["temperatures"]:
            kw = sampling_at(T)
            sampling = Sampling(T, kw.get("top_k", 0), kw.get("top_p", 1.0))
            if auto:
                auto = dataclasses.replace(auto_policy(draft, target, AUTO_K_MAX, capacity, sampling, B=B), horizon=n)
                auto = prompt_prior(auto, draft, target, prompts, sampling)

            def spec(K, policy=None):
                return lambda: picospec.speculative_sample_batch(draft, target, prompts, n, keys, K=K, policy=policy,
                                                                 **kw)
            runs = {"autoregressive": lambda: picospec.autoregressive_sample_batch(target, prompts, n, keys, **kw)}
            runs |= {f"K={K}": spec(K) for K in s["fixed"]} | ({"auto": spec(AUTO_K_MAX, auto)} if auto else {})
            if B == 1:  # the EAGLE head, drafting from the target's features
                runs |= {f"head K={K}": (lambda K: lambda: picospec.speculative_sample_batch(
                    head, target, prompts, n, keys, K=K, **kw))(K) for K in s["fixed"]}
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
    head = ", ".join(f"{tps[name]:.0f} ({tps[name] / ar:.2f})" for name in [f"head K={K}" for K in s["fixed"]]
                     if name in tps) or "—"
    return f"| {r['B']} | {r['T']} | {ar:.0f} | {speeds} | {auto_k} | {costs} | {head} |"


def gpt2_costs(s: dict, rounds: int) -> list[dict]:
    """Section 2: c, v(K) and ms per token for GPT-2's shapes in float32 and bfloat16, theory's speedups."""
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        draft, target = [fast(Model(GPT2Config(**s[name]), init_params(GPT2Config(**s[name]), jax.random.key(i),
                                                                          dtype=dtype)))
                         for i, name in enumerate(("draft", "target"))]
        t = call_times({"draft": (draft, 1)} | {f"{T}": (target, T) for T in [1, *(K + 1 for K in s["Ks"])]},
                       1, 256, s["calls"] // 4, rounds)
        c, v = t["draft"] / t["1"], {K: t[f"{K + 1}"] / t["1"] for K in s["Ks"]}
        best = {a: max(s["Ks"], key=lambda K: theory.walltime_improvement(a, K, c, v[K])) for a in ALPHAS}
        row = dict(dtype=jnp.dtype(dtype).name, target_ms_per_token=1e3 * t["1"], draft_ms_per_token=1e3 * t["draft"],
                   c=c, v=v, theory={a: dict(K=K, speedup=float(theory.walltime_improvement(a, K, c, v[K])))
                                     for a, K in best.items()})
        rows.append(row)
        print(f"| {row['dtype']} | {row['target_ms_per_token']:.2f} | {row['draft_ms_per_token']:.2f} | {c:.3f} | "
              + ", ".join(f"{x:.2f}" for x in v.values()) + " | "
              + " | ".join(f"{x['speedup']:.2f} (K={x['K']})" for x in row["theory"].values()) + " |", flush=True)
        del draft, target
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="small settings, run on the CPU")
    parser.add_argument("--rounds", type=int, help="rounds of the race (default: 5 on a GPU, 2 with --cpu)")
    parser.add_argument("--json", default="gpu.json", help="where to write every figure")
    parser.add_argument("--skip", choices=["bundled", "gpt2"], help="leave one section out")
    parser.add_argument("--no-auto", action="store_true", help="leave --K auto out (it times its iterations first)")
    args = parser.parse_args(argv)
    s = SETTINGS["cpu" if args.cpu else "gpu"]
    rounds, device = args.rounds or s["rounds"], jax.devices("cpu" if args.cpu else None)[0]
    with jax.default_device(device):
        report = run(args, s, rounds, device)
    Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\n{report['seconds']:.0f} s in all; every figure in {args.json}")


def run(args, s: dict, rounds: int, device) -> dict:
    report = dict(device=f"{device.device_kind} ({device.platform})", host=cpu_name(), jax=jax.__version__,
                  settings={k: list(v) if isinstance(v, (tuple, range)) else v for k, v in s.items()}, rounds=rounds)
    t0 = time.perf_counter()
    print(f"Machine: {report['device']}, host {report['host']}; jax {jax.__version__}; median of {rounds} rounds\n")
    if args.skip != "bundled":
        print(f"Bundled pair, {s['n_tokens']} tokens a row: tokens/s (over autoregressive); an iteration's ms "
              "against its floor (K draft steps + one K+1-token target call, each alone)\n")
        ks = ", ".join(map(str, s["fixed"]))
        print("| B | T | autoregressive | " + " | ".join(f"K = {K}" for K in s["fixed"]) + " | auto | auto's k | "
              f"iteration / floor | tiny-head K = {ks} |\n|" + "---|" * (6 + len(s["fixed"])) + "---|", flush=True)
        report["bundled"] = bundled(s, rounds, not args.no_auto)
    if args.skip != "gpt2":
        print(f"\nGPT-2 shapes, draft {s['draft']} -> target {s['target']}, random weights, B = 1: the target's ms "
              f"per token, c, v(K) for K = {s['Ks'][0]}..{s['Ks'][-1]}, theory's speedup at alpha (best K)\n")
        print("| dtype | target ms/token | draft ms/token | c | v(K) | " + " | ".join(f"alpha {a}" for a in ALPHAS)
              + " |\n|" + "---|" * (5 + len(ALPHAS)), flush=True)
        report["gpt2"] = gpt2_costs(s, rounds)
    report["seconds"] = time.perf_counter() - t0
    return report


if __name__ == "__main__":
    main()
