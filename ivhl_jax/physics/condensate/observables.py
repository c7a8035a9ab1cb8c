"""Observables of a Gross–Pitaevskii state: norm, energy parts, chemical potential, virial residual, L_z,
vortex charges and positions, and the family's ``observe(state, params)``.

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`). ψ has the grid's shape
(``indexing="ij"``); :func:`norm` also takes leading batch axes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Inexact, Int

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.physics.condensate.dipolar import DipolarSystem, dipolar_gp_energy
from ivhl_jax.physics.condensate.mixture import (
    MixtureSystem,
    Spin1System,
    component_norms,
    magnetization,
    mixture_energy,
    overlap,
    spin1_energy,
)
from ivhl_jax.physics.condensate.system import GPSystem, Grid, check_system

# Every condensate system the family's doors (strang, observe, energy, ground_state) take.
SYSTEMS = (GPSystem, MixtureSystem, Spin1System, DipolarSystem)

__all__ = [
    "observe",
    "norm",
    "normalize",
    "density",
    "phase",
    "angular_momentum",
    "energy",
    "chemical_potential",
    "virial_residual",
    "residual",
    "vortex_charges",
    "vortex_positions",
]


def observe(psi: Inexact[Array, "*state"], params: Any) -> dict[str, Float[Array, ""]]:
    """The family's observable for :func:`ivhl_jax.numerics.rollout.trajectory`, for every system
    :func:`~ivhl_jax.physics.condensate.strang` steps: the norm N = ∫|ψ|² dV and the energy parts ``energy_<part>``
    of :func:`energy` (scalars, ħω₀), plus what the system conserves or shows:

    - :class:`GPSystem`: ⟨L_z⟩ as ``lz`` (ħ) on a 2-D or 3-D grid;
    - :class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem`: each N_i as ``norm_1`` … ``norm_C`` and, for two
      components, their ``overlap`` Λ = (∫n₁n₂)²/(∫n₁²∫n₂²) (1 miscible, → 0 separated);
    - :class:`~ivhl_jax.physics.condensate.mixture.Spin1System`: the magnetisation M = ∫F_z dV as ``magnetization``;
    - :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem`: nothing more (``energy_dipolar`` is a part).

    ``params`` is the stepper's params (``condensate.strang(system, dt).params``; its ``system`` is read).
    ``trajectory(stepper, psi, steps, observe=condensate.observe)`` compiles once per shape.
    """
    system = getattr(params, "system", None)
    if not isinstance(system, SYSTEMS):
        raise TypeError(
            f"params must be the params of a condensate stepper (condensate.strang(system, dt).params), "
            f"got {type(params).__name__}"
        )
    e = energy(psi, system)
    parts = {f"energy_{k}": v for k, v in e.items()}
    if isinstance(system, MixtureSystem):
        n = component_norms(psi, system.grid)
        obs = {"norm": jnp.sum(n), **{f"norm_{i + 1}": n[i] for i in range(system.n_components)}, **parts}
        if system.n_components == 2:
            obs["overlap"] = overlap(psi, system.grid)
        return obs
    if isinstance(system, Spin1System):
        n = jnp.sum(component_norms(psi, system.grid))
        return {"norm": n, "magnetization": magnetization(psi, system.grid), **parts}
    obs = {"norm": norm(psi, system.grid), **parts}
    if isinstance(system, GPSystem) and system.grid.ndim >= 2:
        obs["lz"] = angular_momentum(psi, system)
    return obs


def _grid_of(x: Any) -> Grid:
    if isinstance(x, GPSystem):
        return x.grid
    if isinstance(x, Grid):
        return x
    raise TypeError(f"expected a Grid or GPSystem, got {type(x).__name__}")


def check_field(psi: Any, grid: Grid, name: str = "psi", *, batched: bool = False) -> jax.Array:
    """``psi`` as an array on ``grid``: an inexact dtype, the grid's shape as its trailing axes (leading batch
    axes only when ``batched``), no NaN/inf (checked for concrete values; tracers pass)."""
    # (a field spread over several processes has no host copy: it was checked before it was placed)
    arr = check_array(psi, name, kind="inexact", finite=distributed_fft.host_readable(psi))
    tail = tuple(arr.shape[arr.ndim - grid.ndim :]) if arr.ndim >= grid.ndim else None
    if tail != tuple(grid.shape) or (not batched and arr.ndim != grid.ndim):
        want = ("(..., " if batched else "(") + ", ".join(map(str, grid.shape)) + ")"
        raise ValueError(f"{name} must have shape {want} (the grid's), got {tuple(arr.shape)}")
    return arr


def norm(psi: Inexact[Array, "*batch_and_grid"], grid: Grid | GPSystem) -> Float[Array, "*batch"]:
    """N = ∫|ψ|² dV (sum over the last grid.ndim axes, so batched ψ works)."""
    grid = _grid_of(grid)
    psi = check_field(psi, grid, batched=True)
    axes = tuple(range(psi.ndim - grid.ndim, psi.ndim))
    return jnp.sum(psi.real * psi.real + psi.imag * psi.imag, axis=axes) * grid.cell_volume


def normalize(psi: Inexact[Array, "*shape"], grid: Grid | GPSystem, n: Any = 1.0) -> Inexact[Array, "*shape"]:
    """ψ scaled so that ∫|ψ|² dV = n (n > 0; a ψ that is zero everywhere cannot be normalised)."""
    psi = check_field(psi, _grid_of(grid), batched=True)
    check_scalar(n, "n", positive=True)
    current = norm(psi, grid)
    if is_concrete(current) and not bool(np.all(np.asarray(current) > 0)):
        raise ValueError("psi is zero everywhere (norm 0), so it cannot be normalised; pass a nonzero psi")
    return psi * jnp.sqrt(jnp.asarray(n, psi.real.dtype) / current).astype(psi.real.dtype)


def density(psi: Inexact[Array, "*shape"]) -> Float[Array, "*shape"]:
    """|ψ|² (particles per unit volume)."""
    psi = check_array(psi, "psi", kind="numeric", finite=True)
    return psi.real * psi.real + psi.imag * psi.imag


def phase(psi: Inexact[Array, "*shape"]) -> Float[Array, "*shape"]:
    """arg ψ in (−π, π]."""
    return jnp.angle(check_array(psi, "psi", kind="numeric", finite=True))


def _fftn(psi: jax.Array, layout: Any) -> jax.Array:
    """F ψ over the grid; with a system's layout, the distributed FFT (the spectrum in its k-space blocks)."""
    return jnp.fft.fftn(psi) if layout is None else distributed_fft.fftn(psi, layout)[0]


