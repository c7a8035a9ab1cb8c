"""The Strang split-step stepper of the Gross–Pitaevskii equation (:func:`strang`) and its thin driver
:func:`evolve`.

One step of size dt (units 1/ω₀) maps ψ to e^{−i dt/2 U} K(dt) e^{−i dt/2 U} ψ, U = V + g|ψ|², K the exact
kinetic (+ rotation) propagator (:mod:`ivhl_jax.physics.condensate`). The builder validates the step
against the grid and computes the kinetic factors once from the one ``dt``; the params hold them in a
private plan, so dt cannot be edited apart from its factors (a new dt is a new ``strang(system, dt)``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Complex, Inexact, Real

from ivhl_jax.core.precision import Policy
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.numerics.fastmath import needs_full_range
from ivhl_jax.numerics.rollout import Stepper, trajectory
from ivhl_jax.numerics.spectral import host_factor, spectral_multiply
from ivhl_jax.numerics.splitstep import phase_factor_m1, split_step, strang_run
from ivhl_jax.physics.condensate.observables import norm, observe
from ivhl_jax.physics.condensate.system import (
    GPSystem,
    Grid,
    as_leaf,
    check_psi,
    check_system,
    concrete_float,
    with_policy,
)

__all__ = ["strang", "StrangParams", "evolve"]


# ----------------------------------------------------------------------------------------------
# Kinetic factors: computed once per (grid, dt, Ω, real/imaginary time, dtype)
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _static_kinetic(grid: Grid, dt: float, imaginary: bool, dtype: str) -> np.ndarray:
    return phase_factor_m1(0.5 * dt * grid.k_squared(), imaginary, np.dtype(dtype))


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


_DT_MESSAGE = (
    "dt is held once, by the stepper's kinetic factors; build a new stepper for a new step size: "
    "condensate.strang(system, dt)"
)


class _KineticPlan(struct.PyTreeNode):
    """The step size and the kinetic factors derived from it (private: built only by :func:`strang`).

    ``kin``: without rotation, e^{−i k² dt/2} − 1 (grid-shaped); with rotation ``rot_a`` (shape
    (n_x, n_y[, 1])) and ``rot_b`` (shape (n_x, n_y[, n_z])), the ADI factors (module docstring of
    :mod:`ivhl_jax.physics.condensate`). Imaginary time replaces −i dt by −dt. With ``fft="ducc"`` and a
    concrete dt (and Ω) each factor is a :class:`ivhl_jax.numerics.spectral.HostFactor`.
    ``grid``/``omega``/``imaginary`` record what the factors were built for (static), so params whose
    system disagrees are refused.
    """

    dt: Any
    kin: Any = None
    rot_a: Any = None
    rot_b: Any = None
    grid: Grid | None = struct.field(pytree_node=False, default=None)
    omega: float | None = struct.field(pytree_node=False, default=None)
    imaginary: bool = struct.field(pytree_node=False, default=False)

    @property
    def rotating(self) -> bool:
        return self.kin is None


def _make_plan(system: GPSystem, dt: Any, imaginary: bool) -> _KineticPlan:
    """Kinetic factors for steps of size dt: a concrete dt (and Ω) in float64 NumPy cast once, a traced one in
    the working precision (e.g. ``vmap``/``grad`` over dt)."""
    grid = system.grid
    cdt, rdt = system.complex_dtype, system.real_dtype
    dtc = concrete_float(dt)
    dt_leaf = jnp.asarray(dt, rdt)
    cname = np.dtype(cdt).name
    host = system.fft == "ducc"
    meta: dict[str, Any] = {"grid": grid, "imaginary": imaginary}
    if not system.rotating:
        if dtc is not None:
            if host:
                return _KineticPlan(
                    dt_leaf,
                    kin=host_factor(
                        functools.partial(_static_kinetic, grid, dtc, imaginary, cname),
                        ("gp-kinetic", grid, dtc, imaginary, cname),
                    ),
                    **meta,
                )
            return _KineticPlan(dt_leaf, kin=jnp.asarray(_static_kinetic(grid, dtc, imaginary, cname)), **meta)
        k2 = jnp.asarray(grid.k_squared(), rdt)
        return _KineticPlan(dt_leaf, kin=phase_factor_m1(0.5 * dt_leaf * k2, imaginary, cdt), **meta)
    omc = concrete_float(system.omega_rot)
    meta["omega"] = omc
    if dtc is not None and omc is not None:
        if host:
            ra, rb = (
                host_factor(
                    functools.partial(_rotating_factor, grid, dtc, omc, imaginary, cname, i),
                    ("gp-rotating", i, grid, dtc, omc, imaginary, cname),
                )
                for i in (0, 1)
            )
            return _KineticPlan(dt_leaf, rot_a=ra, rot_b=rb, **meta)
        fa, fb = _static_rotating(grid, dtc, omc, imaginary, cname)
        return _KineticPlan(dt_leaf, rot_a=jnp.asarray(fa), rot_b=jnp.asarray(fb), **meta)
    # A: ½kx² + Ω y kx, shape (nx, ny); B: ½(ky² + kz²) − Ω x ky, shape (nx, ny[, nz]).
    kx, y, k2_rest, x_b, ky_b = _rotating_axes(grid)
    om = jnp.asarray(system.omega_rot, rdt)
    th_a = 0.5 * dt_leaf * (jnp.asarray(0.5 * kx[:, None] ** 2, rdt) + om * jnp.asarray(y[None, :] * kx[:, None], rdt))
    th_b = dt_leaf * (jnp.asarray(0.5 * k2_rest[None], rdt) - om * jnp.asarray(x_b * ky_b, rdt))
    fa, fb = phase_factor_m1(th_a, imaginary, cdt), phase_factor_m1(th_b, imaginary, cdt)
    if grid.ndim == 3:
        fa = fa[:, :, None]
    return _KineticPlan(dt_leaf, rot_a=jnp.asarray(fa), rot_b=jnp.asarray(fb), **meta)


class StrangParams(struct.PyTreeNode):
    """Everything one GP Strang step reads (built by :func:`strang`; not constructed by hand).

    Attributes:
      system: the :class:`GPSystem` (V, g and Ω are traced leaves: a new value reuses the compiled loop).
      plan: the step size and its kinetic factors (private; ``params.dt`` reads the step size).
      target: Σ|ψ|² over the grid points (no dV) that the norm projection restores, or None (the norm
        each step starts with). Used when ``imaginary`` or ``project_norm``.
      imaginary: static; imaginary-time steps (normalised gradient flow).
      project_norm: static; real time: True projects ψ to the target norm after every step, None (the default of
        :func:`strang`) after every block of steps run between observations (and after a single ``step``),
        False never (the raw scheme).

    ``dt`` is held once: ``params.replace(dt=...)`` raises (use ``strang(system, dt)``), and params whose
    system no longer matches the factors (another grid, another concrete Ω) are refused.
    """

    system: GPSystem
    plan: _KineticPlan
    target: Any = None
    imaginary: bool = struct.field(pytree_node=False, default=False)
    project_norm: bool | None = struct.field(pytree_node=False, default=False)

    def __post_init__(self) -> None:
        plan, system = self.plan, self.system
        if not isinstance(plan, _KineticPlan) or not isinstance(system, GPSystem):
            return  # pytree reconstruction with placeholders
        if plan.grid is not None and system.grid != plan.grid:
            raise ValueError(
                f"params.system has grid {system.grid} but the kinetic factors were built for "
                f"{plan.grid}; build a new stepper: condensate.strang(system, dt)"
            )
        if system.rotating != plan.rotating:
            raise ValueError(
                "params.system's rotation (Ω = 0 or not) differs from the stepper's kinetic factors; "
                "build a new stepper: condensate.strang(system, dt)"
            )
        om = concrete_float(system.omega_rot) if system.rotating else None
        cast = np.dtype(system.real_dtype).type  # Ω is stored in the working precision
        if om is not None and plan.omega is not None and cast(om) != cast(plan.omega):
            raise ValueError(
                f"params.system.omega_rot = {om} but the kinetic factors were built for Ω = {plan.omega}; "
                "build a new stepper: condensate.strang(system, dt)"
            )
        if plan.imaginary != self.imaginary:
            raise ValueError(
                "imaginary is fixed by the stepper's kinetic factors; build a new stepper: "
                "condensate.strang(system, dt, imaginary=...)"
            )

    @property
    def dt(self) -> Any:
        """The step size (a scalar in the system's real dtype)."""
        return self.plan.dt


def _guard_dt(cls: Any) -> None:
    """Make ``cls.replace(dt=...)`` a ValueError (flax.struct installs ``replace`` on the class itself)."""
    plain = cls.replace

    def replace(self: Any, **updates: Any) -> Any:
        if "dt" in updates:
            raise ValueError(_DT_MESSAGE)
        return plain(self, **updates)

    replace.__doc__ = plain.__doc__
    cls.replace = replace


_guard_dt(_KineticPlan)
_guard_dt(StrangParams)


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------
def _fft_multiply(psi: jax.Array, factor_m1: Any, axes: tuple[int, ...], fft: str, layout: Any = None) -> jax.Array:
    """F⁻¹[(1 + m) F ψ] over ``axes``: the one place the kinetic step calls an FFT (the distributed FFT when
    the system has a layout)."""
    if layout is not None:
        return distributed_fft.spectral_multiply(psi, factor_m1, layout, axes)
    return spectral_multiply(psi, factor_m1, axes, fft)


def kinetic_propagate(psi: jax.Array, plan: _KineticPlan, ndim: int, fft: str, layout: Any = None) -> jax.Array:
    axes = tuple(range(psi.ndim - ndim, psi.ndim))
    if not plan.rotating:
        return _fft_multiply(psi, plan.kin, axes, fft, layout)
    psi = _fft_multiply(psi, plan.rot_a, axes[:1], fft, layout)
    psi = _fft_multiply(psi, plan.rot_b, axes[1:], fft, layout)
    return _fft_multiply(psi, plan.rot_a, axes[:1], fft, layout)


def _place_plan(plan: _KineticPlan, layout: Any, shape: tuple[int, ...]) -> _KineticPlan:
    """The factors in the k-space blocks the distributed FFT multiplies (each device builds only its own)."""
    if layout is None:
        return plan
    if not plan.rotating:
        return plan.replace(kin=layout.place_factor(plan.kin, shape))
    return plan.replace(
        rot_a=layout.place_factor(plan.rot_a, shape, (0,)),
        rot_b=layout.place_factor(plan.rot_b, shape, tuple(range(1, len(shape)))),
    )


def _sumsq(psi: jax.Array) -> jax.Array:
    return jnp.sum(psi.real * psi.real + psi.imag * psi.imag)


def local_energy(system: GPSystem):
    rdt = system.real_dtype
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)

    def local(p: jax.Array) -> jax.Array:
        return pot + g * (p.real * p.real + p.imag * p.imag)

    return local


