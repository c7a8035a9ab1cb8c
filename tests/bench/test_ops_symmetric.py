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
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    for chi in (4, 8, 12, 16, 24, 32, 48):
        cfg = ops_symmetric.z2_config(chi)
        legs = MS.layer_legs(mera.ising(), cfg)
        assert legs[-1].out.dim == chi


def test_cores_option_refuses_what_it_cannot_apply():
    """--cores: None means every core (named); a count below 1 is refused; once JAX has started (as in this
    process) a limit it can no longer apply is an error naming --cores, not a results file with the wrong label."""
    import jax.numpy as jnp

    from ivhl_jax.bench import ops_symmetric
    from ivhl_jax.core.backend import host_core_ids

    jnp.zeros(1).block_until_ready()  # the backend has started
    allowed = host_core_ids()
    assert ops_symmetric._hold_cores(None) == f"all cores: {allowed}"
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="--cores"):
            ops_symmetric._hold_cores(bad)
    if len(allowed) > 1:
        with pytest.raises(ValueError, match="--cores 1: not applied"):
            ops_symmetric._hold_cores(1)
    else:
        assert ops_symmetric._hold_cores(1).startswith("all cores")


@pytest.mark.slow  # a fresh process compiles a chi=4 symmetric and dense sweep (about 30 s)
def test_cores_option_holds_a_fresh_run_to_one_core_and_says_so(tmp_path):
    import json
    import subprocess
    import sys

    from ivhl_jax.core.backend import host_core_ids

    out = tmp_path / "sweeps.json"
    cmd = [sys.executable, "-m", "ivhl_jax.bench.ops_symmetric", "--chis", "4", "--sweeps", "1", "--repeats", "1"]
    subprocess.run([*cmd, "--cores", "1", "--out", str(out)], check=True, capture_output=True, timeout=600)
    doc = json.loads(out.read_text())
    allowed = host_core_ids()
    expect = f"applied: cores [{allowed[0]}]" if len(allowed) > 1 else "all cores"
    assert doc["host_cores"].startswith(expect), doc["host_cores"]
    assert "--cores 1" in doc["provenance"]["command"]
    (rec,) = doc["results"]
    assert rec["chi"] == 4 and rec["max_energy_difference_sym_vs_dense"] < 1e-10
