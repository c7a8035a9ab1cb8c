"""`ivhl sim mera`: outputs, JSON contents, checkpoint resume (tiny χ = 4 ladder)."""

from __future__ import annotations

import json
import os

import numpy as np

from ivhl_jax.sims import mera as sim

# Same sweep settings as tests/test_mera.py::_SMALL with one sweep per chunk, so the compiled sweep is shared.
ARGS = ["--set", "chis=[4]", "--set", "chi_mids=[]", "--set", "sweeps=[6]", "--set", "layers=[1]", "--set", "u_delay=3",
        "--set", "sweeps_per_chunk=1", "--set", "checkpoint_every=2", "--no-progress"]


def test_sim_outputs_and_resume(tmp_path, capsys):
    out = str(tmp_path / "mera")
    assert sim.main(ARGS + ["--out", out]) == 0
    with open(os.path.join(out, "mera.json")) as f:
        doc = json.load(f)
    err = np.array(doc["energy_error_per_sweep"])
    assert err.shape == (6,) and np.all(err > 0)
    assert doc["stages"][0]["chi"] == 4 and doc["stages"][0]["resumed_from"] is None
    assert doc["stages"][0]["precision"] == "float64" and doc["restarts"] == []  # 6 sweeps: no stuck check
    assert doc["stages"][0]["isometry_error"]["w"] < 1e-12
    assert len(doc["scaling_dimensions"]) == len(doc["scaling_dimensions_exact"])
    assert abs(doc["scaling_dimensions"][0]) < 1e-8
    for name in ("convergence.png", "scaling_dims.png", "config.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    # a second run with the same configuration resumes from the finished checkpoint and reproduces it
    assert sim.main(ARGS + ["--out", out]) == 0
    with open(os.path.join(out, "mera.json")) as f:
        again = json.load(f)
    assert again["stages"][0]["resumed_from"] == 6
    np.testing.assert_array_equal(again["energy_error_per_sweep"], err)
    # a different configuration in the same folder is refused unless --no-resume
    assert sim.main(ARGS[:-1] + ["--set", "seed=3", "--no-progress", "--out", out]) == 2
    assert "different configuration" in capsys.readouterr().err


def test_sim_bad_config(capsys):
    assert sim.main(["--set", "chis=4,6", "--set", "sweeps=[10]", "--set", "layers=[1]"]) == 2
    assert "same" in capsys.readouterr().err
    # the last stage must finish in float64; per-stage lists need one entry per stage
    assert sim.main(ARGS + ["--set", "precision=[\"f32\"]"]) == 2
    assert "f64" in capsys.readouterr().err
    assert sim.main(ARGS + ["--set", "chi_mids=[4, 4]"]) == 2  # one stage
    assert "one entry per stage" in capsys.readouterr().err
    assert sim.main(ARGS + ["--set", "chis=[4, 4]", "--set", "sweeps=[6, 6]", "--set", "layers=[1, 1]",
                            "--set", "precision=[\"bf16\", \"f64\"]"]) == 2
    assert "precision[0]" in capsys.readouterr().err
