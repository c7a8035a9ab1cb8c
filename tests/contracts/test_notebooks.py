"""Every worked notebook in notebooks/ runs top to bottom in a fresh kernel (small sizes; each ends with cells
that assert its key results). One parametrised test over the folder, so a new notebook is covered when it is
added. CI also executes them in the strict docs build (allow_errors: false); this copy runs in the slow suite."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_in_the_docs_navigation():
    """A notebook left out of mkdocs.yml's nav would be executed here but never shown to a reader."""
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r"notebooks/([\w.-]+\.ipynb)", nav))
    assert NOTEBOOKS and set(NOTEBOOKS) == listed, sorted(set(NOTEBOOKS) ^ listed)


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(run_notebook, name):
    run_notebook(name, timeout=600)
