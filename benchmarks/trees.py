"""Chains, N chains and token trees at an equal number of nodes scored per target call (M = 4, 8, 16, 32):
tokens per target call and tokens/s on the bundled pair, beside theory, and v(M) on GPT-2's shapes.

    python benchmarks/trees.py --temperature 0.8
    python benchmarks/trees.py --temperature 0 --budgets 4,8,16

Contenders for a budget M (each scores M + 1 positions: the newest token and M drafted nodes):
  chain        K = M drafts in one chain (speculative.py);
  2 branches   two chains of M / 2 from the root, as one tree (tree.branches);
  tree iid     tree_theory.optimal_tree for M under the rank law of iid children measured on the prompts
               (tree_theory.rank_law, as --tree does), children drawn independently;
  tree distinct  the same for children drawn without replacement;
  tree top     the same for children the draft's most probable tokens;
  dynamic      EAGLE-2's tree, grown each call where the draft is confident (dynamic.grown(M));
  dynamic calibrated  as --tree M --children dynamic grows it: as deep as theory's tree of top children
               under their rank law on the prompts, its confidence calibrated there (dynamic.calibration).
Tokens per call: the mean over --runs keys per prompt (one batch each). Theory: tokens per call of the
shape under that rank law (tree_theory.tree_tokens_per_call). Tokens/s: the
compiled loop on each prompt and key in turn, contenders raced round after round (timing.race_laps), best
of --rounds.
"""

import argparse
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_report import cpu_name
from timing import forward_times, race_laps

import picospec
from picospec import Sampling
from picospec.beyond import theory, tree_theory
from picospec.beyond.dynamic import Grown, calibration, grown
from picospec.beyond.tree import Shape, branches, feed
from picospec.gpt2 import forward, init_cache
from picospec.sampling import logits_to_probs

sys.path.insert(0, str(Path(__file__).parent))
from adaptive import gpt2_shaped  # noqa: E402

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying", "Blessed are"]


