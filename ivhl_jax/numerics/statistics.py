"""Monte Carlo error analysis for correlated time series (host side, NumPy, float64).

A Markov chain produces a series ``x_1..x_N`` whose successive samples are correlated, so the naive
error of the mean ``σ/sqrt(N)`` is too small. With the normalised autocorrelation function

    C(t) = (1/N) Σ_{i=1}^{N-t} (x_i − x̄)(x_{i+t} − x̄),      ρ(t) = C(t) / C(0),

and the integrated autocorrelation time ``τ_int = 1/2 + Σ_{t≥1} ρ(t)`` (in units of the sampling
interval: sweeps times ``save_every`` of a CDT ``trajectory``), the variance of the
mean is ``Var(x̄) ≈ 2 τ_int σ² / N``: the chain holds ``N_eff = N / (2 τ_int)`` independent samples.

* :func:`autocorrelation` — ``ρ(t)`` by FFT (O(N log N)).
* :func:`integrated_autocorrelation_time` — ``τ_int`` with Sokal's automatic window and the
  Madras–Sokal error.
* :func:`binning_error` — blocking (Flyvbjerg–Petersen) with the automatic plateau choice of Jonsson.
* :func:`mean_with_error` — mean, its autocorrelation-corrected error and ``τ_int``.
* :func:`chi2_histogram_test` — Pearson χ² goodness of fit of a histogram with bin pooling and an
  effective-sample-size correction; :func:`chi2_sf` its p-value (regularised incomplete gamma).

References: A. D. Sokal, "Monte Carlo methods in statistical mechanics" (Cargèse lectures, 1996);
N. Madras and A. D. Sokal, J. Stat. Phys. 50, 109 (1988); H. Flyvbjerg and H. G. Petersen,
J. Chem. Phys. 91, 461 (1989); M. Jonsson, Phys. Rev. E 98, 043304 (2018).

Everything here runs on the host: the inputs are measurement series already fetched from the device,
and the windowing/plateau searches are data-dependent loops that do not belong in a compiled graph.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "TauInt",
    "BinningResult",
    "Chi2Result",
    "autocorrelation",
    "integrated_autocorrelation_time",
    "binning_error",
    "mean_with_error",
    "chi2_histogram_test",
    "ConvergenceOrder",
    "convergence_order",
    "chi2_sf",
]


class TauInt(NamedTuple):
    """Integrated autocorrelation time ``tau`` (sampling intervals), its error and the window ``W``."""

    tau: float
    error: float
    window: int


class BinningResult(NamedTuple):
    """Blocking analysis (:func:`binning_error`).

    ``block_sizes`` (K,) samples per block at level k (``2^k``); ``n_blocks`` (K,) blocks at that level;
    ``errors`` (K,) naive standard error of the mean computed from the blocks; ``errors_err`` (K,) its
    statistical error; ``error`` the plateau estimate, read at level ``level``.
    """

    block_sizes: np.ndarray
    n_blocks: np.ndarray
    errors: np.ndarray
    errors_err: np.ndarray
    error: float
    level: int


class Chi2Result(NamedTuple):
    """Pearson χ² test: ``statistic`` (after the ``n_eff/n`` rescaling), ``dof``, ``p_value``, ``n_bins``
    (bins after pooling)."""

    statistic: float
    dof: int
    p_value: float
    n_bins: int


def _series(x: Any, name: str, min_len: int) -> np.ndarray:
    """``x`` as a finite 1-D float64 array of length ``>= min_len``, or a ValueError naming ``name``."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a 1-D array of real numbers ({e})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.shape[0] < min_len:
        raise ValueError(f"{name} is too short: need at least {min_len} samples, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _is_real_scalar(v: Any) -> bool:
    """A real (integer or floating) number: a Python/NumPy scalar or a 0-d array; not a string, bool or None."""
    try:
        arr = np.asarray(v)
    except Exception:
        return False
    return arr.ndim == 0 and (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating))


def _positive(v: Any, name: str) -> float:
    f = float(v)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return f


