"""The Strang split-step stepper of the Gross–Pitaevskii equation (:func:`strang`): an adapter over
:mod:`ivhl_jax.numerics.splitstep`.

One step of size dt (units 1/ω₀) maps ψ to e^{−i dt/2 U} K(dt) e^{−i dt/2 U} ψ, U = V + g|ψ|², K the exact
kinetic (+ rotation) propagator (:mod:`ivhl_jax.physics.condensate`). The GP equation supplies its kinetic symbol
(½k², or the rotating frame's ADI pieces A and B) and its local energy U; the engine checks dt once, derives the
kinetic factors from it and runs the steps. The params hold the factors and the half-step time in a plan, never
dt beside them: a new dt is a new ``strang(system, dt)`` (the same compiled program when shapes and settings are
unchanged).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Complex

from ivhl_jax.core.precision import Policy
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft, splitstep
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.condensate.dipolar import DIPOLAR_EQUATION, DipolarSystem
from ivhl_jax.physics.condensate.mixture import MIXTURE_EQUATION, SPIN1_EQUATION, MixtureSystem, Spin1System
from ivhl_jax.physics.condensate.system import (
    Equation,
    EquationParams,
    GPSystem,
    Grid,
    as_leaf,
    cast_system,
    check_psi,
    check_start,
    check_system,
    kinetic_max,
    kinetic_plan,
    kinetic_term,
    with_policy,
)

__all__ = ["strang", "StrangParams", "max_stable_dt"]


# ----------------------------------------------------------------------------------------------
# The kinetic symbol
# ----------------------------------------------------------------------------------------------
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


def _rotating_parts(grid: Grid) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A = ½k_x² + Ω y k_x (shape (n_x, n_y[, 1])) and B = ½(k_y² + k_z²) − Ω x k_y (shape (n_x, n_y[, n_z])), each
    as (Ω-free part, coefficient of Ω)."""
    kx, y, k2_rest, x_b, ky_b = _rotating_axes(grid)
    a0, a1 = 0.5 * kx[:, None] ** 2 + 0.0 * y[None, :], y[None, :] * kx[:, None]
    b0, b1 = 0.5 * k2_rest[None] + 0.0 * x_b, -(x_b * ky_b)
    if grid.ndim == 3:
        a0, a1 = a0[:, :, None], a1[:, :, None]
    return (a0, a1), (b0, b1)


def _symbol_rotating(grid: Grid, omega: float, which: int) -> np.ndarray:
    """A (``which`` = 0) or B (1) for a concrete Ω, float64 NumPy."""
    kx, y, k2_rest, x_b, ky_b = _rotating_axes(grid)
    if which == 0:
        a = 0.5 * kx[:, None] ** 2 + omega * y[None, :] * kx[:, None]
        return a[:, :, None] if grid.ndim == 3 else a
    return 0.5 * k2_rest[None] - omega * x_b * ky_b


def _kinetic_terms(system: GPSystem) -> tuple[tuple[splitstep.KineticTerm, ...], tuple[int, ...] | None]:
    """The GP kinetic symbol: ½k² over every axis, or with rotation the ADI pieces A(dt/2) B(dt) A(dt/2)
    (module docstring of :mod:`ivhl_jax.physics.condensate`)."""
    grid = system.grid
    every = tuple(range(grid.ndim))
    if not system.rotating:
        return (kinetic_term(grid),), None
    omc = splitstep.concrete_float(system.omega_rot)
    if omc is not None:
        a = splitstep.KineticTerm(lambda: _symbol_rotating(grid, omc, 0), (0,), 0.5, ("gp-rotating-a", grid, omc))
        b = splitstep.KineticTerm(lambda: _symbol_rotating(grid, omc, 1), every[1:], 1.0, ("gp-rotating-b", grid, omc))
        return (a, b), (0, 1, 0)
    # traced Ω (vmap/grad over it): the symbol built on the device in the working precision
    rdt = system.real_dtype
    om = jnp.asarray(system.omega_rot, rdt)
    (a0, a1), (b0, b1) = _rotating_parts(grid)
    a = splitstep.KineticTerm(jnp.asarray(a0, rdt) + om * jnp.asarray(a1, rdt), (0,), 0.5)
    b = splitstep.KineticTerm(jnp.asarray(b0, rdt) + om * jnp.asarray(b1, rdt), every[1:], 1.0)
    return (a, b), (0, 1, 0)