def _project(p: jax.Array, n0: jax.Array, rdt: Any) -> jax.Array:
    """ψ rescaled so that Σ|ψ|² = n0: ψ(1 + δ) with δ = √(n0/n1) − 1 = (n0 − n1)/(n1 + √(n0 n1)) (a float32
    scale factor near 1 is quantised to 6e-8, which would bias the projection by that much per use)."""
    n1 = _sumsq(p)
    delta = (n0 - n1) / (n1 + jnp.sqrt(n0 * n1))
    return p + p * delta.astype(rdt)


def _needs_full_range(system: GPSystem, dt: Any, sumsq: jax.Array) -> jax.Array:
    """Whether real-time kicks of step dt from a ψ with Σ|ψ|² = ``sumsq`` (grid sum, no dV) can leave the fast
    sine reduction: the largest argument is dt·max|U|/2 (the merged interior kick), and |U| = |V + g|ψ|²| ≤
    max|V| + |g|·2Σ|ψ|² for the whole run (|ψ|² ≤ Σ|ψ|² pointwise, the sum is conserved; twice it covers the
    round-off drift). A bool scalar for ``lax.cond``, unbatched under ``vmap``."""
    rdt = system.real_dtype
    # The barrier keeps XLA from constant-folding this reduction when V is a constant of the program (a stepper
    # closed over by jit): folding a 256³ max took 50 s of compile time on a GPU host, running it takes microseconds.
    pot = jax.lax.optimization_barrier(jnp.asarray(system.potential, rdt))
    umax = jnp.max(jnp.abs(pot)) + jnp.abs(jnp.asarray(system.g, rdt)) * 2 * sumsq
    return needs_full_range(0.5 * jnp.abs(dt) * umax)


