"""Every notebook is a jupytext pair (notebooks/N_name.py, the source, and N_name.ipynb, with outputs)
holding the same cells; it runs from a clean kernel, offline, on the bundled pair, without an error;
and its committed outputs carry no warning, no error, and no bulk."""

import inspect
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.py"))
MAX_BYTES = 250_000  # per committed .ipynb: figures at 100 dpi or more, no stray large output


def cells(notebook):
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def outputs(notebook):
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]


def problems(notebook):
    """The outputs that hold an error, a stream to stderr, or the words Warning or Traceback."""
    def text(o):
        return o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
    return [o for o in outputs(notebook) if o.output_type == "error" or o.get("name") == "stderr"
            or "Warning" in text(o) or "Traceback" in text(o)]


def check_figure(figure):
    """Every plot a reader sees says what it shows: a title (its own or the figure's), and labels on both
    axes (a twin axis may share its partner's x label)."""
    plots = [ax for ax in figure.axes if ax.get_visible() and ax.has_data()]
    for ax in plots:
        twins = ax.get_shared_x_axes().get_siblings(ax)
        assert any(a.get_xlabel() for a in twins), f"a plot without an x label: {ax.get_title()!r}"
        assert ax.get_ylabel(), f"a plot without a y label: {ax.get_title()!r}"
        assert ax.get_title() or figure._suptitle or any(a.get_title() for a in twins), "a plot without a title"


CHECK_FIGURES = inspect.getsource(check_figure) + """
import matplotlib.pyplot as plt
_show = plt.show
def _checked_show(*args, **kwargs):
    for number in plt.get_fignums():
        check_figure(plt.figure(number))
    return _show(*args, **kwargs)
plt.show = _checked_show
"""


def execute(path):
    """The notebook built from the .py, executed from a clean kernel (the committed outputs play no part),
    every figure it shows checked by check_figure."""
    notebook = jupytext.read(path)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(CHECK_FIGURES))
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_ipynb_holds_the_same_cells_as_the_py(path):
    source, paired = jupytext.read(path), path.with_suffix(".ipynb")
    assert source.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert source.metadata["kernelspec"]["name"] == "python3"
    assert paired.exists(), f"{paired.name} is missing: jupytext --sync {path.name}"
    assert cells(jupytext.read(paired)) == cells(source), f"out of step: jupytext --sync {path.name}"


# The fast suite executes notebook 1 (quick mode); `pytest -m slow` executes every notebook.
QUICKLY_RUN = [p if p.stem.startswith("1") else pytest.param(p, marks=pytest.mark.slow) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", QUICKLY_RUN, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("PICOSPEC_NOTEBOOK_QUICK", "1")  # fewer points and samples; the code is the same
    notebook = execute(path)
    assert not problems(notebook)
    assert any(o.output_type in ("stream", "display_data", "execute_result") for o in outputs(notebook))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_in_full(path, monkeypatch, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full-length run (minutes): select it with -m slow")
    monkeypatch.delenv("PICOSPEC_NOTEBOOK_QUICK", raising=False)
    assert not problems(execute(path))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_carry_no_warning_and_no_error(path):
    committed = jupytext.read(path.with_suffix(".ipynb"))
    assert outputs(committed), "notebooks are committed with their outputs"
    assert not problems(committed)


def test_the_figure_check_catches_a_plot_without_labels():
    from matplotlib.figure import Figure
    figure = Figure()
    ax = figure.add_subplot()
    ax.plot([0, 1], [1, 0])
    with pytest.raises(AssertionError, match="x label"):
        check_figure(figure)
    ax.set(xlabel="x", ylabel="y")
    with pytest.raises(AssertionError, match="title"):
        check_figure(figure)
    ax.set_title("a line")
    check_figure(figure)  # labelled and titled: passes


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_cells_carry_no_execution_timestamps(path):
    committed = nbformat.read(path.with_suffix(".ipynb"), as_version=4)
    assert not [cell for cell in committed.cells if "execution" in cell.get("metadata", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_small(path):
    size = path.with_suffix(".ipynb").stat().st_size
    assert size < MAX_BYTES, f"{path.with_suffix('.ipynb').name} is {size} bytes: smaller figures or fewer outputs"