def max_stable_dt(grid: Grid) -> float:
    """The largest real-time step on ``grid``: π / (k_max²/2) (:func:`ivhl_jax.numerics.splitstep.max_stable_dt`);
    :func:`strang` refuses a larger dt."""
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a Grid (Grid.uniform(shape, length)), got {type(grid).__name__}")
    return splitstep.max_stable_dt(kinetic_max(grid))


class StrangParams(struct.PyTreeNode):
    """Everything one GP Strang step reads (built by :func:`strang`).

    Attributes:
      system: the :class:`GPSystem` (V, g and Ω are traced leaves: a new value reuses the compiled loop; Ω and
        the grid are also baked into the kinetic factors, so a new Ω or grid is a new ``strang``).
      plan: the kinetic factors and the half-step time (:class:`ivhl_jax.numerics.splitstep.SplitStepPlan`);
        ``params.dt`` reads the step size.
      target: Σ|ψ|² over the grid points (no dV) that the norm projection restores, or None (the norm
        each step starts with). Used when ``imaginary`` or ``project_norm``.
      imaginary: static; imaginary-time steps (normalised gradient flow).
      project_norm: static; real time: True projects ψ to the target norm after every step, None (the default of
        :func:`strang`) after every block of steps run between observations (and after a single ``step``),
        False never (the raw scheme).
      grid: static; the grid the kinetic factors were built for (a system on another grid is refused at the step).
      real: static; imaginary time: keep ψ real (its imaginary part, round-off of the transforms for a real ψ, is
        dropped after every step), which :func:`~ivhl_jax.physics.condensate.ground_state` sets for a problem
        without rotation (every factor of the flow real).
    """

    system: GPSystem
    plan: splitstep.SplitStepPlan
    target: Any = None
    imaginary: bool = struct.field(pytree_node=False, default=False)
    project_norm: bool | None = struct.field(pytree_node=False, default=False)
    grid: Grid | None = struct.field(pytree_node=False, default=None)
    real: bool = struct.field(pytree_node=False, default=False)

    @property
    def dt(self) -> Any:
        """The step size (a scalar in the system's real dtype)."""
        return self.plan.dt


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------
def local_energy(system: GPSystem):
    """U(ψ) = V + g|ψ|², the GP equation's local energy (real, grid-shaped)."""
    rdt = system.real_dtype
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)

    def local(p: jax.Array) -> jax.Array:
        return pot + g * (p.real * p.real + p.imag * p.imag)

    return local


def _umax(system: GPSystem, sumsq: jax.Array) -> jax.Array:
    """A bound on max|U| for the whole run from a ψ with Σ|ψ|² = ``sumsq`` (grid sum, no dV): |V + g|ψ|²| ≤
    max|V| + |g|·2Σ|ψ|² (|ψ|² ≤ Σ|ψ|² pointwise, the sum is conserved; twice it covers the round-off drift)."""
    rdt = system.real_dtype
    # The barrier keeps XLA from constant-folding this reduction when V is a constant of the program (a stepper
    # closed over by jit): folding a 256³ max took 50 s of compile time on a GPU host, running it takes microseconds.
    pot = jax.lax.optimization_barrier(jnp.asarray(system.potential, rdt))
    return jnp.max(jnp.abs(pot)) + jnp.abs(jnp.asarray(system.g, rdt)) * 2 * sumsq


