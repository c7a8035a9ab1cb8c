"""The CDT notebook runs top to bottom (small sizes)."""


def test_notebook_04_cdt_runs(run_notebook):
    run_notebook("04_cdt.ipynb", timeout=600)