def _one_step(psi: Complex[Array, "*grid"], params: StrangParams) -> Complex[Array, "*grid"]:
    """One Strang step of ``params`` (real time, real time + projection, or imaginary time: static fields)."""
    system, plan = params.system, params.plan
    psi = check_array(psi, "psi", shape=system.grid.shape, kind="complex")  # static facts only: free under jit
    rdt = system.real_dtype
    imaginary = params.imaginary
    # Real time projects after every single step unless the raw scheme was asked for (project_norm=False).
    project = imaginary or params.project_norm is not False
    local = local_energy(system)
    s0 = _sumsq(psi)
    # A fixed target makes the projection self-correcting: a float32 correction too small to change
    # some elements is not lost but retried next step.
    n0 = s0 if params.target is None else jnp.asarray(params.target, rdt)

    def kinetic(p):
        p = kinetic_propagate(p, plan, system.grid.ndim, system.fft, system.layout)
        # Imaginary time: renormalise before the second nonlinear half-step too, so that g|ψ|² is evaluated
        # at the right norm (the fixed point's virial residual is then 1e-5 instead of 3e-2, 1D, gN = 1000).
        return _project(p, n0, rdt) if imaginary else p

    if imaginary:
        out = split_step(_project(psi, n0, rdt), local, kinetic, plan.dt, True, full_range=False)
    else:
        # The local phase needs the full-range sine reduction only if dt·max|U|/2 can leave the fast range.
        out = jax.lax.cond(
            _needs_full_range(system, plan.dt, s0),
            functools.partial(
                split_step, local_energy=local, kinetic=kinetic, dt=plan.dt, imaginary=False, full_range=True
            ),
            functools.partial(
                split_step, local_energy=local, kinetic=kinetic, dt=plan.dt, imaginary=False, full_range=False
            ),
            psi,
        )
    return _project(out, n0, rdt) if project else out


