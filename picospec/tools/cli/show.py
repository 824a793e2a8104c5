"""Showing a generation: what the CLI prints (the streamed text coloured by how each token came to be,
each row's record and summary line, and the batch's), and the same for a notebook, as HTML."""

import html
import os

from picospec.tools.cli.picture import verdicts
from picospec.tools.cli.steps import Step, extra_kind

COLOURS = {"accepted": "32", "rejected": "9;31", "resample": "33", "bonus": "34;1", "target": "0"}  # ANSI SGR


def coloured(out) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR")


def show(out, tokenizer, tokens: list[int], step: Step, mode: str, text: str) -> str:
    """Print `step`'s tokens after `tokens` (decoded: `text`), coloured by how each came; return the text so far."""
    colour = coloured(out)
    paint = (lambda s, kind: f"\033[{COLOURS[kind]}m{s}\033[0m") if colour else (lambda s, kind: s)
    pieces, seen = [], tokens[:]
    for i, token in enumerate(step.tokens):
        kind = "accepted" if i < step.accepted else extra_kind(step)
        if kind == "resample" and colour and mode == "speculative":  # the draft's rejected guess, struck out
            pieces.append(paint(tokenizer.decode(seen + [step.drafted[i]])[len(text):], "rejected"))
        seen.append(token)
        new_text = tokenizer.decode(seen)
        pieces.append(paint(new_text[len(text):], kind) if mode == "speculative" else new_text[len(text):])
        text = new_text
    out.write("".join(pieces))
    out.flush()
    return text


def legend() -> str:
    return "colours: " + " ".join(f"\033[{COLOURS[k]}m{k}\033[0m" for k in COLOURS if k != "target")


def row_record(mode: str, steps: list[Step], tokenizer, prompt_tokens, compile_seconds: float) -> dict:
    """One row's result: its text and tokens, every step's decisions, and its figures."""
    tokens = [t for s in steps for t in s.tokens]
    step_records = [{k: v for k, v in vars(s).items() if k not in ("finished", "seconds")} if mode == "speculative"
                    else {"tokens": s.tokens} for s in steps]
    return {"text": tokenizer.decode(tokens), "tokens": tokens, "prompt_tokens": list(prompt_tokens),
            "steps": step_records, "stats": figures(step_records, steps[-1].seconds, compile_seconds)}


def batch_stats(rows: list[dict], seconds: float, compile_seconds: float) -> dict:
    """The batch as a whole: every row's tokens over the wall time until the last row finished."""
    return {"n_prompts": len(rows)} | figures([s for r in rows for s in r["steps"]], seconds, compile_seconds)


def figures(steps: list[dict], seconds: float, compile_seconds: float) -> dict:
    """Step records' tokens, calls, tokens per call and acceptance (None: nothing drafted), and speed; speculative
    ones also K_used, the drafts the target checked per call that drafted (K unless a policy stopped early)."""
    n_tokens, drafted = sum(len(s["tokens"]) for s in steps), sum(s.get("k", 0) for s in steps)
    calls = sum(s.get("proposed", False) for s in steps)
    return {"n_tokens": n_tokens, "n_steps": len(steps), "tokens_per_step": n_tokens / len(steps),
            "acceptance_rate": sum(s.get("accepted", 0) for s in steps) / drafted if drafted else None,
            "seconds": seconds, "tokens_per_second": n_tokens / seconds, "compile_seconds": compile_seconds} | (
        {"K_used": drafted / calls if calls else 0.0} if "proposed" in steps[0] else {})


def summary(mode: str, stats: dict, what: str = "") -> str:
    """One line of figures: tokens, calls, tokens per call, acceptance, time, speed."""
    rate = f", acceptance {stats['acceptance_rate']:.2f}" if stats["acceptance_rate"] is not None else ""
    calls = "target calls" if mode == "speculative" else "forward calls"
    return (f"[{mode}]{what} {stats['n_tokens']} tokens, {stats['n_steps']} {calls} "
            f"({stats['tokens_per_step']:.2f} tokens/call{rate}), {stats['seconds']:.2f} s, "
            f"{stats['tokens_per_second']:.1f} tokens/s; compile {stats['compile_seconds']:.1f} s"
            + (f"; {stats['device']['kind']} ({stats['device']['platform']})" if "device" in stats else ""))


# ---- in a notebook ----

HTML_COLOURS = {"accepted": "#c8f7c5", "rejected": "#f7c5c5", "resample": "#fbe7a1", "bonus": "#b9d7f7",
                "target": "#eeeeee"}


def decisions(step: Step, tokenizer) -> str:
    """One iteration's decisions as text: each draft with p, q, q/p, u and its verdict, then the target's token."""
    lines = [f"{'':6}{'token':>12}{'p (draft)':>11}{'q (target)':>11}{'q/p':>8}{'u':>8}  verdict"]
    for i, (d, p, q, verdict) in enumerate(zip(step.drafted, step.p, step.q, verdicts(step))):
        numbers = f"{p:11.3g}{q:11.3g}{q / p:8.3g}{step.u[i] if step.u else 0:8.3g}" if verdict != "dropped" else ""
        lines.append(f"{'d_' + str(i):6}{tokenizer.decode([d])!r:>12}{numbers:38}  {verdict}")
    extra = repr(tokenizer.decode(step.tokens[-1:])) if len(step.tokens) > step.accepted else "(cut)"
    lines.append(f"{'extra':6}{extra:>12}{'':38}  {extra_kind(step)}")
    return "\n".join(lines)


def coloured_text(steps: list[Step], tokenizer, prompt_text: str = "") -> str:
    """HTML of the whole generation, each token coloured by how it came to be, and each rejected draft
    struck through before the token that replaced it (as the CLI shows them)."""
    pieces, tokens, text = [html.escape(prompt_text)], [], ""
    for step in steps:
        for i, token in enumerate(step.tokens):
            kind = "accepted" if i < step.accepted else extra_kind(step)
            if kind == "resample":
                guess = tokenizer.decode(tokens + [step.drafted[i]])[len(text):]
                pieces.append(f'<s style="background:{HTML_COLOURS["rejected"]}">{html.escape(guess)}</s>')
            tokens.append(token)
            new = tokenizer.decode(tokens)
            pieces.append(f'<span style="background:{HTML_COLOURS[kind]}">{html.escape(new[len(text):])}</span>')
            text = new
    return f'<div style="font-family:monospace;white-space:pre-wrap">{"".join(pieces)}</div>'
