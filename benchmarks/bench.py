"""`python benchmarks/bench.py`: picospec against what a user would pick instead, in one run.

Measures, on one machine and in one process (warm-up and compile time excluded, reported apart):
  a. greedy decode ms/token, picospec and transformers (PyTorch, use_cache=True, same threads);
  b. the fraction of the memory roofline: bytes read per decode step / (step time x bandwidth);
  c. v(K), the target's time for K+1 tokens over its time for 1, and c, draft step over target step;
  d. speculative against autoregressive, on the bundled pair and the GPT-2 pair, beside theory's
     prediction from the measured alpha, c and v(K), and transformers' assisted generation;
  e. for real GPT-2 124M -> 1558M, the speedup to expect here: the acceptance rate that jaymody's
     published run implies, with this machine's measured costs;
  f. start-up: a fresh process's wall time to its first token, cold and with the compilation cache.
GPT-2 124M and 1558M are used when they are in the Hugging Face cache; otherwise checkpoints of the
same shapes with random weights, written once with transformers (alpha is then meaningless).
Writes a Markdown table to stdout and everything to a JSON file.
"""

import argparse
import json
import os
import platform
from pathlib import Path

import jax
import numpy as np
from bench_batch import batch_report
from bench_reference import torch_device, transformers_assisted, transformers_decode
from bench_report import cpu_name, markdown
from gpt2_shapes import resolve
from timing import forward_times, race, startup_times, stream_1GiB

from picospec.autoregressive import buffers
from picospec.beyond import theory
from picospec.beyond.ngram import NGramDraft
from picospec.gpt2 import Model
from picospec.tools.checkpoints.weights import checkpoint_file, load_model, load_tokenizer
from picospec.tools.samplers import autoregressive_sample, speculative_sample

GROUNDED = "In the beginning God created the heaven and the earth. In the beginning God"  # text that repeats
# jaymody/speculative-sampling's published run: GPT-2 124M drafting for 1558M, K = 4, greedy, 40 tokens,
# 60.64 s autoregressive against 27.15 s speculative (2.23x), in NumPy without a KV cache. Without a
# cache a call costs in proportion to the parameters and hardly more for K + 1 tokens than for one, so
# c is the parameter ratio and v = 1; theory then says a drafted token was accepted with JAYMODY_ALPHA.
JAYMODY = dict(speedup=60.64 / 27.15, K=4, c=124_439_808 / 1_557_611_200, v=1.0)
JAYMODY_ALPHA = theory.alpha_from_speedup(**JAYMODY)  # 0.732
STREAM_CALLS = 8  # products of the bandwidth probe's compiled loop


def picospec_decode(model: Model, prompt, m: int):
    """A greedy decode of m tokens."""
    key = jax.random.key(0)
    return lambda: autoregressive_sample(model, prompt, m, key, temperature=0).block_until_ready()


def step_bytes(model: Model, cache_len: int) -> int:
    """Bytes a decode step reads: every weight once, plus the whole K and V cache buffers."""
    weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.params))
    itemsize = model.params["wte"]["weight"].dtype.itemsize
    return weights + 2 * model.config.n_layer * cache_len * model.config.n_embd * itemsize


def speculative_vs_autoregressive(draft: Model, target: Model, prompt, K: int, n=64) -> dict:
    """Greedy speculative and autoregressive sampling of n tokens, timed, with alpha from the trace."""
    key = jax.random.key(0)
    t, _ = race(ar=lambda: autoregressive_sample(target, prompt, n, key, temperature=0).block_until_ready(),
                spec=lambda: speculative_sample(draft, target, prompt, n, key, K=K, temperature=0)[0].block_until_ready())
    trace = speculative_sample(draft, target, prompt, n, key, K=K, temperature=0)[1]
    a = np.asarray(trace.n_accepted[:int(trace.n_steps)])
    proposed = np.asarray(trace.proposed[:int(trace.n_steps)])  # False: an n-gram step with no guess
    # An iteration's cost in autoregressive steps, whatever alpha: K draft calls, a K+1-token call, the rest.
    iteration_cost = (t["spec"] / len(a)) / (t["ar"] / n)
    return {"K": K, "alpha": theory.alpha_from_trace(a[proposed], K), "tokens_per_call": n / len(a),
            "ar_seconds": t["ar"], "spec_seconds": t["spec"], "speedup": t["ar"] / t["spec"],
            "iteration_cost": iteration_cost}