def _check_params(psi: Any, params: StrangParams) -> jax.Array:
    """Static facts only (free under jit): ψ's shape, and a system that still matches the plan's static choices."""
    system, plan = params.system, params.plan
    if (
        plan.shape != system.grid.shape
        or (params.grid is not None and params.grid != system.grid)
        or (len(plan.factors) == 2) != system.rotating
        or (plan.damping is not None) != system.dissipative
    ):
        raise ValueError(
            "params.system (grid, rotation or damping) differs from the one the kinetic factors were built for; "
            "build a new stepper: condensate.strang(system, dt)"
        )
    psi = check_array(psi, "psi", shape=system.grid.shape, kind="complex")
    splitstep.check_placement(psi, system.layout, system.grid.ndim)
    return psi


def _projection(params: StrangParams, s0: jax.Array) -> Any:
    """The norm the step holds (imaginary time, or real time unless the raw scheme was asked for): the target, or
    Σ|ψ|² = ``s0`` of the incoming ψ; a real imaginary-time flow also drops the imaginary round-off of the
    transforms."""
    if not params.imaginary and params.project_norm is False:
        return None
    target = s0 if params.target is None else params.target
    project = functools.partial(splitstep.project_norm, target=jnp.asarray(target, params.system.real_dtype))
    if params.imaginary and params.real:
        return lambda p: project(jax.lax.complex(p.real, jnp.zeros_like(p.real)))
    return project


def _one_step(psi: Complex[Array, "*grid"], params: StrangParams) -> Complex[Array, "*grid"]:
    """One Strang step of ``params`` (real time, real time + projection, or imaginary time: static fields)."""
    system = params.system
    psi = _check_params(psi, params)
    s0 = splitstep.sumsq(psi)
    umax = None if params.imaginary else _umax(system, s0)
    return splitstep.step(psi, params.plan, local_energy(system), umax, project=_projection(params, s0))


def _run(psi: Complex[Array, "*grid"], params: StrangParams, n: int) -> Complex[Array, "*grid"]:
    """``n`` steps of ``params``. Real time without per-step projection merges the potential half-steps of
    consecutive steps (:func:`ivhl_jax.numerics.splitstep.run`, the same scheme to round-off, one pass over the
    field per step fewer) and, by default (``project_norm=None``), restores the norm once at the end of the ``n``
    steps; otherwise ``n`` single steps."""
    system = params.system
    psi = _check_params(psi, params)
    if params.imaginary or params.project_norm is True or system.dissipative:
        return jax.lax.fori_loop(0, n, lambda _, p: _one_step(p, params), psi)
    s0 = splitstep.sumsq(psi)
    out = splitstep.run(psi, params.plan, local_energy(system), _umax(system, s0), n)
    project = _projection(params, s0)
    return out if project is None else project(out)


def _strang_init(params: StrangParams, psi: Any) -> jax.Array:
    """Validate ψ (shape, finite values) and cast it to the system's complex dtype; for concrete values also
    check that dt resolves the local phase (real time) or decay (imaginary time) over the cloud."""
    system = params.system
    psi = check_psi(psi, system)
    splitstep.check_placement(psi, system.layout, system.grid.ndim)
    dtc = splitstep.concrete_float(params.dt)
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


def check_local_dt(dtc: float, system: GPSystem, psi: np.ndarray, imaginary: bool) -> None:
    """The local factor must be resolved where there are particles (empty corners of the box may have any V):
    dt·max|V + g|ψ|²| over the cloud ≤ 2π (:func:`ivhl_jax.numerics.splitstep.check_local_dt`). Imaginary time
    likewise (else the fixed point is the ground state of a grossly distorted operator, E ≈ 6.4 instead of 0.5
    for the 1D trap at dt = 50, or e^{−dt·U/2} underflows to NaN)."""
    rho = np.abs(psi) ** 2
    u = np.asarray(system.potential, np.float64) + np.asarray(system.g, np.float64) * rho
    splitstep.check_local_dt(dtc, splitstep.local_energy_max(u, rho), imaginary, formula="max|V + g|ψ|²|")


