"""The EAGLE head against the model draft, for the bundled target on held-out text, in one run.

    python benchmarks/eagle.py                      # tiny-head and tiny-draft, K = 2, 4, 7 and auto, T = 0 and 0.8
    python benchmarks/eagle.py --prompts 4 --rounds 2 --ks 2 --temperatures 0 --no-auto --cli-rounds 0  # quick

For each temperature, every contender (autoregressive decoding; each draft at each K and with
`--K auto`) makes --n-tokens tokens after each of --prompts held-out
verses (their first words, one prompt a call, as the CLI runs them), round after round in a shuffled
order, each keeping its fastest round. From the same runs: alpha by draft position (theory.alpha_by_position:
the chance the i-th draft is accepted once reached), tokens per target call, and tokens/s against
autoregressive decoding. c is one draft step's time over one target step's (1 token each), timed here.

A launch-bound GPU: where every kernel costs about the same (the small models' case, figures in
benchmarks/README.md), a step costs its kernel count. Kernels are estimated from the program lowered
for cuda (the operations XLA cannot fuse into a neighbour: products, reductions, cache writes, gathers),
c_launch is a draft step's count over a target call's, and the theory (Leviathan et al.) predicts the
speedup from the alpha measured here. Then the README's compare command with each draft, fresh CLI
processes in turn (--cli-rounds). Markdown tables on stdout, every number in --out.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_report import cpu_name

import picospec
from picospec.beyond import theory
from picospec.beyond.eagle import HeadCache, head_forward
from picospec.gpt2 import forward, init_cache
from picospec.sampling import Sampling
from picospec.tools.autotune import policy_for
from picospec.tools.cli.options import AUTO_K_MAX

sys.path.insert(0, str(Path(__file__).parent))
from never_slower import bundled_prompts  # noqa: E402

KERNELS = re.compile(r"stablehlo\.(dot_general|reduce|dynamic_update_slice|gather|scatter|sort|custom_call)\b")


def kernels(fn, *args) -> int:
    """The kernels fn(*args) should launch on a GPU, estimated from its program lowered for cuda."""
    return len(KERNELS.findall(jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()))


def step_fns(draft, head, target):
    """One draft step of each draft and one target step (1 token each), as functions of their inputs."""
    C, H, S = target.config.n_embd, target.config.n_head, 128
    empty = jnp.zeros((H, S, C // H))
    head_cache = HeadCache([empty], [empty], jnp.int32(3), jnp.zeros((S + 1, C)))
    token = jnp.int32([5])
    return {
        "tiny-draft": (lambda t, c: forward(draft, t, c)[0], token, init_cache(draft.config, S)._replace(length=3)),
        "tiny-head": (lambda t, c: head_forward(head, jnp.zeros((1, C)), t, c)[1], token, head_cache),
        "target": (lambda t, c: forward(target, t, c)[0], token, init_cache(target.config, S)._replace(length=3)),
    }


def step_seconds(fn, *args, calls=200, rounds=5) -> float:
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    best = np.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = jitted(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def cli_race(rounds: int, temperatures) -> list[dict]:
    """The README's compare command with each draft, fresh processes in turn, round after round: the CLI's
    own speculative tokens/s and speedup over autoregressive decoding, median of the rounds."""
    rows = []
    for T in temperatures:
        runs = {name: [] for name in ("tiny-draft", "tiny-head")}
        for _ in range(rounds):
            for name in runs:
                command = [sys.executable, "-m", "picospec", "--draft", name, "--target", "tiny-target", "--prompt",
                           "And God said", "--mode", "compare", "--K", "6", "--n-tokens", "200",
                           "--temperature", str(T), "--json"]
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                report = json.loads(out)
                runs[name].append((report["speculative"]["stats"]["tokens_per_second"], report["speedup"]))
        for name, laps in runs.items():
            row = {"T": T, "draft": name, "speculative_tokens_per_second": statistics.median(r[0] for r in laps),
                   "speedup": statistics.median(r[1] for r in laps), "rounds": laps}
            rows.append(row)
            print(f"| {T:g} | {name} | {row['speculative_tokens_per_second']:.0f} | {row['speedup']:.2f} |", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="2,4,7")
    parser.add_argument("--drafts", default="tiny-draft,tiny-head", help="the drafts raced")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-auto", action="store_true", help="leave --K auto out")
    parser.add_argument("--cli-rounds", type=int, default=3, help="rounds of the CLI race (0: none)")
    parser.add_argument("--out", default="eagle.json")
    args = parser.parse_args(argv)
    target, ks, n = picospec.load_model("tiny-target"), [int(k) for k in args.ks.split(",")], args.n_tokens
    loaders = {"tiny-draft": lambda: picospec.load_model("tiny-draft"),
               "tiny-head": lambda: picospec.load_head("tiny-head", target)}
    drafts = {name: loaders[name]() for name in args.drafts.split(",")}
    prompts = bundled_prompts(args.prompts)
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; tiny-target; {n} tokens after each of {len(prompts)} "
          f"held-out prompts, one a call; each contender's fastest of {args.rounds} rounds\n")
    report = {"machine": cpu_name(), "jax": jax.__version__, "n_tokens": n, "prompts": len(prompts), "rows": []}

    fns = step_fns(picospec.load_model("tiny-draft"), picospec.load_head("tiny-head", target), target)
    seconds = {name: step_seconds(*fn) for name, fn in fns.items()}
    counts = {name: kernels(*fn) for name, fn in fns.items()}
    call, cache = (lambda t, c: forward(target, t, c)[0]), fns["target"][2]
    target_calls = {K: kernels(call, jnp.zeros(K + 1, jnp.int32), cache) for K in ks}
    report |= {"step_ms": {k: 1e3 * v for k, v in seconds.items()}, "kernels": counts,
               "target_call_kernels": target_calls}
    print("| one step | ms on this CPU | c (over the target's step) | kernels (est., for cuda) | c_launch |\n"
          "|---|---|---|---|---|")
    for name in ("tiny-draft", "tiny-head", "target"):
        print(f"| {name} | {1e3 * seconds[name]:.3f} | {seconds[name] / seconds['target']:.2f} | {counts[name]} | "
              f"{counts[name] / counts['target']:.2f} |")
    scored = ", ".join(f"K = {K}: {v} kernels" for K, v in target_calls.items())
    print(f"\nA target call scoring K + 1 tokens: {scored}.\n")

    print("| T | draft | K | tokens/s | / autoregressive | tokens per call | alpha by position | "
          "GPU theory (launch-bound) |\n|---|---|---|---|---|---|---|---|")
    for T in [float(t) for t in args.temperatures.split(",")]:
        keys = [jax.random.key(i) for i in range(len(prompts))]
        contenders = {("autoregressive", 0): lambda: [picospec.autoregressive_sample(target, p, n, k, temperature=T)
                                                      for p, k in zip(prompts, keys)]}
        for name, draft in drafts.items():
            for K in ks:
                contenders[(name, K)] = lambda d=draft, K=K: [picospec.speculative_sample(d, target, p, n, k, K=K,
                                                                                          temperature=T)
                                                              for p, k in zip(prompts, keys)]
        for name, draft in ([] if args.no_auto else drafts.items()):
            policies = [policy_for(draft, target, [p], n, Sampling(T)) for p in prompts]  # timed on these loops
            contenders[(name, "auto")] = lambda d=draft, policies=policies: [
                picospec.speculative_sample(d, target, p, n, k, K=AUTO_K_MAX, temperature=T, policy=policy)
                for p, k, policy in zip(prompts, keys, policies)]
        results = {name: jax.block_until_ready(run()) for name, run in contenders.items()}  # compiles
        laps = {name: np.inf for name in contenders}
        order = np.random.default_rng(int(10 * T))
        for _ in range(args.rounds):
            for i in order.permutation(len(contenders)):
                name = list(contenders)[i]
                t0 = time.perf_counter()
                jax.block_until_ready(contenders[name]())
                laps[name] = min(laps[name], time.perf_counter() - t0)
        ar = len(prompts) * n / laps[("autoregressive", 0)]
        print(f"| {T:g} | autoregressive | | {ar:.0f} | 1.00 | 1.00 | | |")
        for (name, K), runs in results.items():
            if name == "autoregressive":
                continue
            traces = [trace for _, trace in runs]
            steps = sum(int(t.n_steps) for t in traces)
            K_max = AUTO_K_MAX if K == "auto" else K
            accepted = np.concatenate([np.asarray(t.n_accepted[:int(t.n_steps)]) for t in traces])
            proposed = np.concatenate([np.asarray(t.k[:int(t.n_steps)]) for t in traces])
            speed = len(prompts) * n / laps[(name, K)]
            row = {"T": T, "draft": name, "K": K, "tokens_per_second": speed, "over_autoregressive": speed / ar,
                   "tokens_per_call": len(prompts) * n / steps}
            gpu = ""
            if K != "auto":
                by_position = theory.alpha_by_position(accepted, K)[0]
                alpha = theory.alpha_from_trace(accepted, K)
                c_launch = counts[name] / target_calls[K]
                row |= {"alpha_by_position": by_position.round(3).tolist(), "alpha": alpha,
                        "gpu_theory": theory.walltime_improvement(alpha, K, c_launch)}
                gpu = f"{row['gpu_theory']:.2f}× (α {alpha:.2f}, c_launch {c_launch:.2f})"
            else:
                row["k_mean"] = float(proposed.mean())
            shown = ", ".join(f"{a:.2f}" for a in row.get("alpha_by_position", [])) or f"k̄ = {row['k_mean']:.2f}"
            print(f"| {T:g} | {name} | {K_max if K != 'auto' else 'auto'} | {speed:.0f} | {speed / ar:.2f} | "
                  f"{row['tokens_per_call']:.2f} | {shown} | {gpu} |", flush=True)
            report["rows"].append(row)
    if args.cli_rounds:
        print("\nThe README's compare command (K = 6, 200 tokens), fresh processes raced, median of "
              f"{args.cli_rounds}\n\n| T | draft | speculative tokens/s | speedup over autoregressive |\n"
              "|---|---|---|---|")
        report["cli"] = cli_race(args.cli_rounds, [float(t) for t in args.temperatures.split(",")])
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
