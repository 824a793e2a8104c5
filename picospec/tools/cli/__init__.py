"""`picospec` (or `python -m picospec`): speculative sampling on GPT-2 (124M drafting for 1558M), streamed and coloured.

One prompt streams one iteration at a time. Several (`--prompt` given more than once, or `--prompt-file`) run as one
batch, each row printed the moment it finishes; row b samples with jax.random.split(jax.random.key(seed), B)[b]. Both go
through the same stream (a single prompt is a batch of one).
"""

import json
import os
import sys
from pathlib import Path

import jax

from picospec.beyond.dynamic import Grown
from picospec.beyond.ngram import NGramDraft
from picospec.errors import NonFiniteLogits, PicospecError
from picospec.fastpath import default_dtype
from picospec.tools import autotune, checks, draft_checks
from picospec.tools.checkpoints.head import is_head, load_head
from picospec.tools.checkpoints.weights import (
    check_tokenizer,
    checkpoint_file,
    eos_token_id,
    load_model,
    load_tokenizer,
)
from picospec.tools.cli.flags import parse_args
from picospec.tools.cli.options import K_max, read_prompts, tree_shape, use_platform
from picospec.tools.cli.picture import draw
from picospec.tools.cli.show import batch_stats, coloured, legend, row_record, show, summary
from picospec.tools.cli.stream import Timing, stream
from picospec.tools.jit_cache import use_persistent_cache


def load(args):
    """The tokenizer, the draft (a Model, the n-gram draft or None) and the target. The cheap checks come first, before
    any weights load (gpt2-xl's take tens of seconds): the target's tokenizer reads, and the draft's name resolves."""
    tokenizer, draft = load_tokenizer(args.target), None
    draft_is_model = args.mode != "autoregressive" and args.draft != "ngram"
    if draft_is_model:
        draft_config = checkpoint_file(args.draft, "config.json")
    elif args.mode != "autoregressive":
        draft_checks.ngram_max(args.ngram_max)
        draft = NGramDraft(args.ngram_max)
    target = load_model(args.target, args.dtype)
    check_tokenizer(tokenizer, target, checkpoint_file(args.target, "tokenizer.json"))
    if draft_is_model:  # an EAGLE head (for this target) or a draft model
        draft = load_head(args.draft, target) if is_head(draft_config) else load_model(args.draft, args.dtype)
    if draft is not None:
        adaptive_K = args.K == "auto" or args.confidence > 0
        draft_checks.tree(tree_shape(args), args.children, draft, target, args.verify, args.drafts, adaptive_K or None)
        draft_checks.pair(draft, target, K_max(args), args.verify, args.drafts, adaptive_K, args.confidence > 0)
    return tokenizer, draft, target


def run(args, mode, draft, target, tokenizer, texts, prompts, out, device) -> tuple[list[dict], dict]:
    """One sampler over every prompt: print as it goes, return each row's record and the batch's figures."""
    B, timing, where = len(prompts), Timing(), {"device": device, "dtype": args.dtype}
    if mode == "speculative":  # and how it drafted
        where |= {"verify": args.verify, "K": args.K, "confidence": args.confidence, "drafts": args.drafts,
                  "tree": args.shape and {"nodes": args.tree, "children": args.children} | (
                      args.shape._asdict() if isinstance(args.shape, Grown) else {"parents": list(args.shape.parents)})}
    keys = jax.random.split(jax.random.key(args.seed), B)
    eos = eos_token_id(target, tokenizer) if args.stop_at_eos else -1
    steps, records, text = [[] for _ in range(B)], [None] * B, ""
    if out and B == 1:
        out.write(texts[0])
    policy = autotune.make_policy(args) if mode == "speculative" else None
    tune = autotune.tune if mode == "speculative" and args.K == "auto" else None
    for iteration in stream(draft if mode == "speculative" else None, target, prompts, args.n_tokens, keys,
                            K=K_max(args), sampling=args.sampling,
                            eos_id=eos, timing=timing, verify=args.verify, policy=policy, drafts=args.drafts,
                            tree=args.shape, children=args.children, tune=tune):
        for b, step in enumerate(iteration):
            if step is None:
                continue
            if out and B == 1:  # one prompt: stream each step as it comes
                text = show(out, tokenizer, [t for s in steps[b] for t in s.tokens], step, mode, text)
            steps[b].append(step)
            if step.finished:
                records[b] = row_record(mode, steps[b], tokenizer, prompts[b], timing.compile_seconds)
                records[b]["stats"] |= where
                if B > 1:
                    print_row(args, mode, b, texts, records[b], out)
    if out and B == 1:
        out.write("\n")
        print(summary(mode, records[0]["stats"]), file=sys.stderr)
    stats = batch_stats(records, timing.seconds, timing.compile_seconds) | where
    if mode == "speculative" and args.K == "auto":  # what auto decided, and why
        stats["auto"] = autotune.explain(timing.tuned, [s for row in steps for s in row])
        if B == 1:
            records[0]["stats"]["auto"] = stats["auto"]
    if out and B > 1:
        print(summary(mode, stats, f" batch of {B}:"), file=sys.stderr)
    if args.plot and mode == "speculative":
        for b, row in enumerate(steps):
            path = args.plot if B == 1 else str(Path(args.plot).with_stem(f"{Path(args.plot).stem}-{b + 1}"))
            draw(row, tokenizer, K_max(args), f"Every iteration's accept and reject: {texts[b]!r}"[:90]).savefig(path)
    return records, stats