def contenders(M: int, laws, p_plain, q) -> dict:  # laws: the rank law of each way to choose children
    found = {"chain": dict(K=M), "2 branches": dict(tree=branches(2, M // 2))}
    deep = grown(M, Shape(tree_theory.optimal_tree(M, laws["top"])).D)  # as deep as theory's tree of top children
    return found | {f"tree {c}": dict(tree=Shape(tree_theory.optimal_tree(M, laws[c])), children=c) for c in laws} \
        | {"dynamic": dict(tree=grown(M)),
           "dynamic calibrated": dict(tree=deep._replace(calibration=calibration(p_plain, q, deep.W)))}


def shape_of(kw):
    return getattr(kw["tree"], "parents", kw.get("tree")) if "tree" in kw else tuple(range(kw["K"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--budgets", default="4,8,16,32")
    parser.add_argument("--runs", type=int, default=16, help="keys per prompt for tokens per call (default 16)")
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--v", action="store_true", help="also v(M) on GPT-2 124M -> 355M shapes")
    parser.add_argument("--draft-layers", type=int, default=0,
                        help="a weaker draft: the bundled draft's first N layers (default: all of them)")
    parser.add_argument("--only", default="", help="contenders to race, by name, comma-separated (default: all)")
    args = parser.parse_args(argv)
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    if args.draft_layers:  # its embeddings, first blocks and final norm: lower acceptance, where trees pay
        draft = replace(draft, config=replace(draft.config, n_layer=args.draft_layers),
                        params={**draft.params, "h": draft.params["h"][:args.draft_layers]})
    tokenizer = picospec.load_tokenizer("tiny-target")
    prompts, T = [tokenizer.encode(t).ids for t in PROMPTS], args.temperature
    def laws_on_prompts(model, sampling):  # [positions, V]: the laws --tree measures its rank law from
        return np.concatenate([np.asarray(logits_to_probs(picospec.logits(model, x), sampling)) for x in prompts])
    p, q, p_plain = laws_on_prompts(draft, Sampling(T)), laws_on_prompts(target, Sampling(T)), \
        laws_on_prompts(draft, Sampling())  # top children rank by the draft's plain softmax
    which = f"the draft's first {args.draft_layers} layers" if args.draft_layers else "bundled pair"
    print(f"Machine: {cpu_name()}; jax {jax.__version__}; {which}, T = {T}, {args.n_tokens} tokens\n")
    print("| M | contender | shape (parents) | tokens per target call | theory | tokens/s |\n|---|---|---|---|---|---|")
    for M in [int(m) for m in args.budgets.split(",") if m]:
        def tokens_per_call(kw):  # [prompts x runs] each run's mean tokens per call, and alpha from them
            calls, kept_all = [], []
            for i, prompt in enumerate(prompts):
                _, trace = picospec.speculative_sample_batch(draft, target, [prompt] * args.runs, args.n_tokens,
                                                             jax.random.split(jax.random.key(100 + i), args.runs),
                                                             temperature=T, **kw)
                n, kept = np.asarray(trace.n_steps), np.asarray(trace.n_accepted)
                calls += [(kept[b, :n[b]] + 1).mean() for b in range(args.runs)]
                kept_all += [kept[b, :n[b]] for b in range(args.runs)]
            return calls, theory.alpha_from_trace(np.concatenate(kept_all), M)
        chain_calls, alpha = tokens_per_call(dict(K=M))
        laws = {c: tree_theory.rank_law(c, p_plain if c == "top" else p, q, M) for c in ("iid", "distinct", "top")}
        race = {name: kw for name, kw in contenders(M, laws, p_plain, q).items()
                if not args.only or name in args.only.split(",") or name == "chain"}
        per_call = {"chain": chain_calls} | {name: tokens_per_call(kw)[0] for name, kw in race.items()
                                              if name != "chain"}
        keys = jax.random.split(jax.random.key(0), 2)

        def run(kw):
            for prompt in prompts:
                for key in keys:
                    picospec.speculative_sample(draft, target, prompt, args.n_tokens, key, temperature=T, **kw)[0] \
                        .block_until_ready()
        laps, _ = race_laps(args.rounds, **{name: partial(run, kw) for name, kw in race.items()})  # first: compile
        best = {name: min(lap[name] for lap in laps) for name in race}
        for name, kw in race.items():
            parents = shape_of(kw)
            if isinstance(parents, Grown):  # grown each call: no one shape to predict for
                predicted, spelled = float("nan"), str(tuple(parents[:3]))  # (M, W, D)
            else:
                edges = tree_theory.rank_edges(parents, laws[kw.get("children", "iid")])
                predicted = tree_theory.tree_tokens_per_call(parents, edges)
                spelled = "chain" if parents == tuple(range(M)) else str(list(parents))
            print(f"| {M} | {name} | {spelled} | {np.mean(per_call[name]):.2f} ± "
                  f"{np.std(per_call[name]) / np.sqrt(len(per_call[name])):.2f} | {predicted:.2f} (alpha {alpha:.2f}) "
                  f"| {len(prompts) * len(keys) * args.n_tokens / best[name]:.0f} |", flush=True)
    if args.v:
        tree_call_costs()


@partial(jax.jit, static_argnames=("shape",))
def _tree_calls(model, shape: Shape, calls, cache):
    """`calls` tree calls (tree.feed: all M + 1 nodes, the tree's mask and positions) in one compiled loop."""
    nodes, base = np.arange(shape.M + 1), cache.length - 1

    def call(_, tokens):
        logits, _ = feed(model, tokens, cache, base, nodes, shape)  # [M+1, V]
        return jnp.argmax(logits, -1).astype(jnp.int32)
    return jax.lax.fori_loop(0, calls, call, jnp.zeros(shape.M + 1, jnp.int32))


def tree_call_costs(alpha=0.8, capacity=256):
    """v(M) on GPT-2 355M's shapes: one call scoring M + 1 positions, causal (a chain) and with theory's
    tree for M at alpha (tree attention), over one call of one token, all raced together."""
    _, big, _ = gpt2_shaped()
    filled = jnp.zeros(32, jnp.int32)
    cache = forward(big, filled, init_cache(big.config, capacity, big.params["wte"]["weight"].dtype))[1]
    budgets, n = (4, 8, 16, 32), 8
    shapes = {M: Shape(tree_theory.optimal_tree(M, tree_theory.rank_acceptance(alpha, M))) for M in budgets}
    trees = {f"tree {M}": partial(lambda shape: _tree_calls(big, shape, jnp.int32(n), cache).block_until_ready(),
                                  shapes[M]) for M in budgets}
    v = forward_times({f"chain {M}": (big, M + 1) for M in budgets} | {"1": (big, 1)}, capacity=capacity,
                      others=trees)
    v |= {name: v[name] / n for name in trees}
    print(f"\nv(M) / v(1) on GPT-2 355M's shapes, random weights ({jax.devices()[0].device_kind}; "
          f"v(1) = {v['1'] * 1e3:.2f} ms):")
    print("| M | chain (causal call, M + 1 positions) | theory's tree at alpha 0.8 (tree attention) |\n|---|---|---|")
    for M in budgets:
        print(f"| {M} | {v[f'chain {M}'] / v['1']:.2f} | {v[f'tree {M}'] / v['1']:.2f} |")


if __name__ == "__main__":
    main()
