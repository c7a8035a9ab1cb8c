"""The worked notebooks 05-08 run top to bottom (small sizes; each ends with cells that assert its key results)."""

import pytest


@pytest.mark.slow
def test_notebook_05_adaptive_nodes_runs(run_notebook):
    run_notebook("05_adaptive_nodes.ipynb", timeout=300)


@pytest.mark.slow
def test_notebook_06_byte_lm_runs(run_notebook):
    run_notebook("06_byte_lm.ipynb", timeout=300)


@pytest.mark.slow
def test_notebook_07_mixed_precision_runs(run_notebook):
    run_notebook("07_mixed_precision.ipynb", timeout=300)


@pytest.mark.slow
def test_notebook_08_distributed_runs(run_notebook):
    run_notebook("08_distributed.ipynb", timeout=300)