def pair_report(name, draft_name, target_name, prompt, Ks, vKs, n, with_transformers, dtype) -> dict:
    """A draft and a target; draft "ngram" is the n-gram lookup, run on an input-grounded prompt."""
    target = load_model(target_name, dtype)
    if draft_name == "ngram":
        draft, with_transformers = NGramDraft(3), False  # transformers' prompt lookup is not compared
        prompt = load_tokenizer(target_name).encode(GROUNDED).ids
    else:
        draft = load_model(draft_name, dtype)
    calls = {f"target T={K + 1}": (target, K + 1) for K in sorted({0} | set(Ks) | set(vKs))}
    if draft_name != "ngram":  # and the iteration's calls as they alternate (the n-gram draft makes none)
        calls |= {"draft T=1": (draft, 1), **{f"iteration K={K}": (draft, target, K) for K in Ks}}
    t = forward_times(calls, capacity=buffers(prompt, n, max(Ks, default=1), target.config)[2])  # as the runs below
    c = t["draft T=1"] / t["target T=1"] if draft_name != "ngram" else 0.0
    v = {K: t[f"target T={K + 1}"] / t["target T=1"] for K in sorted(set(Ks) | set(vKs))}
    rows = []
    for K in Ks:
        row = speculative_vs_autoregressive(draft, target, prompt, K, n)
        row["predicted_speedup"] = float(theory.walltime_improvement(row["alpha"], K, c, v[K]))
        # The same formula with K c + v(K) measured as the calls alternate, not one model at a time.
        row["calls_cost"] = t[f"iteration K={K}"] / t["target T=1"] if draft_name != "ngram" else v[K]
        row["predicted_speedup_alternating"] = float(theory.expected_tokens_per_call(row["alpha"], K) / row["calls_cost"])
        if with_transformers and dtype == "float32":  # assisted generation is compared in float32
            folders = [str(checkpoint_file(m, "config.json").parent) for m in (draft_name, target_name)]
            row["transformers_assisted"] = transformers_assisted(*folders, prompt, K, n)
        rows.append(row)
    report = {"pair": name, "draft": draft_name, "target": target_name, "dtype": dtype, "c": c, "v": v, "rows": rows}
    if name == "gpt2:gpt2-xl":
        report["real_gpt2_prediction"] = real_gpt2_prediction(report)
    return report


def real_gpt2_prediction(pair: dict) -> dict:
    """What GPT-2 124M -> 1558M with its real weights should gain on this machine: the alpha that
    jaymody's published run implies, with the c, v(K) and iteration cost measured here (speed does not
    depend on the weights' values, so random-weight checkpoints of the same shapes measure it)."""
    alpha, rows = JAYMODY_ALPHA, []
    for r in pair["rows"]:
        tokens = float(theory.expected_tokens_per_call(alpha, r["K"]))
        rows.append({"K": r["K"], "tokens_per_call": tokens, "iteration_cost": r["iteration_cost"],
                     "from_iteration_cost": tokens / r["iteration_cost"],
                     "theory": float(theory.walltime_improvement(alpha, r["K"], pair["c"], pair["v"][r["K"]]))})
    by_K = {K: float(theory.walltime_improvement(alpha, K, pair["c"], v)) for K, v in pair["v"].items()}
    return {"alpha": alpha, "rows": rows, "theory_by_K": by_K}


