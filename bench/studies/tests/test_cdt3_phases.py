"""bench.studies.cdt3_phases: the peak finder, the jackknife variance, the blob count on known inputs, and (slow)
the extended and decoupled phases of 2+1D CDT told apart by N22/N31 as in bench/results/cdt3_phases_n500.json."""

import json
import pathlib

import numpy as np
import pytest

from bench.studies import cdt3_phases as cp


def test_peak_of_a_known_parabola_and_an_unbracketed_maximum():
    k0 = [4.0, 4.5, 5.0, 5.5, 6.0]
    chi = [1.0 - (k - 5.2) ** 2 for k in k0]
    peak = cp.locate_peak(k0, chi, [1e-6] * 5)
    assert peak["bracketed"] and abs(peak["k0_peak"] - 5.2) < 1e-6 and peak["k0_peak_err"] < 1e-3
    noisy = cp.locate_peak(k0, chi, [0.05] * 5)
    assert 0.01 < noisy["k0_peak_err"] < 0.5  # the bootstrap sees the errors
    edge = cp.locate_peak(k0, [5, 4, 3, 2, 1], [0.1] * 5)
    assert not edge["bracketed"] and edge["k0_peak"] == 4.0 and np.isnan(edge["k0_peak_err"])


def test_jackknife_variance_of_independent_normals():
    x = np.random.default_rng(0).normal(0.0, 2.0, 20000)
    var, err = cp.jackknife_variance(x, 20)
    # var(s^2) = 2 sigma^4 / n for normal data: 4 * sqrt(2 / 20000) = 0.04
    assert abs(var - 4.0) < 4 * 0.04 and 0.5 * 0.04 < err < 2 * 0.04


def test_count_blobs_on_periodic_profiles():
    p = np.array(
        [
            [4, 4, 20, 30, 20, 4, 4, 4],  # one blob
            [30, 20, 4, 4, 4, 4, 4, 20],  # one blob across the periodic seam
            [20, 30, 4, 4, 20, 30, 4, 4],  # two
            [4, 30, 4, 4, 4, 4, 4, 4],  # a single-slice spike is no blob
        ],
        float,
    )
    np.testing.assert_array_equal(cp.count_blobs(p, 8.0), [1, 1, 2, 0])


def test_geometric_ramp_and_one_blob_fraction():
    assert cp.geometric_ramp(250, 1000, 1.5) == [250, 375, 562, 844]
    assert cp.geometric_ramp(250, 250, 1.5) == []
    # stalk (the quarter of smallest slices of the mean) at 4: one blob, two blobs, one blob across the seam
    p = np.array(
        [
            [4, 4, 20, 30, 20, 4, 4, 4],
            [20, 30, 4, 4, 20, 30, 4, 4],
            [30, 20, 4, 4, 4, 4, 4, 20],
            [4, 4, 4, 30, 30, 4, 4, 4],
        ],
        float,
    )
    assert cp.one_blob_fraction(p) == pytest.approx(0.75)
    # excess over the level 8: 12 + 22 + 12 in one lump; 12 + 22 and 12 + 22 in two; a seam-crossing lump
    np.testing.assert_allclose(cp.largest_blob_share(p, 8.0), [1.0, 0.5, 1.0, 1.0])
    assert cp.largest_blob_share(np.full((1, 8), 4.0), 8.0)[0] == 0.0


def test_s_by_block_recovers_a_known_width():
    """Profiles drawn (Poisson) around a stalk of 10 plus the de Sitter shape of s = 0.25 at volume 8000, shifted at
    random in time: every block's fit returns s within a few per cent."""
    from ivhl_jax.physics.cdt import d3_profile

    rng = np.random.default_rng(3)
    T, vol, s_true = 32, 8000.0, 0.25
    shape = 10 + d3_profile.de_sitter_profile(np.arange(T), s_true, vol, 2000.0, t0=T // 2)
    prof = np.stack([np.roll(rng.poisson(shape), rng.integers(T)) for _ in range(2000)]).astype(float)
    got = cp.s_by_block(prof, np.full(2000, vol), 4)
    assert len(got) == 4
    np.testing.assert_allclose(got, s_true, rtol=0.05)


def test_k3_start_passes_through_the_reference_values():
    for k0, k3 in cp.REFERENCE_K3.items():
        assert cp.k3_start(k0) == pytest.approx(k3)
    assert cp.REFERENCE_K3[5.0] < cp.k3_start(6.5) < cp.REFERENCE_K3[8.0]


@pytest.mark.slow  # two short chains at N(3,1) = 500 (a minute on a loaded 2-core host)
def test_extended_and_decoupled_phases_are_told_apart_by_n22_over_n31():
    """At the scan's smaller volume (N(3,1) = 500, T = 32, measure="action") a short run at k0 = 3.5 (extended
    phase: (2,2) tetrahedra tie the slices together) and at k0 = 8 (decoupled: they nearly vanish) reproduces the
    study's N22/N31 within errors, and the two phases differ by many errors."""
    import jax

    from ivhl_jax import cdt

    doc = json.loads((pathlib.Path(cp.RESULTS) / "cdt3_phases_n500.json").read_text())
    stored = {p["k0"]: p for p in doc["volumes"][0]["points"]}
    target, ours = 500, {}
    for k0 in (3.5, 8.0):
        stepper = cdt.metropolis_3d(k0, cp.k3_start(k0), target=target, eps=0.005)
        chain = stepper.init(jax.random.key(7), 32)
        _, _, obs, _ = cp.run_point(
            chain, k0, cp.k3_start(k0), target, eps=0.005, attempts=10 * target, thermal=600, sweeps=1000, block=100
        )
        ours[k0] = cp.point_summary(obs, 10)
    for k0, rec in ours.items():
        (a, ea), (b, eb) = rec["n22_over_n31"], stored[k0]["n22_over_n31"]
        assert abs(a - b) < 4 * np.hypot(ea, eb) + 0.01, (k0, a, ea, b, eb)
    (x_ext, e_ext), (x_dec, e_dec) = ours[3.5]["n22_over_n31"], ours[8.0]["n22_over_n31"]
    assert x_ext - x_dec > 10 * np.hypot(e_ext, e_dec) and x_ext > 2 * x_dec
