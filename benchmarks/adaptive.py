"""Fixed K = 1..8 against --K auto (and auto with the confidence stop), in one run, contenders raced in turn.

    python benchmarks/adaptive.py                        # the bundled pair, T = 0 and 0.8
    python benchmarks/adaptive.py --pair gpt2-shaped     # random weights in GPT-2 124M / 355M shapes
    python benchmarks/adaptive.py --positions            # no race: alpha by draft position, K = 7

Each contender generates n tokens after each prompt with a few keys (speculative_sample's compiled
loop); each run keeps its fastest of `rounds` rounds, and in every round each run is taken by all
the contenders in turn, in a shuffled order, so a slow spell of the shared machine hits them alike. auto compiles for
K_max = 7 (the CLI's) with the policy the CLI tunes for the first prompt (tools/autotune/: laps of its own
programs, kept).
"""

import argparse
import dataclasses
import time

import jax
import numpy as np
from bench_report import cpu_name

import picospec
from picospec.beyond import theory
from picospec.fastpath import fast
from picospec.gpt2 import GPT2Config, Model, init_params
from picospec.sampling import Sampling
from picospec.tools.autotune import policy_for
from picospec.tools.cli.options import AUTO_K_MAX

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying", "Blessed are"]
FIXED = range(1, 9)  # the fixed K raced against auto


def gpt2_shaped():
    """Random weights in GPT-2 124M's shape drafting for 355M's (its acceptance is that of two random
    models, not GPT-2's: this pair measures the costs at GPT-2's sizes)."""
    draft = fast(Model(GPT2Config(), init_params(GPT2Config(), jax.random.key(0))))
    big = GPT2Config(n_layer=24, n_head=16, n_embd=1024)
    return draft, fast(Model(big, init_params(big, jax.random.key(1)))), [[464, 2068, 7586], [818, 262, 3726]]


def positions(draft, target, runs, n_tokens, T):
    """The acceptance of each draft position over fixed-K_max runs (theory.alpha_by_position): auto's
    model takes it to be one alpha for all of them."""
    n_accepted = []
    for prompt, key in runs:
        _, trace = picospec.speculative_sample(draft, target, prompt, n_tokens, key, K=AUTO_K_MAX, temperature=T)
        n_accepted.append(np.asarray(trace.n_accepted[:int(trace.n_steps)]))
    n_accepted = np.concatenate(n_accepted)
    alpha_i, reached = theory.alpha_by_position(n_accepted, AUTO_K_MAX)
    se = np.sqrt(alpha_i * (1 - alpha_i) / np.maximum(reached, 1))
    print(f"| {T} | {len(n_accepted)} | {theory.alpha_from_trace(n_accepted, AUTO_K_MAX):.2f} | "
          + " | ".join(f"{a:.2f} ± {e:.2f} ({r})" for a, e, r in zip(alpha_i, se, reached)) + " |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["bundled", "gpt2-shaped"], default="bundled")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--n-tokens", type=int, default=96)
    parser.add_argument("--keys", type=int, default=4, help="runs per prompt (default 4)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--positions", action="store_true", help="only print alpha by draft position")
    args = parser.parse_args(argv)
    if args.pair == "bundled":
        draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
        prompts = [picospec.load_tokenizer("tiny-target").encode(t).ids for t in PROMPTS]
    else:
        draft, target, prompts = gpt2_shaped()
    rounds = "" if args.positions else f"; each run's best of {args.rounds} rounds"
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; {args.pair} pair; {args.n_tokens} tokens after "
          f"{len(prompts)} prompts x {args.keys} keys{rounds}\n")
    keys = jax.random.split(jax.random.key(0), args.keys)
    runs = [(prompt, key) for prompt in prompts for key in keys]
    if args.positions:
        columns = " | ".join(f"alpha_{i} (reached)" for i in range(1, AUTO_K_MAX + 1))
        print(f"| T | iterations | alpha | {columns} |\n|{'---|' * (AUTO_K_MAX + 3)}")
        for T in [float(t) for t in args.temperatures.split(",")]:
            positions(draft, target, runs, args.n_tokens, T)
        return
    print("| T | contender | tokens/s | tokens per call | drafts per call | vs best fixed K |\n|---|---|---|---|---|---|")
    for T in [float(t) for t in args.temperatures.split(",")]:
        auto = policy_for(draft, target, [runs[0][0]], args.n_tokens, Sampling(T))
        print(f"<!-- T = {T}: iteration costs for k = 0..{AUTO_K_MAX}: {', '.join(f'{v:.2f}' for v in np.asarray(auto.v))} -->")
        contenders = {f"K={K}": dict(K=K) for K in FIXED}
        contenders |= {"auto": dict(K=AUTO_K_MAX, policy=auto),
                       "auto, confidence 0.2": dict(K=AUTO_K_MAX, policy=dataclasses.replace(auto, threshold=0.2))}

        def run(kw, prompt, key):
            t0 = time.perf_counter()
            out, trace = picospec.speculative_sample(draft, target, prompt, args.n_tokens, key, temperature=T, **kw)
            out.block_until_ready()
            n = int(trace.n_steps)
            return time.perf_counter() - t0, n, int(np.asarray(trace.k[:n]).sum())

        for kw in contenders.values():
            run(kw, *runs[0])  # compile
        best = {name: np.full(len(runs), np.inf) for name in contenders}
        counts = {name: np.zeros((len(runs), 2)) for name in contenders}  # (target calls, drafts proposed)
        order = np.random.default_rng(0)
        for _ in range(args.rounds):
            for i, (prompt, key) in enumerate(runs):
                for name in order.permutation(list(contenders)):  # a fresh order each time: none always follows another
                    seconds, calls, drafted = run(contenders[name], prompt, key)
                    best[name][i] = min(best[name][i], seconds)
                    counts[name][i] = calls, drafted
        tokens = len(runs) * args.n_tokens
        speed = {name: tokens / best[name].sum() for name in contenders}
        best_fixed = max(speed[f"K={K}"] for K in FIXED)
        for name in contenders:
            calls, drafted = counts[name].sum(0)
            print(f"| {T} | {name} | {speed[name]:.0f} | {tokens / calls:.2f} | {drafted / calls:.2f} | "
                  f"{speed[name] / best_fixed:.3f} |", flush=True)


if __name__ == "__main__":
    main()
