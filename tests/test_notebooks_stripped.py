"""Notebooks are kept in git with their outputs stripped (they are executed by tests/test_notebooks.py)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_exist() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"01_tail_miss.ipynb", "02_categorical_simulation.ipynb", "03_maze_fgrpo_vs_grpo.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_stripped_and_imports_lit_fgrpo(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in code)
    assert any("lit_fgrpo" in cell.source for cell in code)