def _deriv(psi_k: jax.Array, grid: Grid, axis: int, layout: Any = None) -> jax.Array:
    k = jnp.asarray(grid._bcast(grid.wavenumbers[axis], axis), psi_k.real.dtype)
    return jnp.fft.ifftn(1j * k * psi_k) if layout is None else distributed_fft.ifftn(1j * k * psi_k, layout)


def angular_momentum(psi: Inexact[Array, "*grid"], grid: Grid | GPSystem) -> Float[Array, ""]:
    """⟨L_z⟩ = ∫ ψ* (−i)(x ∂_y − y ∂_x) ψ dV (spectral derivatives; real). Given a GPSystem with a layout, the
    transforms are the distributed FFT's."""
    layout = getattr(grid, "layout", None)
    grid = _grid_of(grid)
    if grid.ndim < 2:
        raise ValueError("angular_momentum needs a 2D or 3D grid")
    psi = check_field(psi, grid)
    lz = _lz(_fftn(psi, layout), grid, layout)
    return jnp.sum(jnp.conj(psi) * lz).real * grid.cell_volume


def _lz(psi_k: jax.Array, grid: Grid, layout: Any) -> jax.Array:
    """L_z ψ = −i(x ∂_y − y ∂_x)ψ from ψ's spectrum (spectral derivatives)."""
    rdt = psi_k.real.dtype
    x = jnp.asarray(grid._bcast(grid.coords[0], 0), rdt)
    y = jnp.asarray(grid._bcast(grid.coords[1], 1), rdt)
    return -1j * (x * _deriv(psi_k, grid, 1, layout) - y * _deriv(psi_k, grid, 0, layout))


