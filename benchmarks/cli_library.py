"""The CLI against the library: the same work streamed and coloured, or in one call.

    python benchmarks/cli_library.py                     # the bundled pair, 200 tokens, T = 0.8, K = 4
    python benchmarks/cli_library.py --temperature 0 --K 6 --rounds 5

One prompt ("And God said"), n tokens, T with top-k 20 and top-p 0.9 (T = 0: greedy), for autoregressive
sampling and speculative sampling at K. The CLI runs as a user runs it (`picospec.tools.cli.main`, with
--json), in this process, so its programs are compiled once; its tokens/s is the one it reports (prefill and
every iteration, compiling left out). The library's is `picospec.speculative_sample` (or
`autoregressive_sample`) timed whole, prefill included, after a first call that compiles it. Each round
runs the four in turn; each figure is the median over the rounds. Also the CLI's first run's compile
seconds as it reports them (in this process, so the first mode's run includes loading JAX's kernels)."""

import argparse
import contextlib
import io
import json
import statistics
import time

import jax

import picospec
from picospec.tools.cli import main as cli

PROMPT = "And God said"


def sampling_flags(T: float) -> list[str]:
    return ["--temperature", str(T)] + ([] if T == 0 else ["--top-k", "20", "--top-p", "0.9"])


def run_cli(mode: str, n: int, T: float, K: int, pair) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["--draft", pair[0], "--target", pair[1], "--prompt", PROMPT, "--n-tokens", str(n), "--K", str(K),
                    "--mode", mode, "--json", *sampling_flags(T)])
    if code:
        raise RuntimeError(f"the CLI exited with {code}")
    return json.loads(out.getvalue())["stats"]


def library(mode: str, n: int, T: float, K: int, models, prompt) -> float:
    """tokens/s of one call of the library's sampler (the same prompt, key and sampling as the CLI's)."""
    draft, target = models
    kw = dict(temperature=T) | ({} if T == 0 else dict(top_k=20, top_p=0.9))
    t0 = time.perf_counter()
    if mode == "speculative":
        jax.block_until_ready(picospec.speculative_sample(draft, target, prompt, n, jax.random.key(0), K=K, **kw))
    else:
        jax.block_until_ready(picospec.autoregressive_sample(target, prompt, n, jax.random.key(0), **kw))
    return n / (time.perf_counter() - t0)


def race(n: int = 200, T: float = 0.8, K: int = 4, rounds: int = 3, pair=("tiny-draft", "tiny-target")) -> dict:
    """{mode: {"cli": tokens/s, "library": tokens/s, "over": library / cli, "compile": the CLI's first run's
    compile seconds}}, medians over `rounds` interleaved rounds."""
    models = picospec.load_model(pair[0]), picospec.load_model(pair[1])
    prompt = picospec.load_tokenizer(pair[1]).encode(PROMPT).ids
    modes = ("autoregressive", "speculative")
    first = {mode: run_cli(mode, n, T, K, pair)["compile_seconds"] for mode in modes}
    for mode in modes:
        library(mode, n, T, K, models, prompt)  # compiled
    laps = {(mode, who): [] for mode in modes for who in ("cli", "library")}
    for _ in range(rounds):
        for mode in modes:
            laps[mode, "cli"].append(run_cli(mode, n, T, K, pair)["tokens_per_second"])
            laps[mode, "library"].append(library(mode, n, T, K, models, prompt))
    result = {}
    for mode in modes:
        c, lib = statistics.median(laps[mode, "cli"]), statistics.median(laps[mode, "library"])
        result[mode] = dict(cli=c, library=lib, over=lib / c, compile=first[mode])
    return result


def table(result: dict) -> str:
    rows = [f"| {mode} | {r['cli']:.0f} | {r['library']:.0f} | {r['over']:.2f} | {r['compile']:.1f} |"
            for mode, r in result.items()]
    return "\n".join(["| mode | CLI tok/s | library tok/s | library / CLI | CLI's first compile s |",
                      "|---|---|---|---|---|", *rows])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(table(race(args.n_tokens, args.temperature, args.K, args.rounds)))
