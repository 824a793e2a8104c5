"""`python -m picospec` with several prompts: `--prompt` given more than once, or `--prompt-file`.

All the prompts run as one batch; each row is printed the moment it finishes, with its own summary,
then one summary for the batch. Row b samples with jax.random.split(jax.random.key(seed), B)[b].
"""

import json
import sys

import jax

from picospec.errors import PicospecError
from picospec.sampling import Sampling
from picospec.tools.batch_stream import Row, stream_batch
from picospec.tools.stream import Timing
from picospec.tools.weights import eos_token_id


def read_prompts(args) -> list[str]:
    """The --prompt flags, then the --prompt-file's lines (`-` reads stdin); blank lines are skipped."""
    texts = list(args.prompt or [])
    if args.prompt_file:
        name = "standard input" if args.prompt_file == "-" else args.prompt_file
        try:
            raw = sys.stdin.read() if args.prompt_file == "-" else open(args.prompt_file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise PicospecError(f"cannot read the prompt file {name}: {getattr(e, 'strerror', None) or e}; "
                                f"give a UTF-8 text file with one prompt a line") from None
        lines = [line for line in raw.splitlines() if line.strip()]
        if not lines:
            raise PicospecError(f"the prompt file {name} has no prompts: write one prompt a line")
        texts += lines
    return texts or [""]


def run_batch(args, draft, target, tokenizer, texts: list[str]) -> dict:
    """Run every mode asked for on the batch; print rows as they finish; return the JSON report."""
    prompts = [tokenizer.encode(t).ids or [eos_token_id(target, tokenizer)] for t in texts]
    keys = jax.random.split(jax.random.key(args.seed), len(prompts))
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    eos = eos_token_id(target, tokenizer) if args.stop_at_eos else -1
    modes = ["autoregressive", "speculative"] if args.mode == "compare" else [args.mode]
    report = {}
    for mode in modes:
        timing, rows = Timing(), {}
        for row in stream_batch(draft if mode == "speculative" else None, target, prompts, args.n_tokens, keys,
                                K=args.K, sampling=sampling, eos_id=eos, timing=timing):
            rows[row.index] = row
            record = {"mode": mode, "row": row.index, "prompt": texts[row.index], "text": tokenizer.decode(row.tokens),
                      "tokens": row.tokens, "stats": row_stats(row, mode)}
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                print(f"--- {mode}, prompt {row.index + 1} of {len(texts)} ---\n{texts[row.index]}{record['text']}",
                      flush=True)
                print(f"[{mode}] prompt {row.index + 1}: {summary(record['stats'])}", file=sys.stderr)
        report[mode] = batch_stats([rows[b] for b in range(len(texts))], mode, timing)
        if not args.json:
            print(f"[{mode}] batch of {len(texts)}: {summary(report[mode])}; "
                  f"compile {timing.compile_seconds:.1f} s", file=sys.stderr)
    if args.mode == "compare":
        ar, spec = report["autoregressive"], report["speculative"]
        report["speedup"] = spec["tokens_per_second"] / ar["tokens_per_second"]
        report["identical"] = ar["tokens"] == spec["tokens"] if args.temperature == 0 else None
        if not args.json:
            same = "" if report["identical"] is None else \
                f"; greedy outputs {'identical' if report['identical'] else 'DIFFER'} in every row"
            print(f"speedup {report['speedup']:.2f}x{same}", file=sys.stderr)
    for stats in (report.get("autoregressive"), report.get("speculative")):
        if stats:
            stats.pop("tokens")
    if args.json:
        print(json.dumps({"summary": report}))
    return report


def row_stats(row: Row, mode: str) -> dict:
    return {"n_tokens": len(row.tokens), "n_steps": row.n_steps, "tokens_per_step": len(row.tokens) / row.n_steps,
            "acceptance_rate": row.accepted / row.drafted if row.drafted else None, "seconds": row.seconds,
            "tokens_per_second": len(row.tokens) / row.seconds}


def batch_stats(rows: list[Row], mode: str, timing: Timing) -> dict:
    """The batch as a whole: every row's tokens over the wall time until the last row finished."""
    n_tokens, drafted = sum(len(r.tokens) for r in rows), sum(r.drafted for r in rows)
    return {"n_prompts": len(rows), "n_tokens": n_tokens, "n_steps": sum(r.n_steps for r in rows),
            "tokens_per_step": n_tokens / sum(r.n_steps for r in rows),
            "acceptance_rate": sum(r.accepted for r in rows) / drafted if drafted else None,
            "seconds": timing.seconds, "tokens_per_second": n_tokens / timing.seconds,
            "compile_seconds": timing.compile_seconds, "tokens": [r.tokens for r in rows]}


def summary(stats: dict) -> str:
    rate = f", acceptance {stats['acceptance_rate']:.2f}" if stats["acceptance_rate"] is not None else ""
    return (f"{stats['n_tokens']} tokens, {stats['n_steps']} calls ({stats['tokens_per_step']:.2f} tokens/call"
            f"{rate}), {stats['seconds']:.2f} s, {stats['tokens_per_second']:.1f} tokens/s")
