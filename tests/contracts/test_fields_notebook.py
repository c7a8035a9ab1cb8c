"""notebooks/01_wave_fields.ipynb runs top to bottom."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # CI also executes every notebook in the strict docs build (allow_errors: false)
def test_wave_fields_notebook_runs(run_notebook):
    run_notebook("01_wave_fields.ipynb", timeout=600)