# ----------------------------------------------------------------------------------------------
# The builder
# ----------------------------------------------------------------------------------------------
def strang(
    system: GPSystem | MixtureSystem | Spin1System | DipolarSystem,
    dt: Any,
    *,
    imaginary: bool = False,
    project_norm: bool | None = None,
    norm: Any = None,
    magnetization: Any = None,
    policy: str | Policy | None = None,
) -> Stepper:
    """The Strang split-step stepper of the GP equation i∂ψ/∂t = [−½∇² + V + g|ψ|² − Ω L_z]ψ.

    One step of size dt (units 1/ω₀) maps ψ (complex, shape ``system.grid.shape``) to
    e^{−i dt/2 U} K(dt) e^{−i dt/2 U} ψ with U = V + g|ψ|² and K the exact kinetic (+ rotation)
    propagator. The factors are computed here once (float64 NumPy for a concrete dt) and held in the
    stepper's :class:`StrangParams`; V and g are traced leaves, so new values reuse the compiled
    loop of :func:`ivhl_jax.numerics.rollout.trajectory`. A new dt is a new ``strang(system, dt)`` (same
    program when shapes and settings are unchanged).

    A dissipative system (``GPSystem.create(..., gamma=γ)``, γ > 0) steps i∂ψ/∂t = (1 − iγ)(H − μ)ψ: every factor
    becomes e^{−i(1 − iγ)θ} and ψ is projected back to its norm after every step, which is μ chosen to hold the
    atom number; the energy then falls monotonically to a stationary state (in a rotating trap, a vortex lattice).
    γ is built into the kinetic factors like dt: a new γ is a new ``strang`` (the same program), and a traced γ
    (``vmap``/``grad`` over it) builds them on the device.

    Args:
      system: the :class:`GPSystem`.
      dt: step size (> 0). Real time: dt·k_max²/2 ≤ π on the grid (split-step stability, :func:`max_stable_dt`),
        else ValueError with the bound; ``init`` also checks the local phase over the cloud.
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

    The family's one door also takes the other systems, each with its own scheme (same arguments where they
    apply): a :class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem` (C components, ψ of shape (C, *grid);
    ``norm`` one N_i or C of them), a :class:`~ivhl_jax.physics.condensate.mixture.Spin1System` (ψ of shape
    (3, *grid); ``magnetization`` held in imaginary time) and a
    :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` (grid-shaped ψ with the dipolar potential);
    ``project_norm`` is the scalar GP system's only.

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper`: ``stepper.init(psi)`` validates and casts ψ,
      ``stepper.step(psi)`` is one pure step (jit/vmap/grad-safe); record with
      ``trajectory(stepper, psi, steps, observe=condensate.observe)``.
    """
    other = EQUATIONS.get(type(system))
    if other is not None:
        return _other_strang(other, system, dt, imaginary, project_norm, norm, magnetization, policy)
    if not isinstance(system, GPSystem):
        raise TypeError(
            f"system must be a GPSystem, MixtureSystem, Spin1System or DipolarSystem, got {type(system).__name__}"
        )
    if magnetization is not None:
        raise ValueError("magnetization applies to a Spin1System, not to a GPSystem; drop it")
    system = with_policy(check_system(system), policy)
    imaginary, project_norm = _check_gp_flags(system, imaginary, project_norm)
    plan = _gp_plan(system, dt, imaginary)
    target = None
    if norm is not None:
        check_scalar(norm, "norm", positive=True)
        target = jnp.asarray(norm, system.real_dtype) / jnp.asarray(system.grid.cell_volume, system.real_dtype)
    system = _typed_leaves(system)
    params = StrangParams(system, plan, target, imaginary=imaginary, project_norm=project_norm, grid=system.grid)
    name = (
        "gp-strang-imaginary"
        if imaginary
        else {True: "gp-strang-projected", None: "gp-strang", False: "gp-strang-raw"}[project_norm]
    )
    return Stepper.create(_one_step, params, init_fn=_strang_init, run_fn=_run, name=name, check_fn=check_start)


