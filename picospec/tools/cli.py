"""`python -m picospec`: speculative sampling on GPT-2 (124M drafting for 1558M), streamed and coloured."""

import argparse
import json
import os
import sys

import jax

from picospec.errors import PicospecError
from picospec.ngram import NGramDraft
from picospec.sampling import Sampling
from picospec.speculative import check_pair
from picospec.tools.batch_cli import read_prompts, run_batch
from picospec.tools.display import extra_kind
from picospec.tools.jit_cache import use_persistent_cache
from picospec.tools.stream import Timing, stream_autoregressive, stream_speculative
from picospec.tools.weights import DTYPES, check_tokenizer, checkpoint_file, eos_token_id, load_model, load_tokenizer

COLOURS = {"accepted": "32", "rejected": "9;31", "resample": "33", "bonus": "34;1", "target": "0"}  # ANSI SGR


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m picospec", description=__doc__)
    parser.add_argument("--prompt", action="append", help="the text to continue; empty starts from <|endoftext|>; "
                        "give it several times to run the prompts as one batch")
    parser.add_argument("--prompt-file", help="one prompt a line (- reads standard input), run as one batch")
    parser.add_argument("--draft", default="gpt2",
                        help="draft model: name, hub repo or folder (default gpt2, 124M); or ngram for n-gram lookup")
    parser.add_argument("--ngram-max", type=int, default=3, help="with --draft ngram: longest n-gram tried (default 3)")
    parser.add_argument("--target", default="gpt2-xl", help="target model (default gpt2-xl, 1558M)")
    parser.add_argument("--n-tokens", type=int, default=40, help="tokens to generate (default 40)")
    parser.add_argument("--K", type=int, default=4, help="tokens drafted per target call (default 4)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1: all)")
    parser.add_argument("--seed", type=int, default=0, help="jax.random seed (default 0)")
    parser.add_argument("--mode", choices=["speculative", "autoregressive", "compare"], default="speculative",
                        help="compare runs both and reports the speedup (default speculative)")
    parser.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)")
    parser.add_argument("--stop-at-eos", action="store_true", help="stop early at <|endoftext|>")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text "
                        "(a batch: one line per row as it finishes, then one with the summary)")
    parser.error = lambda message: _fail(message)  # one line, exit code 2: no usage dump
    return parser.parse_args(argv)


def _fail(message):
    raise PicospecError(message)


def run(args, mode, draft, target, tokenizer, prompt, out):
    """One sampler's run: stream it to `out` (if given) and return its JSON record."""
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    eos = eos_token_id(target, tokenizer) if args.stop_at_eos else -1
    key = jax.random.key(args.seed)
    timing = Timing()
    if mode == "speculative":
        steps = stream_speculative(draft, target, prompt, args.n_tokens, key, K=args.K, sampling=sampling,
                                   eos_id=eos, timing=timing)
    else:
        steps = stream_autoregressive(target, prompt, args.n_tokens, key, sampling=sampling, eos_id=eos,
                                      timing=timing)
    tokens, records, text = [], [], ""
    for step in steps:
        if out:
            text = _show(out, tokenizer, tokens, step, mode, text)
        tokens += step.tokens
        records.append(vars(step) if mode == "speculative" else {"tokens": step.tokens})
    n_steps = len(records)
    drafted = args.K * sum(r["proposed"] for r in records) if mode == "speculative" else 0
    accepted = sum(r["accepted"] for r in records) if mode == "speculative" else 0
    stats = {"n_tokens": len(tokens), "n_steps": n_steps, "tokens_per_step": len(tokens) / n_steps,
             "acceptance_rate": accepted / drafted if drafted else None, "seconds": timing.seconds,
             "tokens_per_second": len(tokens) / timing.seconds, "compile_seconds": timing.compile_seconds}
    return {"text": tokenizer.decode(tokens), "tokens": tokens, "prompt_tokens": prompt, "steps": records,
            "stats": stats}


