"""The 2+1D side-by-side op (bench/ops_cdt3.py): the comparison and our engine's run in the reference's terms."""

import numpy as np
import pytest

from ivhl_jax.bench import ops_cdt3, peer_cdt3


def _analysed(rng, n22_mean, s_blob):
    T, n = 12, 400
    n31 = np.full(n, 600)
    n22 = rng.normal(n22_mean, 5.0, n)
    t = np.arange(T)
    shape = np.exp(-0.5 * ((t - T // 2) / s_blob) ** 2)
    prof = np.rint(4 + 26 * shape * (1 + 0.05 * rng.standard_normal((n, T)))).astype(np.int64)
    counts = {"n0": prof.sum(1) // 2 + 2 * T, "n31": n31, "n22": n22, "n3": n31 + n22}
    return peer_cdt3.analyse(counts, prof)


def test_compare_gives_small_z_for_the_same_law_and_large_for_another():
    rng = np.random.default_rng(3)
    a, b = _analysed(rng, 180.0, 2.0), _analysed(rng, 180.0, 2.0)
    same = ops_cdt3.compare(a, b)
    assert abs(same["z"]["n22_over_n31"]) < 4 and same["profile_dof"] == 12
    other = ops_cdt3.compare(_analysed(rng, 200.0, 2.0), b)
    assert other["z"]["n22_over_n31"] > 10  # 20 triangles apart at an error of about 0.25 each
    assert ops_cdt3.compare(_analysed(rng, 180.0, 3.0), b)["profile_chi2"] > 10 * same["profile_chi2"]


@pytest.mark.slow
def test_engine_run_measures_at_the_target_in_the_reference_terms():
    spec = peer_cdt3.RunSpec(k0=5.0, k3=1.70, target=120, n_slices=4, thermal=10, sweeps=20, ksteps=1, epsilon=0.01)
    run = ops_cdt3.engine_run(spec)
    c = run["counts"]
    assert run["profiles"].shape[1] == 4 and run["profiles"].shape[0] == c["n31"].shape[0] > 0
    assert np.all(run["profiles"].sum(axis=1) == 120) and np.all(c["n31"] == 240)
    assert np.all(c["n3"] == c["n31"] + c["n22"]) and np.all(c["n0"] == 60 + 2 * 4)
    assert run["attempts_per_s"] > 0 and not run["overflow"]
