"""Ground states at fixed particle number: the exact discrete ground state by Riemannian conjugate gradient (the
default, :mod:`~ivhl_jax.physics.condensate.riemannian`) or imaginary-time Strang steps (the normalised gradient
flow, ``method="flow"`` or any call that gives a step ``dt``; :func:`default_method` states the rule).

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`).

The scalar GP flow (:func:`ground_state` of a GPSystem) minimises E[ψ] (:func:`energy`) at ∫|ψ|² dV = N by the
normalised gradient flow ∂ψ/∂τ = −[−½∇² + V + g|ψ|² − Ω L_z]ψ, projected to norm N (τ in 1/ω₀, energies in ħω₀).
Iterates blocks of ``check_every`` steps in a ``lax.while_loop`` until both the relative energy change
over a block, |ΔE|/|E|, is below ``tol`` and the state has settled, ‖ψ − ψ_old‖/‖ψ‖ ≤ √tol over the block, or
``max_steps`` is reached. The energy error is quadratic in the error of ψ; the change of ψ over a block is
linear in it (it is the residual of the discrete flow, ψ' − ψ ≈ −τ(H_dt − μ)ψ), so slow modes that barely move
the energy are seen. The fixed point carries the splitting's bias: its residual ‖Hψ − μψ‖/‖Hψ‖
(:func:`~ivhl_jax.physics.condensate.residual`, reported) falls linearly with dt; refine by calling again with a
smaller dt and ``psi0``.

A real problem (Ω = 0: every factor of the flow is real) has a real, positive ground state, and the flow keeps
ψ real: a complex ``psi0`` (or the complex ``noise``) loses its global phase θ = ½ arg Σψ² and its imaginary
part once, and the imaginary round-off of the transforms is dropped after every step, so E[ψ] = E[|ψ|] and
:func:`~ivhl_jax.physics.condensate.bogoliubov` takes the result (Thomas–Fermi regime included). The returned
ψ is then real and positive (complex dtype, zero imaginary part).
The whole solve (noise, normalisation, loop, observables) is one jitted program.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Inexact

from ivhl_jax.core.precision import Policy, complex_state_dtype
from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.numerics import splitstep
from ivhl_jax.numerics.distributed_fft import host_readable
from ivhl_jax.numerics.rollout import Stepper, converge
from ivhl_jax.physics.condensate._descent import check_finite, descent_settings, flow_ground_state, real_part
from ivhl_jax.physics.condensate.dipolar import DipolarSystem
from ivhl_jax.physics.condensate.mixture import MixtureSystem, Spin1System
from ivhl_jax.physics.condensate.observables import chemical_potential, energy, normalize, residual
from ivhl_jax.physics.condensate.riemannian import riemannian_ground_state
from ivhl_jax.physics.condensate.states import gaussian
from ivhl_jax.physics.condensate.stepper import EQUATIONS, check_local_dt, strang
from ivhl_jax.physics.condensate.system import (
    FLOAT32_TOL,
    GPSystem,
    cast_output,
    check_psi,
    check_system,
    with_policy,
)

__all__ = ["ground_state", "default_method", "FLOAT32_TOL", "FLOW_DT", "FLOW_CHECK_EVERY"]

#: The flow's default imaginary time step (``method="flow"`` without ``dt``).
FLOW_DT = 1e-2
#: The flow's default number of steps per convergence check.
FLOW_CHECK_EVERY = 100


def default_method(system: Any, dt: Any = None, check_every: Any = None, policy: str | Policy | None = None) -> str:
    """The method :func:`ground_state` uses when ``method`` is None: ``"cg"`` (the exact discrete ground state by
    Riemannian conjugate gradient), except ``"flow"`` (imaginary-time steps) when

    - the call gives a flow parameter, ``dt`` or ``check_every`` (it asks for the flow at that step);
    - the system has a ``layout`` (the conjugate gradient runs on one device);
    - the system is a :class:`Spin1System` in float32 (the system's dtype under ``policy``): its complex float32
      solve can stall above the float32 residual tolerance (3D: at 5.6e-5, not converged, in four times the
      flow's time), while in float64 it reaches 1e-10 faster than the flow.

    Elsewhere the conjugate gradient reached a smaller residual than the flow at its default step, without its
    O(dt) bias, mostly in less time (every system in 1D, 2D and 3D, float32 and float64:
    bench/results/ground_state_solvers.json, ground_state_solvers_f32.json); in three 1D solves of hundredths of
    a second the flow's coarser answer came as fast or first (ratios 0.5 to 0.99), and the flow reaches the
    conjugate gradient's accuracy only at a smaller dt, in proportionally more steps."""
    if dt is not None or check_every is not None or getattr(system, "layout", None) is not None:
        return "flow"
    if isinstance(system, Spin1System):
        cdt = complex_state_dtype(policy, like=system.potential, routine="ground_state")
        if np.dtype(cdt).itemsize <= 8:
            return "flow"
    return "cg"


def _energy_and_state(psi: jax.Array, params: Any) -> tuple[jax.Array, jax.Array]:
    """What the search watches settle: the energy (its change is quadratic in the error) and ψ itself (its change
    over a block, linear in the error, is the residual of the discrete flow: ψ' − ψ ≈ −τ(H_dt − μ)ψ)."""
    return energy(psi, params.system)["total"], psi


@functools.partial(jax.jit, static_argnames=("n_blocks", "check_every", "use_noise"))
def _ground_state_loop(
    stepper: Stepper,
    psi: jax.Array,
    norm: Any,
    tol: Any,
    key: Any,
    noise: Any,
    *,
    n_blocks: int,
    check_every: int,
    use_noise: bool,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    params = stepper.params
    system = params.system
    grid = system.grid
    rdt, cdt = system.real_dtype, system.complex_dtype
    psi = psi.astype(cdt)
    if use_noise:
        kr, ki = jax.random.split(key)
        amp = jnp.max(jnp.abs(psi))
        psi = psi + (jnp.asarray(noise, rdt) * amp).astype(cdt) * jax.lax.complex(
            jax.random.normal(kr, grid.shape, rdt), jax.random.normal(ki, grid.shape, rdt)
        ).astype(cdt)
    # A real problem (no rotation: every factor of the flow is real) has a real, positive ground state; the flow
    # keeps ψ real, else the round-off in Im ψ grows while ψ is far from the ground state and then decays only
    # through slow phase modes.
    real = not system.rotating
    if real:
        psi = real_part(psi)
    norm = jnp.asarray(norm, rdt)
    psi = normalize(psi, grid, norm)
    # A fixed projection target (Σ|ψ|² = N/dV) keeps the norm anchored instead of random-walking.
    params = params.replace(target=norm / jnp.asarray(grid.cell_volume, rdt), real=real)
    stepper = stepper.replace(params=params)
    tols = (jnp.asarray(tol, rdt), jnp.sqrt(jnp.asarray(tol, rdt)))
    psi, _, (delta, moved), k = converge(stepper, psi, _energy_and_state, tols, blocks=n_blocks, block=check_every)
    # Final renormalisation: the returned state has the requested norm to round-off (and, real, is positive).
    psi = normalize(psi, grid, norm)
    if real:
        psi = psi * jnp.where(jnp.sum(psi.real) < 0, -1, 1).astype(rdt)
    e = energy(psi, system)["total"]
    finite = jnp.logical_and(jnp.all(jnp.isfinite(psi.real) & jnp.isfinite(psi.imag)), jnp.isfinite(e))
    info = {
        "steps": k * check_every,
        "energy": e,
        "mu": chemical_potential(psi, system),
        "delta": delta,
        "moved": moved,
        "residual": residual(psi, system),
        "converged": (delta <= tol) & (moved <= tols[1]),
        "finite": finite,
    }
    return psi, info


def ground_state(
    system: GPSystem | MixtureSystem | Spin1System | DipolarSystem,
    norm: Any = 1.0,
    dt: float | None = None,
    tol: float | None = None,
    max_steps: int = 100_000,
    *,
    psi0: Inexact[ArrayLike, "*state"] | None = None,
    check_every: int | None = None,
    key: jax.Array | None = None,
    noise: float = 0.0,
    magnetization: Any = None,
    policy: str | Policy | None = None,
    method: str | None = None,
) -> tuple[Complex[Array, "*state"], dict[str, Array]]:
    """Ground state of any condensate system at fixed norm: the family's one door.

    Two methods. ``"cg"``: the exact discrete ground state (no time-step bias) by preconditioned Riemannian
    conjugate gradient, :func:`~ivhl_jax.physics.condensate.riemannian.riemannian_ground_state` (``tol`` is its
    residual ‖Hψ − μψ‖/‖Hψ‖, ``max_steps`` its iteration cap). ``"flow"``: imaginary-time Strang steps
    (:func:`strang` with ``imaginary=True``) of size ``dt``, as described below. ``method=None`` (the default)
    follows :func:`default_method`: the conjugate gradient, unless ``dt`` or ``check_every`` is given (a step size
    asks for the flow), the system has a ``layout`` (the conjugate gradient runs on one device) or it is spin-1 in
    float32.

    Flow: a :class:`GPSystem` is solved as described below. A
    :class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem` (ψ of shape (C, *grid)) holds every N_i (``norm``
    one number or C; the default guess is unit Gaussians at the origin, a stationary point also when the components
    would separate: pass a ``psi0`` that breaks the symmetry); a :class:`~ivhl_jax.physics.condensate.mixture.
    Spin1System` (ψ of shape (3, *grid)) holds N and, given ``magnetization``, M = ∫F_z dV (|M| < N; the default
    guess a Gaussian times the generic spinor (0.6, 0.5 + 0.4i, 0.3)/|·|); a
    :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` holds N. Their tolerance default is 4e-7 in float32
    and 1e-10 in float64; ``key`` and ``noise`` are the scalar system's only, ``magnetization`` the spin-1 one's
    (another system refuses them in one line). info holds "steps", "energy", "delta", "moved", "converged",
    "finite" for every system, and every search stops when both the energy and ψ have settled. The mixture and
    dipolar searches keep ψ real as below (a mixture one phase per component); the spin-1 search runs the complex
    flow.

    The scalar GP search (module docstring: the flow, its stopping rule, its bias and why ψ stays real) is one
    jitted program, compiled once per (grid, dtype, check_every, number of blocks, noise on/off): a new dt, N, tol,
    g or V reuses it.

    Args:
      system: the :class:`GPSystem` (with Ω ≠ 0 this is the rotating-frame ground state).
      norm: particle number N = ∫|ψ|² dV (the returned ψ has this norm to round-off).
      dt: the flow's imaginary time step (given: ``method=None`` selects the flow; None: :data:`FLOW_DT`).
      tol: cg: the relative residual (None: 1e-11 in float64, 1e-5 in float32). Flow: the relative energy change
        per block that counts as converged (and √tol the change of ψ); None: 1e-9 in float64 and
        :data:`FLOAT32_TOL` (4e-7) in float32, whose energy sums bottom out at ~1e-7 (one ulp of E), so that a
        smaller float32 tol is never met and the solve always runs to ``max_steps``.
      max_steps: cg: the iteration cap; flow: the step budget (rounded up to a multiple of ``check_every``).
      psi0: initial guess, shape ``grid.shape`` (default: a Gaussian of unit trap width).
      check_every: the flow's steps per convergence check (given: ``method=None`` selects the flow; None:
        :data:`FLOW_CHECK_EVERY`).
      key: PRNG key of the noise (required when ``noise`` ≠ 0).
      noise: relative amplitude of complex noise added to the initial guess (breaks symmetries, e.g.
        to let a vortex lattice nucleate in a rotating trap).
      method: None (:func:`default_method`), ``"cg"`` (which refuses ``dt`` and ``check_every``) or ``"flow"``.
      policy: None (the system's dtype) or a precision policy / preset (:func:`with_policy`);
        ``"f32"`` reaches |E − E₀|/E₀ ≈ 1e-7, ``"f64"`` ≈ 3e-13 (1D trap, dt = 2e-3)
        (measured, docs/guide/precision.md). ψ is returned in the policy's output dtype.

    Returns:
      (ψ, info): ψ complex of shape ``grid.shape``; info = {"steps", "energy" (total E of the returned
      ψ), "mu", "delta" (last relative energy change), "moved" (last relative change of ψ), "residual"
      (‖Hψ − μψ‖/‖Hψ‖ of the returned ψ), "converged", "finite"}. Works under jit and vmap (e.g. over
      ``system.g``). Outside a trace a non-finite result raises ``ValueError`` (the flow's names dt). cg on a real
      problem is differentiable in reverse mode (implicit function theorem); the flow is not (its loop).
    """
    check_scalar(max_steps, "max_steps", integer=True, minimum=1)
    method = default_method(system, dt, check_every, policy) if method is None else method
    if method not in ("flow", "cg"):
        raise ValueError(f"method must be 'flow' (imaginary-time steps) or 'cg' (Riemannian CG), got {method!r}")
    solve = _cg_ground_state if method == "cg" else _flow_ground_state
    options = {"psi0": psi0, "key": key, "noise": noise, "magnetization": magnetization, "policy": policy}
    return solve(system, norm, dt, tol, max_steps, check_every, **options)


def _cg_ground_state(
    system: Any, norm: Any, dt: float | None, tol: float | None, max_steps: int, check_every: int | None, **options: Any
) -> tuple[jax.Array, dict[str, Array]]:
    """:func:`ground_state`'s ``method="cg"``: :func:`riemannian_ground_state`, which has no time step (``dt`` and
    ``check_every`` refused)."""
    if dt is not None or check_every is not None:
        raise ValueError(
            "dt and check_every are the flow's step and check interval: pass method='flow' to use them (the "
            "conjugate gradient has no time step; its tol is the residual)"
        )
    return riemannian_ground_state(system, norm, tol, max_steps, **options)


def _flow_ground_state(
    system: Any,
    norm: Any,
    dt: float | None,
    tol: float | None,
    max_steps: int,
    check_every: int | None,
    *,
    psi0: Any,
    key: Any,
    noise: Any,
    magnetization: Any,
    policy: str | Policy | None,
) -> tuple[jax.Array, dict[str, Array]]:
    """:func:`ground_state`'s ``method="flow"``: ``dt`` and ``check_every`` defaulted (:data:`FLOW_DT`,
    :data:`FLOW_CHECK_EVERY`), the scalar GP search for a :class:`GPSystem`, the equation's flow for another."""
    dt = FLOW_DT if dt is None else dt
    check_every = FLOW_CHECK_EVERY if check_every is None else check_every
    if not isinstance(system, GPSystem):
        other = {"psi0": psi0, "check_every": check_every, "key": key, "noise": noise, "policy": policy}
        return _other_ground_state(system, norm, dt, tol, max_steps, magnetization=magnetization, **other)
    if magnetization is not None:
        raise ValueError("magnetization applies to a Spin1System, not to a GPSystem; drop it")
    system = with_policy(check_system(system), policy)
    psi, info = _gp_ground_state(system, norm, dt, tol, max_steps, psi0, check_every, key, noise)
    return cast_output(psi, policy), info


def _gp_ground_state(
    system: GPSystem,
    norm: Any,
    dt: Any,
    tol: Any,
    max_steps: int,
    psi0: Any,
    check_every: int,
    key: jax.Array | None,
    noise: Any,
) -> tuple[jax.Array, dict[str, Array]]:
    """The scalar GP search of :func:`ground_state` (module docstring) on a system in its working dtype."""
    tol, n_blocks = descent_settings(tol, max_steps, check_every, system.real_dtype, f64_tol=1e-9)
    check_scalar(norm, "norm", positive=True)
    check_scalar(noise, "noise", nonnegative=True)
    check_scalar(dt, "dt", positive=True)
    use_noise = not (is_concrete(noise) and float(np.asarray(noise)) == 0.0)
    if use_noise and key is None:
        raise ValueError(
            f"noise={noise} needs a PRNG key: pass key=jax.random.key(seed) (without one the noise "
            "would be silently ignored)"
        )
    grid = system.grid
    if psi0 is None:
        psi = gaussian(grid, 1.0, dtype=system.complex_dtype)
    else:
        psi = check_psi(psi0, system, "psi0")
        if is_concrete(psi) and host_readable(psi) and not np.any(np.asarray(psi) != 0):
            raise ValueError(
                "psi0 is zero everywhere (zero norm), so it cannot be normalised to norm; pass a "
                "non-zero initial guess (or psi0=None for the default Gaussian)"
            )
    if system.dissipative:  # a stationary state of (1 − iγ)(H − μ)ψ = 0 is one of H: γ plays no part
        system = system.replace(gamma=0.0)
    stepper = strang(system, dt, imaginary=True)
    dtc = splitstep.concrete_float(dt)
    # (arrays spread over several processes have no host copy here: the check is skipped for them)
    local = host_readable(psi) and host_readable(system.potential)
    if dtc is not None and local and is_concrete(psi) and is_concrete(system.potential) and is_concrete(system.g):
        check_local_dt(dtc, system, np.asarray(psi), True)
    psi, info = _ground_state_loop(
        stepper,
        psi,
        norm,
        tol,
        key if use_noise else None,
        noise if use_noise else None,
        n_blocks=n_blocks,
        check_every=int(check_every),
        use_noise=use_noise,
    )
    check_finite(
        info["finite"],
        dt,
        ", e^(-dt·V/2) underflows the occupied region",
        lambda: f"use a smaller dt (e.g. dt <= {_gs_dt_hint(system):.3g}) and refine",
    )
    return psi, info


def _other_ground_state(system: Any, norm: Any, dt: Any, tol: Any, max_steps: Any, **options: Any) -> Any:
    """The flow search of a mixture, spin-1 or dipolar system's equation (options it does not take refused in one
    line naming the system)."""
    equation = EQUATIONS.get(type(system))
    if equation is None:
        raise TypeError(
            f"system must be a condensate system (GPSystem, MixtureSystem, Spin1System or DipolarSystem), got "
            f"{type(system).__name__}"
        )
    name = type(system).__name__
    key, noise = options.pop("key"), options.pop("noise")
    if key is not None or not (is_concrete(noise) and float(np.asarray(noise)) == 0.0):
        raise ValueError(f"key and noise apply to a GPSystem, not to a {name}; drop them (or pass psi0)")
    magnetization = options.pop("magnetization")
    if magnetization is not None:
        if not isinstance(system, Spin1System):
            raise ValueError(f"magnetization applies to a Spin1System, not to a {name}; drop it")
        options["magnetization"] = magnetization
    return flow_ground_state(equation, system, norm, dt, tol, max_steps, **options)


def _gs_dt_hint(system: GPSystem) -> float:
    # Keep e^{−dt·max U/2} representable: dt·(max V − min V)/2 below ~half the float exponent range.
    try:
        v = np.asarray(system.potential, np.float64)
        span = float(v.max() - v.min())
    except Exception:  # noqa: BLE001 - traced potential: no hint from values
        return 1e-2
    lim = 0.5 * math.log(float(np.finfo(np.dtype(system.real_dtype)).max))
    return 2 * lim / span if span > 0 else 1.0
