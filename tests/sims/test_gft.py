"""`ivhl sim gft`: the GFT condensate's outputs, its gradient flow, bad values refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ivhl_jax.sims import gft

SMALL = [
    "--no-progress",
    "--set",
    "rank=2",
    "--set",
    "grid=16",
    "--set",
    "steps=200",
    "--set",
    "steps_per_chunk=100",
    "--set",
    "save_every=50",
    "--set",
    "checkpoint_every=100",
]


def test_gradient_flow_lowers_the_potential_and_writes_its_outputs(tmp_path):
    out = tmp_path / "gft"
    assert gft.main([*SMALL, "--set", "imaginary=true", "--set", "dt=0.05", "--out", str(out)]) == 0
    doc = json.loads((out / "observables.json").read_text())
    energies = doc["observables"]["energy"]
    assert energies[-1] < energies[0]  # gradient flow lowers V (symmetry breaking from noise)
    np.testing.assert_allclose(doc["t"], [2.5, 5.0, 7.5, 10.0])  # records after 50, 100, ... steps of dt = 0.05
    assert doc["vacuum"]["abs2"] == pytest.approx(0.5 / 0.1)  # -m²/λ of the defaults
    for name in ("density.png", "phase.png", "observables.png", "final_state.npy"):
        assert (out / name).stat().st_size > 0
    assert np.load(out / "final_state.npy").shape == (16, 16)


def test_real_time_run_resumes_bit_exactly(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert gft.main([*SMALL, "--out", str(full)]) == 0
    assert gft.main([*SMALL, "--set", "steps=100", "--out", str(part)]) == 0
    assert gft.main([*SMALL, "--out", str(part)]) == 0  # extends from the step-100 checkpoint
    assert np.array_equal(np.load(full / "final_state.npy"), np.load(part / "final_state.npy"))
    obs_full = json.loads((full / "observables.json").read_text())
    obs_part = json.loads((part / "observables.json").read_text())
    assert obs_part["resumed_from"] == 100 and obs_full["observables"] == obs_part["observables"]
    charge = np.asarray(obs_full["observables"]["charge"])
    assert np.max(np.abs(charge / charge[0] - 1)) < 1e-4  # real time conserves Q = Σ|φ|² (float32)


def test_rank_3_plots_name_their_slice():
    cfg = gft.GFTConfig(rank=3, grid=8)
    assert gft._slice_label(cfg, 3) == ", slice axis 3 = 4 (of 8 sites)"
    assert gft._slice_label(cfg, 2) == ""


# One bad value per key: each is refused by validate() before any work, in one line, exit 2.
BAD_VALUES = {
    "grid=1": "grid must be >= 2",
    "rank=5": "rank must be 1..4",
    "rank=0": "rank must be 1..4",
    "lam=0": "lam must be a finite number > 0",
    "mass_sq=nan": "mass_sq must be a finite number",
    "noise=nan": "noise must be a finite",
    "noise=-1": "noise must be a finite number >= 0",
    "dt=-1": "dt must be a finite number",
    "dt=0.5": "use dt <= 0.262",
    "steps=0": "steps must be >= 1",
    "save_every=7": "multiple of save_every",
    "checkpoint_every=-3": "checkpoint_every must be >= 1",
    "mesh=3": "does not divide",
    "precision=float16": "precision",
    "model=gp": "unknown config key",
}


@pytest.mark.parametrize("setting, message", BAD_VALUES.items(), ids=list(BAD_VALUES))
def test_every_bad_value_is_one_line_and_exit_2(refused, setting, message):
    refused(gft.main, [setting], message)
