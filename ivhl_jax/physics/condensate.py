"""Gross–Pitaevskii condensates: a Strang split-step Fourier solver in 1, 2 and 3 dimensions.

Units: dimensionless, ħ = m = 1; lengths in trap units a_ho = √(ħ/(mω₀)), times in 1/ω₀, energies
in ħω₀. The wave function is normalised to the particle number, ∫|ψ|² dV = N, and solves

    i ∂ψ/∂t = [−½∇² + V(r) + g|ψ|² − Ω L_z] ψ,        L_z = −i (x ∂_y − y ∂_x),

on a periodic box centred at 0 (:class:`Grid`). Arrays use ``indexing="ij"``: array axis i is
coordinate i (x, y, z).

Time stepping (second-order Strang splitting, one step of size dt)::

    ψ ← e^{−i dt/2 (V + g|ψ|²)} ψ  →  kinetic(dt)  →  ψ ← e^{−i dt/2 (V + g|ψ|²)} ψ

The potential half-steps are exact (|ψ| does not change under them); without rotation the
kinetic step is exact in Fourier space, e^{−i k² dt/2}. With rotation the kinetic + rotation part
½p² − Ω L_z is split (ADI-type, as in Bao–Wang 2006 / GPELab) into two pieces that are each
diagonal after a 1D (resp. (d−1)-D) FFT:

    A = ½p_x² + Ω y p_x           (FFT along x at fixed y: phase ½k_x² + Ω y k_x)
    B = ½p_y² + ½p_z² − Ω x p_y   (FFT along y, z at fixed x: phase ½k_y² + ½k_z² − Ω x k_y)

applied symmetrically as A(dt/2) B(dt) A(dt/2), so the whole step stays second order and unitary.
Imaginary time (``imaginary=True``) replaces −i dt by −dt in every factor and projects ψ back to
its norm before the step, after the kinetic factor and after the step (normalised gradient flow).
The projection before the second nonlinear half-step matters: without it g|ψ|² is evaluated at the
wrong norm and the fixed point's virial residual is 3e-2 (1D, gN = 1000, dt = 2e-3); with it 1.3e-5.

Every factor e^{−iθ} is applied as ψ + ψ·(e^{−iθ} − 1) (see :func:`phase_factor_m1`): a float32
e^{−iθ} has |e^{−iθ}|² − 1 ~ ±1e-7 for the small θ of occupied modes, the same at every step, which
would add up to a norm drift of ~1e-3 over 10⁴ steps; the "minus one" form removes that bias.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact, Int, Real

from ivhl_jax.core.precision import Policy, complex_state_dtype, physics_policy
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics.fastmath import sincos
from ivhl_jax.numerics.rollout import Stepper, rollout, trajectory
from ivhl_jax.numerics.spectral import check_backend, host_factor, spectral_multiply

__all__ = [
    "Grid", "GPSystem", "harmonic", "step", "evolve", "ground_state", "norm", "normalize", "energy",
    "chemical_potential", "virial_residual", "density", "phase", "angular_momentum", "vortex_charges",
    "vortex_positions", "imprint_vortices", "dark_soliton_pair", "bright_soliton", "thomas_fermi_mu",
    "thomas_fermi_density", "gaussian", "split_step", "phase_factor_m1", "strang", "KineticPlan", "StrangParams",
    "make_plan", "with_policy", "strang_step_real", "strang_step_real_projected", "strang_step_imaginary",
    "default_observables",
]


# ----------------------------------------------------------------------------------------------
# Grid
# ----------------------------------------------------------------------------------------------
class Grid(struct.PyTreeNode):
    """A periodic box centred at the origin: ``shape`` points over side ``length`` per axis.

    Coordinates x_j = −L/2 + j·dx, j = 0..n−1 (dx = L/n, the point L/2 is the image of −L/2);
    wavenumbers k = 2π·fftfreq(n, dx). The grid is static (hashable, no array leaves), so it can be
    closed over or passed through ``jit``/``vmap`` freely.
    """

    shape: tuple[int, ...] = struct.field(pytree_node=False)
    length: tuple[float, ...] = struct.field(pytree_node=False)

    @classmethod
    def uniform(cls, shape: int | Sequence[int], length: float | Sequence[float]) -> Grid:
        """Grid with ``shape`` points (int or 1–3 ints) over box side(s) ``length`` (trap units)."""
        entries: tuple[Any, ...] = (shape,) if np.ndim(shape) == 0 else tuple(cast(Sequence[int], shape))
        for s in entries:
            check_scalar(s, "shape", integer=True)  # 16.7 points is an error, not 16
        shape_t = tuple(int(s) for s in entries)
        if np.ndim(length) == 0:
            length_t: tuple[Any, ...] = (length,) * len(shape_t)
        else:
            length_t = tuple(cast(Sequence[float], length))
        for v in length_t:
            check_scalar(v, "length", positive=True)
        return cls(shape=shape_t, length=tuple(float(v) for v in length_t))

    def __post_init__(self):
        # Also runs for Grid(shape=..., length=...) built directly (the grid is static: cheap, no arrays).
        shape, length = self.shape, self.length
        if not isinstance(shape, tuple) or not all(isinstance(s, (int, np.integer)) for s in shape):
            raise TypeError(f"shape must be a tuple of ints, got {shape!r}")
        if not 1 <= len(shape) <= 3:
            raise ValueError(f"shape must have 1, 2 or 3 entries (dimensions), got {shape}")
        if any(s < 2 for s in shape):
            raise ValueError(f"shape entries must be >= 2 points per axis, got {shape}")
        if not isinstance(length, tuple) or len(length) != len(shape):
            raise ValueError(f"length must be a number or have {len(shape)} entries to match shape, got {length!r}")
        for v in length:
            check_scalar(v, "length", positive=True)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def dx(self) -> tuple[float, ...]:
        return tuple(L / n for L, n in zip(self.length, self.shape))

    @property
    def cell_volume(self) -> float:
        """dV = Π dx_i (the quadrature weight of every grid point)."""
        return float(np.prod(self.dx))

    @property
    def coords(self) -> tuple[np.ndarray, ...]:
        """1D coordinate arrays (float64 NumPy), one per axis."""
        return tuple(-L / 2 + np.arange(n) * (L / n) for L, n in zip(self.length, self.shape))

    @property
    def wavenumbers(self) -> tuple[np.ndarray, ...]:
        """1D angular wavenumber arrays k = 2π fftfreq(n, dx) (float64 NumPy), one per axis."""
        return tuple(2 * np.pi * np.fft.fftfreq(n, d) for n, d in zip(self.shape, self.dx))

    def mesh(self, dtype: Any = jnp.float32) -> tuple[Float[Array, "*grid"], ...]:
        """Full coordinate arrays X, Y, Z of shape ``self.shape`` (indexing="ij")."""
        return tuple(jnp.asarray(m, dtype) for m in np.meshgrid(*self.coords, indexing="ij"))

    def points(self, dtype: Any = jnp.float32) -> Float[Array, "points d"]:
        """All grid points as an (N, d) array in C order (reshape results to ``self.shape``)."""
        return jnp.stack([m.reshape(-1) for m in self.mesh(dtype)], axis=-1)

    def k_squared(self) -> Float[np.ndarray, "*grid"]:
        """|k|² on the Fourier grid (float64 NumPy, shape ``self.shape``)."""
        return _k2(self)

    def _bcast(self, v: np.ndarray, axis: int) -> np.ndarray:
        shp = [1] * self.ndim
        shp[axis] = -1
        return v.reshape(shp)


@functools.lru_cache(maxsize=64)
def _k2(grid: Grid) -> np.ndarray:
    out = np.zeros(grid.shape)
    for a, k in enumerate(grid.wavenumbers):
        out = out + grid._bcast(k, a) ** 2
    return out


def harmonic(grid: Grid, omega: float | Sequence[float] = 1.0, *, dtype: Any = jnp.float32) -> Float[Array, "*grid"]:
    """Harmonic trap V = ½ Σ_i ω_i² x_i² on ``grid`` (ω a number or one per axis; anisotropic allowed)."""
    try:
        om = np.asarray(omega, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"omega must be a real number or one per axis, got {omega!r}") from None
    if om.ndim == 0:
        om = np.broadcast_to(om, (grid.ndim,))
    if om.shape != (grid.ndim,):
        raise ValueError(f"omega must be a number or have {grid.ndim} entries (one per axis), got {omega}")
    for w in om:
        check_scalar(w, "omega")  # finite (float64): ω = inf would give an inf/NaN potential
    if not np.all(om >= 0):
        raise ValueError(f"omega must be >= 0, got {omega}")
    v = np.zeros(grid.shape)
    for a, x in enumerate(grid.coords):
        v = v + 0.5 * om[a] ** 2 * grid._bcast(x, a) ** 2
    return jnp.asarray(v, dtype)


# ----------------------------------------------------------------------------------------------
# System
# ----------------------------------------------------------------------------------------------
class GPSystem(struct.PyTreeNode):
    """A Gross–Pitaevskii problem: grid, external potential V (real, grid-shaped), coupling g, rotation Ω.

    ``potential``, ``g`` and ``omega_rot`` are pytree leaves (they can be traced, differentiated and
    vmapped, e.g. an ensemble of g values); the grid is static. The real dtype of ``potential`` sets
    the working precision: float32 → complex64 (default), float64 → complex128 (needs x64).
    The rotation term −Ω L_z needs a 2D or 3D grid (rotation about z).
    """

    grid: Grid = struct.field(pytree_node=False)
    potential: Any
    g: Any = 0.0
    omega_rot: Any = 0.0
    # FFT backend of the kinetic step: "xla" (portable, shardable) or "ducc" (CPU host FFT, ~1.6x faster
    # steps at 128³ on 2 cores; optional GPL dependency), see ivhl_jax.numerics.spectral.
    fft: str = struct.field(pytree_node=False, default="xla")

    def __post_init__(self):
        # A concrete Ω = 0 is stored as None (an empty pytree node), so that "no rotation" stays
        # static under jit and the cheaper rotation-free kinetic step is selected at trace time.
        om = self.omega_rot
        if om is not None and not isinstance(om, jax.core.Tracer) and isinstance(om, (int, float, np.ndarray,
                                                                                       np.generic, jax.Array)):
            if np.ndim(om) == 0 and float(np.asarray(om)) == 0.0:
                object.__setattr__(self, "omega_rot", None)
        check_backend(self.fft)
        # Validate only genuine user input; pytree reconstruction may pass tracers or placeholders.
        if isinstance(self.potential, list):
            object.__setattr__(self, "potential", check_array(self.potential, "potential", kind="floating"))
        for name in ("g", "omega_rot"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)):
                raise TypeError(f"{name} must be a real number (or array), got {type(v).__name__} {v!r}")
            if isinstance(v, (int, float, np.ndarray, np.generic, jax.Array)) and is_concrete(v):
                arr = np.asarray(v)
                if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_) or np.iscomplexobj(arr):
                    raise TypeError(f"{name} must be a real number, got dtype {arr.dtype}")
                if not np.all(np.isfinite(arr)):
                    raise ValueError(f"{name} must be finite, got {v}")
        pot = self.potential
        if isinstance(pot, (np.ndarray, jax.Array)) and is_concrete(pot) and isinstance(self.grid, Grid):
            if tuple(pot.shape) != self.grid.shape:
                raise ValueError(f"potential must have the grid's shape {self.grid.shape}, got {tuple(pot.shape)}")
            if not jnp.issubdtype(pot.dtype, jnp.floating):
                raise TypeError(f"potential must be real (float32/float64), got {pot.dtype}")
            check_array(pot, "potential", finite=True)
            om = self.omega_rot
            if om is not None and self.grid.ndim < 2:
                raise ValueError("omega_rot (rotation about z) needs a 2D or 3D grid; use omega_rot=0.0 in 1D")

    @property
    def real_dtype(self):
        return jnp.result_type(self.potential)

    @property
    def complex_dtype(self):
        return jnp.result_type(self.real_dtype, jnp.complex64)

    @property
    def rotating(self) -> bool:
        """False when Ω was given as a concrete 0 (then the cheaper rotation-free kinetic step is used)."""
        return self.omega_rot is not None


# ----------------------------------------------------------------------------------------------
# Phase factors
# ----------------------------------------------------------------------------------------------
def phase_factor_m1(theta: Any, imaginary: bool, dtype: Any) -> Any:
    """The propagator factor minus one, e^{−iθ} − 1 (real time) or e^{−θ} − 1 (imaginary time).

    Steps apply a factor as ``p + p·(f − 1)`` instead of ``p·f``. In float32, cos θ rounds to 1 or to
    1 − 6e-8 for the small θ of the occupied modes, so |f|² − 1 ~ ±1e-7 is the *same* every step and
    the norm would drift by ~1e-4 per 10⁴ steps. The small numbers −2 sin²(θ/2) − i sin θ are
    represented to full relative precision, and the final addition rounds differently each step.
    NumPy θ (trace-time constants) is evaluated in float64.
    """
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    if isinstance(theta, np.ndarray):
        if imaginary:
            return np.expm1(-theta).astype(dtype)
        s = np.sin(0.5 * theta)
        return (-2 * s * s - 1j * np.sin(theta)).astype(dtype)
    rdt = jnp.finfo(dtype).dtype
    theta_j = theta.astype(rdt)
    if imaginary:
        return jnp.expm1(-theta_j).astype(dtype)
    # One shared range reduction for sin and cos (XLA's CPU sin/cos are ~10x slower); relative
    # precision at small θ is kept because the odd polynomial is x·(1 + O(x²)).
    sj, cj = sincos(0.5 * theta_j)
    return jax.lax.complex(-2 * sj * sj, -2 * sj * cj).astype(dtype)


def _apply(p: jax.Array, f_m1: jax.Array) -> jax.Array:
    return p + p * f_m1


def split_step(psi: Complex[Array, "*shape"], local_potential: Callable[[jax.Array], jax.Array],
               kinetic: Callable[[jax.Array], jax.Array], dt: Any, imaginary: bool) -> Complex[Array, "*shape"]:
    """One Strang step e^{−dt/2 U} · K · e^{−dt/2 U} (U local, K the kinetic propagator callable).

    ``local_potential(psi)`` returns the real local energy U(r, |ψ|²) (trap + interaction, or
    m² + λ|φ|² for the GFT). Shared by the GP solver and :mod:`ivhl_jax.physics.gft`.
    """
    psi = check_array(psi, "psi", kind="complex")
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    half = 0.5 * dt

    def local(p):
        u = local_potential(p)
        rdt = u.dtype
        th = u * jnp.asarray(half, rdt)
        return _apply(p, phase_factor_m1(th, imaginary, p.dtype))

    psi = local(psi)
    psi = kinetic(psi)
    return local(psi)


# ----------------------------------------------------------------------------------------------
# Kinetic propagators (the plan: fixed factors computed once per (system, dt)) and the stepper
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _static_kinetic(grid: Grid, dt: float, imaginary: bool, dtype: str) -> np.ndarray:
    return phase_factor_m1(0.5 * dt * _k2(grid), imaginary, np.dtype(dtype))


def _rotating_axes(grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(k_x, y, k_y² + k_z² of shape (n_y[, n_z]), x and k_y broadcast to the B shape (n_x, n_y[, n_z]))."""
    x, y = grid.coords[0], grid.coords[1]
    kx, ky = grid.wavenumbers[0], grid.wavenumbers[1]
    k2_rest = np.zeros(grid.shape[1:])
    for a in range(1, grid.ndim):
        shp = [1] * (grid.ndim - 1)
        shp[a - 1] = -1
        k2_rest = k2_rest + grid.wavenumbers[a].reshape(shp) ** 2
    ky_b = ky.reshape((1, -1) + (1,) * (grid.ndim - 2))
    x_b = x.reshape((-1,) + (1,) * (grid.ndim - 1))
    return kx, y, k2_rest, x_b, ky_b


