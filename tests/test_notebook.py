"""examples/quickstart.ipynb: committed without outputs, and executed here as a reader would run it
(Jupyter's python3 kernel through nbclient, in a fresh folder): it audits the smoke preset, shows
the headline table of its configurations and draws figures inline."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import audit

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def _text(output) -> str:
    if output.output_type == "stream":
        return output.text
    return "\n".join(str(output.get("data", {}).get(kind, "")) for kind in ("text/html", "text/plain"))


def test_the_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
    # user-facing text: no references to this repository's internals
    text = "\n".join(cell.source for cell in notebook.cells)
    assert "../shared" not in text and "issue" not in text.lower() and "spec " not in text


def test_the_notebook_runs_the_smoke_audit_and_shows_its_table_and_figures(tmp_path, monkeypatch):
    # the kernel is a subprocess: it imports this checkout's audit, as the tests do
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # "python3" is found without a kernelspec install: jupyter_client falls back to ipykernel's own
    # kernel (running this interpreter) when no spec of that name is installed
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert (tmp_path / "quickstart-out" / "results.csv").is_file()  # written where the notebook runs
    labels = [experiment.label for experiment in audit.plan(audit.load_config(preset_name="smoke")).experiments]
    assert labels == ["fedavg", "dp-fedavg (ε=8)"]
    # the headline table: a DataFrame shown as HTML, one row per configuration of the smoke preset
    tables = [_text(o) for o in outputs if "text/html" in o.get("data", {}) and "<table" in o.data["text/html"]]
    headline = [table for table in tables if "strongest attack" in table]
    assert len(headline) == 1 and all(f"<th>{label}</th>" in headline[0] for label in labels)
    # the verdicts printed per configuration, and figures drawn inline
    printed = "\n".join(_text(o) for o in outputs if o.output_type == "stream")
    assert all(f"{label}: " in printed for label in labels)
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2


@pytest.mark.parametrize("extra", ["dev", "notebook"])
def test_the_extras_install_what_the_notebook_test_needs(extra):
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {requirement.split(">")[0].split("=")[0].split("[")[0] for requirement in extras[extra]}
    assert {"nbclient", "nbformat", "ipykernel"} <= names