def decode_report(name: str, prompt, with_transformers, dtype: str, n=32) -> dict:
    """Greedy decode of one model in one dtype, picospec and transformers, beside the roofline, all
    raced in one loop. A decode step is the time for n + 8 tokens less the time for 8, over n, so
    prefill and fixed costs cancel."""
    folder, real = resolve(name)
    model = load_model(folder, dtype)
    runs = dict(long=picospec_decode(model, prompt, n + 8), short=picospec_decode(model, prompt, 8),
                stream=stream_1GiB(STREAM_CALLS))
    hf_folder = str(checkpoint_file(folder, "config.json").parent)
    if with_transformers and (hf_long := transformers_decode(hf_folder, prompt, dtype, n + 8)):
        runs |= dict(hf_long=hf_long, hf_short=transformers_decode(hf_folder, prompt, dtype, 8))
    t, warmup = race(**runs)
    s_pico = (t["long"] - t["short"]) / n
    s_hf = (t["hf_long"] - t["hf_short"]) / n if "hf_long" in t else None
    bw = (1 << 30) * STREAM_CALLS / t["stream"]  # bytes/s: the 1 GiB matrix read once a call
    cache_len = 64  # what autoregressive_sample allocates for these runs: the power of two >= 8+8+32
    roofline = step_bytes(model, cache_len) / bw
    return {"model": name, "dtype": dtype, "real_weights": real, "picospec_ms_per_token": 1e3 * s_pico,
            "picospec_compile_seconds": warmup["long"] - t["long"],
            "transformers_ms_per_token": None if s_hf is None else 1e3 * s_hf,
            "vs_transformers": None if s_hf is None else s_hf / s_pico,
            "bandwidth_GBps": bw / 1e9, "weights_stream_ms": 1e3 * roofline, "roofline_fraction": roofline / s_pico}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--decode", default="gpt2,gpt2-xl", help="models for decode ms/token (comma list)")
    parser.add_argument("--pairs", default="tiny-draft:tiny-target,ngram:tiny-target,gpt2:gpt2-xl",
                        help="DRAFT:TARGET pairs; DRAFT ngram is the n-gram lookup on an input-grounded prompt")
    parser.add_argument("--K", default="2,3,4", help="K values for the speculative rows")
    parser.add_argument("--v-K", default="1,2,3,4,5,6,7,8", help="K values for v(K)")
    parser.add_argument("--n-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32",
                        help="comma list of float32, bfloat16: picospec's and transformers' weights")
    parser.add_argument("--startup", default="tiny-draft:tiny-target,gpt2:gpt2-xl",
                        help="DRAFT:TARGET pairs timed from a fresh process to the first token, cold and warm")
    parser.add_argument("--batch", default="", help="batch sizes for the batch rows, e.g. 1,2,4,8,16 (default none)")
    parser.add_argument("--batch-pairs", default="tiny-draft:tiny-target,gpt2:gpt2-xl",
                        help="DRAFT:TARGET pairs for the batch rows")
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers rows")
    parser.add_argument("--out", type=Path, default=Path("bench.json"))
    args = parser.parse_args(argv)
    with_hf = not args.no_transformers
    prompt = list(range(100, 108))  # 8 token ids valid in every vocabulary here
    device = jax.devices()[0]
    report = {"machine": f"{cpu_name()}, {platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
                         f"jax {jax.__version__}", "device": f"{device.device_kind} ({device.platform})",
              "transformers_device": torch_device(), "decode": [], "pairs": []}
    dtypes = args.dtype.split(",")
    if unknown := set(dtypes) - {"float32", "bfloat16"}:
        parser.error(f"unknown dtype {unknown.pop()!r}; use float32 and/or bfloat16")
    for name in filter(None, args.decode.split(",")):
        for dtype in dtypes:
            report["decode"].append(decode_report(name, prompt, with_hf, dtype))
            print(f"decode {name} {dtype}: {json.dumps(report['decode'][-1])}", flush=True)
    Ks, vKs = [int(k) for k in args.K.split(",")], [int(k) for k in args.v_K.split(",")]
    for pair in filter(None, args.pairs.split(",")):
        draft, target = (resolve(m)[0] if m != "ngram" else m for m in pair.split(":"))
        for dtype in dtypes:
            p = pair_report(pair, draft, target, prompt, Ks, vKs, args.n_tokens, with_hf, dtype)
            report["pairs"].append(p)
            print(f"pair {pair} {dtype}: {json.dumps(p)}", flush=True)
    report["batch"] = []
    for pair in filter(None, args.batch_pairs.split(",") if args.batch else []):
        folders = [resolve(m)[0] for m in pair.split(":")]
        draft, target = (load_model(f, "float32") for f in folders)
        folders = [str(checkpoint_file(f, "config.json").parent) for f in folders]
        report["batch"].append(batch_report(pair, draft, target, folders, Ks[-1], args.n_tokens,
                                            [int(b) for b in args.batch.split(",")], with_hf))
    report["startup"] = []
    for pair in filter(None, args.startup.split(",")):
        draft, target = (resolve(m)[0] for m in pair.split(":"))
        report["startup"].append({"pair": pair, **startup_times(draft, target)})
        print(f"startup {pair}: {json.dumps(report['startup'][-1])}", flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
