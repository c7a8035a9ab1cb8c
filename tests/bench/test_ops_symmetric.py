"""bench/ops_symmetric.py: the symmetric-MERA GPU check runs (CPU-sized) and reports its records and a summary."""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow  # one compilation of a tiny symmetric sweep; runs in the slow step
def test_symmetric_gpu_check_quick_runs_on_cpu():
    from ivhl_jax.bench import ops_symmetric

    doc = ops_symmetric.gpu_check(True)
    (rec,) = doc["symmetric_sweeps"]
    assert "error" not in rec, rec
    assert rec["chi"] == 4 and rec["ms_per_sweep"] > 0 and rec["isometry_error"] < 1e-12
    assert math.isfinite(rec["energy_error"]) and rec["energy_error"] > 0
    assert doc["summary"][0].startswith("Z2 sweep chi=4")


def test_z2_configs_fit_their_layers():
    """The benchmark's sector choices add up and fit every layer (checked by the builder, no sweep run)."""
    from ivhl_jax import mera
    from ivhl_jax.bench import ops_symmetric
    from ivhl_jax.physics.mera import symmetric as MS

    for chi in (4, 8, 12, 16, 24, 32, 48):
        cfg = ops_symmetric.z2_config(chi)
        legs = MS.layer_legs(mera.ising(), cfg)
        assert legs[-1].out.dim == chi
