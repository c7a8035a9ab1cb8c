"""``ivhl sim bec`` with the Lee–Huang–Yang term: ``dipolar.lhy`` / ``dipolar.gamma_qf`` and ``mixture.lhy``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ivhl_jax.sims import bec


def _run(tmp_path, name, *sets, steps=100):
    out = tmp_path / name
    base = ["steps_per_chunk=50", "save_every=25", "checkpoint_every=100", f"steps={steps}", "dt=1e-3"]
    args = ["--no-progress", "--out", str(out), *(a for kv in (*base, *sets) for a in ("--set", kv))]
    assert bec.main(args) == 0
    return json.loads((out / "observables.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets",
    [
        ["system=dipolar", "g=20", "dipolar.eps_dd=1.3", "dipolar.lhy=true"],
        ["system=dipolar", "g=20", "dipolar.eps_dd=1.3", "dipolar.gamma_qf=500"],
        ["system=mixture", "g=20", "mixture.g12=-22", "mixture.lhy=true"],
    ],
    ids=["dipolar-lhy", "dipolar-gamma_qf", "mixture-lhy"],
)
def test_an_lhy_run_records_its_energy_and_conserves_n_and_e(tmp_path, sets):
    """The ground state (16³ over 10³) converges with the LHY term and the evolution records ``energy_lhy`` > 0 while
    N and E hold (float32: 1e-5)."""
    doc = _run(tmp_path, "run", "dims=3", "grid=16", "length=10.0", "ground_steps=2000", *sets)
    obs = doc["observables"]
    assert doc["ground_state"]["finite"]
    assert min(obs["energy_lhy"]) > 0
    np.testing.assert_allclose(obs["norm"], obs["norm"][0], rtol=1e-5)
    e = np.asarray(obs["energy_total"])
    assert np.max(np.abs(e / e[0] - 1)) < 1e-5


BAD_LHY_SETTINGS = [
    (["dipolar.lhy=true"], "dipolar.lhy applies to system=dipolar, not to system=scalar"),
    (["system=mixture", "mixture.g12=-1.1", "mixture.lhy=true"], "mixture.lhy=True is Petrov's 3-D two-component"),
    (
        ["system=dipolar", "dims=3", "dipolar.eps_dd=1.3", "dipolar.lhy=true", "dipolar.gamma_qf=1"],
        "or gamma_qf=..., not both",
    ),
    (["system=dipolar", "dims=3", "dipolar.eps_dd=1.3", "g=-1", "dipolar.lhy=true"], "dipolar.lhy=True needs g > 0"),
    (["system=dipolar", "dims=3", "dipolar.eps_dd=1.3", "dipolar.gamma_qf=-1"], "dipolar.gamma_qf must be"),
]


@pytest.mark.parametrize("sets, message", BAD_LHY_SETTINGS, ids=[" ".join(s) for s, _ in BAD_LHY_SETTINGS])
def test_every_bad_lhy_setting_is_one_line_and_exit_2(refused, sets, message):
    refused(bec.main, sets, message)
