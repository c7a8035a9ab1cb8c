"""2+1D CDT analysis (ivhl_jax.physics.cdt.d3_profile) against synthetic data with known answers."""

import math

import numpy as np
import pytest

from ivhl_jax.physics.cdt import d3_profile as dp


def _blobs(rng, n, T, s, volume, total, noise):
    """n periodic profiles: the de Sitter shape (centre on a slice, random roll), a stalk of 30, Gaussian noise."""
    t = np.arange(T)
    out = np.empty((n, T))
    for i in range(n):
        shape = dp.de_sitter_profile(t, s, volume, total, t0=T // 2)
        out[i] = np.roll(30.0 + shape + noise * rng.standard_normal(T), rng.integers(T))
    assert out.min() > 0
    return out


def test_de_sitter_profile_carries_the_total_area():
    t = np.linspace(-50, 50, 200001)
    v = dp.de_sitter_profile(t, s=0.5, volume=20_000.0, total=3000.0)
    b = 0.5 * 20_000 ** (1 / 3)
    assert np.trapezoid(v, t) == pytest.approx(3000.0, rel=1e-6)
    assert v.max() == pytest.approx(2 * 3000 / (math.pi * b), rel=1e-9)
    assert np.all(v[np.abs(t) > math.pi * b / 2] == 0)


@pytest.mark.parametrize("method", ["phase", "max"])
def test_centre_profiles_lines_up_rolled_copies(method):
    T = 20
    base = np.array([4, 4, 5, 9, 20, 40, 55, 42, 18, 9, 6] + [4] * 9, dtype=float)
    rolled = np.stack([np.roll(base, k) for k in range(T)])
    c = dp.centre_profiles(rolled, method)
    assert np.all(c == c[0])  # every copy shifted onto the same one
    if method == "max":
        assert int(np.argmax(c[0])) == T // 2
    else:  # the centroid (index 6 of base, weighted) lands on T // 2
        assert abs(int(np.argmax(c[0])) - T // 2) <= 1


def test_fit_recovers_s_from_noisy_rolled_profiles():
    rng = np.random.default_rng(0)
    T, s, volume, total = 40, 0.45, 8000.0, 1500.0
    profiles = _blobs(rng, 600, T, s, volume, total, noise=5.0)
    mean, err = dp.mean_profile(profiles)
    # the stalk under the blob is subtracted: the normalisation is the blob's own area
    stalk = dp.stalk_level(mean)
    assert stalk == pytest.approx(30.0, abs=1.0)
    fit = dp.fit_de_sitter(mean, err, volume, min_area=32.0, stalk=30.0)
    assert fit.total == pytest.approx(mean.sum() - 30.0 * T)
    assert fit.s_err < 0.02
    assert abs(fit.s - s) < 4 * fit.s_err
    assert fit.width == pytest.approx(fit.s * volume ** (1 / 3))
    assert abs(fit.t0 - T // 2) < 1.0
    assert fit.chi2 / fit.dof < 2.0
    # a clearly different s would not fit: the same data against s = 0.6 is far off
    assert abs(fit.s - 0.6) > 10 * fit.s_err


def test_fit_rejects_too_few_slices_and_bad_shapes():
    with pytest.raises(ValueError, match="min_area"):
        dp.fit_de_sitter(np.array([1.0, 0, 0, 0, 5.0]), np.ones(5), 100.0, min_area=2.0)
    with pytest.raises(ValueError, match="equal 1-D"):
        dp.fit_de_sitter(np.ones(5), np.ones(4), 100.0)
    with pytest.raises(ValueError, match="stalk"):
        dp.fit_de_sitter(np.ones(5), np.ones(5), 100.0, stalk=2.0)
    with pytest.raises(ValueError, match="volume"):
        dp.fit_de_sitter(np.ones(5), np.ones(5), 0.0)
    with pytest.raises(ValueError, match="method"):
        dp.centre_profiles(np.ones((2, 5)), "mean")
    with pytest.raises(ValueError, match="n_measurements, T"):
        dp.centre_profiles(np.ones(5))


def _ar1(rng, n, rho, size):
    x = np.empty((size, n))
    x[:, 0] = rng.standard_normal(size)
    e = rng.standard_normal((size, n)) * math.sqrt(1 - rho**2)
    for i in range(1, n):
        x[:, i] = rho * x[:, i - 1] + e[:, i]
    return x


def test_ratio_error_is_calibrated_on_correlated_series():
    rng = np.random.default_rng(1)
    n, rho, reps, r_true = 4000, 0.8, 120, 0.25
    den = 2000.0 + 5.0 * _ar1(rng, n, rho, reps)
    num = r_true * den + 8.0 * _ar1(rng, n, rho, reps)
    z = []
    for a, b in zip(num, den, strict=True):
        r, e, tau = dp.ratio_with_error(a, b)
        z.append((r - r_true) / e)
    tau_true = 0.5 + rho / (1 - rho)  # AR(1): 1/2 + Σ ρ^t
    assert tau == pytest.approx(tau_true, rel=0.35)
    z = np.asarray(z)
    assert 0.75 < z.std() < 1.3  # errors neither too small (naive) nor too large
    assert abs(z.mean()) < 0.4
    # the naive error (no τ) would be too small by sqrt(2 τ) = 3: the calibration test above would fail
    assert math.sqrt(2 * tau_true) > 2.5


def test_z_scores():
    z = dp.z_scores({"a": (1.0, 0.3), "b": (2.0, 0.0), "c": (5.0, 1.0)}, {"a": (0.6, 0.4), "b": (2.0, 0.0)})
    assert z == {"a": pytest.approx(0.8), "b": 0.0}
    assert dp.z_scores({"x": (1.0, 0.0)}, {"x": (2.0, 0.0)})["x"] == -math.inf


def test_ratio_rejects_bad_input():
    with pytest.raises(ValueError, match="equal length"):
        dp.ratio_with_error(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="mean 0"):
        dp.ratio_with_error(np.ones(3), np.zeros(3))
