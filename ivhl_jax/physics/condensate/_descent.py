"""The imaginary-time ground-state front end shared by the condensate solvers (private to the package).

A ground state is the fixed point of the normalised gradient flow: imaginary-time Strang steps of a stepper
built with ``imaginary=True``, which project ψ to the held norms. :func:`descent_settings` checks a search's
settings and resolves the default tolerance, :func:`descend` runs the steps in blocks of ``check_every`` until the
relative energy change over a block, |ΔE|/|E|, is below ``tol`` and ψ has settled (‖ψ − ψ_old‖/‖ψ‖ ≤ √tol), or
the block budget is spent (one jitted ``lax.while_loop``, :func:`ivhl_jax.numerics.rollout.converge`), keeping ψ
real for a real problem (:func:`real_part`), and :func:`check_finite` turns a broken-down
iteration (NaN/inf) into the one-line error that names dt. :func:`flow_ground_state` is the search of every
:class:`~ivhl_jax.physics.condensate.system.Equation` (mixture, spin-1, dipolar).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper, converge
from ivhl_jax.physics.condensate.observables import energy
from ivhl_jax.physics.condensate.stepper import strang
from ivhl_jax.physics.condensate.system import (
    FLOAT32_TOL,
    Equation,
    cast_output,
    cast_system,
    place_state,
)

__all__ = ["descent_settings", "descend", "check_finite", "real_part", "flow_ground_state"]


def descent_settings(
    tol: Any, max_steps: Any, check_every: Any, real_dtype: Any, f64_tol: float = 1e-10
) -> tuple[Any, int]:
    """(tol, number of blocks): ``tol`` None is :data:`~ivhl_jax.physics.condensate.system.FLOAT32_TOL` in float32
    (a float32 energy's relative change bottoms out at one ulp, ~1e-7) and ``f64_tol`` in float64; ``tol`` > 0,
    ``max_steps`` and ``check_every`` integers ≥ 1 (one-line errors naming them); ``max_steps`` rounded up to whole
    blocks of ``check_every`` steps."""
    if tol is None:
        tol = FLOAT32_TOL if np.dtype(real_dtype).itemsize <= 4 else f64_tol
    check_scalar(tol, "tol", positive=True)
    check_scalar(max_steps, "max_steps", integer=True, minimum=1)
    check_scalar(check_every, "check_every", integer=True, minimum=1)
    return tol, -(-int(max_steps) // int(check_every))


def real_part(psi: jax.Array, axes: tuple[int, ...] | None = None) -> jax.Array:
    """ψ without its phase θ = ½ arg Σψ² over ``axes`` (None: all; one phase per remaining index, e.g. per
    component of a (C, *grid) mixture), which makes Σψ² real and positive so that the real part keeps the most of
    ψ, as a complex array with zero imaginary part. A real ψ is returned as it is."""
    theta = 0.5 * jnp.angle(jnp.sum(psi * psi, axis=axes, keepdims=True))
    turned = psi * jax.lax.complex(jnp.cos(theta), -jnp.sin(theta)).astype(psi.dtype)
    return jax.lax.complex(turned.real, jnp.zeros_like(turned.real))


def _positive(psi: jax.Array, axes: tuple[int, ...] | None) -> jax.Array:
    """A real ψ with the sign of each Σψ over ``axes`` made positive (a nodeless ground state is then ≥ 0)."""
    sign = jnp.where(jnp.sum(psi.real, axis=axes, keepdims=True) < 0, -1, 1).astype(psi.real.dtype)
    return psi * sign


@dataclasses.dataclass(frozen=True)
class _RealStep:
    """A step that drops the imaginary round-off of its result (the flow of a real problem keeps ψ real)."""

    step: Callable[[Any, Any], Any]

    def __call__(self, psi: jax.Array, params: Any) -> jax.Array:
        out = self.step(psi, params)
        return jax.lax.complex(out.real, jnp.zeros_like(out.real))


def _energy_and_state(energy: Callable, psi: jax.Array, params: Any) -> tuple[jax.Array, jax.Array]:
    """What the search watches settle: the energy and ψ itself (its change over a block is the discrete flow's
    residual, so slow modes that barely move the energy are seen)."""
    return energy(psi, params), psi


@functools.partial(jax.jit, static_argnames=("energy", "n_blocks", "check_every", "real_axes"))
def _descend(
    stepper: Stepper,
    psi: jax.Array,
    tol: Any,
    *,
    energy: Callable,
    n_blocks: int,
    check_every: int,
    real_axes: tuple[int, ...] | None,
) -> tuple[Any, Any]:
    real = real_axes is not None
    if real:
        psi = real_part(psi, real_axes)
        stepper = stepper.replace(step_fn=_RealStep(stepper.step_fn), run_fn=None)
    psi = stepper.step_fn(psi, stepper.params)  # one projected step: the state has the held norms from here on
    tols = (tol, jnp.sqrt(jnp.asarray(tol, psi.real.dtype)))
    psi, (e, _), (delta, moved), k = converge(
        stepper, psi, functools.partial(_energy_and_state, energy), tols, blocks=n_blocks, block=check_every
    )
    if real:
        psi = _positive(psi, real_axes)
    finite = jnp.all(jnp.isfinite(psi.real) & jnp.isfinite(psi.imag)) & jnp.isfinite(e)
    info = {
        "steps": k * check_every + 1,
        "energy": e,
        "delta": delta,
        "moved": moved,
        "converged": (delta <= tol) & (moved <= tols[1]),
        "finite": finite,
    }
    return psi, info


def descend(
    stepper: Stepper,
    psi: jax.Array,
    energy: Callable[[jax.Array, Any], jax.Array],
    tol: Any,
    n_blocks: int,
    check_every: Any,
    dt: Any,
    *,
    real_axes: tuple[int, ...] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One projected step, then blocks of ``check_every`` imaginary-time steps of ``stepper`` until both the
    relative change of ``energy(psi, params)`` (a module-level function: it is a static argument of the compiled
    loop) over a block is ≤ ``tol`` and ψ has settled, ‖ψ − ψ_old‖/‖ψ‖ ≤ √tol (the energy error is quadratic in the
    error of ψ, the change of ψ linear), or ``n_blocks`` blocks.

    ``real_axes`` not None: the problem is real (every factor of the flow real), so ψ is kept real: its phase
    ½ arg Σψ² over ``real_axes`` (one per remaining index: per component of a mixture) and its imaginary part are
    dropped once, the imaginary round-off after every step, and the result has each Σψ over ``real_axes``
    positive. Returns (ψ, info) with info = {"steps", "energy", "delta", "moved", "converged", "finite"}; a
    non-finite result outside a trace raises :func:`check_finite`'s error."""
    psi, info = _descend(
        stepper, psi, tol, energy=energy, n_blocks=n_blocks, check_every=int(check_every), real_axes=real_axes
    )
    check_finite(info["finite"], dt)
    return psi, info


def _total_energy(psi: jax.Array, params: Any) -> jax.Array:
    return energy(psi, params.system)["total"]


def flow_ground_state(
    equation: Equation,
    system: Any,
    norm: Any,
    dt: Any,
    tol: Any,
    max_steps: Any,
    *,
    psi0: Any = None,
    check_every: Any = 100,
    policy: Any = None,
    magnetization: Any = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The ground state of ``equation`` on ``system`` by the normalised gradient flow (arguments and info as
    :func:`~ivhl_jax.physics.condensate.ground_state` with ``method="flow"``): the start state
    ``equation.guess(system, psi0, magnetization)`` placed on the system's layout, imaginary-time steps of
    :func:`~ivhl_jax.physics.condensate.strang` holding ``norm`` (and ``magnetization``), run by
    :func:`descend` (ψ kept real over the grid axes when ``equation.real``), ψ returned in ``policy``'s output
    dtype."""
    system = cast_system(equation.check(system), policy, equation.solver)
    check_scalar(dt, "dt", positive=True)
    psi = place_state(equation.guess(system, psi0, magnetization), system)
    stepper = strang(system, dt, imaginary=True, norm=norm, magnetization=magnetization)
    tol, n_blocks = descent_settings(tol, max_steps, check_every, system.real_dtype)
    real_axes = tuple(range(psi.ndim - system.grid.ndim, psi.ndim)) if equation.real else None
    psi, info = descend(stepper, psi, _total_energy, tol, n_blocks, check_every, dt, real_axes=real_axes)
    return cast_output(psi, policy), info


def check_finite(ok: Any, dt: Any, cause: str = "", advice: str | Callable[[], str] = "use a smaller dt") -> None:
    """Raise the one-line ValueError of an imaginary-time solve that broke down (``ok`` concrete and False): it
    names dt, the ``cause`` appended to "NaN/inf" and the ``advice`` (a string, or a function that builds it only
    when the error is raised)."""
    if is_concrete(ok) and not bool(ok):
        text = advice() if callable(advice) else advice
        raise ValueError(
            f"dt={dt} is too large for this imaginary-time solve: the iteration broke down (NaN/inf{cause}); {text}"
        )
