"""The CDT notebook runs top to bottom (small sizes)."""

import pytest


# CI executes every notebook in the strict docs build (allow_errors: false); this copy runs in the slow suite.
@pytest.mark.slow
def test_notebook_04_cdt_runs(run_notebook):
    run_notebook("04_cdt.ipynb", timeout=600)
