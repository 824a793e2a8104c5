"""The README's compare command with `--K auto` against a fixed K, prompt by prompt, in one run.

    python benchmarks/compare_auto.py                    # 8 held-out verses, T = 0 and 0.8, against --K 6
    python benchmarks/compare_auto.py --seeds            # the 3 runs of each prompt with seeds 0, 1, 2
    python benchmarks/compare_auto.py --in-process       # the same texts, raced in one process
    python benchmarks/compare_auto.py --seeds --against 6    # --K 6 against itself: the race's own noise

Each prompt is the first 4 words of a held-out verse; each contender runs the CLI
(`--mode compare --n-tokens 200 --json`) 3 times, interleaved with the other (each first in turn),
and keeps the median of its speedups over autoregressive sampling (each run times both itself).
Printed: auto / fixed per prompt, and their median. With --seeds the 3 runs sample with seeds 0, 1,
2 (at T > 0 one sampled text is luck); without, all three use the CLI's default seed.

Each CLI speedup is a ratio of two timings in one process, and the race divides two of them from
different processes: on a shared machine a prompt's figure moves by up to 0.2 between runs. With
--in-process the contenders sample from the same seeds (0, 1, 2, or --samples of them) with
`speculative_sample` in one process, in turn, round after round (costs.race_laps), each (prompt,
contender) keeping its fastest round; auto with the CLI's policy (this machine's costs for one call a
text, the prompt's prior). Greedy, both write the same text; at T > 0 another K draws another text from
the same law, and three of them leave a prompt's figure to their luck: one prompt's seeds that accept
less under auto gave it 0.80 and 0.82 in two races (`--samples 12` averages it out).
"""

import argparse
import json
import statistics
import subprocess
import sys

import jax
from bench_report import cpu_name
from timing import race_laps

import picospec
from picospec.sampling import Sampling
from picospec.tools.autotune import policy_for
from picospec.tools.checkpoints.weights import BUNDLED_DIR
from picospec.tools.cli.options import AUTO_K_MAX


def speedup(prompt: str, K: str, T: str, seed: int) -> float:
    command = [sys.executable, "-m", "picospec", "--draft", "tiny-draft", "--target", "tiny-target", "--prompt", prompt,
               "--mode", "compare", "--K", K, "--n-tokens", "200", "--temperature", T, "--seed", str(seed), "--json"]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)["speedup"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--fixed", default="6", help="the fixed K raced (default 6, the README's)")
    parser.add_argument("--against", default="auto", help="the --K raced against --fixed (default auto; the "
                        "same as --fixed: the race's own noise, a command against itself)")
    parser.add_argument("--seeds", action="store_true", help="the 3 runs with seeds 0, 1, 2")
    parser.add_argument("--in-process", action="store_true", help="race in one process (seeds 0, 1, 2)")
    parser.add_argument("--rounds", type=int, default=5, help="--in-process: rounds, each keeps its fastest")
    parser.add_argument("--samples", type=int, default=3, help="--in-process: texts of each prompt (seeds 0, 1, ...): "
                        "at T > 0 each contender's texts differ, and a few of them are luck")
    args = parser.parse_args(argv)
    lines = (BUNDLED_DIR / "heldout_sample.txt").read_text().splitlines()[:8]
    prompts = [" ".join(line.split()[:4]) for line in lines]
    print(f"Machine: {cpu_name()}; bundled pair; --K {args.against} / --K {args.fixed}, median speedup of 3 runs\n")
    print("| T | " + " | ".join(f"{p!r}" for p in prompts) + " | median |\n|---|" + "---|" * (len(prompts) + 1))
    for T in args.temperatures.split(","):
        if args.in_process:
            ratios = in_process(prompts, int(args.fixed), args.against, float(T), args.rounds, args.samples)
            print(f"| {T} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {statistics.median(ratios):.2f} |",
                  flush=True)
            continue
        speedup(prompts[0], args.against, T, 0)  # auto's costs timed once, before the race
        ratios = []
        for prompt in prompts:
            contenders = {"fixed": args.fixed, "against": args.against}
            runs = {name: [] for name in contenders}
            for r in range(3):  # each goes first in turn: a run's place in the pair may tell on its time
                for name, K in list(contenders.items())[::1 if r % 2 == 0 else -1]:
                    runs[name].append(speedup(prompt, K, T, r if args.seeds else 0))
            ratios.append(statistics.median(runs["against"]) / statistics.median(runs["fixed"]))
        print(f"| {T} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {statistics.median(ratios):.2f} |",
              flush=True)


def in_process(prompts: list[str], K: int, against: str, T: float, rounds: int, samples: int = 3) -> list[float]:
    """`against` (auto, or another fixed K) / fixed K tokens per second for each prompt, both raced in this
    process over `samples` texts (seeds 0, 1, ...)."""
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    tokenizer, sampling = picospec.load_tokenizer("tiny-target"), Sampling(T)
    ratios = []
    for text in prompts:
        prompt = tokenizer.encode(text).ids
        policy = policy_for(draft, target, [prompt], 200, sampling)  # timed on the library's loop: 200 tokens

        def run(**kw):
            return lambda: jax.block_until_ready([picospec.speculative_sample(
                draft, target, prompt, 200, jax.random.key(seed), temperature=T, **kw) for seed in range(samples)])
        other = run(K=AUTO_K_MAX, policy=policy) if against == "auto" else run(K=int(against))
        laps, _ = race_laps(rounds, fixed=run(K=K), against=other)  # the first call compiles
        ratios.append(min(lap["fixed"] for lap in laps) / min(lap["against"] for lap in laps))
    return ratios


if __name__ == "__main__":
    main()
