"""Monte Carlo error analysis (ivhl_jax.numerics.statistics) against processes with known answers.

The AR(1) process x_{t+1} = ρ x_t + sqrt(1−ρ²) ξ_t (stationary start x_0 ~ N(0, 1)) has unit variance,
ρ(t) = ρ^t, τ_int = (1+ρ)/(2(1−ρ)) and Var(x̄_N) = (1/N)[1 + 2 Σ_{t=1}^{N-1} (1 − t/N) ρ^t] → 2 τ_int / N.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import signal, stats

from ivhl_jax.numerics import statistics as st


def ar1(rho: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xi = rng.standard_normal(n)
    x0 = rng.standard_normal()
    # y[t] = sqrt(1-ρ²) ξ[t] + ρ y[t-1] with y[-1] = x0: lfilter's state z0 = ρ y[-1]
    return signal.lfilter([math.sqrt(1 - rho * rho)], [1.0, -rho], xi, zi=[rho * x0])[0]


def exact_tau(rho: float) -> float:
    return (1 + rho) / (2 * (1 - rho))


def exact_mean_var(rho: float, n: int) -> float:
    t = np.arange(1, n)
    return (1 + 2 * np.sum((1 - t / n) * rho**t)) / n


def test_autocorrelation_matches_direct_sum_and_ar1():
    x = ar1(0.7, 4000, 1)
    rho = st.autocorrelation(x)
    d = x - x.mean()
    direct = np.array([np.dot(d[: len(d) - t], d[t:]) for t in range(20)]) / len(d)
    np.testing.assert_allclose(rho[:20], direct / direct[0], rtol=1e-10, atol=1e-12)
    assert rho[0] == 1.0 and rho.shape == (4000,)
    big = st.autocorrelation(ar1(0.7, 1 << 17, 2))
    np.testing.assert_allclose(big[:6], 0.7 ** np.arange(6), atol=0.02)


def test_autocorrelation_of_a_constant_series():
    rho = st.autocorrelation(np.full(10, 3.0))
    np.testing.assert_array_equal(rho, np.eye(10)[0])
    m, e, tau = st.mean_with_error(np.full(10, 3.0))
    assert (m, e, tau) == (3.0, 0.0, 0.5)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1])
def test_tau_int_of_ar1_within_stated_error(rho, seed):
    n = 1 << 17
    res = st.integrated_autocorrelation_time(ar1(rho, n, 10 * seed + 3))
    exact = exact_tau(rho)
    assert abs(res.tau - exact) < 3 * res.error, (res, exact)
    # the stated error is Madras–Sokal's, and the window obeys Sokal's rule
    assert res.error == pytest.approx(res.tau * math.sqrt(2 * (2 * res.window + 1) / n))
    assert res.window >= 5 * res.tau and res.window >= 1


def test_tau_int_error_is_honest_over_replicas():
    # the spread of τ̂ over independent chains matches the Madras–Sokal error (within a factor ~1.5)
    taus, errs = [], []
    for seed in range(24):
        r = st.integrated_autocorrelation_time(ar1(0.5, 1 << 14, 100 + seed))
        taus.append(r.tau)
        errs.append(r.error)
    spread, stated = np.std(taus, ddof=1), np.mean(errs)
    assert 0.5 * stated < spread < 1.6 * stated, (spread, stated)
    assert abs(np.mean(taus) - exact_tau(0.5)) < 3 * stated / math.sqrt(len(taus)) + 0.02


def test_tau_int_short_series_warns():
    with pytest.warns(RuntimeWarning, match="too short"):
        st.integrated_autocorrelation_time(ar1(0.99, 50, 0))


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_binning_error_matches_exact_error_of_ar1_mean(rho):
    n = 1 << 17
    x = ar1(rho, n, 7)
    res = st.binning_error(x)
    exact = math.sqrt(exact_mean_var(rho, n))
    # the asymptotic formula σ²/N · 2τ_int is what the exact finite-N variance tends to
    assert exact == pytest.approx(math.sqrt(2 * exact_tau(rho) / n), rel=1e-3)
    assert abs(res.error - exact) < 4 * res.errors_err[res.level], (res.error, exact, res.level)
    # the curve: level 0 is the naive error, blocks are powers of two, the estimate reads a level
    assert res.errors[0] == pytest.approx(np.std(x, ddof=1) / math.sqrt(n), rel=1e-9)
    np.testing.assert_array_equal(res.block_sizes, 1 << np.arange(len(res.block_sizes)))
    assert res.error == res.errors[res.level]
    # blocks long against τ_int sit on the plateau (all levels with enough blocks agree with exact)
    long = (res.block_sizes >= 20 * exact_tau(rho)) & (res.n_blocks >= 64)
    assert np.all(np.abs(res.errors[long] - exact) < 4 * res.errors_err[long])


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_mean_with_error_of_ar1(rho):
    n = 1 << 16
    x = ar1(rho, n, 11)
    m, e, tau = st.mean_with_error(x)
    exact = math.sqrt(exact_mean_var(rho, n))
    assert e == pytest.approx(exact, rel=0.1)
    assert tau == st.integrated_autocorrelation_time(x).tau
    assert abs(m) < 4 * exact  # the true mean is 0


def test_chi2_sf_matches_scipy():
    for dof in (1, 2, 3, 7, 30, 200):
        for s in (0.0, 0.01, 0.5, 1.0, 3.0, 10.0, 50.0, 300.0, 1000.0):
            ref = stats.chi2.sf(s, dof)
            got = st.chi2_sf(s, dof)
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-300), (dof, s)


def test_chi2_uniform_multinomial_not_rejected_biased_rejected():
    rng = np.random.default_rng(5)
    k = 12
    p = np.full(k, 1.0 / k)
    pvals = [st.chi2_histogram_test(rng.multinomial(2000, p), p).p_value for _ in range(200)]
    # p-values of a true null are uniform: none tiny, and their distribution is ~U(0, 1)
    assert min(pvals) > 1e-4
    assert stats.kstest(pvals, "uniform").pvalue > 1e-3
    q = p.copy()
    q[0] *= 1.3
    q /= q.sum()
    res = st.chi2_histogram_test(rng.multinomial(20000, q), p)
    assert res.p_value < 1e-8 and res.dof == k - 1


def test_chi2_statistic_against_scipy_and_pooling():
    obs = np.array([3, 40, 100, 41, 2, 1, 0])
    p = np.array([0.002, 0.2, 0.6, 0.19, 0.006, 0.001, 0.001])
    res = st.chi2_histogram_test(obs, p)
    # pooling left to right until E >= 5: [0, 1], [2], [3], remainder [4, 5, 6] joins the last group
    n = obs.sum()
    go = np.array([43, 100, 44])
    gp = np.array([0.202, 0.6, 0.198])
    ref = stats.chisquare(go, n * gp)
    assert res.n_bins == 3 and res.dof == 2
    assert res.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    # unnormalised probabilities are normalised
    assert st.chi2_histogram_test(obs, 7 * p).statistic == pytest.approx(res.statistic, rel=1e-12)


def test_chi2_effective_sample_size_rescales():
    # an autocorrelated chain over 3 states: counts fluctuate 2τ times more than multinomial
    rng = np.random.default_rng(3)
    p = np.array([0.2, 0.5, 0.3])
    obs = rng.multinomial(5000, p) * 4  # every sample repeated 4 times: n_eff = n / 4
    plain = st.chi2_histogram_test(obs, p)
    corr = st.chi2_histogram_test(obs, p, n_eff=obs.sum() / 4)
    assert corr.statistic == pytest.approx(plain.statistic / 4, rel=1e-12)
    assert corr.p_value >= plain.p_value


@pytest.mark.parametrize(
    "fn", [st.autocorrelation, st.integrated_autocorrelation_time, st.binning_error, st.mean_with_error]
)
def test_bad_series_named(fn):
    with pytest.raises(ValueError, match="x must be a 1-D"):
        fn(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="x is too short"):
        fn(np.zeros(1))
    with pytest.raises(ValueError, match="x contains NaN"):
        fn(np.array([1.0, np.nan, 2.0, 3.0, 4.0]))


def test_bad_chi2_inputs_named():
    p = np.full(4, 0.25)
    with pytest.raises(ValueError, match="observed_counts must be a 1-D"):
        st.chi2_histogram_test(np.zeros((4, 2)), p)
    with pytest.raises(ValueError, match="expected_probs must have the shape"):
        st.chi2_histogram_test(np.ones(4), np.full(5, 0.2))
    with pytest.raises(ValueError, match="observed_counts must be finite"):
        st.chi2_histogram_test(np.array([1, 2, np.nan, 4]), p)
    with pytest.raises(ValueError, match="expected_probs must be finite"):
        st.chi2_histogram_test(np.ones(4), np.array([0.5, -0.1, 0.3, 0.3]))
    with pytest.raises(ValueError, match="n_eff must be"):
        st.chi2_histogram_test(np.ones(4) * 100, p, n_eff=0)
    with pytest.raises(ValueError, match="observed_counts: too few samples"):
        st.chi2_histogram_test(np.ones(4), p)
    with pytest.raises(ValueError, match="c must be"):
        st.integrated_autocorrelation_time(np.arange(10.0), c=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="dof must be"):
            st.chi2_sf(1.0, 0)


def test_convergence_order_of_known_schemes():
    h = np.array([0.1, 0.05, 0.025, 0.0125])
    # forward Euler on y' = -y to t = 1 (first order) and the midpoint rule (second order), exact error known
    for p, scheme in ((1, lambda k: (1 - k) ** round(1 / k)), (2, lambda k: (1 - k + k * k / 2) ** round(1 / k))):
        err = np.array([abs(scheme(k) - np.exp(-1.0)) for k in h])
        res = st.convergence_order(h, err)
        assert abs(res.order - p) < 0.1 and np.all(np.abs(res.local - p) < 0.15), res
        assert res.order_err < 0.05
    exact = st.convergence_order([0.2, 0.1], [4e-2, 1e-2])
    assert exact.order == pytest.approx(2.0) and exact.order_err == 0.0
    with pytest.raises(ValueError, match="same length"):
        st.convergence_order([0.1, 0.05], [1.0, 0.5, 0.25])
    with pytest.raises(ValueError, match="> 0"):
        st.convergence_order([0.1, 0.05], [1.0, 0.0])
    with pytest.raises(ValueError, match="distinct"):
        st.convergence_order([0.1, 0.1], [1.0, 0.5])