def energy(psi: Inexact[Array, "*state"], system: Any) -> dict[str, Float[Array, ""]]:
    """The energy parts of ψ (ħω₀; totals, not per particle) for every condensate system, each with ``total``:

    - :class:`GPSystem`: E[ψ] = ∫ [½|∇ψ|² + V|ψ|² + ½g|ψ|⁴] dV − Ω⟨L_z⟩ as ``kinetic``, ``trap``, ``interaction``,
      ``rotation``; the kinetic part spectral, ½ Σ_k k²|ψ̂_k|² dV / N_points (Parseval);
    - :class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem` (ψ of shape (C, *grid)): ``kinetic``, ``trap``,
      ``interaction`` (½ Σ_ij g_ij ∫|ψ_i|²|ψ_j|²);
    - :class:`~ivhl_jax.physics.condensate.mixture.Spin1System` (ψ of shape (3, *grid)): ``kinetic``, ``trap``,
      ``zeeman``, ``density`` (c₀), ``spin`` (c₂);
    - :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem`: ``kinetic``, ``trap``, ``interaction``
      (contact), ``dipolar`` (½∫Φ_dd|ψ|²).
    """
    if isinstance(system, MixtureSystem):
        return mixture_energy(psi, system)
    if isinstance(system, Spin1System):
        return spin1_energy(psi, system)
    if isinstance(system, DipolarSystem):
        return dipolar_gp_energy(psi, system)
    if not isinstance(system, GPSystem):
        raise TypeError(
            f"system must be a condensate system (GPSystem, MixtureSystem, Spin1System or DipolarSystem), got "
            f"{type(system).__name__}"
        )
    grid = system.grid
    psi = check_field(psi, grid)
    rdt = psi.real.dtype
    psi_k = _fftn(psi, system.layout)
    k2 = jnp.asarray(grid.k_squared(), rdt)
    dv = grid.cell_volume
    ekin = 0.5 * jnp.sum(k2 * density(psi_k)) * dv / grid.size
    rho = density(psi)
    etrap = jnp.sum(jnp.asarray(system.potential, rdt) * rho) * dv
    eint = 0.5 * jnp.asarray(system.g, rdt) * jnp.sum(rho * rho) * dv
    if system.rotating:
        erot = -jnp.asarray(system.omega_rot, rdt) * angular_momentum(psi, system)
    else:
        erot = jnp.zeros((), rdt)
    return {"kinetic": ekin, "trap": etrap, "interaction": eint, "rotation": erot, "total": ekin + etrap + eint + erot}


def _scalar_gp(system: Any, routine: str) -> GPSystem:
    """``system`` when it is a :class:`GPSystem`; another condensate system is refused in one line naming it."""
    if isinstance(system, SYSTEMS) and not isinstance(system, GPSystem):
        raise TypeError(f"{routine} applies to a scalar GPSystem, not to a {type(system).__name__}")
    return check_system(system)


def chemical_potential(psi: Inexact[Array, "*grid"], system: GPSystem) -> Float[Array, ""]:
    """μ = (E_kin + E_trap + 2E_int + E_rot)/N (the eigenvalue of the GP operator for a stationary ψ); a scalar
    GP system's only (a mixture has one μ_i per component)."""
    e = energy(psi, _scalar_gp(system, "chemical_potential"))
    return (e["kinetic"] + e["trap"] + 2 * e["interaction"] + e["rotation"]) / norm(psi, system.grid)


