"""The README's compare command with `--K auto` against a fixed K, prompt by prompt, in one run.

    python benchmarks/compare_auto.py                    # 8 held-out verses, T = 0 and 0.8, against --K 6
    python benchmarks/compare_auto.py --seeds            # the 3 runs of each prompt with seeds 0, 1, 2

Each prompt is the first 4 words of a held-out verse; each contender runs the CLI
(`--mode compare --n-tokens 200 --json`) 3 times, interleaved with the other, and keeps the median of
its speedups over autoregressive sampling (each run times both itself). Printed: auto / fixed per
prompt, and their median. With --seeds the 3 runs sample with seeds 0, 1, 2 (at T > 0 one sampled
text is luck); without, all three use the CLI's default seed.
"""

import argparse
import json
import statistics
import subprocess
import sys

from picospec.tools.bench.report import cpu_name
from picospec.tools.checkpoints.weights import BUNDLED_DIR


def speedup(prompt: str, K: str, T: str, seed: int) -> float:
    command = [sys.executable, "-m", "picospec", "--draft", "tiny-draft", "--target", "tiny-target", "--prompt", prompt,
               "--mode", "compare", "--K", K, "--n-tokens", "200", "--temperature", T, "--seed", str(seed), "--json"]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)["speedup"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--fixed", default="6", help="the fixed K raced (default 6, the README's)")
    parser.add_argument("--seeds", action="store_true", help="the 3 runs with seeds 0, 1, 2")
    args = parser.parse_args(argv)
    lines = (BUNDLED_DIR / "heldout_sample.txt").read_text().splitlines()[:8]
    prompts = [" ".join(line.split()[:4]) for line in lines]
    print(f"Machine: {cpu_name()}; bundled pair; --K auto / --K {args.fixed}, median speedup of 3 runs\n")
    print("| T | " + " | ".join(f"{p!r}" for p in prompts) + " | median |\n|---|" + "---|" * (len(prompts) + 1))
    for T in args.temperatures.split(","):
        speedup(prompts[0], "auto", T, 0)  # auto's costs timed once, before the race
        ratios = []
        for prompt in prompts:
            runs = {args.fixed: [], "auto": []}
            for r in range(3):
                for K in runs:
                    runs[K].append(speedup(prompt, K, T, r if args.seeds else 0))
            ratios.append(statistics.median(runs["auto"]) / statistics.median(runs[args.fixed]))
        print(f"| {T} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {statistics.median(ratios):.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