def _run(psi: Complex[Array, "*grid"], params: StrangParams, n: int) -> Complex[Array, "*grid"]:
    """``n`` steps of ``params``. Real time without per-step projection merges the potential half-steps of
    consecutive steps (:func:`ivhl_jax.numerics.splitstep.strang_run`, the same scheme to round-off, one pass
    over the field per step fewer) and, by default (``project_norm=None``), restores the norm once at the end
    of the ``n`` steps; otherwise ``n`` single steps."""
    system, plan = params.system, params.plan
    psi = check_array(psi, "psi", shape=system.grid.shape, kind="complex")
    if params.imaginary or params.project_norm is True:
        return jax.lax.fori_loop(0, n, lambda _, p: _one_step(p, params), psi)
    local = local_energy(system)

    def kinetic(p):
        return kinetic_propagate(p, plan, system.grid.ndim, system.fft, system.layout)

    s0 = _sumsq(psi)
    out = jax.lax.cond(
        _needs_full_range(system, plan.dt, s0),
        functools.partial(strang_run, local_energy=local, kinetic=kinetic, dt=plan.dt, n=n, full_range=True),
        functools.partial(strang_run, local_energy=local, kinetic=kinetic, dt=plan.dt, n=n, full_range=False),
        psi,
    )
    if params.project_norm is None:
        rdt = system.real_dtype
        out = _project(out, s0 if params.target is None else jnp.asarray(params.target, rdt), rdt)
    return out


