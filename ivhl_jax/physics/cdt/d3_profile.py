"""Analysis of 2+1D CDT measurements: centred volume profiles, the de Sitter fit, ratios, z-scores (host, NumPy).

Inputs are measurement series already on the host: ``profiles`` (n, T) spatial triangles per slice (the
``slice_volumes`` of a 2+1D stepper's ``observe``, or the reference code's volume profile), and count
series such as ``n22``, ``n31`` (n,).

**De Sitter profile.** In the extended phase of 2+1D CDT the averaged slice area follows the Euclidean
de Sitter (S³) shape (Ambjørn, Jurkiewicz & Loll, Phys. Rev. D 64, 044011 (2001); Cooperman & Miller,
Class. Quant. Grav. 31, 035012 (2014)):

    V₂(t) = A cos²((t − t₀) / B),   B = s · N₃^{1/3},   |t − t₀| ≤ π B / 2   (0 outside),

with ``A`` fixed by the total spatial area: the continuum integral ∫ A cos²(τ/B) dτ = A π B / 2 equals
``Σ_t V₂(t)`` (the number of spatial triangles = N(3,1) = N(1,3)), so ``A = 2 Σ / (π B)`` and the shape has
one dimensionless parameter ``s`` (plus the centre ``t₀``). ``N₃`` is the volume that sets the time
scale; the literature uses the total number of tetrahedra (AJL) or N(3,1) (Cooperman & Miller): the
caller passes it as ``volume`` and says which. Units: ``t`` in slices, ``V₂`` in spatial triangles.

Functions: :func:`centre_profiles`, :func:`mean_profile`, :func:`de_sitter_profile`,
:func:`fit_de_sitter`, :func:`stalk_level`, :func:`ratio_with_error`, :func:`z_scores`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ivhl_jax.numerics.statistics import mean_with_error
from ivhl_jax.physics.cdt.observables import center_profiles

__all__ = [
    "DeSitterFit",
    "centre_profiles",
    "mean_profile",
    "de_sitter_profile",
    "fit_de_sitter",
    "stalk_level",
    "ratio_with_error",
    "z_scores",
]

CENTRINGS = ("phase", "max")


class DeSitterFit(NamedTuple):
    """Least-squares fit of :func:`de_sitter_profile` to an averaged profile.

    ``s`` (dimensionless) and ``t0`` (slices) with their standard errors (from the fit's covariance scaled
    by ``chi2/dof`` when that exceeds 1); ``width`` ``B = s volume^{1/3}`` (slices); ``amplitude`` ``A``
    (triangles); ``total`` the blob's area ``Σ (mean − stalk)``; ``stalk`` the per-slice area the blob sits on;
    ``chi2``/``dof`` over the fitted ``slices`` (indices).
    """

    s: float
    s_err: float
    t0: float
    t0_err: float
    width: float
    amplitude: float
    total: float
    stalk: float
    volume: float
    chi2: float
    dof: int
    slices: np.ndarray


def _profiles(profiles: Any, name: str = "profiles") -> np.ndarray:
    x = np.asarray(profiles, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 3:
        raise ValueError(f"{name} must have shape (n_measurements, T) with T >= 3 slices, got {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"{name} must hold finite, non-negative slice areas")
    return x


def centre_profiles(profiles: Any, method: str = "phase") -> np.ndarray:
    """Shift each periodic profile (n, T) by a whole number of slices so its centre sits at index T // 2.

    ``method="phase"``: the centre is the circular centroid ``t_c = T/(2π) arg Σ_t V(t) e^{2πit/T}`` (robust
    to noise: it uses the whole blob); ``"max"``: the largest slice (:func:`ivhl_jax.physics.cdt.center_profiles`,
    the 1+1D rule; biased upward at the peak on small volumes because it picks the largest fluctuation).
    Returns float64 (n, T).
    """
    x = _profiles(profiles)
    if method == "max":
        return np.asarray(center_profiles(x.astype(np.int64)), dtype=np.float64)
    if method != "phase":
        raise ValueError(f"method must be one of {CENTRINGS}, got {method!r}")
    T = x.shape[1]
    phase = np.angle(x @ np.exp(2j * np.pi * np.arange(T) / T))
    centre = np.rint(phase * T / (2 * np.pi)).astype(np.int64) % T
    shift = T // 2 - centre
    idx = (np.arange(T)[None, :] - shift[:, None]) % T
    return np.take_along_axis(x, idx, axis=1)


def mean_profile(profiles: Any, method: str = "phase") -> tuple[np.ndarray, np.ndarray]:
    """Average of the centred profiles: ``(mean (T,), error (T,))``, the error per slice autocorrelation-corrected
    (:func:`ivhl_jax.numerics.statistics.mean_with_error` on that slice's series, in measurement order)."""
    c = centre_profiles(profiles, method)
    if c.shape[0] < 2:
        raise ValueError(f"profiles needs at least 2 measurements for an error, got {c.shape[0]}")
    stats = [mean_with_error(c[:, t]) for t in range(c.shape[1])]
    return np.array([m for m, _, _ in stats]), np.array([e for _, e, _ in stats])


def de_sitter_profile(t: Any, s: float, volume: float, total: float, t0: float = 0.0) -> np.ndarray:
    """``V₂(t) = A cos²((t − t0)/B)`` inside ``|t − t0| <= πB/2``, 0 outside; ``B = s volume^{1/3}``,
    ``A = 2 total / (π B)`` so that the continuum area is ``total``. ``t`` in slices (any shape)."""
    if not (s > 0 and volume > 0 and total >= 0):
        raise ValueError(f"need s > 0, volume > 0, total >= 0; got s={s!r}, volume={volume!r}, total={total!r}")
    b = s * volume ** (1.0 / 3.0)
    u = (np.asarray(t, dtype=np.float64) - t0) / b
    return np.where(np.abs(u) <= np.pi / 2, 2.0 * total / (np.pi * b) * np.cos(u) ** 2, 0.0)


def fit_de_sitter(mean: Any, error: Any, volume: float, *, min_area: float = 0.0, stalk: float = 0.0) -> DeSitterFit:
    """Fit ``s`` and ``t0`` of :func:`de_sitter_profile` to a centred averaged profile (weighted least squares).

    Args:
      mean: (T,) the averaged profile (:func:`mean_profile`), centred at T // 2.
      error: (T,) its errors per slice.
      volume: the volume setting the time scale (N₃ or N(3,1), see the module docstring).
      min_area: only slices with ``mean > min_area`` enter the fit (e.g. to leave out the stalk of
        near-minimal slices outside the blob, 4 triangles each at the least).
      stalk: a constant area per slice under the blob (the stalk's level), subtracted from every slice before
        the fit: the model is ``stalk + V₂(t)`` and its normalisation ``total = Σ_t (mean − stalk)`` is the
        blob's area, the area the continuum shape must carry. 0 (the default): the whole profile.

    The fit starts from ``t0 = T // 2`` and the ``s`` of the profile's second moment about it.

    Returns :class:`DeSitterFit`. Raises ValueError on bad shapes or too few slices (need > 2).
    """
    from scipy.optimize import curve_fit

    m = np.asarray(mean, dtype=np.float64)
    e = np.asarray(error, dtype=np.float64)
    if m.ndim != 1 or m.shape != e.shape or m.shape[0] < 3:
        raise ValueError(f"mean and error must be equal 1-D shapes with T >= 3, got {m.shape} and {e.shape}")
    if not (volume > 0):
        raise ValueError(f"volume must be positive, got {volume!r}")
    T = m.shape[0]
    t = np.arange(T, dtype=np.float64)
    if not (0 <= stalk < float(m.max())):
        raise ValueError(f"stalk must lie in [0, max(mean)) (the area under the blob), got {stalk!r}")
    sel = np.nonzero(m > min_area)[0]
    m = m - stalk
    total = float(m.sum())
    if total <= 0:
        raise ValueError("the profile is empty (sum 0): nothing to fit")
    if sel.shape[0] <= 2:
        raise ValueError(f"only {sel.shape[0]} slices have mean > min_area={min_area}; need at least 3 to fit s, t0")
    # A zero error (a slice that never fluctuated) would get infinite weight: floor it at the smallest positive.
    pos = e[e > 0]
    sigma = np.maximum(e, pos.min() if pos.size else 1.0)[sel]
    c = T // 2
    # Second moment of cos² on [-πB/2, πB/2]: <τ²> = B² (π²/12 − 1/2).
    var = float(np.sum(m * (t - c) ** 2) / total)
    s_guess = math.sqrt(max(var, 1e-6) / (math.pi**2 / 12 - 0.5)) / volume ** (1.0 / 3.0)

    def model(tt, s, t0):
        return de_sitter_profile(tt, abs(s), volume, total, t0)

    p, cov = curve_fit(model, t[sel], m[sel], p0=[s_guess, float(c)], sigma=sigma, absolute_sigma=True)
    s_fit, t0_fit = abs(float(p[0])), float(p[1])
    resid = (m[sel] - model(t[sel], s_fit, t0_fit)) / sigma
    chi2 = float(resid @ resid)
    dof = int(sel.shape[0] - 2)
    scale = max(chi2 / dof, 1.0) if dof > 0 else 1.0
    errs = np.sqrt(np.maximum(np.diag(cov), 0.0) * scale)
    width = s_fit * volume ** (1.0 / 3.0)
    return DeSitterFit(
        s=s_fit,
        s_err=float(errs[0]),
        t0=t0_fit,
        t0_err=float(errs[1]),
        width=width,
        amplitude=2.0 * total / (math.pi * width),
        total=total,
        stalk=float(stalk),
        volume=float(volume),
        chi2=chi2,
        dof=dof,
        slices=sel,
    )


def stalk_level(mean: Any) -> float:
    """The stalk's area per slice of an averaged profile (T,): the mean of its quarter of smallest slices (at least
    one). Outside the blob the slices stay near the minimal sphere (4 triangles); the de Sitter shape sits on top
    (:func:`fit_de_sitter`'s ``stalk``; fit the slices above twice this level)."""
    m = np.asarray(mean, dtype=np.float64)
    if m.ndim != 1 or m.shape[0] < 1:
        raise ValueError(f"mean must be a 1-D profile, got shape {m.shape}")
    return float(np.mean(np.sort(m)[: max(1, m.shape[0] // 4)]))


def ratio_with_error(num: Any, den: Any) -> tuple[float, float, float]:
    """``R = <num> / <den>`` of two simultaneous series (n,), its autocorrelation-corrected error and ``τ_int``.

    Delta method: the error of ``R`` is the error of the mean of ``y_i = (num_i − R den_i) / <den>``, whose
    autocorrelation time :func:`ivhl_jax.numerics.statistics.mean_with_error` takes into account (so a
    correlated pair such as N22 and N31 of the same sweeps gets its covariance right). Returns
    ``(R, error, tau_int)`` (``tau_int`` in measurement intervals).
    """
    a = np.asarray(num, dtype=np.float64)
    b = np.asarray(den, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.shape[0] < 2:
        raise ValueError(f"num and den must be 1-D series of equal length >= 2, got {a.shape} and {b.shape}")
    mb = float(b.mean())
    if mb == 0:
        raise ValueError("den has mean 0: the ratio is undefined")
    r = float(a.mean()) / mb
    _, err, tau = mean_with_error((a - r * b) / mb)
    return r, float(err), float(tau)


def z_scores(ours: dict[str, tuple[float, float]], ref: dict[str, tuple[float, float]]) -> dict[str, float]:
    """``z = (x_ours − x_ref) / sqrt(σ_ours² + σ_ref²)`` for every name in both dicts of ``(value, error)``.

    Independent estimates of one quantity give ``|z| < 2`` about 95% of the time. A pair with both errors 0
    gives 0 if equal, ±inf otherwise.
    """
    out = {}
    for name in sorted(set(ours) & set(ref)):
        (a, ea), (b, eb) = ours[name], ref[name]
        d = float(a) - float(b)
        s = math.hypot(float(ea), float(eb))
        out[name] = d / s if s > 0 else (0.0 if d == 0 else math.copysign(math.inf, d))
    return out
