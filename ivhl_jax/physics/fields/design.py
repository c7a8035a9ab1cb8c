"""Inverse design of a wave field: :func:`focus_phases` optimises source phases (Adam, through the gradient of
:func:`~ivhl_jax.physics.fields.superpose`) to focus the intensity at a target point."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.fields.inputs import per_source, points_and_sources
from ivhl_jax.physics.fields.waves import intensity, superpose

__all__ = ["focus_phases"]


def focus_phases(
    sources: Real[ArrayLike, "m d"],
    target: Real[ArrayLike, " d"],
    *,
    amplitudes: Any = 1.0,
    wavenumbers: Any = 1.0,
    softening: Any = 0.1,
    init_phases: Any = 0.0,
    steps: int = 200,
    learning_rate: float = 0.05,
) -> tuple[Float[Array, " m"], Float[Array, " steps"]]:
    """Inverse design: optimise source phases so that the intensity at ``target`` is maximal.

    Minimises  L(φ) = −I(target; φ) / I_max  with Adam (optax), where I comes from
    :func:`superpose` at t = 0 (gradient through it) and I_max = (Σ_j |A_j| / (r_j + ε))² is the
    analytic optimum reached by phase conjugation φ_j = −k_j r_j (all waves arrive in phase). The
    loop is a ``lax.scan`` inside one module-level jitted function: a second call with the same shapes and
    ``steps`` compiles nothing (new sources, target, amplitudes, wavenumbers, softening or learning rate are
    traced values).

    Args:
      sources: (M, D) source positions.
      target: (D,) focus point.
      amplitudes: as in :func:`superpose`.
      wavenumbers: as in :func:`superpose`.
      softening: ε of :func:`superpose`.
      init_phases: (M,) or scalar starting phases.
      steps: optimiser steps.
      learning_rate: Adam step size (radians).

    Returns:
      (phases (M,), history (steps,) of the normalised target intensity I/I_max before each step).
    """
    src, tgt = points_and_sources(sources, jnp.reshape(jnp.asarray(target), (1, -1)), "sources", "target")
    tgt = tgt[0]
    check_scalar(steps, "steps", integer=True, minimum=1)
    check_scalar(learning_rate, "learning_rate", positive=True)
    m = src.shape[0]
    amp = per_source(amplitudes, "amplitudes", m, src.dtype)
    k = per_source(wavenumbers, "wavenumbers", m, src.dtype)
    phi0 = per_source(init_phases, "init_phases", m, src.dtype)
    check_scalar(softening, "softening", nonnegative=True)
    eps = jnp.asarray(softening, src.dtype)
    return _focus_run(phi0, tgt, src, amp, k, eps, jnp.asarray(learning_rate, src.dtype), steps=int(steps))


@functools.partial(jax.jit, static_argnames=("steps",))
def _focus_run(phi0, tgt, src, amp, k, softening, learning_rate, *, steps):
    """The Adam loop of :func:`focus_phases` on checked arrays: (phases, history of I/I_max)."""
    import optax

    r = jnp.linalg.norm(src - tgt[None], axis=-1)
    i_max = jnp.sum(jnp.abs(amp) / (r + softening)) ** 2
    opt = optax.adam(learning_rate)

    def normalised_intensity(phi):
        psi = superpose(tgt[None], src, amplitudes=amp, wavenumbers=k, phases=phi, softening=softening)
        return intensity(psi)[0] / i_max

    def body(carry, _):
        phi, opt_state = carry
        val, g = jax.value_and_grad(normalised_intensity)(phi)
        updates, opt_state = opt.update(-g, opt_state, phi)
        return (optax.apply_updates(phi, updates), opt_state), val

    (phi, _), hist = jax.lax.scan(body, (phi0, opt.init(phi0)), None, length=steps)
    return phi, hist
