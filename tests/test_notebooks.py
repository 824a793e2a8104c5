"""Every notebook runs from a clean kernel, offline, on the bundled pair, without an error."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("PICOSPEC_NOTEBOOK_QUICK", "1")  # notebook 3 draws fewer samples; the code is the same
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # run from scratch: the committed outputs play no part
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(o.output_type in ("stream", "display_data", "execute_result")
               for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_carry_no_warning_and_no_error(path):
    outputs = [o for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" for o in c.outputs]
    assert outputs, "notebooks are committed with their outputs"
    assert not [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "Warning" not in text and "Traceback" not in text