def _strang_init(params: StrangParams, psi: Any) -> jax.Array:
    """Validate ψ (shape, finite values) and cast it to the system's complex dtype; for concrete values also
    check that dt resolves the local phase (real time) or decay (imaginary time) over the cloud."""
    system = params.system
    psi = check_psi(psi, system)
    dtc = concrete_float(params.dt)
    # (a V spread over several processes has no host copy here; the builder's dt bound still applies)
    if (
        dtc is not None
        and is_concrete(psi)
        and is_concrete(system.potential)
        and is_concrete(system.g)
        and distributed_fft.host_readable(system.potential)
    ):
        check_local_dt(dtc, system, np.asarray(psi), params.imaginary)
    return psi if system.layout is None else system.layout.place(psi, "psi")


# ----------------------------------------------------------------------------------------------
# Validation of dt
# ----------------------------------------------------------------------------------------------
def _kinetic_dt_bound(grid: Grid) -> float:
    """π / (k_max²/2): split-step Fourier on a non-vanishing background is unstable when the kinetic phase of
    the highest mode reaches π (Weideman & Herbst, SIAM J. Numer. Anal. 23, 485 (1986))."""
    return float(np.pi / (0.5 * np.max(grid.k_squared())))


def _check_dt(dt: Any, system: GPSystem, imaginary: bool) -> None:
    check_scalar(dt, "dt", positive=True)
    dtc = concrete_float(dt)
    if dtc is not None and not imaginary:
        bound = _kinetic_dt_bound(system.grid)
        if dtc > bound:
            raise ValueError(
                f"dt={dtc} is unstable on this grid: the kinetic phase per step dt·k_max²/2 = "
                f"{dtc * np.pi / bound:.3g} exceeds π (split-step instability); use dt <= {bound:.3g} "
                "or a coarser grid"
            )


def check_local_dt(dtc: float, system: GPSystem, psi: np.ndarray, imaginary: bool) -> None:
    """The local factor must be resolved where there are particles (empty corners of the box may have any V).

    Real time: the phase dt·max|V + g|ψ|²| over the cloud must stay below 2π. Imaginary time: the decay
    per step likewise (else the fixed point is the ground state of a grossly distorted operator, E ≈ 6.4
    instead of 0.5 for the 1D trap at dt = 50, or e^{−dt·U/2} underflows to NaN).
    """
    rho = np.abs(psi) ** 2
    if not rho.size or not rho.max() > 0:
        return
    occupied = rho > 1e-6 * rho.max()
    u = np.asarray(system.potential, np.float64) + np.asarray(system.g, np.float64) * rho
    umax = float(np.max(np.abs(u[occupied])))
    if dtc * umax > 2 * np.pi:
        what = "decay" if imaginary else "phase"
        raise ValueError(
            f"dt={dtc} is too large: the local {what} per step dt·max|V + g|ψ|²| = {dtc * umax:.3g} over "
            f"the cloud exceeds 2π, so the dynamics is not resolved; use dt <= {np.pi / umax:.3g}"
        )