def residual(psi: Inexact[Array, "*grid"], system: GPSystem) -> Float[Array, ""]:
    """The relative residual ‖Hψ − μψ‖ / ‖Hψ‖ of the GP operator H = −½∇² + V + g|ψ|² − Ω L_z, μ = ⟨ψ, Hψ⟩/⟨ψ, ψ⟩
    (2-norms over the grid; 0 for a stationary state of the grid's H; spectral derivatives)."""
    system = _scalar_gp(system, "residual")
    grid, layout = system.grid, system.layout
    psi = check_field(psi, grid)
    psi = psi.astype(jnp.result_type(psi.dtype, jnp.complex64))
    rdt = psi.real.dtype
    psi_k = _fftn(psi, layout)
    half_k2 = jnp.asarray(0.5 * grid.k_squared(), rdt)
    lap = jnp.fft.ifftn(half_k2 * psi_k) if layout is None else distributed_fft.ifftn(half_k2 * psi_k, layout)
    h = lap + (jnp.asarray(system.potential, rdt) + jnp.asarray(system.g, rdt) * density(psi)) * psi
    if system.rotating:
        h = h - jnp.asarray(system.omega_rot, rdt) * _lz(psi_k, grid, layout)
    mu = jnp.sum(jnp.conj(psi) * h).real / jnp.sum(density(psi))
    return jnp.sqrt(jnp.sum(density(h - mu * psi)) / jnp.sum(density(h)))


def virial_residual(psi: Inexact[Array, "*grid"], system: GPSystem) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Virial residual r = 2E_kin − 2E_trap + d·E_int for a harmonic trap (0 for stationary states).

    Returns (r, r / (2E_kin + 2E_trap + d|E_int|)), the absolute and relative residual.
    """
    e = energy(psi, _scalar_gp(system, "virial_residual"))
    d = system.grid.ndim
    r = 2 * e["kinetic"] - 2 * e["trap"] + d * e["interaction"]
    return r, r / (2 * e["kinetic"] + 2 * e["trap"] + d * jnp.abs(e["interaction"]))


def vortex_charges(
    psi: Inexact[Array, "x y"], grid: Grid, *, min_density: float = 0.05, window: int = 4
) -> Int[Array, "x-1 y-1"]:
    """Plaquette winding numbers of a 2D ψ inside the condensate.

    Uses :func:`ivhl_jax.physics.fields.vortex_map`; returns int32 (nx−1, ny−1). A plaquette counts when the
    mean density over the (2·window + 2)² cells around it is ≥ ``min_density``·max|ψ|²: this keeps
    real vortices (whose own core is empty) and drops the "ghost" phase singularities of the
    near-empty region outside a trapped condensate. ``grid``: the 2-D grid of ψ, or a 3-D grid whose (x, y)
    plane ψ is (a z-slice). Sub-grid positions, periodic plaquettes and batches over time:
    :func:`ivhl_jax.physics.condensate.vortices`.
    """
    from ivhl_jax.physics import fields

    grid = _grid_of(grid)
    psi = check_array(psi, "psi", kind="numeric", finite=True)
    if psi.ndim != 2:
        raise ValueError(f"vortex_charges needs a 2D psi (take a z-slice in 3D), got shape {psi.shape}")
    if grid.ndim < 2 or tuple(psi.shape) != grid.shape[:2]:
        raise ValueError(
            f"psi of shape {tuple(psi.shape)} does not match the grid {grid.shape}: pass the 2-D grid of "
            "psi (or the 3-D grid of which psi is a z-slice)"
        )
    check_scalar(min_density, "min_density", minimum=0.0, maximum=1.0)
    check_scalar(window, "window", integer=True, nonnegative=True)
    w = fields.vortex_map(psi)
    rho = density(psi)
    k = 2 * int(window) + 2
    local_mean = jax.lax.reduce_window(rho, 0.0, jax.lax.add, (k, k), (1, 1), ((window, window), (window, window))) / (
        k * k
    )
    return jnp.where(local_mean >= min_density * jnp.max(rho), w, 0).astype(jnp.int32)


def vortex_positions(
    psi: Inexact[Array, "x y"], grid: Grid, *, min_density: float = 0.05, window: int = 4
) -> tuple[Float[np.ndarray, "m 2"], Int[np.ndarray, " m"]]:
    """Vortex positions (M, 2) (plaquette centres, trap units) and charges (M,) of a 2D ψ (not jittable)."""
    w = np.asarray(vortex_charges(psi, grid, min_density=min_density, window=window))
    ix, iy = np.nonzero(w)
    x, y = grid.coords[0], grid.coords[1]
    dx, dy = grid.dx[0], grid.dx[1]
    return np.stack([x[ix] + dx / 2, y[iy] + dy / 2], axis=-1), w[ix, iy]
