"""Race this tree's picospec against an earlier revision's, in one process, on the same models.

    python benchmarks/race_revisions.py --against HEAD~1
    python benchmarks/race_revisions.py --against v0.1 --pairs tiny-draft:tiny-target,gpt2:gpt2-xl --K 4
    python benchmarks/race_revisions.py --against HEAD~1 --batch 1,2,4,8,16

The earlier revision's package is taken from git into a temporary folder, renamed so that both import
side by side, and each loads the models its own way. Then, for each pair, every contender is raced
in turn (picospec.tools.bench.timing.race, fastest of the rounds kept): the target's one-token and
(K+1)-token forward calls (so v(K)), the draft's one-token call (so c), and greedy autoregressive and
speculative sampling of --n-tokens tokens. The ratios "now / then" are the speed change; a pair named
gpt2 or gpt2-xl without the real weights in the Hugging Face cache gets random weights of the real
shapes (speed does not depend on the values). With --batch, the race is the batch table instead:
for each B, batched greedy autoregressive and speculative sampling of B ragged prompts (the
benchmark's own), and the speculative/autoregressive speedup of each revision.
"""

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

import picospec
from picospec.tools.bench.gpt2_shapes import resolve
from picospec.tools.bench.report import cpu_name
from picospec.tools.bench.timing import race

ROOT = Path(__file__).resolve().parents[1]


def import_revision(rev: str, folder: Path):
    """The package as it was at `rev`, importable as picospec_then."""
    subprocess.run(f"git -C {ROOT} archive {rev} picospec weights | tar -x -C {folder}", shell=True, check=True)
    (folder / "picospec").rename(folder / "picospec_then")
    importlib.invalidate_caches()
    for path in (folder / "picospec_then").rglob("*.py"):
        path.write_text(re.sub(r"\bpicospec(?=[.\s]|$)", "picospec_then", path.read_text(), flags=re.M))
    sys.path.insert(0, str(folder))
    return importlib.import_module("picospec_then")


def timing(package):
    """The package's own timing module (tools/bench/timing.py, or tools/timing.py before tools/ was grouped)."""
    for name in ("tools.bench.timing", "tools.timing"):
        try:
            return importlib.import_module(f"{package.__name__}.{name}")
        except ImportError:
            pass
    raise ImportError(f"no timing module in {package.__name__}")


def race_pair(packages: dict, draft_name: str, target_name: str, K: int, n_tokens: int, rounds: int) -> dict:
    prompt = list(range(100, 108))
    runs, calls = {}, {}
    for tag, package in packages.items():
        draft, target = package.load_model(draft_name), package.load_model(target_name)
        calls |= {f"{tag} target 1": (target, 1), f"{tag} target {K + 1}": (target, K + 1), f"{tag} draft 1": (draft, 1)}
        runs[f"{tag} autoregressive"] = (lambda p=package, t=target: p.autoregressive_sample(
            t, prompt, n_tokens, jax.random.key(0), temperature=0).block_until_ready())
        runs[f"{tag} speculative"] = (lambda p=package, d=draft, t=target: p.speculative_sample(
            d, t, prompt, n_tokens, jax.random.key(0), K=K, temperature=0)[0].block_until_ready())
    t = {}  # each package times its own calls (their forward functions differ); the two alternate
    for _ in range(rounds):
        for tag, package in packages.items():
            own = {name: call for name, call in calls.items() if name.startswith(tag)}
            for name, seconds in timing(package).forward_times(own, capacity=64, rounds=2).items():
                t[name] = min(seconds, t.get(name, seconds))
    return t | race(rounds=rounds, **runs)[0]


def race_batch(packages: dict, draft_name: str, target_name: str, K: int, n_tokens: int, rounds: int, B: int) -> dict:
    prompts = [list(range(100, 105 + (7 * b) % 8)) for b in range(B)]  # 5 to 12 tokens, as the benchmark's
    runs = {}
    for tag, package in packages.items():
        draft, target = package.load_model(draft_name), package.load_model(target_name)
        keys = jax.random.split(jax.random.key(0), B)
        runs[f"{tag} autoregressive"] = (lambda p=package, t=target, k=keys: p.autoregressive_sample_batch(
            t, prompts, n_tokens, k, temperature=0).block_until_ready())
        runs[f"{tag} speculative"] = (lambda p=package, d=draft, t=target, k=keys: p.speculative_sample_batch(
            d, t, prompts, n_tokens, k, K=K, temperature=0)[0].block_until_ready())
    return race(rounds=rounds, **runs)[0]


def print_batch(args, packages):
    print("| pair | B | tokens/s, autoregressive now | then | speculative now | then | now / then (speculative) | "
          "speedup now | speedup then |\n|---|---|---|---|---|---|---|---|---|")
    for pair in args.pairs.split(","):
        names = [resolve(name)[0] for name in pair.split(":")]
        for B in [int(b) for b in args.batch.split(",")]:
            t = race_batch(packages, *names, args.K, args.n_tokens, args.rounds, B)
            rate = {name: B * args.n_tokens / seconds for name, seconds in t.items()}
            print(f"| {pair} | {B} | {rate['now autoregressive']:.0f} | {rate['then autoregressive']:.0f} | "
                  f"{rate['now speculative']:.0f} | {rate['then speculative']:.0f} | "
                  f"{rate['now speculative'] / rate['then speculative']:.2f} | "
                  f"{rate['now speculative'] / rate['now autoregressive']:.2f}x | "
                  f"{rate['then speculative'] / rate['then autoregressive']:.2f}x |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to race (e.g. HEAD~1)")
    parser.add_argument("--pairs", default="tiny-draft:tiny-target", help="DRAFT:TARGET,... (default the bundled pair)")
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--n-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the race; each contender keeps its fastest")
    parser.add_argument("--batch", help="race the batch samplers at these B instead (e.g. 1,2,4,8,16)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        packages = {"now": picospec, "then": import_revision(args.against, Path(folder))}
        print(f"Machine: {cpu_name()}; jax {jax.__version__}; now = this tree, then = {args.against}\n")
        if args.batch:
            return print_batch(args, packages)
        print("| pair | what | now | then | now / then |\n|---|---|---|---|---|")
        for pair in args.pairs.split(","):
            names = [resolve(name)[0] for name in pair.split(":")]
            t = race_pair(packages, *names, args.K, args.n_tokens, args.rounds)
            rows = [("target call, 1 token (ms)", "target 1", 1e3), (f"target call, {args.K + 1} tokens (ms)",
                    f"target {args.K + 1}", 1e3), ("draft call, 1 token (ms)", "draft 1", 1e3),
                    (f"autoregressive, {args.n_tokens} tokens (s)", "autoregressive", 1),
                    (f"speculative K={args.K}, {args.n_tokens} tokens (s)", "speculative", 1)]
            for what, key, scale in rows:
                now, then = t[f"now {key}"] * scale, t[f"then {key}"] * scale
                print(f"| {pair} | {what} | {now:.3f} | {then:.3f} | {now / then:.2f} |", flush=True)


if __name__ == "__main__":
    main()