def autocorrelation(x: Any) -> np.ndarray:
    """Normalised autocorrelation ``ρ(t) = C(t)/C(0)``, ``t = 0..N-1``, of a 1-D series ``x`` (N,).

    ``C(t) = (1/N) Σ_{i=1}^{N-t} (x_i − x̄)(x_{i+t} − x̄)`` — the 1/N ("biased") estimator, which has a
    smaller variance than the 1/(N−t) one and keeps ``ρ`` a positive-definite sequence (Sokal). Computed
    by zero-padded FFT: ``C = IFFT(|FFT(x − x̄)|²)/N`` with padding to ``>= 2N`` so that the cyclic
    correlation equals the linear one. Returns (N,) float64 with ``ρ(0) = 1``. A constant series
    (``C(0) = 0``) has no fluctuations to correlate: by convention ``ρ = (1, 0, 0, ...)``.
    """
    a = _series(x, "x", 2)
    n = a.shape[0]
    dev = a - a.mean()
    nfft = 1 << int(2 * n - 1).bit_length()  # power of two >= 2N: fast and no wrap-around
    f = np.fft.rfft(dev, n=nfft)
    acov = np.fft.irfft(f * np.conj(f), n=nfft)[:n] / n
    rho = np.zeros(n)
    # relative threshold: a series that is constant up to round-off has C(0) ~ eps² x̄², not exactly 0
    if acov[0] <= 1e-28 * max(1.0, float(np.max(np.abs(a)))) ** 2:
        rho[0] = 1.0
        return rho
    return acov / acov[0]


def integrated_autocorrelation_time(x: Any, c: float = 5.0) -> TauInt:
    """Integrated autocorrelation time of ``x`` (N,) with Sokal's automatic windowing.

    ``τ_int(W) = 1/2 + Σ_{t=1}^{W} ρ(t)`` (:func:`autocorrelation`); the window is the smallest ``W >= 1``
    with ``W >= c τ_int(W)`` — long enough that the neglected tail ``Σ_{t>W} ρ(t) ~ e^{-W/τ}`` is small
    (``c = 5`` leaves < 1% for a pure exponential), short enough that the noise of the summed ``ρ(t)``
    (which grows like ``sqrt(W/N)``) stays small. Error (Madras–Sokal):
    ``δτ ≈ τ_int sqrt(2(2W + 1)/N)``. Units: sampling intervals of the series.

    Returns :class:`TauInt` ``(tau, error, window)``. An uncorrelated series has ``τ_int = 1/2``.
    Warns (RuntimeWarning) when the series is too short for a trustworthy estimate: no window
    satisfies the condition, or ``N < 50 τ_int`` (then τ is typically underestimated, because the
    mean-subtracted ``ρ(t)`` sums to zero over all lags and the tail is cut by the noise).
    """
    c = _positive(c, "c")
    rho = autocorrelation(x)
    n = rho.shape[0]
    taus = 0.5 + np.concatenate([[0.0], np.cumsum(rho[1:])])  # taus[W] = τ_int(W), W = 0..N-1
    w_all = np.arange(n)
    ok = (w_all >= 1) & (w_all >= c * taus)
    w = int(np.argmax(ok)) if np.any(ok) else n - 1
    constant = not np.any(rho[1:])  # a constant series (ρ = δ_t0 by convention) is exactly τ = 1/2
    if not constant and (not np.any(ok) or n < 50 * taus[w]):
        warnings.warn(
            f"integrated_autocorrelation_time: the series is too short (N = {n}, tau = {taus[w]:.3g}, "
            f"window {w}; want N >= 50 tau): the estimate is unreliable",
            RuntimeWarning,
            stacklevel=2,
        )
    tau = float(taus[w])
    return TauInt(tau, tau * math.sqrt(2.0 * (2 * w + 1) / n), w)