# ----------------------------------------------------------------------------------------------
# The builder and the driver
# ----------------------------------------------------------------------------------------------
def strang(
    system: GPSystem,
    dt: Any,
    *,
    imaginary: bool = False,
    project_norm: bool | None = None,
    norm: Any = None,
    policy: str | Policy | None = None,
) -> Stepper:
    """The Strang split-step stepper of the GP equation i∂ψ/∂t = [−½∇² + V + g|ψ|² − Ω L_z]ψ.

    One step of size dt (units 1/ω₀) maps ψ (complex, shape ``system.grid.shape``) to
    e^{−i dt/2 U} K(dt) e^{−i dt/2 U} ψ with U = V + g|ψ|² and K the exact kinetic (+ rotation)
    propagator. The factors are computed here once (float64 NumPy for a concrete dt) and held with dt in
    the stepper's :class:`StrangParams`; V, g and Ω are traced leaves, so new values reuse the compiled
    loop of :func:`ivhl_jax.numerics.rollout.trajectory`. A new dt is a new ``strang(system, dt)`` (same
    program when shapes and settings are unchanged).

    Args:
      system: the :class:`GPSystem`.
      dt: step size (> 0). Real time: dt·k_max²/2 ≤ π on the grid (split-step stability), else ValueError
        with the bound; ``init`` also checks the local phase over the cloud.
      imaginary: imaginary-time steps (−i dt → −dt, ψ projected to its norm: the normalised gradient flow).
      project_norm: real time. The scheme is unitary in exact arithmetic, but complex64 FFTs lose ~5e-8 of the
        norm per transform, always downwards (~1.4e-7 per step: 4 % over 4·10⁵ steps), and the energy follows.
        Rescaling ψ to the target norm removes that round-off and nothing else (the exact flow conserves
        the norm). None (default): ψ is rescaled once after every block of steps run between two
        observations (the fused multi-step path keeps its speed: one reduction and one pass per block) and
        after every single ``step``; True: after every step; False: never (the raw scheme, e.g. to measure
        the round-off).
      norm: particle number N = ∫|ψ|² dV that the projection restores (``imaginary`` or ``project_norm``);
        None projects to the norm each step starts with.
      policy: None (the system's dtype: that of ``system.potential``) or a precision policy / preset:
        ``"f32"`` → complex64, ``"f64"`` → complex128 (needs ``jax.enable_x64``); ``"bf16"`` is rejected.

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper`: ``stepper.init(psi)`` validates and casts ψ,
      ``stepper.step(psi)`` is one pure step (jit/vmap/grad-safe); record with
      ``trajectory(stepper, psi, steps, observe=condensate.observe)``.
    """
    system = with_policy(check_system(system), policy)
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    if project_norm is not None and not isinstance(project_norm, (bool, np.bool_)):
        raise TypeError(
            f"project_norm must be None (restore the norm per block of steps), True (every step) or "
            f"False (the raw scheme), got {project_norm!r}"
        )
    project_norm = None if project_norm is None else bool(project_norm)
    _check_dt(dt, system, bool(imaginary))
    rdt = system.real_dtype
    target = None
    if norm is not None:
        check_scalar(norm, "norm", positive=True)
        target = jnp.asarray(norm, rdt) / jnp.asarray(system.grid.cell_volume, rdt)
    plan = _place_plan(_make_plan(system, dt, bool(imaginary)), system.layout, system.grid.shape)
    # g and Ω as typed arrays: a Python float and an array of the same value compile the same program.
    system = system.replace(g=as_leaf(system.g, rdt), omega_rot=as_leaf(system.omega_rot, rdt))
    params = StrangParams(system, plan, target, imaginary=bool(imaginary), project_norm=project_norm)
    name = (
        "gp-strang-imaginary"
        if imaginary
        else {True: "gp-strang-projected", None: "gp-strang", False: "gp-strang-raw"}[project_norm]
    )
    return Stepper.create(_one_step, params, init_fn=_strang_init, run_fn=_run, name=name)


def evolve(
    psi: Inexact[ArrayLike, "*grid"],
    system: GPSystem,
    dt: Real[ArrayLike, ""],
    steps: int,
    save_every: int = 1,
    *,
    imaginary: bool = False,
    project_norm: bool | None = None,
    remat: bool = False,
    policy: str | Policy | None = None,
) -> tuple[Complex[Array, "*grid"], Any]:
    """``steps`` Strang steps from ψ, recording :func:`~ivhl_jax.physics.condensate.observe` every ``save_every``.

    Exactly ``trajectory(stepper, stepper.init(psi), steps, save_every=..., observe=observe, remat=...)``
    with ``stepper = strang(system, dt, imaginary=..., project_norm=..., norm=N(ψ), policy=...)`` (the
    projection, unless ``project_norm=False``, pins the initial norm for the whole run). For other observables call
    :func:`ivhl_jax.numerics.rollout.trajectory` directly.
    """
    pinned = norm(jnp.asarray(psi), check_system(system).grid) if project_norm is not False and not imaginary else None
    stepper = strang(system, dt, imaginary=imaginary, project_norm=project_norm, policy=policy, norm=pinned)
    return trajectory(stepper, stepper.init(psi), steps, save_every=save_every, observe=observe, remat=remat)
