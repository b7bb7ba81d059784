"""The notebooks run from top to bottom (short settings: JAXPHYLO_QUICK=1)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("JAXPHYLO_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # A kernel compiles nothing another process did: the tests' compilation cache (conftest) would only add the
    # cost of writing its entries (20 s for 03_dated_phylodynamics).
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("JAXPHYLO_CACHE_DIR", "off")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
