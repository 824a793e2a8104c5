"""Write the notebooks from notebooks/cells/, and execute them so they are committed with outputs.

    python notebooks/build.py            # all of them
    python notebooks/build.py speed      # the ones whose name contains "speed"

The cells live in notebooks/cells/, one file per notebook, as plain text, so that changes to them
read well in a diff.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent

sys.path.insert(0, str(HERE / "cells"))
import accept_and_reject  # noqa: E402
import losslessness  # noqa: E402
import one_generation  # noqa: E402
import speed  # noqa: E402

NOTEBOOKS = {
    "1_one_generation_step_by_step": one_generation.CELLS,
    "2_accept_and_reject": accept_and_reject.CELLS,
    "3_speed": speed.CELLS,
    "4_losslessness": losslessness.CELLS,
}


def build(name, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=1200, resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(nb, HERE / f"{name}.ipynb")
    print(f"wrote notebooks/{name}.ipynb")


if __name__ == "__main__":
    for name, cells in NOTEBOOKS.items():
        if len(sys.argv) < 2 or any(arg in name for arg in sys.argv[1:]):
            build(name, cells)
