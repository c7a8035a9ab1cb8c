"""Strang split-step kernels shared by the Gross–Pitaevskii and GFT condensate solvers.

Both solve i ∂ψ/∂t = [K + U(r, |ψ|²)] ψ with K diagonal in Fourier space and U a real local energy
(trap + interaction, or m² + λ|φ|²). One Strang step of size dt is

    ψ ← e^{−i dt/2 U} ψ  →  ψ ← F⁻¹ e^{−i dt K(k)} F ψ  →  ψ ← e^{−i dt/2 U} ψ,

second order in dt, unitary, with both factors exact (|ψ| is unchanged by the local factor, so U can be
evaluated on the incoming ψ). Imaginary time replaces −i dt by −dt.

Every factor f = e^{−iθ} is applied as ψ + ψ·(f − 1) (:func:`phase_factor_m1`): in float32, cos θ rounds
to 1 or to 1 − 6e-8 for the small θ of the occupied modes, so |f|² − 1 ~ ±1e-7 is the *same* every
step and would add up to a norm drift of ~1e-3 over 10⁴ steps; the "minus one" form represents the
small numbers −2 sin²(θ/2) − i sin θ to full relative precision.

:func:`split_step` is the one-step kernel. :func:`kick` is the local factor alone. :func:`strang_run` runs n
real-time steps with the closing half-step of each step merged into the opening half-step of the next,

    e^{−i dt/2 U} · [K · e^{−i dt U}]^{n−1} · K · e^{−i dt/2 U},

the same scheme to round-off (U depends only on |ψ|², which the local factor does not change), with one
pass over the field per step fewer: 2 elementwise passes (kinetic factor, local factor) and 2 FFTs per step
instead of 3 and 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Complex

from ivhl_jax.core.validation import check_array
from ivhl_jax.numerics.fastmath import sincos, sincos_static

__all__ = ["phase_factor_m1", "split_step", "kick", "strang_run"]


def _check_imaginary(imaginary: Any) -> bool:
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    return bool(imaginary)


def phase_factor_m1(theta: Any, imaginary: bool, dtype: Any, full_range: bool | None = None) -> Any:
    """The propagator factor minus one: e^{−iθ} − 1 (real time) or e^{−θ} − 1 (imaginary time).

    Args:
      theta: real phase (NumPy: a trace-time constant, evaluated in float64; or a JAX array).
      imaginary: static choice of real (False) or imaginary (True) time.
      dtype: complex dtype of the result.
      full_range: how a JAX θ's sine is reduced (:mod:`ivhl_jax.numerics.fastmath`): None checks θ
        (:func:`~ivhl_jax.numerics.fastmath.sincos`); False is the fast reduction, exact for |θ|/2 ≤
        ``FAST_LIMIT`` (the caller guarantees it); True is correct for every finite θ.

    Returns:
      ``f − 1`` with θ's shape in ``dtype`` (NumPy for NumPy θ, else a JAX array).
    """
    _check_imaginary(imaginary)
    if isinstance(theta, np.ndarray):
        if imaginary:
            return np.expm1(-theta).astype(dtype)
        s = np.sin(0.5 * theta)
        return (-2 * s * s - 1j * np.sin(theta)).astype(dtype)
    rdt = jnp.finfo(dtype).dtype
    theta_j = theta.astype(rdt)
    if imaginary:
        return jnp.expm1(-theta_j).astype(dtype)
    # One shared range reduction for sin and cos (XLA's CPU sin/cos are much slower); relative precision
    # at small θ is kept because the odd polynomial is x·(1 + O(x²)).
    half = 0.5 * theta_j
    sj, cj = sincos(half) if full_range is None else sincos_static(half, full_range)
    return jax.lax.complex(-2 * sj * sj, -2 * sj * cj).astype(dtype)


def kick(
    psi: Complex[Array, "*shape"],
    local_energy: Callable[[jax.Array], jax.Array],
    tau: Any,
    imaginary: bool,
    full_range: bool | None = None,
) -> Complex[Array, "*shape"]:
    """The local factor ψ ← e^{−i τ U(ψ)} ψ (imaginary time: e^{−τ U(ψ)} ψ), applied in the "minus one" form.

    ``local_energy(psi)`` returns the real U (shape broadcastable to ψ); ``tau`` is the (real) time it acts;
    ``full_range`` as in :func:`phase_factor_m1`.
    """
    u = local_energy(psi)
    theta = u * jnp.asarray(tau, u.dtype)
    return psi + psi * phase_factor_m1(theta, imaginary, psi.dtype, full_range)


def split_step(
    psi: Complex[Array, "*shape"],
    local_energy: Callable[[jax.Array], jax.Array],
    kinetic: Callable[[jax.Array], jax.Array],
    dt: Any,
    imaginary: bool,
    full_range: bool | None = None,
) -> Complex[Array, "*shape"]:
    """One Strang step e^{−dt/2 U} · K · e^{−dt/2 U} (U local, K the kinetic propagator callable).

    Args:
      psi: complex field.
      local_energy: ``U(psi)``, the real local energy (trap + interaction, or m² + λ|φ|²).
      kinetic: the exact kinetic propagator over dt, ``psi -> F⁻¹ e^{−i dt K} F psi``.
      dt: step size (real scalar).
      imaginary: static; imaginary-time factors e^{−dt/2 U}.
      full_range: the local phase's reduction, as in :func:`phase_factor_m1`.
    """
    psi = check_array(psi, "psi", kind="complex")
    imaginary = _check_imaginary(imaginary)
    half = 0.5 * dt
    psi = kick(psi, local_energy, half, imaginary, full_range)
    psi = kinetic(psi)
    return kick(psi, local_energy, half, imaginary, full_range)


def strang_run(
    psi: Complex[Array, "*shape"],
    local_energy: Callable[[jax.Array], jax.Array],
    kinetic: Callable[[jax.Array], jax.Array],
    dt: Any,
    n: int,
    full_range: bool | None = None,
) -> Complex[Array, "*shape"]:
    """``n`` real-time Strang steps with the potential half-steps of consecutive steps merged (module docstring).

    Equal to ``n`` applications of :func:`split_step` (``imaginary=False``) to round-off. ``n`` is a static
    int ≥ 1; the interior steps run in a ``lax.fori_loop`` (the field is the loop carry, updated in place).
    ``full_range``: the local phase's reduction, as in :func:`phase_factor_m1`.
    """
    psi = check_array(psi, "psi", kind="complex")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of steps), got {n!r}")
    psi = kick(psi, local_energy, 0.5 * dt, False, full_range)

    def interior(_, p):
        return kick(kinetic(p), local_energy, dt, False, full_range)

    psi = jax.lax.fori_loop(0, int(n) - 1, interior, psi)
    return kick(kinetic(psi), local_energy, 0.5 * dt, False, full_range)
