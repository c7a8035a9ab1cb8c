"""The imaginary-time ground-state front end shared by the condensate solvers (private to the package).

A ground state is the fixed point of the normalised gradient flow: imaginary-time Strang steps of a stepper
built with ``imaginary=True``, which project ψ to the held norms. :func:`descent_settings` checks a search's
settings and resolves the default tolerance, :func:`descend` runs the steps in blocks of ``check_every`` until the
relative energy change over a block, |ΔE|/|E|, is below ``tol`` or the block budget is spent (one jitted
``lax.while_loop``, :func:`ivhl_jax.numerics.rollout.converge`), and :func:`check_finite` turns a broken-down
iteration (NaN/inf) into the one-line error that names dt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper, converge
from ivhl_jax.physics.condensate.system import FLOAT32_TOL

__all__ = ["descent_settings", "descend", "check_finite"]


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


@functools.partial(jax.jit, static_argnames=("energy", "n_blocks", "check_every"))
def _descend(
    stepper: Stepper, psi: jax.Array, tol: Any, *, energy: Callable, n_blocks: int, check_every: int
) -> tuple[Any, Any]:
    psi = stepper.step_fn(psi, stepper.params)  # one projected step: the state has the held norms from here on
    psi, e, delta, k = converge(stepper, psi, energy, tol, blocks=n_blocks, block=check_every)
    finite = jnp.all(jnp.isfinite(psi.real) & jnp.isfinite(psi.imag)) & jnp.isfinite(e)
    info = {"steps": k * check_every + 1, "energy": e, "delta": delta, "converged": delta <= tol, "finite": finite}
    return psi, info


def descend(
    stepper: Stepper,
    psi: jax.Array,
    energy: Callable[[jax.Array, Any], jax.Array],
    tol: Any,
    n_blocks: int,
    check_every: Any,
    dt: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One projected step, then blocks of ``check_every`` imaginary-time steps of ``stepper`` until the relative
    change of ``energy(psi, params)`` (a module-level function: it is a static argument of the compiled loop) over
    a block is ≤ ``tol``, or ``n_blocks`` blocks. Returns (ψ, info) with info = {"steps", "energy", "delta",
    "converged", "finite"}; a non-finite result outside a trace raises :func:`check_finite`'s error."""
    psi, info = _descend(stepper, psi, tol, energy=energy, n_blocks=n_blocks, check_every=int(check_every))
    check_finite(info["finite"], dt)
    return psi, info


def check_finite(ok: Any, dt: Any, cause: str = "", advice: str | Callable[[], str] = "use a smaller dt") -> None:
    """Raise the one-line ValueError of an imaginary-time solve that broke down (``ok`` concrete and False): it
    names dt, the ``cause`` appended to "NaN/inf" and the ``advice`` (a string, or a function that builds it only
    when the error is raised)."""
    if is_concrete(ok) and not bool(ok):
        text = advice() if callable(advice) else advice
        raise ValueError(
            f"dt={dt} is too large for this imaginary-time solve: the iteration broke down (NaN/inf{cause}); {text}"
        )
