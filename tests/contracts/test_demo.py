"""`ivhl demo`: the README's first command must run with no arguments and produce its pictures."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ivhl_jax import cli


@pytest.mark.slow
def test_ivhl_demo_default_runs_and_writes_pictures(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default output folder runs/demo is relative to the cwd
    assert cli.main(["demo", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name in ("intensity.png", "phase.png", "mean_intensity.png", "summary.json"):
        path = tmp_path / "runs" / "demo" / name
        assert path.is_file() and path.stat().st_size > 0
        assert str(path) in out
    # Running it again starts fresh (the demo does not resume) and gives the same numbers.
    import json

    from ivhl_jax.run import open_run

    demo = tmp_path / "runs" / "demo"
    first = json.load(open(demo / "summary.json"))
    first_records = {k: np.asarray(v) for k, v in open_run(demo).observations.data_vars.items()}
    assert first_records and all(len(v) for v in first_records.values())
    assert cli.main(["demo", "--no-progress"]) == 0
    second = json.load(open(demo / "summary.json"))
    assert second["resumed_from"] is None
    assert second["final"] == first["final"]
    for name, values in open_run(demo).observations.data_vars.items():  # the per-step records, in the run store
        np.testing.assert_array_equal(np.asarray(values), first_records[name])


def test_ivhl_demo_small_override(tmp_path, capsys):
    out = str(tmp_path / "d")
    # Same sizes as tests/sims/test_holography.py's SMALL, so one process compiles the chunk only once.
    small = ["n_sources=12", "grid=[24, 20]", "steps=4", "steps_per_chunk=2", "checkpoint_every=4"]
    assert cli.main(["demo", "--out", out, "--no-progress", *[f"--set={s}" for s in small]]) == 0
    printed = capsys.readouterr().out
    assert os.path.join(os.path.abspath(out), "intensity.png") in printed