def binning_error(x: Any, *, alpha: float = 0.01) -> BinningResult:
    """Standard error of the mean of ``x`` (N,) by blocking (Flyvbjerg–Petersen).

    Level ``k`` averages neighbouring pairs of level ``k−1`` (an odd last sample is dropped), giving
    ``n_k`` blocks of ``2^k`` samples with variance ``s_k² = (1/n_k) Σ (b_i − b̄)²``. The naive error of
    the mean computed from the blocks, ``σ_k = sqrt(s_k² / (n_k − 1))``, grows with ``k`` and levels off
    at the true error once blocks are longer than ``~2 τ_int``; its own error is
    ``σ_k / sqrt(2(n_k − 1))``. Exact for a stationary series: ``σ_∞² = Var(x̄) ≈ 2 τ_int σ²/N``.

    The plateau is chosen automatically (Jonsson 2018): with ``γ_k`` the lag-1 autocovariance of level
    ``k``, ``M_j = Σ_{k>=j} n_k (γ_k / s_k²)²`` is χ²-distributed with (number of terms) degrees of
    freedom once the blocks of level ``j`` are uncorrelated; the estimate is ``σ_j`` at the smallest
    ``j`` whose ``M_j`` is below the ``1 − alpha`` quantile. Levels are formed while ``n_k >= 2``.
    Warns (RuntimeWarning) when no level passes (too little data for the correlation time).
    """
    a = _series(x, "x", 4)
    alpha = _positive(alpha, "alpha")
    if not alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1) (a significance level), got {alpha!r}")
    blocks = a
    sizes, nbs, s2s, g2s = [], [], [], []
    k = 0
    while blocks.shape[0] >= 2:
        nb = blocks.shape[0]
        dev = blocks - blocks.mean()
        sizes.append(1 << k)
        nbs.append(nb)
        s2s.append(float(np.mean(dev * dev)))
        g2s.append(float(np.sum(dev[:-1] * dev[1:]) / nb))
        m = nb // 2
        blocks = 0.5 * (blocks[0 : 2 * m : 2] + blocks[1 : 2 * m : 2])
        k += 1
    n_blocks = np.asarray(nbs, dtype=np.int64)
    s2 = np.asarray(s2s)
    gam = np.asarray(g2s)
    errors = np.sqrt(s2 / (n_blocks - 1))
    errors_err = errors / np.sqrt(2.0 * (n_blocks - 1))
    if s2[0] <= 0.0:  # constant series: no fluctuation, zero error at every level
        return BinningResult(np.asarray(sizes), n_blocks, errors, errors_err, 0.0, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(s2 > 0, n_blocks * (gam / np.where(s2 > 0, s2, 1.0)) ** 2, 0.0)
    big_m = np.cumsum(terms[::-1])[::-1]  # M_j = Σ_{k>=j} terms_k
    levels = len(terms)
    level = None
    for j in range(levels):
        if chi2_sf(float(big_m[j]), levels - j) > alpha:
            level = j
            break
    if level is None:
        level = levels - 1
        warnings.warn(
            "binning_error: no blocking level passed the decorrelation test; "
            "the series is too short for its correlation time",
            RuntimeWarning,
            stacklevel=2,
        )
    return BinningResult(np.asarray(sizes), n_blocks, errors, errors_err, float(errors[level]), level)


def mean_with_error(x: Any, c: float = 5.0) -> tuple[float, float, float]:
    """``(mean, error, tau_int)`` of ``x`` (N,): ``error = sqrt(2 τ_int s² / N)``.

    ``s²`` is the unbiased sample variance and ``τ_int`` comes from
    :func:`integrated_autocorrelation_time` (window constant ``c``): the error of the mean of a
    correlated series, ``sqrt(s²/N_eff)`` with ``N_eff = N/(2 τ_int)``. Units: those of ``x``.
    """
    a = _series(x, "x", 2)
    t = integrated_autocorrelation_time(a, c)
    n = a.shape[0]
    var = float(np.var(a, ddof=1))
    return float(a.mean()), math.sqrt(max(2.0 * t.tau, 0.0) * var / n), t.tau


def _gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma ``Q(a, x) = Γ(a, x)/Γ(a)`` (a > 0), double precision.

    Series for ``P = 1 − Q`` when ``x < a + 1`` (there ``Q`` is not small, so ``1 − P`` loses nothing),
    modified-Lentz continued fraction for ``Q`` otherwise (relative accuracy in the far tail).
    """
    if x <= 0.0:
        return 1.0
    log_pref = -x + a * math.log(x) - math.lgamma(a)
    max_iter = 100_000
    if x < a + 1.0:
        ap, term = a, 1.0 / a
        total = term
        for _ in range(max_iter):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-17:
                break
        return min(1.0, max(0.0, 1.0 - total * math.exp(log_pref)))
    tiny = 1e-300
    b = x + 1.0 - a
    cc = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, max_iter):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        cc = b + an / cc
        cc = tiny if abs(cc) < tiny else cc
        d = 1.0 / d
        delta = d * cc
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return min(1.0, max(0.0, math.exp(log_pref) * h))


def chi2_sf(statistic: float, dof: int) -> float:
    """Survival function of the χ² distribution: ``P(χ²_dof >= statistic) = Q(dof/2, statistic/2)``."""
    if not _is_real_scalar(dof):
        raise TypeError(f"dof must be an integer >= 1, got {dof!r}")
    dof_f = float(dof)
    if not (math.isfinite(dof_f) and dof_f >= 1 and dof_f == int(dof_f)):
        raise ValueError(f"dof must be an integer >= 1, got {dof!r}")
    dof_i = int(dof_f)
    if not _is_real_scalar(statistic):
        raise TypeError(f"statistic must be a number, got {statistic!r}")
    s = float(statistic)
    if math.isnan(s):
        raise ValueError("statistic must not be NaN")
    if s == math.inf:
        return 0.0
    return _gammaincc(0.5 * dof_i, 0.5 * s)


def chi2_histogram_test(
    observed_counts: Any, expected_probs: Any, *, min_expected: float = 5.0, n_eff: float | None = None
) -> Chi2Result:
    """Pearson χ² test of a histogram ``observed_counts`` (K,) against bin probabilities ``expected_probs`` (K,).

    With ``n = Σ O_i`` samples and expectations ``E_i = n p_i`` (``p`` normalised to sum 1, so it need only
    be proportional to the probabilities), ``χ² = Σ (O_i − E_i)² / E_i`` over pooled bins, and
    ``p-value = Q(dof/2, χ²/2)`` with ``dof = (pooled bins) − 1``.

    Pooling: adjacent bins (in the given order, so tails of an ordered histogram pool together) are
    merged left to right until each group's expectation ``n_eff p`` reaches ``min_expected``; a remainder
    joins the last group. It depends on ``p`` only, never on the observations, so the χ² law holds.

    Correlated samples (a Markov chain) inflate the fluctuations of the counts by ``n/n_eff``, with
    ``n_eff = n/(2 τ_int)`` (:func:`integrated_autocorrelation_time`): pass ``n_eff`` and χ² is scaled by
    ``n_eff / n`` (and pooling uses ``n_eff p``). Raises ValueError when fewer than two pooled bins remain.
    """
    arrays = []
    for v, name in ((observed_counts, "observed_counts"), (expected_probs, "expected_probs")):
        try:
            arrays.append(np.asarray(v, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be a 1-D array of real numbers ({e})") from None
    obs, p = arrays
    if obs.ndim != 1:
        raise ValueError(f"observed_counts must be a 1-D array, got shape {obs.shape}")
    if p.ndim != 1:
        raise ValueError(f"expected_probs must be a 1-D array, got shape {p.shape}")
    if p.shape != obs.shape:
        raise ValueError(f"expected_probs must have the shape of observed_counts {obs.shape}, got {p.shape}")
    if not np.all(np.isfinite(obs)) or np.any(obs < 0):
        raise ValueError("observed_counts must be finite and >= 0")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("expected_probs must be finite, >= 0 and not all zero")
    min_expected = _positive(min_expected, "min_expected")
    n = float(obs.sum())
    if n <= 0:
        raise ValueError("observed_counts must contain at least one sample")
    ne = n if n_eff is None else _positive(n_eff, "n_eff")
    p = p / p.sum()
    groups: list[tuple[float, float]] = []  # (observed, probability) per pooled bin
    acc_o = acc_p = 0.0
    for o_i, p_i in zip(obs, p):
        acc_o += o_i
        acc_p += p_i
        if ne * acc_p >= min_expected:
            groups.append((acc_o, acc_p))
            acc_o = acc_p = 0.0
    if acc_o > 0 or acc_p > 0:
        if groups:
            o_last, p_last = groups[-1]
            groups[-1] = (o_last + acc_o, p_last + acc_p)
        else:
            groups.append((acc_o, acc_p))
    if len(groups) < 2:
        raise ValueError(
            f"observed_counts: too few samples (n_eff = {ne:.4g}) for two bins with expected "
            f"count >= min_expected = {min_expected}"
        )
    go = np.array([g[0] for g in groups])
    ge = n * np.array([g[1] for g in groups])
    stat = float(np.sum((go - ge) ** 2 / ge)) * (ne / n)
    dof = len(groups) - 1
    return Chi2Result(stat, dof, chi2_sf(stat, dof), len(groups))


class ConvergenceOrder(NamedTuple):
    """Observed order of accuracy (:func:`convergence_order`): ``order`` the least-squares slope of
    ``log err`` against ``log h``, ``order_err`` its standard error (0 for two points), ``local`` (K-1,) the
    slopes between successive step sizes."""

    order: float
    order_err: float
    local: np.ndarray


def convergence_order(step_sizes: Any, errors: Any) -> ConvergenceOrder:
    """Order ``p`` of ``err ≈ C h^p`` from errors measured at step sizes ``h`` (diffrax-style order tests).

    ``p`` is the least-squares slope of ``log err`` on ``log h``; ``local[k] = log(err_{k+1}/err_k) /
    log(h_{k+1}/h_k)``. Both inputs (K,), K >= 2, positive and finite; the step sizes distinct.
    """
    h = _series(step_sizes, "step_sizes", 2)
    e = _series(errors, "errors", 2)
    if h.shape != e.shape:
        raise ValueError(f"step_sizes and errors must have the same length, got {h.shape[0]} and {e.shape[0]}")
    if np.any(h <= 0) or np.any(e <= 0):
        raise ValueError("step_sizes and errors must be > 0 (their logarithms are fitted)")
    if np.unique(h).size != h.size:
        raise ValueError("step_sizes must be distinct")
    lh, le = np.log(h), np.log(e)
    local = np.diff(le) / np.diff(lh)
    if h.size == 2:
        return ConvergenceOrder(float(local[0]), 0.0, local)
    coef, cov = np.polyfit(lh, le, 1, cov=True) if h.size > 3 else (np.polyfit(lh, le, 1), None)
    err = float(np.sqrt(max(cov[0, 0], 0.0))) if cov is not None else float("nan")
    return ConvergenceOrder(float(coef[0]), err, local)
