"""The accept/reject picture: one generation as a grid, every decision of every iteration at a glance.

One row per iteration (target call), one column per draft position d_0..d_{K-1}, then the extra token:
  accepted   green     the draft's token, kept
  rejected   red       the first draft the target turned down
  dropped    grey      drafts after a rejection, never judged
  resample   yellow    the target's token after a rejection, from norm(max(0, q - p))
  bonus      blue      the target's token after all drafts were kept
  target     white     nothing was proposed (the n-gram draft found nothing): a plain target step
  cut        hatched   accepted, or the extra token, but past --n-tokens (or after <|endoftext|>): not kept
Each judged draft has a small bar under its token: its length is what the uniform u is compared with (min(1, q/p) for
the token rule, the stop chance h for block verification), and a black tick marks u: the draft is kept when the tick
lies left of the bar's end (the token rule); the match rule draws no uniform, so it has no bar. At the right, the tokens
the iteration kept. A PNG through matplotlib (the `plot` extra), so it shows wherever a notebook or a file is viewed.
"""

import io

from picospec.tools.cli.steps import Step, extra_kind

COLOURS = {"accepted": "#7fd17a", "rejected": "#f08a8a", "dropped": "#dddddd", "resample": "#f5d76e",
           "bonus": "#86b6f0", "target": "#ffffff", "cut": "#f2f2f2"}
LABELS = {"cut": "cut by --n-tokens"}
HATCH, HATCH_COLOUR = "////", "#b0b0b0"
COMPACT = {"handlelength": 1.2, "handletextpad": 0.4, "columnspacing": 1.0, "labelspacing": 0.2, "borderaxespad": 0.2}
DPI = 100
CELL_WIDTH, ROW_HEIGHT, MARGIN_WIDTH, MARGIN_HEIGHT = 0.95, 0.32, 1.6, 1.45  # inches


def figure_size(n_iterations: int, K: int) -> tuple[float, float]:
    """The figure's (width, height) in inches for a generation of n_iterations with K drafts each."""
    return (K + 1) * CELL_WIDTH + MARGIN_WIDTH, n_iterations * ROW_HEIGHT + MARGIN_HEIGHT


def verdicts(step: Step) -> list[str]:
    """One verdict per drafted token: accepted, then rejected at the first miss, then dropped."""
    a, k = step.accepted, len(step.drafted)
    return ["accepted"] * a + (["rejected"] + ["dropped"] * (k - a - 1) if a < k else [])


def is_cut(step: Step) -> bool:
    """Whether the step's tokens were cut short (at n_tokens, or after <|endoftext|>): then the extra
    token, and the accepted drafts from the first not kept on, are not in the generation."""
    return len(step.tokens) <= step.accepted


def draw(steps: list[Step], tokenizer, K: int, title: str = "Every iteration's accept and reject"):
    """The grid for `steps` (one row's Steps, from trace_steps or the stream), as a matplotlib Figure."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    width, height = figure_size(len(steps), K)
    figure = Figure(figsize=(width, height), dpi=DPI)
    ax = figure.add_axes((0.55 / width, 0.4 / height, 1 - MARGIN_WIDTH / width, 1 - MARGIN_HEIGHT / height))
    for row, step in enumerate(steps):
        kept = len(step.tokens)  # accepted drafts from position `kept` on were cut
        cells = [(i, d, "cut" if v == "accepted" and i >= kept else v)
                 for i, d, v in zip(range(K), step.drafted, verdicts(step))]
        extra = None if is_cut(step) else step.tokens[-1]
        for column, token, verdict in cells + [(K, extra, "cut" if is_cut(step) else extra_kind(step))]:
            ax.add_patch(Rectangle((column, row), 1, 1, facecolor=COLOURS[verdict], edgecolor="white", lw=1.5))
            if verdict == "cut":  # the hatch over the cell, in its own colour (the cell's edge is white)
                ax.add_patch(Rectangle((column, row), 1, 1, fill=False, hatch=HATCH, edgecolor=HATCH_COLOUR, lw=0))
            if token is not None:
                label = repr(tokenizer.decode([token]))[1:-1].replace("$", r"\$")  # as short, printable text
                label = label if len(label) <= 9 else label[:8] + "…"
                ax.text(column + 0.5, row + 0.42, label, ha="center", va="center", fontsize=8, family="monospace",
                        color="#555555" if verdict in ("dropped", "cut") else "black")
        for i, verdict in enumerate(verdicts(step)):  # what u was compared with, and u
            bar = step.h[i] if step.h else (min(1.0, step.q[i] / step.p[i]) if step.p[i] > 0 else 0.0)
            if verdict != "dropped" and step.u and any(step.u):
                ax.add_patch(Rectangle((i + 0.1, row + 0.72), 0.8 * bar, 0.14, facecolor="#444444", alpha=0.45))
                ax.plot([i + 0.1 + 0.8 * step.u[i]] * 2, [row + 0.66, row + 0.92], color="black", lw=1.2)
        ax.text(K + 1.15, row + 0.5, f"+{len(step.tokens)}", va="center", fontsize=8)
    ax.set(xlim=(0, K + 1), ylim=(len(steps), 0))
    ax.set_xticks([i + 0.5 for i in range(K + 1)], [f"d_{i}" for i in range(K)] + ["extra"], fontsize=8)
    ax.xaxis.tick_top()
    against = "h" if any(s.h for s in steps) else "min(1, q/p)"
    bars = f" (bars: u against {against})" if any(any(s.u) for s in steps) else ""
    ax.set_xlabel(f"draft position, then the token the target added{bars}", fontsize=8)
    ax.xaxis.set_label_position("top")
    ax.set_yticks([i + 0.5 for i in range(len(steps))], [str(i) for i in range(len(steps))], fontsize=7)
    ax.set_ylabel("iteration (one target call each)", fontsize=8)
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)
    shown = {"target": any(not s.proposed for s in steps), "cut": any(map(is_cut, steps))}
    kinds = [k for k in COLOURS if shown.get(k, True)]
    handles = [Patch(facecolor=COLOURS[k], edgecolor="#999999", hatch=HATCH if k == "cut" else None,
                     label=LABELS.get(k, k)) for k in kinds]
    for ncol, spacing in ((len(kinds), {}), (len(kinds), COMPACT), (-(-len(kinds) // 2), COMPACT)):
        legend = figure.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False, **spacing)
        if legend.get_window_extent().width <= figure.bbox.width - 0.6 * DPI or ncol < len(kinds):
            break
        legend.remove()  # over the y label or wider than the figure: closer together, then in two rows
    figure.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    return figure


def png(figure) -> bytes:
    """The figure as PNG bytes (in a notebook: IPython.display.Image(png(figure)))."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
