"""``examples/quickstart.ipynb`` runs top to bottom on a real Jupyter kernel.

The kernel is this interpreter (a kernel spec written to a temporary folder runs
``sys.executable -m ipykernel_launcher``), so the notebook sees the package and the test
extras this test-suite runs with. Any cell that raises fails the test; so does a figure
missing from the outputs.

Mutation check (tried by hand on a copy of the notebook): ``sel.block_ids`` misspelt in the
heat map cell -> CellExecutionError naming the cell; that cell's ``plt.show()`` replaced by
``plt.close(fig)`` -> the figure count check fails (two PNG outputs instead of three).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
KERNEL = "jax_mxfp4_tests"


def _kernel_manager(folder: Path) -> KernelManager:
    """A kernel manager whose kernel is ``sys.executable`` with ipykernel."""
    spec = folder / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "jax_mxfp4 tests", "language": "python",
    }))
    specs = KernelSpecManager(kernel_dirs=[str(folder)])
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_quickstart_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, km=_kernel_manager(tmp_path / "kernels"), timeout=300,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 3, f"expected 3 figures, got {len(figures)}"
