"""Dipolar supersolids in elongated traps: a species' laboratory parameters in the condensate family's trap units,
and what tells a supersolid from a superfluid along the trap's long axis — the line density, the number of its
maxima and the density contrast.

**From a species** (SI constants, CODATA 2018). Given the s-wave length a_s and the dipole length
a_dd = m μ₀ μ_m²/(12πħ²) in Bohr radii a₀, the mass m in atomic mass units and the trap frequencies f_i in Hz (not
2π f_i), :func:`species_units` returns the trap units of :mod:`ivhl_jax.physics.condensate` (ħ = m = 1) ::

    ω₀ = 2π (f_x f_y f_z)^{1/3},    a_ho = √(ħ/(m ω₀)),    trap_i = f_i/(f_x f_y f_z)^{1/3},
    g = 4π a_s/a_ho,                ε_dd = a_dd/a_s,

so that ``DipolarSystem.create(grid, harmonic(grid, trap), g, Dipolar.create(eps_dd=ε_dd, axis=...), lhy=True)``
with ψ normalised to the atom number N is the extended GP equation of the species, with the Lima–Pelster LHY
coefficient γ_QF = (128√π/3)(a_s/a_ho)^{5/2} Q₅(ε_dd) (:mod:`ivhl_jax.physics.condensate.lhy`). Energies come out
in ħω₀, lengths in a_ho, times in 1/ω₀ (e.g. ¹⁶⁴Dy, a_dd = 131–132 a₀, at f = (110, 90, 30) Hz: a_ho = 0.961 µm).

**Along the axis** (host NumPy, float64, after a ground state): the line density n(z) = ∫|ψ|² dx dy
(:func:`line_density`), its maxima (:func:`density_maxima`: the local maxima whose prominence is at least
``prominence`` × max n, which skips round-off ripples in the tails) and the contrast of the central maximum
(:func:`density_contrast`) ::

    C = (n_max − n_min)/(n_max + n_min),

n_max the maximum nearest the trap centre and n_min the mean of the minima between it and its neighbouring maxima
(C = 0 for a single maximum: the unmodulated superfluid; C → 1 for isolated droplets). A contrast of this form tells
the superfluid, the supersolid (0 < C < 1, droplets joined by a superfluid background) and the droplet array (C ≈ 1)
apart, as in the supersolid literature (e.g. Blakie et al., PRR 2, 043318 (2020)); papers differ in how they take
n_min, so compare contrasts only under the same definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ivhl_jax.core.validation import check_scalar

__all__ = [
    "HBAR",
    "ATOMIC_MASS",
    "BOHR_RADIUS",
    "species_units",
    "species_system",
    "tube_system",
    "line_density",
    "density_maxima",
    "density_contrast",
]

#: ħ in J s (CODATA 2018, exact).
HBAR = 1.054571817e-34
#: The atomic mass unit in kg (CODATA 2018).
ATOMIC_MASS = 1.66053906660e-27
#: The Bohr radius a₀ in m (CODATA 2018).
BOHR_RADIUS = 5.29177210903e-11


def species_units(a_s: float, a_dd: float, mass: float, trap_hz: Sequence[float]) -> dict[str, Any]:
    """A dipolar species in trap units (module docstring): ``a_s`` and ``a_dd`` in Bohr radii (> 0 and ≥ 0),
    ``mass`` in atomic mass units, ``trap_hz`` the three trap frequencies f_i in Hz (> 0; not 2π f_i).

    Returns {"omega" (ω₀ in rad/s), "length" (a_ho in m), "trap" (the three ω_i/ω₀), "g" (4π a_s/a_ho),
    "eps_dd" (a_dd/a_s), "a" (a_s/a_ho)}: pass ``trap`` to :func:`~ivhl_jax.physics.condensate.harmonic`, ``g`` to
    ``DipolarSystem.create`` and ``eps_dd`` to ``Dipolar.create``; grid lengths in µm are divided by
    ``length`` × 1e6."""
    check_scalar(a_s, "a_s", positive=True)
    check_scalar(a_dd, "a_dd", nonnegative=True)
    check_scalar(mass, "mass", positive=True)
    f = np.asarray(trap_hz, np.float64)
    if f.shape != (3,) or not np.all(np.isfinite(f)) or not np.all(f > 0):
        raise ValueError(f"trap_hz must be three positive trap frequencies in Hz (f, not 2*pi*f), got {trap_hz!r}")
    f_bar = float(np.cbrt(np.prod(f)))
    omega = 2 * math.pi * f_bar
    length = math.sqrt(HBAR / (float(mass) * ATOMIC_MASS * omega))
    a = float(a_s) * BOHR_RADIUS / length
    return {
        "omega": omega,
        "length": length,
        "trap": tuple(float(x) for x in f / f_bar),
        "g": 4 * math.pi * a,
        "eps_dd": float(a_dd) / float(a_s),
        "a": a,
    }


def species_system(
    shape: Sequence[int],
    half_um: Sequence[float],
    a_s: float,
    a_dd: float,
    mass: float,
    trap_hz: Sequence[float],
    *,
    axis: Sequence[float] = (1.0, 0.0, 0.0),
    lhy: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """(system, units): the :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` of a species
    (:func:`species_units`) in its harmonic trap on a 3-D grid of ``shape`` points over the box
    [−h_i, h_i] µm (``half_um`` = the three h_i), dipoles along ``axis``, with the LHY term unless ``lhy=False``.
    The potential is float64 NumPy: the system is float64 under ``jax.enable_x64`` (the ground state's ``policy``
    casts it). ψ is normalised to the atom number N (``ground_state(system, N)``)."""
    from ivhl_jax.physics.condensate.dipolar import Dipolar, DipolarSystem
    from ivhl_jax.physics.condensate.system import Grid, harmonic

    h = np.asarray(half_um, np.float64)
    if h.shape != (3,) or not np.all(np.isfinite(h)) or not np.all(h > 0):
        raise ValueError(f"half_um must be three positive half-sides of the box in micrometres, got {half_um!r}")
    u = species_units(a_s, a_dd, mass, trap_hz)
    grid = Grid.uniform(tuple(shape), tuple(float(x) for x in 2 * h * 1e-6 / u["length"]))
    dip = Dipolar.create(eps_dd=u["eps_dd"], axis=axis)
    return DipolarSystem.create(grid, harmonic(grid, u["trap"], dtype=np.float64), u["g"], dip, lhy=lhy), u


def tube_system(
    shape: Sequence[int],
    half_um: Sequence[float],
    length_um: float,
    a_s: float,
    a_dd: float,
    mass: float,
    trap_hz: Sequence[float],
    *,
    axis: Sequence[float] = (1.0, 0.0, 0.0),
    cutoff_um: float | None = None,
    lhy: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """(system, units): a species in an infinite tube — harmonic in x and y (``trap_hz`` = (f_x, f_y) in Hz),
    free and periodic along z with period ``length_um`` (µm) — on a 3-D grid of ``shape`` points over
    [−h_x, h_x] × [−h_y, h_y] µm (``half_um`` = (h_x, h_y)) × one period, dipoles along ``axis``, LHY unless
    ``lhy=False``. The trap units are those of the transverse trap: ω₀ = 2π√(f_x f_y) (:func:`species_units` with
    f_z = √(f_x f_y), whose trap z entry is then set to 0), so ``units["trap"]`` = (f_x/f₀, f_y/f₀, 0).

    The dipolar kernel is cut to a sphere of radius R_c = ``cutoff_um`` (default min(h_x, h_y)): with the cloud
    inside a transverse diameter D ≤ 2h − R_c no transverse image is within R_c, while along z every periodic
    image within R_c interacts, as in the infinite tube; the interaction beyond R_c (its 1/r³ tail) is left out.
    ψ normalised to N = n₁ × L atoms is the tube at linear density n₁ = N/L."""
    from ivhl_jax.physics.condensate.dipolar import Dipolar, DipolarSystem
    from ivhl_jax.physics.condensate.system import Grid, harmonic

    h = np.asarray(half_um, np.float64)
    if h.shape != (2,) or not np.all(np.isfinite(h)) or not np.all(h > 0):
        raise ValueError(f"half_um must be the two positive transverse half-sides in micrometres, got {half_um!r}")
    check_scalar(length_um, "length_um", positive=True)
    f = np.asarray(trap_hz, np.float64)
    if f.shape != (2,) or not np.all(np.isfinite(f)) or not np.all(f > 0):
        raise ValueError(
            f"trap_hz must be the two positive transverse trap frequencies (f_x, f_y) in Hz, got {trap_hz!r}"
        )
    u = species_units(a_s, a_dd, mass, (f[0], f[1], math.sqrt(f[0] * f[1])))
    u["trap"] = (u["trap"][0], u["trap"][1], 0.0)
    rc = float(np.min(h)) if cutoff_um is None else cutoff_um
    check_scalar(rc, "cutoff_um", positive=True)
    scale = 1e-6 / u["length"]
    grid = Grid.uniform(tuple(shape), (2 * h[0] * scale, 2 * h[1] * scale, float(length_um) * scale))
    dip = Dipolar.create(eps_dd=u["eps_dd"], axis=axis, cutoff=float(rc) * scale)
    return DipolarSystem.create(grid, harmonic(grid, u["trap"], dtype=np.float64), u["g"], dip, lhy=lhy), u


def line_density(psi: Any, grid: Any, axis: int = -1) -> np.ndarray:
    """n(x_axis) = ∫|ψ|² over the other axes (host float64, shape (grid.shape[axis],)): ``psi`` of the grid's shape
    (complex or real), ``grid`` its :class:`~ivhl_jax.physics.condensate.Grid`; Σ n · dx_axis = N."""
    p = np.asarray(psi)
    if p.shape != tuple(grid.shape):
        raise ValueError(f"psi must have the grid's shape {tuple(grid.shape)}, got {p.shape}")
    ax = axis % p.ndim
    n = (p.real.astype(np.float64) ** 2) + (p.imag.astype(np.float64) ** 2 if np.iscomplexobj(p) else 0.0)
    others = tuple(i for i in range(p.ndim) if i != ax)
    cell = float(np.prod([grid.dx[i] for i in others])) if others else 1.0
    return n.sum(axis=others) * cell


def density_maxima(line: Any, prominence: float = 0.01) -> np.ndarray:
    """Indices of the maxima of a line density whose prominence (height above the higher of the two minima that
    separate it from higher ground, :func:`scipy.signal.find_peaks`) is at least ``prominence`` × max(line)."""
    from scipy.signal import find_peaks

    check_scalar(prominence, "prominence", positive=True)
    x = np.asarray(line, np.float64)
    if x.ndim != 1 or x.size < 3 or not np.all(np.isfinite(x)):
        raise ValueError(f"line must be a finite 1-D density of at least 3 points, got shape {x.shape}")
    peaks, _ = find_peaks(x, prominence=float(prominence) * float(x.max()))
    return peaks


def density_contrast(line: Any, prominence: float = 0.01) -> tuple[int, float]:
    """(number of maxima, contrast C) of a line density (module docstring): C = (n_max − n_min)/(n_max + n_min) at
    the maximum nearest the centre of the axis, n_min the mean of the minima between it and its neighbouring maxima;
    (1, 0.0) for a single maximum, (0, 0.0) for none."""
    x = np.asarray(line, np.float64)
    peaks = density_maxima(x, prominence)
    if len(peaks) < 2:
        return len(peaks), 0.0
    i = int(np.argmin(np.abs(peaks - (x.size - 1) / 2)))
    mins = [x[peaks[j] : peaks[j + 1] + 1].min() for j in (i - 1, i) if 0 <= j < len(peaks) - 1]
    n_max, n_min = float(x[peaks[i]]), float(np.mean(mins))
    return len(peaks), (n_max - n_min) / (n_max + n_min)
