"""The --plot grid draws what was kept: drafts (and the extra token) past --n-tokens are drawn as cut,
not as accepted. Steps are made by hand, so no model is loaded or compiled."""

import matplotlib

matplotlib.use("Agg")
from matplotlib.colors import to_hex  # noqa: E402

from picospec.tools.cli.picture import COLOURS, draw  # noqa: E402
from picospec.tools.cli.steps import Step  # noqa: E402


class Tokenizer:  # the one method draw uses
    def decode(self, ids):
        return "".join(f"t{i}" for i in ids)


def step(tokens, drafted, accepted, bonus=False):
    k = len(drafted)
    return Step(tokens, drafted, accepted, bonus, [0.5] * k, [0.4] * k, [0.3] * k, k=k)


def cells(figure, row):
    """For each column of the row: the facecolours of its filled cells, and whether one is hatched."""
    ax = figure.axes[0]
    found = {}
    for patch in ax.patches:
        x, y = patch.get_xy()
        if (patch.get_width(), patch.get_height(), y) == (1, 1, row):
            colours, hatched = found.setdefault(int(x), ([], [False]))
            if patch.get_fill():
                colours.append(to_hex(patch.get_facecolor()))
            hatched[0] |= bool(patch.get_hatch())
    return {x: (colours, hatched[0]) for x, (colours, hatched) in found.items()}


def texts(figure):
    return [t.get_text() for t in figure.axes[0].texts]


def test_drafts_and_bonus_past_n_tokens_are_drawn_cut_not_accepted():
    # row 2 accepted all 4 drafts and a bonus, but --n-tokens kept only its first 2 tokens
    steps = [step([1, 2, 9], [1, 2, 3, 4], 2), step([5, 6, 7, 8, 10], [5, 6, 7, 8], 4, True),
             step([11, 12], [11, 12, 13, 14], 4, True)]
    figure = draw(steps, Tokenizer(), 4)
    accepted, bonus = COLOURS["accepted"], COLOURS["bonus"]
    last = cells(figure, 2)
    assert set(last) == {0, 1, 2, 3, 4}
    for column in (0, 1):  # kept: accepted, as before
        assert last[column] == ([accepted], False)
    for column in (2, 3, 4):  # d_2, d_3 and the bonus: cut, hatched, neither green nor blue
        colours, hatched = last[column]
        assert hatched and accepted not in colours and bonus not in colours, (column, last[column])
    assert "+2" in texts(figure) and "+5" in texts(figure) and "+1" not in texts(figure)
    assert "t13" in texts(figure)  # a cut draft still shows its token
    assert cells(figure, 1)[4] == ([bonus], False)  # the rows before are drawn as they were
    assert cells(figure, 0)[2] == ([COLOURS["rejected"]], False)
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert any(label.startswith("cut") for label in labels), labels
    assert any(h.get_hatch() for h in figure.legends[0].legend_handles)

    # a generation nothing cut: no hatch anywhere, and the legend as it always was
    figure = draw(steps[:2], Tokenizer(), 4)
    assert not any(p.get_hatch() for p in figure.axes[0].patches)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["accepted", "rejected", "dropped", "resample",
                                                                     "bonus"]
