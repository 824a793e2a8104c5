"""`--K auto` through the CLI, on held-out prompts it was never tuned on, against autoregressive
decoding and every fixed K.

    python benchmarks/held_out.py                          # B = 1, 4, 8; T = 0, 0.8; 64 tokens; 3 rounds
    python benchmarks/held_out.py --half tune --batches 4   # the half a policy may be tuned on

The bundled held-out file is split in two: its first half to tune on, its second half to report (the
default). Round r takes the half's verses from r * B on, their first 3 to 6 words as B prompts, and runs
every contender on them, each a fresh `picospec` process as a user runs it, in a shuffled order (B = 1:
--singles prompts a round, from r * singles on, each its own process, the contenders shuffled for each;
the round's figure is their tokens over their seconds, as a batch's is, not one prompt's):
autoregressive decoding twice (their ratio is the row's noise floor), fixed K = 1..7, and --K auto
(with its costs timed and kept before the first round). A contender's figure is the CLI's own tokens/s
(compiling left out); a ratio is the median over the rounds of the ratios within each round (both
contenders meet the same spell of a shared machine). The best fixed K is the one with the highest
median ratio to autoregressive decoding; chosen on the rounds it is then measured on, the best of seven
noisy contenders looks faster than it is, so --best-from (a tune-half run's JSON) names, for each row,
the K that was best there, and auto is weighed against it too.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
from bench_report import cpu_name

from picospec.tools.checkpoints.weights import BUNDLED_DIR

PAIR = ["--draft", "tiny-draft", "--target", "tiny-target"]
EXTRA: dict = {}  # more contenders, {name: flags}, for a caller that races variants


def prompts(half: str, first: int, B: int) -> list[str]:
    lines = (BUNDLED_DIR / "heldout_sample.txt").read_text().splitlines()
    mine = lines[:len(lines) // 2] if half == "tune" else lines[len(lines) // 2:]
    return [" ".join(mine[(first + b) % len(mine)].split()[:3 + (first + b) % 4]) for b in range(B)]


def run_cli(flags: list[str], prompt_file: str, extra: list[str], cache: str) -> dict:
    """The CLI's figures for one run: its stats, and auto's decisions where it reports them."""
    out = subprocess.run([sys.executable, "-m", "picospec", *PAIR, "--prompt-file", prompt_file, "--json", *flags,
                          *extra], capture_output=True, text=True,
                         env={**os.environ, "NO_COLOR": "1", "PICOSPEC_JIT_CACHE": cache})
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    last = json.loads(out.stdout.splitlines()[-1])
    mode = "autoregressive" if "autoregressive" in flags else "speculative"
    return last["summary"][mode] if "summary" in last else last["stats"]


def race(B: int, T: float, args, chosen: str | None = None) -> dict:
    contenders = {"autoregressive": ["--mode", "autoregressive"], "autoregressive again": ["--mode", "autoregressive"]}
    contenders |= {f"K = {K}": ["--K", str(K)] for K in args.ks} | {"auto": ["--K", "auto"]} | EXTRA
    sampled = [] if T == 0 else ["--temperature", str(T), "--top-k", "20", "--top-p", "0.9"]
    rng, speeds, k_auto, decided = np.random.default_rng(B), {name: [] for name in contenders}, [], []
    with tempfile.TemporaryDirectory() as folder:  # its own cache folder: auto times the machine anew each race
        cli = partial(run_cli, cache=str(Path(folder) / "jit"))
        for r in range(args.rounds):
            groups = ([[p] for p in prompts(args.half, r * args.singles, args.singles)] if B == 1  # one a process
                      else [prompts(args.half, r * B, B)])
            files = [Path(folder) / f"round{r}-{i}.txt" for i in range(len(groups))]
            for file, group in zip(files, groups):
                file.write_text("\n".join(group) + "\n")
            extra = ["--n-tokens", str(args.n_tokens), "--seed", str(r), *sampled]
            if r == 0:  # compile every program, and time auto's costs, before the first round
                for flags in contenders.values():
                    cli(flags, str(files[0]), extra)
            ran = {name: [] for name in contenders}  # each contender's stats on each of the round's files
            for file in files:
                for name in rng.permutation(list(contenders)):
                    ran[name].append(cli(contenders[name], str(file), extra))
            for name, runs in ran.items():  # the round's tokens over its seconds
                speeds[name].append(sum(x["n_tokens"] for x in runs) / sum(x["seconds"] for x in runs))
            k_auto.append(float(np.mean([x.get("K_used", np.nan) for x in ran["auto"]])))  # the k it drafted
            decided += [x.get("auto") for x in ran["auto"]]  # and what it decided from, each run
    ratio = {name: statistics.median(np.divide(s, speeds["autoregressive"])) for name, s in speeds.items()}
    best = max((n for n in contenders if n.startswith("K =")), key=ratio.get)
    over_best = {n: statistics.median(np.divide(speeds[n], speeds[best])) for n in contenders if "auto" in n}
    over_chosen = {n: statistics.median(np.divide(speeds[n], speeds[chosen])) for n in over_best} if chosen else {}
    return dict(B=B, T=T, tokens_per_s={n: statistics.median(s) for n, s in speeds.items()}, ratio=ratio,
                best=best, auto_over_best=over_best["auto"], over_best=over_best, chosen=chosen,
                over_chosen=over_chosen, floor=ratio["autoregressive again"], auto_k=k_auto, decided=decided,
                rounds=speeds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--half", choices=["tune", "report"], default="report")
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--singles", type=int, default=8, help="B = 1: prompts a round, each its own process")
    parser.add_argument("--ks", default="1,2,3,4,5,6,7", help="the fixed K raced")
    parser.add_argument("--draft", default="tiny-draft", help="the draft (tiny-head: the EAGLE head)")
    parser.add_argument("--json", default="held_out.json")
    parser.add_argument("--best-from", help="a tune-half run's JSON: each row's best fixed K there")
    args = parser.parse_args(argv)
    args.ks = [int(K) for K in args.ks.split(",")]
    PAIR[1] = args.draft
    tuned = {(r["B"], r["T"]): r["best"] for r in json.loads(Path(args.best_from).read_text())} \
        if args.best_from else {}
    print(f"Machine: {cpu_name()}; {args.draft} drafting for tiny-target; the {args.half} half; {args.n_tokens} tokens a row; "
          f"median of {args.rounds} interleaved rounds\n")
    print("| B | T | autoregressive tok/s | auto / autoregressive | best fixed K | auto / best fixed K | "
          "K best on the tune half: auto / it | autoregressive / itself | auto's mean k, each round |\n"
          "|---|---|---|---|---|---|---|---|---|",
          flush=True)
    rows = []
    for T in [float(t) for t in args.temperatures.split(",")]:
        for B in [int(b) for b in args.batches.split(",")]:
            row = race(B, T, args, tuned.get((B, T)))
            rows.append(row)
            chosen = f"{row['chosen']}: {row['over_chosen']['auto']:.2f}" if row["chosen"] else "—"
            print(f"| {B} | {T:g} | {row['tokens_per_s']['autoregressive']:.0f} | {row['ratio']['auto']:.2f} | "
                  f"{row['best']}: {row['ratio'][row['best']]:.2f} | {row['auto_over_best']:.2f} | {chosen} | "
                  f"{row['floor']:.2f} | {' '.join(f'{k:.1f}' for k in row['auto_k'])} |", flush=True)
            for name in EXTRA:
                print(f"|   | {name} | | {row['ratio'][name]:.2f} | | {row['over_best'][name]:.2f} | | |", flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
