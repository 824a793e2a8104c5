"""Showing speculative sampling in a notebook: every accept/reject decision as an HTML table."""

import html

from picospec.tools.stream import Step, extra_kind  # noqa: F401  (extra_kind: for the notebooks too)

VERDICT_COLOURS = {"accepted": "#c8f7c5", "rejected": "#f7c5c5", "resample": "#fbe7a1",
                   "bonus": "#b9d7f7", "dropped": "#eeeeee", "target": "#dddddd"}


def verdicts(step: Step) -> list[str]:
    """One verdict per drafted token: accepted, then rejected at the first miss, then dropped."""
    a = step.accepted
    return ["accepted"] * a + (["rejected"] + ["dropped"] * (len(step.drafted) - a - 1) if a < len(step.drafted) else [])


def step_table(step: Step, tokenizer, index: int) -> str:
    """HTML: each drafted token with p, q, q/p, the uniform u and its verdict, then the extra token."""
    def cell(text, verdict):
        return f'<td style="background:{VERDICT_COLOURS[verdict]};font-family:monospace">{text}</td>'

    def show(token):
        return html.escape(repr(tokenizer.decode([token]))[1:-1])

    rows = {"i": [], "token": [], "p (draft)": [], "q (target)": [], "q/p": [], "u": [], "verdict": []}
    for i, (d, p, q, u, verdict) in enumerate(zip(step.drafted, step.p, step.q, step.u, verdicts(step))):
        rows["i"].append(cell(f"d_{i}", verdict))  # 0-based, as in speculative.py
        rows["token"].append(cell(show(d), verdict))
        for name, value in [("p (draft)", p), ("q (target)", q), ("q/p", q / p), ("u", u)]:
            rows[name].append(cell(f"{value:.3g}" if verdict != "dropped" else "", verdict))  # 3 significant figures
        rows["verdict"].append(cell(verdict, verdict))
    extra = extra_kind(step)
    rows["i"].append(cell("extra", extra))
    rows["token"].append(cell(show(step.tokens[-1]) if len(step.tokens) > step.accepted else "(cut)", extra))
    for name in ["p (draft)", "q (target)", "q/p", "u"]:
        rows[name].append(cell("", extra))
    rows["verdict"].append(cell(extra, extra))
    body = "".join(f"<tr><th>{name}</th>{''.join(cells)}</tr>" for name, cells in rows.items())
    return f"<p><b>iteration {index}</b>: {step.accepted} of {len(step.drafted)} accepted</p><table>{body}</table>"


def coloured_text(steps: list[Step], tokenizer, prompt_text: str = "") -> str:
    """HTML of the whole generation, each token coloured by how it came to be."""
    pieces, tokens, text = [html.escape(prompt_text)], [], ""
    for step in steps:
        for i, token in enumerate(step.tokens):
            tokens.append(token)
            new = tokenizer.decode(tokens)
            kind = "accepted" if i < step.accepted else extra_kind(step)
            pieces.append(f'<span style="background:{VERDICT_COLOURS[kind]}">{html.escape(new[len(text):])}</span>')
            text = new
    return f'<div style="font-family:monospace;white-space:pre-wrap">{"".join(pieces)}</div>'
