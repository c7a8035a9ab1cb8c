"""Repository-wide pytest setup, loaded whatever path pytest is given (one file, one folder or the testpaths).

The tests tests/measured_slow.txt lists (moved to the slow step by their measured time) get the ``slow`` mark here,
not in tests/conftest.py: a run of one study test file (``make test-slow`` runs each file in its own process) never
loads tests/conftest.py, and would deselect the file's slow tests and collect nothing.
"""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent


def _measured_slow() -> set[str]:
    """The node ids tests/measured_slow.txt lists (the tests moved to the slow step by their measured time)."""
    path = REPO / "tests" / "measured_slow.txt"
    out = set()
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            out.add(line.split(maxsplit=1)[1].strip())
    return out


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    slow = _measured_slow()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
