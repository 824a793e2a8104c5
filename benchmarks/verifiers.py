"""Tokens per target call for each verifier (match, token, block) on the bundled pair, many seeds.

    python benchmarks/verifiers.py --K 2,4 --temperature 0.8

For each K and rule: B runs of n tokens after each of a few prompts (one batch per prompt, a key per
row), and the mean over runs of (kept drafts + 1) per target call, with its standard error. Every
rule emits the target's law; they differ only in how many drafts a call keeps.
"""

import argparse

import jax
import numpy as np
from bench_report import cpu_name

import picospec

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying", "Blessed are"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--K", default="2,4")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--runs", type=int, default=64, help="runs per prompt (default 64)")
    parser.add_argument("--n-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    tokenizer = picospec.load_tokenizer("tiny-target")
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; bundled pair, T = {args.temperature}\n")
    print("| K | rule | tokens per target call | runs |\n|---|---|---|---|")
    for K in [int(k) for k in args.K.split(",")]:
        for rule in ("match", "token", "block"):
            per_call = []
            for i, text in enumerate(PROMPTS):
                keys = jax.random.split(jax.random.key(100 + i), args.runs)
                _, trace = picospec.speculative_sample_batch(draft, target, [tokenizer.encode(text).ids] * args.runs,
                                                             args.n_tokens, keys, K=K, temperature=args.temperature,
                                                             verify=rule)
                n, kept = np.asarray(trace.n_steps), np.asarray(trace.n_accepted)
                per_call += [(kept[b, :n[b]] + 1).mean() for b in range(args.runs)]
            mean, error = np.mean(per_call), np.std(per_call) / np.sqrt(len(per_call))
            print(f"| {K} | {rule} | {mean:.3f} ± {error:.3f} | {len(per_call)} |", flush=True)


if __name__ == "__main__":
    main()
