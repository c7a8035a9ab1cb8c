"""The worked notebooks 05-08 run top to bottom (small sizes; each ends with cells that assert its key results)."""

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("name", ["05_adaptive_nodes", "06_byte_lm", "07_mixed_precision", "08_distributed"])
def test_notebook_runs(run_notebook, name):
    run_notebook(f"{name}.ipynb", timeout=300)
