"""Several drafts (--drafts N): tokens per target call and tokens/s for N = 1, 2, 4, match and token
rules, on the bundled pair, beside the theory.

    python benchmarks/several.py --K 3 --temperature 0.8

Tokens per call: the mean over B runs per prompt (one batch each). Tokens/s: speculative_sample's
compiled loop, the contenders raced in turn, best of `rounds`. Theory: alpha_N, the chance that one
of N drafts is accepted at a position (theory.alpha_several), averaged over the held-out text's
positions, and the tokens per call it gives if every chain stayed alive at every depth (an upper
bound: only the chains that drafted the accepted token go on). v: the target's one call of N K + 1
tokens (the root and N chains of K, as one tree) over a call of one.
"""

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from bench_report import cpu_name
from timing import forward_times

import picospec
from picospec import Sampling
from picospec.beyond import theory
from picospec.sampling import logits_to_probs

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying", "Blessed are"]
HELDOUT = Path(__file__).parent.parent / "weights" / "heldout_sample.txt"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--K", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--runs", type=int, default=32, help="runs per prompt for tokens per call (default 32)")
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    tokenizer = picospec.load_tokenizer("tiny-target")
    prompts = [tokenizer.encode(t).ids for t in PROMPTS]
    K, T, sampling = args.K, args.temperature, Sampling(args.temperature)
    text = tokenizer.encode(HELDOUT.read_text()).ids[:target.config.n_positions]
    p, q = (np.asarray(logits_to_probs(picospec.logits(m, text), sampling)) for m in (draft, target))
    v = forward_times({f"N={N}": (target, N * K + 1) for N in (1, 2, 4)} | {"one": (target, 1)}, capacity=128)
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; bundled pair, K = {K}, T = {T}\n")
    contenders = {(N, rule): dict(K=K, drafts=N, verify=rule) for N in (1, 2, 4) for rule in ("match", "token")}
    keys = jax.random.split(jax.random.key(0), 4)

    def run(kw):
        for prompt in prompts:
            for key in keys:
                picospec.speculative_sample(draft, target, prompt, args.n_tokens, key, temperature=T, **kw)[0] \
                    .block_until_ready()
    for kw in contenders.values():
        run(kw)  # compile
    best = {name: np.inf for name in contenders}
    for _ in range(args.rounds):
        for name, kw in contenders.items():
            t0 = time.perf_counter()
            run(kw)
            best[name] = min(best[name], time.perf_counter() - t0)
    print("| N | rule | tokens per target call | theory, all chains alive | tokens/s | v(NK+1) |\n"
          "|---|---|---|---|---|---|")
    for (N, rule), kw in contenders.items():
        per_call = []
        for i, prompt in enumerate(prompts):
            _, trace = picospec.speculative_sample_batch(draft, target, [prompt] * args.runs, args.n_tokens,
                                                         jax.random.split(jax.random.key(100 + i), args.runs),
                                                         temperature=T, **kw)
            n, kept = np.asarray(trace.n_steps), np.asarray(trace.n_accepted)
            per_call += [(kept[b, :n[b]] + 1).mean() for b in range(args.runs)]
        alpha = theory.alpha_several(p, q, N) if rule == "token" else float(  # match: some chain drafted
            np.mean((q * (1 - (1 - p) ** N)).sum(-1)))  # the target's own sample t ~ q
        speed = len(prompts) * len(keys) * args.n_tokens / best[(N, rule)]
        print(f"| {N} | {rule} | {np.mean(per_call):.3f} ± {np.std(per_call) / np.sqrt(len(per_call)):.3f} | "
              f"{float(theory.expected_tokens_per_call(alpha, K)):.3f} (alpha {alpha:.3f}) | {speed:.0f} | "
              f"{v[f'N={N}'] / v['one']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
