"""Batched autoregressive decoding, every fixed K and `--K auto`, for batches of B = 1..16, in one run.

    python benchmarks/never_slower.py                      # the bundled pair, B = 1, 2, 4, 8, 16, T = 0 and 0.8
    python benchmarks/never_slower.py --pair gpt2-shaped --batches 1,4 --n-tokens 24

Each contender generates n tokens after each of B prompts (the first words of held-out verses, of
different lengths) as one batch, for each of max(ceil(--texts / B), --sets) sets of B prompts and keys
(a round of one call is a coin toss on a shared machine: two runs of one program differ by 5-10%), each set
its own verses (one text is luck: greedy, a text that suits long drafts makes a fixed K = 7 look best
in hindsight; sampled, two contenders' texts differ, and so do their tokens per call, by up to 1.7x
at B = 1); every round runs all the contenders in turn, in a shuffled order. The best fixed K is
the one auto trails most by the median of the first half of the rounds' ratios, and it is measured on
the other half: chosen and measured on the same rounds, the best of seven noisy contenders looks faster
than it is (the winner's curse). Autoregressive decoding runs twice a round, as two contenders: their
ratio is the noise floor of the row. auto compiles for K_max = 7 (the
CLI's) with the policy `--K auto` gives the library for each set (tools/autotune/policy_for: laps of the
library's own loop for this B, kept, and a run's drafts' acceptance as the prior), knowing the n tokens each row makes. Printed: one markdown
row per (T, B) with tokens/s of autoregressive decoding, the best fixed K, and auto (each its fastest
round of the second half), and auto's ratios to them: of the fastest rounds, and the median of the rounds'
ratios (both contenders in one round meet the same spell of a noisy machine).
"""

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np
from bench_report import cpu_name

import picospec
from picospec.sampling import Sampling
from picospec.tools.autotune import policy_for
from picospec.tools.checkpoints.weights import BUNDLED_DIR
from picospec.tools.cli.options import AUTO_K_MAX

sys.path.insert(0, str(Path(__file__).parent))
from adaptive import gpt2_shaped  # noqa: E402


def bundled_prompts(B: int, first: int = 0) -> list[list[int]]:
    """The first 3 to 6 words of each of B held-out verses from the first-th on, as token ids."""
    lines = (BUNDLED_DIR / "heldout_sample.txt").read_text().splitlines()
    tokenizer = picospec.load_tokenizer("tiny-target")
    return [tokenizer.encode(" ".join(line.split()[:3 + b % 4])).ids for b, line in enumerate(lines[first:first + B])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["bundled", "gpt2-shaped"], default="bundled")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--fixed", default="1,2,3,4,5,6,7", help="the fixed K raced")
    parser.add_argument("--rounds", type=int, default=6, help="the first half chooses the best fixed K, "
                        "the second measures")
    parser.add_argument("--texts", type=int, default=16, help="texts each contender makes a round, at least: "
                        "ceil(texts / B) sets of B prompts and keys")
    parser.add_argument("--sets", type=int, default=4, help="sets of B prompts and keys a round, at least")
    args = parser.parse_args(argv)
    if args.pair == "bundled":
        draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
        prompts_for = bundled_prompts
    else:
        draft, target, two = gpt2_shaped()
        prompts_for = lambda B, first: [two[(first + b) % 2][:2 + (first + b) % 3] for b in range(B)]  # noqa: E731
    n, fixed = args.n_tokens, [int(k) for k in args.fixed.split(",")]
    device = jax.devices()[0]
    on = "" if device.platform == "cpu" else f"{device.device_kind} ({device.platform}), host "
    print(f"Machine: {on}{cpu_name()}; jax {jax.__version__}; {args.pair} pair; {n} tokens after each of B prompts; "
          f"each contender's best of the last {args.rounds - args.rounds // 2} of {args.rounds} rounds\n")
    print("| T | B | autoregressive tokens/s | best fixed K: tokens/s | auto: tokens/s | auto / autoregressive "
          "(median of rounds) | auto / best fixed (median) | auto's k per call | autoregressive again / itself "
          "(median) |\n|---|---|---|---|---|---|---|---|---|")
    for T in [float(t) for t in args.temperatures.split(",")]:
        for B in [int(b) for b in args.batches.split(",")]:
            n_sets = max(-(-args.texts // B), args.sets)
            sets = [(prompts_for(B, B * i), jax.random.split(jax.random.key(i), B)) for i in range(n_sets)]
            autos = [policy_for(draft, target, prompts, n, Sampling(T), keys) for prompts, keys in sets]  # as the CLI

            def spec(policies=None, **kw):
                return lambda: [picospec.speculative_sample_batch(draft, target, prompts, n, keys, temperature=T,
                                                                  policy=policies and policies[i], **kw)
                                for i, (prompts, keys) in enumerate(sets)]

            ar = lambda: [picospec.autoregressive_sample_batch(target, prompts, n, keys, temperature=T)  # noqa: E731
                          for prompts, keys in sets]
            contenders = {"ar": ar, "ar again": ar}
            contenders |= {f"K={K}": spec(K=K) for K in fixed} | {"auto": spec(autos, K=AUTO_K_MAX)}
            results = {name: jax.block_until_ready(run()) for name, run in contenders.items()}  # compile
            laps = {name: [] for name in contenders}
            order = np.random.default_rng(B)
            for _ in range(args.rounds):
                for name in order.permutation(list(contenders)):
                    t0 = time.perf_counter()
                    jax.block_until_ready(contenders[name]())
                    laps[name].append(time.perf_counter() - t0)
            half = args.rounds // 2
            choose = {name: np.array(seconds[:half]) for name, seconds in laps.items()}
            laps = {name: np.array(seconds[half:]) for name, seconds in laps.items()}
            speed = {name: B * n * len(sets) / seconds.min() for name, seconds in laps.items()}
            def over(name, laps=laps):  # round by round: a slow spell hits both
                return np.median(laps[name] / laps["auto"])
            top = min((f"K={K}" for K in fixed), key=lambda name: over(name, choose))  # by the first half
            floor = np.median(laps["ar again"] / laps["ar"])
            k = np.concatenate([np.asarray(trace.k[b, :int(trace.n_steps[b])]) for _, trace in results["auto"]
                                for b in range(B)])
            print(f"| {T} | {B} | {speed['ar']:.0f} | {top}: {speed[top]:.0f} | {speed['auto']:.0f} | "
                  f"{speed['auto'] / speed['ar']:.2f} ({over('ar'):.2f}) | "
                  f"{speed['auto'] / speed[top]:.2f} ({over(top):.2f}) | {k.mean():.2f} "
                  f"(costs: {', '.join(f'{x:.2f}' for x in np.asarray(autos[0].v))}) | "
                  f"{speed['ar again'] / speed['ar']:.2f} ({floor:.2f}) |", flush=True)
            jax.clear_caches()  # ten batch sizes' programs would exhaust the process's memory maps


if __name__ == "__main__":
    main()