def print_row(args, mode, b, texts, record, out):
    """A finished row of a batch: a JSON line, or its text with a header and its summary line."""
    if args.json:
        sys.stdout.write(json.dumps({"mode": mode, "row": b, "prompt": texts[b], **record}) + "\n")  # one write:
        sys.stdout.flush()  # an interrupt leaves whole lines
    else:
        print(f"--- {mode}, prompt {b + 1} of {len(texts)} ---\n{texts[b]}{record['text']}", file=out, flush=True)
        print(summary(mode, record["stats"], f" prompt {b + 1}:"), file=sys.stderr)


def main(argv=None) -> int:
    args = None
    try:
        args = parse_args(argv)
        chosen = use_platform(args.platform)  # named in the summary and the JSON (kind: a GPU's model name)
        device = {"platform": chosen.platform, "kind": chosen.device_kind, "name": str(chosen)}
        args.dtype = args.dtype or default_dtype(chosen.platform)
        use_persistent_cache()  # a second run of the same command compiles nothing
        args.sampling = checks.sampling(args.temperature, args.top_k, args.top_p)  # the cheap checks, before loading
        checks.positive("K", K_max(args))
        checks.positive("n-tokens", args.n_tokens)
        checks.confidence(args.confidence)
        checks.plot(args.plot, args.mode)
        texts = read_prompts(args)
        tokenizer, draft, target = load(args)
        prompts = [tokenizer.encode(t).ids or [eos_token_id(target, tokenizer)] for t in texts]
        checks.prompts(prompts, args.n_tokens, 0 if args.mode == "autoregressive" else K_max(args), target.config)
        args.shape = tree_shape(args, draft, target, prompts, args.sampling)
        modes = ["autoregressive", "speculative"] if args.mode == "compare" else [args.mode]
        results = {}
        for mode in modes:
            out = None if args.json and len(texts) == 1 else sys.stdout
            if out and len(modes) > 1 and len(texts) == 1:
                out.write(f"--- {mode} ---\n")
            results[mode] = run(args, mode, draft, target, tokenizer, texts, prompts, out, device)
    except NonFiniteLogits as e:  # found after the loop: name the model, and the flag that fixes it
        print(f"picospec: error: {getattr(args, e.which)} (the {e.which}) computed NaN or Inf logits with --dtype "
              f"{args.dtype}: use --dtype bfloat16 or float32", file=sys.stderr)
        return 2
    except PicospecError as e:
        print(f"picospec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: end the streamed line with the terminal's colour reset
        if not (args and args.json):
            sys.stdout.write(("\033[0m" if coloured(sys.stdout) else "") + "\n")
            sys.stdout.flush()
        return 130
    report = {mode: records[0] if len(texts) == 1 else stats for mode, (records, stats) in results.items()}
    if args.mode == "compare":
        (ar, ar_stats), (spec, spec_stats) = results["autoregressive"], results["speculative"]
        same = [r["tokens"] for r in ar] == [r["tokens"] for r in spec] if args.temperature == 0 else None
        report |= {"speedup": spec_stats["tokens_per_second"] / ar_stats["tokens_per_second"], "identical": same}
        if not args.json:
            greedy = "" if same is None else f"; greedy outputs {'identical' if same else 'DIFFER'}"
            print(f"speedup {report['speedup']:.2f}x{greedy}", file=sys.stderr)
    if args.json:
        print(json.dumps({"summary": report} if len(texts) > 1 else report if args.mode == "compare"
                         else report[args.mode]))
    elif args.mode != "autoregressive" and coloured(sys.stdout):
        print(legend(), file=sys.stderr)
    return 0


def command_line():
    """The `picospec` command: main(), then out at once, without Python's shutdown after JAX (0.15-0.25 s on 2
    cores, longer than a repeated run's decode on the bundled pair; all the run keeps is written and closed by
    then). A reader that stops reading (`picospec ... | head`) ends it quietly, with a broken pipe's status."""
    try:
        code = main()
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = 141
    os._exit(code)
