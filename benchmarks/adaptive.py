"""Fixed K = 1..8 against --K auto (and auto with the confidence stop), in one run, contenders raced in turn.

    python benchmarks/adaptive.py                        # the bundled pair, T = 0 and 0.8
    python benchmarks/adaptive.py --pair gpt2-shaped     # random weights in GPT-2 124M / 355M shapes

Each contender generates n tokens after each prompt with a few keys (speculative_sample's compiled
loop); tokens/s is the best of `rounds` rounds, the contenders taking turns within every round, so
a slow spell of the shared machine hits them alike. auto reads c and v(k) from tools/costs.py.
"""

import argparse
import time

import jax
import numpy as np

import picospec
from picospec.fastpath import fast
from picospec.gpt2 import GPT2Config, Model, init_params
from picospec.sampling import buffers
from picospec.tools.costs import auto_policy
from picospec.tools.report import cpu_name

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying", "Blessed are"]
K_MAX = 8


def gpt2_shaped():
    """Random weights in GPT-2 124M's shape drafting for 355M's (its acceptance is that of two random
    models, not GPT-2's: this pair measures the costs, c and v(k), at GPT-2's sizes)."""
    draft = fast(Model(GPT2Config(), init_params(GPT2Config(), jax.random.key(0))))
    big = GPT2Config(n_layer=24, n_head=16, n_embd=1024)
    return draft, fast(Model(big, init_params(big, jax.random.key(1)))), [[464, 2068, 7586], [818, 262, 3726]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["bundled", "gpt2-shaped"], default="bundled")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--n-tokens", type=int, default=96)
    parser.add_argument("--keys", type=int, default=4, help="runs per prompt (default 4)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.pair == "bundled":
        draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
        prompts = [picospec.load_tokenizer("tiny-target").encode(t).ids for t in PROMPTS]
    else:
        draft, target, prompts = gpt2_shaped()
    capacity = max(buffers(p, args.n_tokens, K_MAX, target.config)[2] for p in prompts)
    auto = auto_policy(draft, target, K_MAX, capacity)
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; {args.pair} pair; {args.n_tokens} tokens after "
          f"{len(prompts)} prompts x {args.keys} keys; best of {args.rounds} rounds\n")
    print(f"measured: c = {float(auto.c):.3f}, v(1..8) = {', '.join(f'{v:.2f}' for v in np.asarray(auto.v))}\n")
    contenders = {f"K={K}": dict(K=K) for K in range(1, K_MAX + 1)}
    contenders |= {"auto": dict(K=K_MAX, policy=auto),
                   "auto, confidence 0.2": dict(K=K_MAX, policy=auto_policy(draft, target, K_MAX, capacity, 0.2))}
    keys = jax.random.split(jax.random.key(0), args.keys)
    print("| T | contender | tokens/s | tokens per call | drafts per call | vs best fixed K |\n|---|---|---|---|---|---|")
    for T in [float(t) for t in args.temperatures.split(",")]:
        def run(kw):
            calls, drafted = 0, 0
            for prompt in prompts:
                for key in keys:
                    out, trace = picospec.speculative_sample(draft, target, prompt, args.n_tokens, key,
                                                             temperature=T, **kw)
                    n = int(trace.n_steps)
                    calls, drafted = calls + n, drafted + int(np.asarray(trace.k[:n]).sum())
            return calls, drafted
        for kw in contenders.values():
            run(kw)  # compile
        best, counts = {name: np.inf for name in contenders}, {}
        for _ in range(args.rounds):
            for name, kw in contenders.items():
                t0 = time.perf_counter()
                counts[name] = run(kw)  # (target calls, drafts proposed)
                best[name] = min(best[name], time.perf_counter() - t0)
        tokens = len(prompts) * args.keys * args.n_tokens
        speed = {name: tokens / best[name] for name in contenders}
        best_fixed = max(speed[f"K={K}"] for K in range(1, K_MAX + 1))
        for name, (calls, drafted) in counts.items():
            print(f"| {T} | {name} | {speed[name]:.0f} | {tokens / calls:.2f} | {drafted / calls:.2f} | "
                  f"{speed[name] / best_fixed:.3f} |", flush=True)


if __name__ == "__main__":
    main()
