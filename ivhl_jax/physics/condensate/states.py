"""Initial and analytic states of the Gross–Pitaevskii equation: a Gaussian guess, bright and dark solitons,
the Thomas–Fermi limit and imprinted vortices.

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact, Int, Real

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.physics.condensate.observables import check_field
from ivhl_jax.physics.condensate.system import GPSystem, Grid, check_system

__all__ = [
    "gaussian",
    "thomas_fermi_mu",
    "thomas_fermi_density",
    "bright_soliton",
    "dark_soliton_pair",
    "imprint_vortices",
]


def gaussian(
    grid: Grid,
    n: float = 1.0,
    width: float | Sequence[float] = 1.0,
    center: Sequence[float] | None = None,
    *,
    dtype: Any = jnp.complex64,
) -> Inexact[Array, "*grid"]:
    """Normalised Gaussian exp(−Σ(x_i − c_i)²/(2w_i²)) with ∫|ψ|² = n (an initial guess).

    ``width``: one positive number or one per axis; ``center``: one coordinate per axis (default the origin).
    """
    # NumPy throughout (a host-built constant, also when called inside jit, where jnp would make tracers).
    check_scalar(n, "n", positive=True)
    try:
        w = np.asarray(width, np.float64)
        c = np.zeros(grid.ndim) if center is None else np.asarray(center, np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"width and center must be numbers or sequences of numbers, got {width!r}, {center!r}") from e
    if w.ndim > 1 or (w.ndim == 1 and w.shape != (grid.ndim,)) or not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError(f"width must be a positive number or {grid.ndim} positive numbers (one per axis), got {width}")
    w = np.broadcast_to(w, (grid.ndim,))
    if c.shape != (grid.ndim,) or not np.all(np.isfinite(c)):
        raise ValueError(f"center must have {grid.ndim} finite coordinates (one per axis), got {center}")
    arg = np.zeros(grid.shape)
    for a, x in enumerate(grid.coords):
        arg = arg + grid._bcast((x - c[a]) ** 2 / (2 * w[a] ** 2), a)
    psi = np.exp(-arg)
    psi = psi * np.sqrt(n / (np.sum(psi**2) * grid.cell_volume))
    return jnp.asarray(psi, dtype)


def thomas_fermi_mu(g: float, n: float, omega: float = 1.0, dim: int = 1) -> float:
    """Thomas–Fermi chemical potential of an isotropic harmonic trap (from n = (μ − V)/g).

    1D μ = (3gNω/(4√2))^{2/3};  2D μ = ω√(gN/π);  3D μ = (15gNω³/(16√2 π))^{2/5}. Needs g, n, ω > 0.
    """
    check_scalar(g, "g", positive=True)
    check_scalar(n, "n", positive=True)
    check_scalar(omega, "omega", positive=True)
    if dim == 1:
        return (3 * g * n * omega / (4 * math.sqrt(2))) ** (2 / 3)
    if dim == 2:
        return omega * math.sqrt(g * n / math.pi)
    if dim == 3:
        return (15 * g * n * omega**3 / (16 * math.sqrt(2) * math.pi)) ** 0.4
    raise ValueError(f"dim must be 1, 2 or 3, got {dim}")


def thomas_fermi_density(system: GPSystem, mu: float) -> Float[Array, "*grid"]:
    """n_TF = max(μ − V, 0)/g (g > 0)."""
    check_system(system)
    check_scalar(mu, "mu")
    if is_concrete(system.g) and not float(np.asarray(system.g)) > 0:
        raise ValueError(f"system.g must be > 0 for a Thomas-Fermi density, got {float(np.asarray(system.g))}")
    return jnp.maximum(mu - system.potential, 0.0) / system.g


def bright_soliton(
    grid: Grid,
    n: float,
    g: float,
    position: float = 0.0,
    velocity: float = 0.0,
    t: float = 0.0,
    *,
    dtype: Any = jnp.complex64,
) -> Inexact[Array, " x"]:
    """Exact 1D bright soliton of i∂ψ/∂t = −½ψ'' + g|ψ|²ψ with g = −a < 0, ∫|ψ|² = n (V = 0).

    ψ = (n√a/2) sech(a n (x − x₀ − vt)/2) exp(i v x − i(v²/2 + μ)t), μ = −a²n²/8. The periodic box
    must be much longer than the width 2/(a n).
    """
    if grid.ndim != 1:
        raise ValueError("bright_soliton needs a 1D grid")
    if not g < 0:
        raise ValueError(f"g must be < 0 (attractive) for a bright soliton, got {g}")
    check_scalar(n, "n", positive=True)
    for value, label in ((position, "position"), (velocity, "velocity"), (t, "t")):
        check_scalar(value, label)
    a = -g
    x = grid.coords[0]
    xr = (x - position - velocity * t + grid.length[0] / 2) % grid.length[0] - grid.length[0] / 2
    mu = -(a**2) * n**2 / 8
    psi = (n * math.sqrt(a) / 2) / np.cosh(a * n * xr / 2) * np.exp(1j * (velocity * x - (velocity**2 / 2 + mu) * t))
    return jnp.asarray(psi, dtype)


def dark_soliton_pair(
    grid: Grid, n0: float, g: float, separation: float, velocity: float, t: float = 0.0, *, dtype: Any = jnp.complex64
) -> Inexact[Array, " x"]:
    """Two gray solitons on a uniform background n₀ (1D, V = 0, g > 0), periodic-compatible.

    One soliton at −separation/2 moving with +v, its mirror image at +separation/2 moving with −v:
    ψ = −√n₀ f(x + s/2 − vt) f(−x + s/2 − vt) e^{−iμt}, f(u) = iv/c + √(1−v²/c²) tanh(√(1−v²/c²) u/ξ),
    c = √(g n₀), ξ = 1/√(g n₀), μ = g n₀. Exact for each soliton; the product is exact up to
    e^{−2·separation/ξ}-small overlap. Density minimum n₀ v²/c².
    """
    if grid.ndim != 1:
        raise ValueError("dark_soliton_pair needs a 1D grid")
    if not g > 0:
        raise ValueError(f"g must be > 0 for dark solitons, got {g}")
    check_scalar(n0, "n0", positive=True)
    check_scalar(separation, "separation")
    check_scalar(velocity, "velocity")
    check_scalar(t, "t")
    c = math.sqrt(g * n0)
    if not abs(velocity) < c:
        raise ValueError(f"|velocity| must be below the sound speed c = {c:.4g}, got {velocity}")
    xi = 1 / c
    gam = math.sqrt(1 - velocity**2 / c**2)
    x = grid.coords[0]

    def f(u):
        # Not wrapped: the product tends to −1 at both box ends (periodic to e^{−(L/2 − |x_s|)/ξ}).
        return 1j * velocity / c + gam * np.tanh(gam * u / xi)

    psi = -math.sqrt(n0) * f(x + separation / 2 - velocity * t) * f(-x + separation / 2 - velocity * t)
    return jnp.asarray(psi * np.exp(-1j * g * n0 * t), dtype)


def imprint_vortices(
    psi: Complex[Array, "*grid"],
    grid: Grid,
    centers: Real[ArrayLike, "v d"],
    charges: Int[ArrayLike, " v"],
    *,
    core_size: float = 0.0,
) -> Complex[Array, "*grid"]:
    """Multiply ψ by the phase windings Π_v exp(i q_v θ_v) about z (via :func:`ivhl_jax.physics.fields.vortex`).

    ``centers``: (V, 2) positions in the (x, y) plane (or (V, 3), z ignored); ``charges``: (V,) ints.
    ``core_size`` > 0 also multiplies by the core profile of ``fields.vortex`` (zero on the axis);
    with 0 only the phase is imprinted and imaginary-time relaxation forms the core.
    """
    from ivhl_jax.physics import fields

    if grid.ndim < 2:
        raise ValueError("imprint_vortices needs a 2D or 3D grid")
    psi = check_field(psi, grid)
    check_scalar(core_size, "core_size", nonnegative=True)
    centers = check_array(centers, "centers", ndim=2, kind="numeric", finite=True)
    if centers.shape[1] not in (2, grid.ndim):
        want = " or ".join(f"(V, {d})" for d in sorted({2, grid.ndim}))
        raise ValueError(f"centers must have shape {want}, got {tuple(centers.shape)}")
    charges = check_array(charges, "charges", ndim=1, kind="integer")
    if centers.shape[0] != charges.shape[0]:
        raise ValueError(f"centers ({centers.shape[0]}) and charges ({charges.shape[0]}) must have the same length")
    rdt = psi.real.dtype
    if centers.shape[1] != grid.ndim:
        pad = jnp.zeros((centers.shape[0], grid.ndim - centers.shape[1]), rdt)
        centers = jnp.concatenate([centers.astype(rdt)[:, : min(centers.shape[1], grid.ndim)], pad], axis=1)
    pts = grid.points(rdt)
    w = fields.vortex(pts, centers.astype(rdt), charges, core_size=max(float(core_size), 1e-12))
    w = w.reshape(grid.shape)
    if not core_size:
        w = w / jnp.maximum(jnp.abs(w), jnp.finfo(rdt).tiny)
    return psi * w.astype(psi.dtype)