def _show(out, tokenizer, tokens, step, mode, text):
    """Print what one step added, coloured by how each token came to be; return the text so far."""
    colour = out.isatty() and not os.environ.get("NO_COLOR")
    paint = (lambda s, kind: f"\033[{COLOURS[kind]}m{s}\033[0m") if colour else (lambda s, kind: s)
    pieces, seen = [], tokens[:]
    for i, token in enumerate(step.tokens):
        kind = "accepted" if i < step.accepted else extra_kind(step)
        if kind == "resample" and colour:  # show the draft's rejected guess, struck through
            rejected = tokenizer.decode(seen + [step.drafted[i]])[len(text):]
            pieces.append(paint(rejected, "rejected"))
        seen.append(token)
        new_text = tokenizer.decode(seen)
        piece = new_text[len(text):]
        text = new_text
        pieces.append(paint(piece, kind) if mode == "speculative" else piece)
    out.write("".join(pieces))
    out.flush()
    return text


def _summary(mode, stats):
    rate = f", acceptance {stats['acceptance_rate']:.2f}" if stats["acceptance_rate"] is not None else ""
    calls = "target calls" if mode == "speculative" else "forward calls"
    return (f"[{mode}] {stats['n_tokens']} tokens, {stats['n_steps']} {calls} "
            f"({stats['tokens_per_step']:.2f} tokens/call{rate}), {stats['seconds']:.2f} s, "
            f"{stats['tokens_per_second']:.1f} tokens/s; compile {stats['compile_seconds']:.1f} s")


def main(argv=None):
    try:
        args = parse_args(argv)
        use_persistent_cache()  # a second run of the same command compiles nothing
        Sampling(args.temperature, args.top_k, args.top_p)  # validate before loading anything
        for name, value in [("K", args.K), ("n-tokens", args.n_tokens)]:
            if value < 1:
                raise PicospecError(f"{name} must be >= 1, got {value}")
        texts = read_prompts(args)
        # The cheap checks first, before any weights load (gpt2-xl's take tens of seconds): the target's
        # tokenizer reads, and the draft's name resolves.
        tokenizer = load_tokenizer(args.target)
        uses_draft = args.mode != "autoregressive"
        draft_is_model = uses_draft and args.draft != "ngram"
        if draft_is_model:
            checkpoint_file(args.draft, "config.json")
        ngram = NGramDraft(args.ngram_max) if uses_draft and args.draft == "ngram" else None
        target = load_model(args.target, args.dtype)
        check_tokenizer(tokenizer, target, checkpoint_file(args.target, "tokenizer.json"))
        draft = load_model(args.draft, args.dtype) if draft_is_model else ngram
        if draft is not None:
            check_pair(draft, target, args.K)
        if len(texts) > 1 or args.prompt_file:
            run_batch(args, draft, target, tokenizer, texts)
            return 0
        args.prompt = texts[0]
        prompt = tokenizer.encode(args.prompt).ids or [eos_token_id(target, tokenizer)]
        modes = ["autoregressive", "speculative"] if args.mode == "compare" else [args.mode]
        results = {}
        for mode in modes:
            out = None if args.json else sys.stdout
            if out and len(modes) > 1:
                out.write(f"--- {mode} ---\n")
            if out:
                out.write(args.prompt)
            results[mode] = run(args, mode, draft, target, tokenizer, prompt, out)
            if out:
                out.write("\n")
                print(_summary(mode, results[mode]["stats"]), file=sys.stderr)
    except PicospecError as e:
        print(f"picospec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if args.mode == "compare":
        ar, spec = results["autoregressive"], results["speculative"]
        speedup = spec["stats"]["tokens_per_second"] / ar["stats"]["tokens_per_second"]
        identical = ar["tokens"] == spec["tokens"] if args.temperature == 0 else None
        report = {**results, "speedup": speedup, "identical": identical}
        if not args.json:
            same = "" if identical is None else f"; greedy outputs {'identical' if identical else 'DIFFER'}"
            print(f"speedup {speedup:.2f}x{same}", file=sys.stderr)
    else:
        report = results[args.mode]
    if args.json:
        print(json.dumps(report))
    elif args.mode != "autoregressive" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        legend = " ".join(f"\033[{COLOURS[k]}m{k}\033[0m" for k in COLOURS if k != "target")
        print(f"colours: {legend}", file=sys.stderr)
    return 0