def _gp_plan(system: GPSystem, dt: Any, imaginary: bool) -> splitstep.SplitStepPlan:
    """The engine's plan of the GP kinetic symbol (free or rotating, damped when the system is dissipative)."""
    terms, stages = _kinetic_terms(system)
    return splitstep.plan(
        terms,
        dt,
        shape=system.grid.shape,
        imaginary=imaginary,
        dtype=system.complex_dtype,
        kinetic_max=kinetic_max(system.grid),
        label="k_max²/2",
        stages=stages,
        fft=system.fft,
        layout=system.layout,
        damping=system.gamma if system.dissipative else None,
    )


def _typed_leaves(system: GPSystem) -> GPSystem:
    """g, Ω and γ as arrays of the working dtype: a Python float and an array of the same value compile the same
    program."""
    rdt = system.real_dtype
    return system.replace(
        g=as_leaf(system.g, rdt),
        omega_rot=as_leaf(system.omega_rot, rdt),
        rotating=system.rotating,
        gamma=as_leaf(system.gamma, rdt),
        dissipative=system.dissipative,
    )


def _check_gp_flags(system: GPSystem, imaginary: Any, project_norm: Any) -> tuple[bool, bool | None]:
    """The static choices of a GP stepper, each refused in one line when it cannot be met."""
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    if project_norm is not None and not isinstance(project_norm, (bool, np.bool_)):
        raise TypeError(
            f"project_norm must be None (restore the norm per block of steps), True (every step) or "
            f"False (the raw scheme), got {project_norm!r}"
        )
    project_norm = None if project_norm is None else bool(project_norm)
    if system.dissipative and imaginary:
        raise ValueError(
            "gamma damps real-time dynamics; imaginary=True is already a gradient flow: give the system gamma=0"
        )
    if system.dissipative and project_norm is False:
        raise ValueError(
            "a dissipative system (gamma > 0) holds the atom number by projecting every step (μ tracked); "
            "project_norm=False would let the damping drain it: use project_norm=None or True"
        )
    return bool(imaginary), project_norm


def _other_strang(
    equation: Equation,
    system: Any,
    dt: Any,
    imaginary: Any,
    project_norm: Any,
    norm: Any,
    magnetization: Any,
    policy: Any,
) -> Stepper:
    """The stepper of a mixture, spin-1 or dipolar system's ``equation`` over the free kinetic factor
    (:func:`~ivhl_jax.physics.condensate.system.kinetic_plan`, dt checked once), with
    :class:`~ivhl_jax.physics.condensate.system.EquationParams`, named ``<name>-strang[-imaginary]`` (options it does
    not take refused in one line naming the system)."""
    if project_norm is not None:
        raise ValueError(f"project_norm applies to a GPSystem, not to a {type(system).__name__}; drop it")
    if magnetization is not None and not isinstance(system, Spin1System):
        raise ValueError(f"magnetization applies to a Spin1System, not to a {type(system).__name__}; drop it")
    system = cast_system(equation.check(system), policy, equation.solver)
    target = equation.targets(system, norm, magnetization, imaginary)
    plan = kinetic_plan(system.grid, dt, imaginary=imaginary, dtype=system.complex_dtype, layout=system.layout)
    params = EquationParams(system, plan, target, imaginary=plan.imaginary)
    name = f"{equation.name}-strang-imaginary" if plan.imaginary else f"{equation.name}-strang"
    return Stepper.create(equation.step, params, init_fn=equation.init, name=name, check_fn=check_start)


#: The equations of the other systems behind the one door, by system type (their own modules define each equation);
#: :func:`strang` and :func:`~ivhl_jax.physics.condensate.ground_state` look a system up here.
EQUATIONS: dict[type, Any] = {e.system_type: e for e in (MIXTURE_EQUATION, SPIN1_EQUATION, DIPOLAR_EQUATION)}