@functools.lru_cache(maxsize=32)
def _static_rotating(grid: Grid, dt: float, omega: float, imaginary: bool, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The A and B factors (minus one) for a concrete dt and Ω, in float64 NumPy cast once."""
    kx, y, k2_rest, x_b, ky_b = _rotating_axes(grid)
    th_a = 0.5 * dt * (0.5 * kx[:, None] ** 2 + omega * y[None, :] * kx[:, None])
    th_b = dt * (0.5 * k2_rest[None] - omega * x_b * ky_b)
    fa, fb = phase_factor_m1(th_a, imaginary, np.dtype(dtype)), phase_factor_m1(th_b, imaginary, np.dtype(dtype))
    return (fa[:, :, None] if grid.ndim == 3 else fa), fb


def _rotating_factor(grid: Grid, dt: float, omega: float, imaginary: bool, dtype: str, which: int) -> np.ndarray:
    return _static_rotating(grid, dt, omega, imaginary, dtype)[which]


def _concrete_float(x: Any) -> float | None:
    if is_concrete(x) and np.ndim(x) == 0:
        try:
            return float(np.asarray(x))
        except TypeError:
            return None
    return None


class KineticPlan(struct.PyTreeNode):
    """The step size and the fixed kinetic factors of one Strang step (a typed pytree).

    Attributes:
      dt: step size (scalar, real dtype of the system; traced, so a new dt never recompiles).
      kin: without rotation, e^{−i k² dt/2} − 1 (complex, grid-shaped); else None.
      rot_a: with rotation, the A-factor e^{−i dt/2 (½k_x² + Ω y k_x)} − 1, shape (n_x, n_y[, 1]).
      rot_b: with rotation, the B-factor e^{−i dt (½(k_y² + k_z²) − Ω x k_y)} − 1, shape (n_x, n_y[, n_z]).
    Imaginary time replaces −i dt by −dt. With ``fft="ducc"`` and a concrete dt (and Ω) each factor is a
    :class:`ivhl_jax.numerics.spectral.HostFactor` (the array in ``.value``; see :func:`make_plan`).
    Exactly one of ``kin`` / (``rot_a``, ``rot_b``) is set,
    fixed by the (static) pytree structure, so the step dispatches on the plan's type at trace time.
    """

    dt: Any
    kin: Any = None
    rot_a: Any = None
    rot_b: Any = None

    @property
    def rotating(self) -> bool:
        return self.kin is None


class StrangParams(struct.PyTreeNode):
    """Everything one GP Strang step reads: the system, the kinetic plan, an optional norm target.

    ``target`` (Σ|ψ|² over grid points, no dV) is the norm the projection restores; None projects
    to the norm each step starts with.
    """

    system: GPSystem
    plan: KineticPlan
    target: Any = None


def make_plan(system: GPSystem, dt: Any, imaginary: bool = False) -> KineticPlan:
    """Fixed propagator factors for steps of size dt (computed once, reused by every step).

    A concrete dt (and Ω) is evaluated in float64 NumPy and cast once; a traced dt in the working precision.
    With ``system.fft == "ducc"`` and a concrete dt (and Ω) each factor is a
    :class:`ivhl_jax.numerics.spectral.HostFactor`: the same device array plus a traced int32 key of its
    host copy, so a compiled step sends 4 bytes to the host instead of the factor (still one program for
    every dt).
    """
    grid = _check_system(system).grid
    check_scalar(dt, "dt", positive=True)
    cdt = system.complex_dtype
    rdt = system.real_dtype
    dtc = _concrete_float(dt)
    dt_leaf = jnp.asarray(dt, rdt)
    cname = np.dtype(cdt).name
    host = system.fft == "ducc"
    if not system.rotating:
        if dtc is not None:
            if host:
                return KineticPlan(dt_leaf, kin=host_factor(
                    functools.partial(_static_kinetic, grid, dtc, imaginary, cname),
                    ("gp-kinetic", grid, dtc, imaginary, cname)))
            return KineticPlan(dt_leaf, kin=jnp.asarray(_static_kinetic(grid, dtc, imaginary, cname)))
        return KineticPlan(dt_leaf, kin=phase_factor_m1(0.5 * dt_leaf * jnp.asarray(_k2(grid), rdt), imaginary, cdt))
    # A: ½kx² + Ω y kx, shape (nx, ny); B: ½(ky² + kz²) − Ω x ky, shape (nx, ny[, nz]).
    omc = _concrete_float(system.omega_rot)
    if dtc is not None and omc is not None:
        if host:
            ra, rb = (host_factor(functools.partial(_rotating_factor, grid, dtc, omc, imaginary, cname, i),
                                  ("gp-rotating", i, grid, dtc, omc, imaginary, cname)) for i in (0, 1))
            return KineticPlan(dt_leaf, rot_a=ra, rot_b=rb)
        fa, fb = _static_rotating(grid, dtc, omc, imaginary, cname)
        return KineticPlan(dt_leaf, rot_a=jnp.asarray(fa), rot_b=jnp.asarray(fb))
    kx, y, k2_rest, x_b, ky_b = _rotating_axes(grid)
    om = jnp.asarray(system.omega_rot, rdt)
    th_a = 0.5 * dt_leaf * (jnp.asarray(0.5 * kx[:, None] ** 2, rdt)
                            + om * jnp.asarray(y[None, :] * kx[:, None], rdt))
    th_b = dt_leaf * (jnp.asarray(0.5 * k2_rest[None], rdt) - om * jnp.asarray(x_b * ky_b, rdt))
    fa, fb = phase_factor_m1(th_a, imaginary, cdt), phase_factor_m1(th_b, imaginary, cdt)
    if grid.ndim == 3:
        fa = fa[:, :, None]
    return KineticPlan(dt_leaf, rot_a=jnp.asarray(fa), rot_b=jnp.asarray(fb))


def _kinetic_apply(psi: jax.Array, plan: KineticPlan, ndim: int, fft: str = "xla") -> jax.Array:
    axes = tuple(range(psi.ndim - ndim, psi.ndim))
    if not plan.rotating:
        return spectral_multiply(psi, plan.kin, axes, fft)
    psi = spectral_multiply(psi, plan.rot_a, axes[:1], fft)
    psi = spectral_multiply(psi, plan.rot_b, axes[1:], fft)
    return spectral_multiply(psi, plan.rot_a, axes[:1], fft)


def _step_plan(psi: jax.Array, system: GPSystem, plan: KineticPlan, imaginary: bool,
               project_norm: bool = False, target: jax.Array | None = None) -> jax.Array:
    rdt = system.real_dtype
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)

    def local(p):
        return pot + g * (p.real * p.real + p.imag * p.imag)

    if imaginary or project_norm:
        # A fixed target (the initial Σ|ψ|², from evolve) makes the projection self-correcting: a
        # float32 correction too small to change some elements is not lost but retried next step.
        n0 = _sumsq(psi) if target is None else jnp.asarray(target, rdt)

    def project(p):
        n1 = _sumsq(p)
        # ψ(1 + δ) with δ = √(n0/n1) − 1 = (n0 − n1)/(n1 + √(n0 n1)): a float32 scale factor near 1
        # is quantised to 6e-8, which would bias the projection by that much per step.
        delta = (n0 - n1) / (n1 + jnp.sqrt(n0 * n1))
        return p + p * delta.astype(rdt)

    def kinetic(p):
        p = _kinetic_apply(p, plan, system.grid.ndim, system.fft)
        # Imaginary time: renormalise before the second nonlinear half-step too, so that g|ψ|² is
        # evaluated at the right norm (measured: virial residual of the fixed point 3e-2 → 1.3e-5).
        return project(p) if imaginary else p

    if imaginary:
        psi = project(psi)
    out = split_step(psi, local, kinetic, plan.dt, imaginary)
    if imaginary or project_norm:
        out = project(out)
    return out


def _sumsq(psi: jax.Array) -> jax.Array:
    nd = psi.ndim
    return jnp.sum(psi.real * psi.real + psi.imag * psi.imag, axis=tuple(range(nd)), keepdims=False)


def _check_step_state(psi: Any, params: StrangParams) -> jax.Array:
    """Shape and dtype of a state handed to a step function (static facts: free under jit; no value checks,
    which :func:`strang`'s ``init`` does once)."""
    psi = check_array(psi, "psi", shape=params.system.grid.shape, kind="complex")
    return psi


# The static settings (imaginary / project_norm) select one of three module-level step functions, so
# the Stepper's step_fn (hashed by identity) is what distinguishes the compiled programs.
def strang_step_real(psi: Complex[Array, "*grid"], params: StrangParams) -> Complex[Array, "*grid"]:
    """One real-time Strang step ψ(t) → ψ(t + dt) (``step_fn`` of :func:`strang`)."""
    psi = _check_step_state(psi, params)
    return _step_plan(psi, params.system, params.plan, False)


def strang_step_real_projected(psi: Complex[Array, "*grid"], params: StrangParams) -> Complex[Array, "*grid"]:
    """Real-time Strang step followed by the norm projection (``project_norm=True``)."""
    psi = _check_step_state(psi, params)
    return _step_plan(psi, params.system, params.plan, False, True, params.target)


def strang_step_imaginary(psi: Complex[Array, "*grid"], params: StrangParams) -> Complex[Array, "*grid"]:
    """One imaginary-time (normalised gradient flow) Strang step."""
    psi = _check_step_state(psi, params)
    return _step_plan(psi, params.system, params.plan, True, False, params.target)


def _strang_init(params: StrangParams, psi: Any) -> jax.Array:
    return _check_psi(psi, params.system)


def _leaf(x: Any, dtype: Any) -> Any:
    return None if x is None else jnp.asarray(x, dtype)


def strang(system: GPSystem, dt: Any, *, imaginary: bool = False, project_norm: bool = False,
           policy: str | Policy | None = None) -> Stepper:
    """The Strang split-step stepper of the GP equation i∂ψ/∂t = [−½∇² + V + g|ψ|² − Ω L_z]ψ.

    One step of size dt (units 1/ω₀) maps ψ (complex, shape ``system.grid.shape``) to
    e^{−i dt/2 U} K(dt) e^{−i dt/2 U} ψ with U = V + g|ψ|² and K the exact kinetic (+ rotation)
    propagator (module docstring). The factors are computed once here (float64 NumPy for a concrete
    dt) and stored with dt in a :class:`KineticPlan` inside the stepper's :class:`StrangParams`
    (all traced leaves: a new dt, g, V or Ω reuses the compiled loop of
    :func:`ivhl_jax.numerics.rollout.trajectory`).

    Args:
      system: the :class:`GPSystem`.
      dt: step size (> 0).
      imaginary: imaginary-time steps (−i dt → −dt, ψ projected to its incoming norm, the
        normalised gradient flow towards the ground state).
      project_norm: real time, rescale ψ after every step to the norm it started with (removes
        complex64 FFT round-off drift; see :func:`step`). To pin the norm of a whole run, set
        ``params.target`` to Σ|ψ₀|² (as :func:`evolve` does).
      policy: None (the system's dtype: that of ``system.potential``) or a precision policy /
        preset (see :func:`with_policy`): ``"f32"`` → complex64, ``"f64"`` → complex128 (needs
        ``jax.enable_x64``); ``"bf16"`` is rejected with a ValueError naming ``policy``.

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper`; ``stepper.init(psi)`` validates and casts ψ,
      ``stepper.step(psi)`` is one pure step (jit/vmap/grad-safe).
    """
    system = with_policy(_check_system(system), policy)
    _check_dt(dt, system)
    rdt = system.real_dtype
    plan = make_plan(system, dt, imaginary)
    # g and Ω as typed arrays: a Python float and an array of the same value compile the same program.
    system = system.replace(g=_leaf(system.g, rdt), omega_rot=_leaf(system.omega_rot, rdt))
    if imaginary:
        fn, name = strang_step_imaginary, "gp-strang-imaginary"
    elif project_norm:
        fn, name = strang_step_real_projected, "gp-strang-projected"
    else:
        fn, name = strang_step_real, "gp-strang"
    return Stepper(fn, StrangParams(system, plan), init_fn=_strang_init, name=name)


# ----------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------
def _check_system(system: Any) -> GPSystem:
    if not isinstance(system, GPSystem):
        raise TypeError(f"system must be a GPSystem, got {type(system).__name__}")
    return system


def with_policy(system: GPSystem, policy: str | Policy | None) -> GPSystem:
    """``system`` with V, g and Ω in the real dtype of ``policy``'s complex state (None: unchanged).

    The solver's precision is the real dtype of the system (module docstring), so a policy is
    applied by casting the system: compute float32 → complex64 state, float64 → complex128.
    What a reduced policy cannot mean here: XLA has no complex bf16/f16 type and no bf16 FFT, so
    a bf16 policy could only round ψ to bf16 between float32 steps. Measured (bright soliton,
    1024 points, 2000 steps of dt = 1e-3, max density error relative to the peak, against the exact
    solution): bf16-rounded state 0.25, complex64 3.1e-4, complex128 5.4e-6 (the scheme's own
    O(dt²) error); see docs/guide/precision.md. So bf16/f16 anywhere in the policy is a ValueError.
    """
    if policy is None:
        return system
    cdt = complex_state_dtype(policy, routine="the Gross-Pitaevskii split-step solver")
    rdt = jnp.finfo(cdt).dtype
    return system.replace(potential=jnp.asarray(system.potential, rdt), g=_leaf(system.g, rdt),
                          omega_rot=_leaf(system.omega_rot, rdt))


def _output(psi: jax.Array, policy: str | Policy | None) -> jax.Array:
    """ψ cast to complex(output_dtype) of the policy (unchanged without one)."""
    pol = physics_policy(policy)
    return psi if pol is None else psi.astype(jnp.result_type(pol.output_dtype, jnp.complex64))


def _check_psi(psi: Any, system: GPSystem, name: str = "psi") -> jax.Array:
    psi = check_array(psi, name, shape=system.grid.shape, kind="inexact", finite=True)
    return psi.astype(system.complex_dtype)


def _check_dt(dt: Any, system: GPSystem | None = None, psi: jax.Array | None = None, name: str = "dt") -> Any:
    check_scalar(dt, name, positive=True)
    dtc = _concrete_float(dt)
    if (dtc is not None and system is not None and psi is not None and is_concrete(psi)
            and is_concrete(system.potential) and is_concrete(system.g)):
        # The local phase dt·(V + g|ψ|²) must be resolved where there are particles (empty corners
        # of the box may have any V). NumPy, not jnp: inside a jit trace jnp makes tracers.
        rho = np.abs(np.asarray(psi)) ** 2
        occupied = rho > 1e-6 * rho.max()
        u = np.asarray(system.potential) + np.asarray(system.g, np.float64) * rho
        vmax = float(np.max(np.abs(u[occupied]))) if occupied.any() else 0.0
        if dtc * vmax > 2 * np.pi:
            raise ValueError(
                f"{name}={dtc} is too large: the local phase per step dt·max|V + g|ψ|²| = {dtc * vmax:.3g} exceeds 2π, "
                f"so the dynamics is not resolved; use {name} <= {np.pi / vmax:.3g}"
            )
    if dtc is not None and system is not None and psi is not None:
        # Split-step Fourier on a non-vanishing background is unstable when the kinetic phase of the
        # highest mode reaches π (Weideman & Herbst, SIAM J. Numer. Anal. 23, 485 (1986)).
        kin_max = 0.5 * float(np.max(_k2(system.grid)))
        if dtc * kin_max > np.pi:
            raise ValueError(
                f"{name}={dtc} is unstable on this grid: the kinetic phase per step dt·k_max²/2 = {dtc * kin_max:.3g} "
                f"exceeds π (split-step instability); use {name} <= {np.pi / kin_max:.3g} or a coarser grid"
            )
    return dt


# ----------------------------------------------------------------------------------------------
# Stepping
# ----------------------------------------------------------------------------------------------
def step(psi: Inexact[ArrayLike, "*grid"], system: GPSystem, dt: Real[ArrayLike, ""], *, imaginary: bool = False,
         project_norm: bool = False, policy: str | Policy | None = None) -> Complex[Array, "*grid"]:
    """One Strang split-step of size ``dt`` (real time; imaginary time keeps ‖ψ‖ fixed).

    A thin wrapper over ``strang(system, dt, ...).step(psi)``.

    Args:
      psi: complex array of shape ``system.grid.shape`` (cast to the system's complex dtype).
      system: the :class:`GPSystem`.
      dt: time step (> 0), in units of 1/ω₀.
      imaginary: imaginary-time (normalised gradient flow) step instead of real time.
      project_norm: rescale ψ to its norm before the step (projection onto the invariant manifold,
        Hairer–Lubich–Wanner §IV.4). The step is unitary in exact arithmetic, so this removes only
        round-off: complex64 FFTs (XLA and NumPy alike) lose ~5e-8 of the norm per transform,
        *systematically*, i.e. ~1e-3 over 10⁴ steps. Off by default (the raw scheme).
      policy: precision policy (:func:`with_policy`); the result is cast to its output dtype.

    Returns:
      ψ after one step, same shape. Pure; works under jit/vmap/grad.
    """
    system = with_policy(_check_system(system), policy)
    psi = _check_psi(psi, system)
    _check_dt(dt, system, None if imaginary else psi)
    return _output(strang(system, dt, imaginary=imaginary, project_norm=project_norm).step(psi), policy)


def default_observables(psi: Inexact[Array, "*grid"], system: GPSystem) -> dict[str, Float[Array, ""]]:
    """Norm and the energy parts (what :func:`evolve` records by default)."""
    e = energy(psi, system)
    return {"norm": norm(psi, system.grid), **{f"energy_{k}": v for k, v in e.items()}}


@dataclasses.dataclass(frozen=True)
class _SystemObserve:
    """Adapts ``observe(psi, system)`` to the stepper protocol's ``observe(psi, params)``; hashes as ``fn``
    (so a module-level ``fn`` keeps the compiled loop cached across calls)."""

    fn: Callable[[jax.Array, Any], Any]

    def __call__(self, state: Any, params: Any) -> Any:
        return self.fn(state, params.system)


def evolve(psi: Inexact[ArrayLike, "*grid"], system: GPSystem, dt: Real[ArrayLike, ""], steps: int,
           save_every: int = 1, *, imaginary: bool = False,
           observe: Callable[[jax.Array, GPSystem], Any] | None = None, remat: bool = False,
           project_norm: bool = False, policy: str | Policy | None = None) -> tuple[Complex[Array, "*grid"], Any]:
    """Advance ``psi`` by ``steps`` Strang steps: ``trajectory(strang(system, dt, ...), psi, steps)``.

    Compiled once per (shapes, dtypes, steps, save_every, imaginary/project_norm, observe, remat):
    a second call with a new ψ, dt, g or V compiles nothing (pass ``observe`` as a module-level
    function; a fresh lambda per call recompiles).

    Args:
      psi: complex initial state, shape ``system.grid.shape`` (as in :func:`step`).
      system: the :class:`GPSystem`.
      dt: step size (units 1/ω₀).
      steps: number of steps (multiple of ``save_every``).
      save_every: record ``observe(psi, system)`` every this many steps.
      imaginary: imaginary-time evolution (norm kept).
      observe: observable function; default :func:`default_observables` (norm, energy parts).
      remat: rematerialise each block of ``save_every`` steps, so ``grad`` through the evolution
        stores ~steps/save_every states instead of ``steps``.
      project_norm: remove the float32 FFT round-off drift of the norm (see :func:`step`); here the
        target is the initial Σ|ψ|², so the projection is self-correcting over the run.
      policy: None (the system's dtype) or a precision policy / preset (:func:`with_policy`):
        ``"f32"`` complex64, ``"f64"`` complex128 (needs ``jax.enable_x64``); the final ψ is cast
        to the policy's output dtype, the observations stay in the compute dtype.

    Returns:
      (final ψ, observations stacked along a leading axis of length steps // save_every).
    """
    system = with_policy(_check_system(system), policy)
    psi = _check_psi(psi, system)
    _check_dt(dt, system, None if imaginary else psi)
    stepper = strang(system, dt, imaginary=imaginary, project_norm=project_norm)
    if project_norm and not imaginary:
        stepper = stepper.replace(params=stepper.params.replace(target=_sumsq(psi)))
    obs = _SystemObserve(observe if observe is not None else default_observables)
    final, observed = trajectory(stepper, psi, steps, save_every=save_every, observe=obs, remat=remat)
    return _output(final, policy), observed


# ----------------------------------------------------------------------------------------------
# Observables
# ----------------------------------------------------------------------------------------------
def _grid_of(x: Any) -> Grid:
    if isinstance(x, GPSystem):
        return x.grid
    if isinstance(x, Grid):
        return x
    raise TypeError(f"expected a Grid or GPSystem, got {type(x).__name__}")


def _check_field(psi: Any, grid: Grid, name: str = "psi", *, batched: bool = False) -> jax.Array:
    """``psi`` as an array on ``grid``: an inexact dtype, the grid's shape as its trailing axes (leading batch
    axes only when ``batched``), no NaN/inf (checked for concrete values; tracers pass)."""
    arr = check_array(psi, name, kind="inexact", finite=True)
    tail = tuple(arr.shape[arr.ndim - grid.ndim:]) if arr.ndim >= grid.ndim else None
    if tail != tuple(grid.shape) or (not batched and arr.ndim != grid.ndim):
        want = ("(..., " if batched else "(") + ", ".join(map(str, grid.shape)) + ")"
        raise ValueError(f"{name} must have shape {want} (the grid's), got {tuple(arr.shape)}")
    return arr


def norm(psi: Inexact[Array, "*batch_and_grid"], grid: Grid | GPSystem) -> Float[Array, "*batch"]:
    """N = ∫|ψ|² dV (sum over the last grid.ndim axes, so batched ψ works)."""
    grid = _grid_of(grid)
    psi = _check_field(psi, grid, batched=True)
    axes = tuple(range(psi.ndim - grid.ndim, psi.ndim))
    return jnp.sum(psi.real * psi.real + psi.imag * psi.imag, axis=axes) * grid.cell_volume


def normalize(psi: Inexact[Array, "*shape"], grid: Grid | GPSystem, n: Any = 1.0) -> Inexact[Array, "*shape"]:
    """ψ scaled so that ∫|ψ|² dV = n (n > 0; a ψ that is zero everywhere cannot be normalised)."""
    psi = _check_field(psi, _grid_of(grid), batched=True)
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


def _deriv(psi_k: jax.Array, grid: Grid, axis: int) -> jax.Array:
    k = jnp.asarray(grid._bcast(grid.wavenumbers[axis], axis), psi_k.real.dtype)
    return jnp.fft.ifftn(1j * k * psi_k)


def angular_momentum(psi: Inexact[Array, "*grid"], grid: Grid | GPSystem) -> Float[Array, ""]:
    """⟨L_z⟩ = ∫ ψ* (−i)(x ∂_y − y ∂_x) ψ dV (spectral derivatives; real)."""
    grid = _grid_of(grid)
    if grid.ndim < 2:
        raise ValueError("angular_momentum needs a 2D or 3D grid")
    psi = _check_field(psi, grid)
    rdt = psi.real.dtype
    psi_k = jnp.fft.fftn(psi)
    x = jnp.asarray(grid._bcast(grid.coords[0], 0), rdt)
    y = jnp.asarray(grid._bcast(grid.coords[1], 1), rdt)
    lz = -1j * (x * _deriv(psi_k, grid, 1) - y * _deriv(psi_k, grid, 0))
    return jnp.sum(jnp.conj(psi) * lz).real * grid.cell_volume


def energy(psi: Inexact[Array, "*grid"], system: GPSystem) -> dict[str, Float[Array, ""]]:
    """Energy parts of E[ψ] = ∫ [½|∇ψ|² + V|ψ|² + ½g|ψ|⁴] dV − Ω⟨L_z⟩ (in ħω₀; totals, not per particle).

    Returns a dict with ``kinetic``, ``trap``, ``interaction``, ``rotation`` and ``total``. The
    kinetic part is spectral: ½ Σ_k k²|ψ̂_k|² dV / N_points (Parseval).
    """
    grid = _check_system(system).grid
    psi = _check_field(psi, grid)
    rdt = psi.real.dtype
    psi_k = jnp.fft.fftn(psi)
    k2 = jnp.asarray(_k2(grid), rdt)
    dv = grid.cell_volume
    ekin = 0.5 * jnp.sum(k2 * density(psi_k)) * dv / grid.size
    rho = density(psi)
    etrap = jnp.sum(jnp.asarray(system.potential, rdt) * rho) * dv
    eint = 0.5 * jnp.asarray(system.g, rdt) * jnp.sum(rho * rho) * dv
    if system.rotating:
        erot = -jnp.asarray(system.omega_rot, rdt) * angular_momentum(psi, grid)
    else:
        erot = jnp.zeros((), rdt)
    return {"kinetic": ekin, "trap": etrap, "interaction": eint, "rotation": erot,
            "total": ekin + etrap + eint + erot}


def chemical_potential(psi: Inexact[Array, "*grid"], system: GPSystem) -> Float[Array, ""]:
    """μ = (E_kin + E_trap + 2E_int + E_rot)/N (the eigenvalue of the GP operator for a stationary ψ)."""
    e = energy(psi, system)
    return (e["kinetic"] + e["trap"] + 2 * e["interaction"] + e["rotation"]) / norm(psi, system.grid)


def virial_residual(psi: Inexact[Array, "*grid"], system: GPSystem) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Virial residual r = 2E_kin − 2E_trap + d·E_int for a harmonic trap (0 for stationary states).

    Returns (r, r / (2E_kin + 2E_trap + d|E_int|)), the absolute and relative residual.
    """
    e = energy(psi, system)
    d = system.grid.ndim
    r = 2 * e["kinetic"] - 2 * e["trap"] + d * e["interaction"]
    return r, r / (2 * e["kinetic"] + 2 * e["trap"] + d * jnp.abs(e["interaction"]))


# ----------------------------------------------------------------------------------------------
# Ground states
# ----------------------------------------------------------------------------------------------
def gaussian(grid: Grid, n: float = 1.0, width: float | Sequence[float] = 1.0, center: Sequence[float] | None = None,
             *, dtype: Any = jnp.complex64) -> Inexact[Array, "*grid"]:
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
    psi = psi * np.sqrt(n / (np.sum(psi ** 2) * grid.cell_volume))
    return jnp.asarray(psi, dtype)


def _zero_observe(state: Any, params: Any) -> Any:
    del state, params
    return None


@functools.partial(jax.jit, static_argnames=("n_blocks", "check_every", "use_noise"))
def _ground_state_loop(stepper: Stepper, psi: jax.Array, norm: Any, tol: Any, key: Any, noise: Any, *,
                       n_blocks: int, check_every: int, use_noise: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    params = stepper.params
    system = params.system
    grid = system.grid
    rdt, cdt = system.real_dtype, system.complex_dtype
    psi = psi.astype(cdt)
    if use_noise:
        kr, ki = jax.random.split(key)
        amp = jnp.max(jnp.abs(psi))
        psi = psi + (jnp.asarray(noise, rdt) * amp).astype(cdt) * jax.lax.complex(
            jax.random.normal(kr, grid.shape, rdt), jax.random.normal(ki, grid.shape, rdt)).astype(cdt)
    norm = jnp.asarray(norm, rdt)
    psi = normalize(psi, grid, norm)
    # A fixed projection target (Σ|ψ|² = N/dV) keeps the norm anchored instead of random-walking.
    params = params.replace(target=norm / jnp.asarray(grid.cell_volume, rdt))
    tol = jnp.asarray(tol, rdt)

    def cond(c):
        _, _, delta, k = c
        return jnp.logical_and(k < n_blocks, delta > tol)

    def body(c):
        p, e_old, _, k = c
        p, _ = rollout(stepper.step_fn, p, params, check_every, save_every=check_every, observe=_zero_observe)
        e = energy(p, system)["total"]
        delta = jnp.abs(e - e_old) / jnp.maximum(jnp.abs(e), jnp.finfo(rdt).tiny)
        # A non-finite energy (the iteration broke down) stops the loop: NaN > tol is False.
        return p, e, delta, k + 1

    e0 = energy(psi, system)["total"]
    init = (psi, e0, jnp.asarray(jnp.inf, rdt), jnp.asarray(0, jnp.int32))
    psi, _, delta, k = jax.lax.while_loop(cond, body, init)
    # Final renormalisation: the returned state has the requested norm to round-off.
    psi = normalize(psi, grid, norm)
    e = energy(psi, system)["total"]
    finite = jnp.logical_and(jnp.all(jnp.isfinite(psi.real) & jnp.isfinite(psi.imag)), jnp.isfinite(e))
    info = {"steps": k * check_every, "energy": e, "mu": chemical_potential(psi, system), "delta": delta,
            "converged": delta <= tol, "finite": finite}
    return psi, info


def ground_state(system: GPSystem, norm: Any = 1.0, dt: float = 1e-2, tol: float = 1e-9, max_steps: int = 100_000,
                 *, psi0: Inexact[ArrayLike, "*grid"] | None = None, check_every: int = 100,
                 key: jax.Array | None = None, noise: float = 0.0, policy: str | Policy | None = None
                 ) -> tuple[Complex[Array, "*grid"], dict[str, Array]]:
    """Ground state by imaginary-time Strang steps (:func:`strang` with ``imaginary=True``) at fixed norm.

    Minimises E[ψ] (see :func:`energy`) at ∫|ψ|² dV = N by the normalised gradient flow
    ∂ψ/∂τ = −[−½∇² + V + g|ψ|² − Ω L_z]ψ, projected to norm N (τ in 1/ω₀, energies in ħω₀).
    Iterates blocks of ``check_every`` steps in a ``lax.while_loop`` until the relative energy change
    over a block, |ΔE|/|E|, is below ``tol`` or ``max_steps`` is reached. The fixed point carries a
    splitting error O(dt²) in the energy; refine by calling again with a smaller dt and ``psi0``.
    The whole solve (noise, normalisation, loop, observables) is one jitted program, compiled once per
    (grid, dtype, check_every, number of blocks, noise on/off): a new dt, N, tol, g or V reuses it.

    Args:
      system: the :class:`GPSystem` (with Ω ≠ 0 this is the rotating-frame ground state).
      norm: particle number N = ∫|ψ|² dV (the returned ψ has this norm to round-off).
      dt: imaginary time step.
      tol: relative energy change per block that counts as converged (float32 bottoms out ~1e-7).
      max_steps: step budget (rounded up to a multiple of ``check_every``).
      psi0: initial guess, shape ``grid.shape`` (default: a Gaussian of unit trap width).
      check_every: steps per convergence check.
      key: PRNG key of the noise (required when ``noise`` ≠ 0).
      noise: relative amplitude of complex noise added to the initial guess (breaks symmetries, e.g.
        to let a vortex lattice nucleate in a rotating trap).
      policy: None (the system's dtype) or a precision policy / preset (:func:`with_policy`);
        ``"f32"`` reaches |E − E₀|/E₀ ≈ 1e-7, ``"f64"`` ≈ 3e-13 (1D trap, dt = 2e-3)
        (measured, docs/guide/precision.md). ψ is returned in the policy's output dtype.

    Returns:
      (ψ, info): ψ complex of shape ``grid.shape``; info = {"steps", "energy" (total E of the returned
      ψ), "mu", "delta" (last relative change), "converged", "finite"}. Works under jit and vmap (e.g. over
      ``system.g``). Outside a trace a non-finite result raises ``ValueError`` naming dt.
    """
    system = with_policy(_check_system(system), policy)
    check_scalar(tol, "tol", positive=True)
    check_scalar(max_steps, "max_steps", integer=True, minimum=1)
    check_scalar(check_every, "check_every", integer=True, minimum=1)
    check_scalar(norm, "norm", positive=True)
    check_scalar(noise, "noise", nonnegative=True)
    check_scalar(dt, "dt", positive=True)
    use_noise = not (is_concrete(noise) and float(np.asarray(noise)) == 0.0)
    if use_noise and key is None:
        raise ValueError(f"noise={noise} needs a PRNG key: pass key=jax.random.key(seed) (without one the noise "
                         "would be silently ignored)")
    grid = system.grid
    if psi0 is None:
        psi = gaussian(grid, 1.0, dtype=system.complex_dtype)
    else:
        psi = _check_psi(psi0, system, "psi0")
        if is_concrete(psi) and not np.any(np.asarray(psi) != 0):
            raise ValueError("psi0 is zero everywhere (zero norm), so it cannot be normalised to norm; pass a "
                             "non-zero initial guess (or psi0=None for the default Gaussian)")
    _check_imaginary_dt(dt, system, psi)
    stepper = strang(system, dt, imaginary=True)
    n_blocks = -(-int(max_steps) // int(check_every))
    psi, info = _ground_state_loop(stepper, psi, norm, tol, key if use_noise else None, noise if use_noise else None,
                                   n_blocks=n_blocks, check_every=int(check_every), use_noise=use_noise)
    ok = info["finite"]
    if is_concrete(ok) and not bool(ok):
        raise ValueError(f"dt={dt} is too large for this imaginary-time solve: the iteration broke down (NaN/inf, "
                         f"e^(-dt·V/2) underflows the occupied region); use a smaller dt (e.g. dt <= "
                         f"{_gs_dt_hint(system):.3g}) and refine")
    return _output(psi, policy), info


def _check_imaginary_dt(dt: Any, system: GPSystem, psi: jax.Array) -> None:
    """Resolution bound of an imaginary-time step (the analogue of the real-time phase bound).

    Each half-step multiplies ψ by e^{−dt·U/2}, U = V + g|ψ|². Where the initial guess has particles,
    dt·max|U| > 2π means the local factor changes ψ by more than e^{−π} per step: the fixed point is
    then the ground state of a grossly distorted operator (E ≈ 6.4 instead of 0.5 for the 1D
    harmonic trap at dt = 50) or, where e^{−dt·U/2} underflows everywhere, NaN.
    """
    dtc = _concrete_float(dt)
    if dtc is None or not (is_concrete(psi) and is_concrete(system.potential) and is_concrete(system.g)):
        return
    rho = np.abs(np.asarray(psi)) ** 2
    occupied = rho > 1e-6 * rho.max()
    u = np.asarray(system.potential, np.float64) + np.asarray(system.g, np.float64) * rho
    umax = float(np.max(np.abs(u[occupied]))) if occupied.any() else 0.0
    if dtc * umax > 2 * np.pi:
        raise ValueError(
            f"dt={dtc} is too large for imaginary-time steps: the local decay per step dt·max|V + g|ψ|²| = "
            f"{dtc * umax:.3g} over the initial cloud exceeds 2π, so the fixed point is not the ground state "
            f"(or underflows to NaN); use dt <= {np.pi / umax:.3g} (and refine with a smaller dt)")


def _gs_dt_hint(system: GPSystem) -> float:
    # Keep e^{−dt·max U/2} representable: dt·(max V − min V)/2 below ~half the float exponent range.
    try:
        v = np.asarray(system.potential, np.float64)
        span = float(v.max() - v.min())
    except Exception:  # noqa: BLE001 - traced potential: no hint from values
        return 1e-2
    lim = 0.5 * math.log(float(np.finfo(np.dtype(system.real_dtype)).max))
    return 2 * lim / span if span > 0 else 1.0


# ----------------------------------------------------------------------------------------------
# Analytic states and reference formulas
# ----------------------------------------------------------------------------------------------
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
        return (15 * g * n * omega ** 3 / (16 * math.sqrt(2) * math.pi)) ** 0.4
    raise ValueError(f"dim must be 1, 2 or 3, got {dim}")


def thomas_fermi_density(system: GPSystem, mu: float) -> Float[Array, "*grid"]:
    """n_TF = max(μ − V, 0)/g (g > 0)."""
    _check_system(system)
    check_scalar(mu, "mu")
    if is_concrete(system.g) and not float(np.asarray(system.g)) > 0:
        raise ValueError(f"system.g must be > 0 for a Thomas-Fermi density, got {float(np.asarray(system.g))}")
    return jnp.maximum(mu - system.potential, 0.0) / system.g


def bright_soliton(grid: Grid, n: float, g: float, position: float = 0.0, velocity: float = 0.0, t: float = 0.0,
                   *, dtype: Any = jnp.complex64) -> Inexact[Array, " x"]:
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
    mu = -(a ** 2) * n ** 2 / 8
    psi = (n * math.sqrt(a) / 2) / np.cosh(a * n * xr / 2) * np.exp(1j * (velocity * x - (velocity ** 2 / 2 + mu) * t))
    return jnp.asarray(psi, dtype)


def dark_soliton_pair(grid: Grid, n0: float, g: float, separation: float, velocity: float, t: float = 0.0,
                      *, dtype: Any = jnp.complex64) -> Inexact[Array, " x"]:
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
    gam = math.sqrt(1 - velocity ** 2 / c ** 2)
    x = grid.coords[0]

    def f(u):
        # Not wrapped: the product tends to −1 at both box ends (periodic to e^{−(L/2 − |x_s|)/ξ}).
        return 1j * velocity / c + gam * np.tanh(gam * u / xi)

    psi = -math.sqrt(n0) * f(x + separation / 2 - velocity * t) * f(-x + separation / 2 - velocity * t)
    return jnp.asarray(psi * np.exp(-1j * g * n0 * t), dtype)


# ----------------------------------------------------------------------------------------------
# Vortices
# ----------------------------------------------------------------------------------------------
def imprint_vortices(psi: Complex[Array, "*grid"], grid: Grid, centers: Real[ArrayLike, "v d"],
                     charges: Int[ArrayLike, " v"], *, core_size: float = 0.0) -> Complex[Array, "*grid"]:
    """Multiply ψ by the phase windings Π_v exp(i q_v θ_v) about z (via :func:`ivhl_jax.physics.fields.vortex`).

    ``centers``: (V, 2) positions in the (x, y) plane (or (V, 3), z ignored); ``charges``: (V,) ints.
    ``core_size`` > 0 also multiplies by the core profile of ``fields.vortex`` (zero on the axis);
    with 0 only the phase is imprinted and imaginary-time relaxation forms the core.
    """
    from ivhl_jax.physics import fields

    if grid.ndim < 2:
        raise ValueError("imprint_vortices needs a 2D or 3D grid")
    psi = _check_field(psi, grid)
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


def vortex_charges(psi: Inexact[Array, "x y"], grid: Grid, *, min_density: float = 0.05, window: int = 4
                   ) -> Int[Array, "x-1 y-1"]:
    """Plaquette winding numbers of a 2D ψ inside the condensate.

    Uses :func:`ivhl_jax.physics.fields.vortex_map`; returns int32 (nx−1, ny−1). A plaquette counts when the
    mean density over the (2·window + 2)² cells around it is ≥ ``min_density``·max|ψ|²: this keeps
    real vortices (whose own core is empty) and drops the "ghost" phase singularities of the
    near-empty region outside a trapped condensate.
    """
    from ivhl_jax.physics import fields

    psi = check_array(psi, "psi", kind="numeric", finite=True)
    if psi.ndim != 2:
        raise ValueError(f"vortex_charges needs a 2D psi (take a z-slice in 3D), got shape {psi.shape}")
    check_scalar(min_density, "min_density", minimum=0.0, maximum=1.0)
    check_scalar(window, "window", integer=True, nonnegative=True)
    w = fields.vortex_map(psi)
    rho = density(psi)
    k = 2 * int(window) + 2
    local_mean = jax.lax.reduce_window(rho, 0.0, jax.lax.add, (k, k), (1, 1),
                                       ((window, window), (window, window))) / (k * k)
    return jnp.where(local_mean >= min_density * jnp.max(rho), w, 0).astype(jnp.int32)


def vortex_positions(psi: Inexact[Array, "x y"], grid: Grid, *, min_density: float = 0.05, window: int = 4
                     ) -> tuple[Float[np.ndarray, "m 2"], Int[np.ndarray, " m"]]:
    """Vortex positions (M, 2) (plaquette centres, trap units) and charges (M,) of a 2D ψ (not jittable)."""
    w = np.asarray(vortex_charges(psi, grid, min_density=min_density, window=window))
    ix, iy = np.nonzero(w)
    x, y = grid.coords[0], grid.coords[1]
    dx, dy = grid.dx[0], grid.dx[1]
    return np.stack([x[ix] + dx / 2, y[iy] + dy / 2], axis=-1), w[ix, iy]
