"""The Bogoliubov–de Gennes (BdG) spectrum of a stationary condensate: :func:`bogoliubov`.

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`); frequencies in ω₀.

A small perturbation of a stationary state ψ₀ (chemical potential μ), ψ = [ψ₀ + u e^{−iωt} + v* e^{iωt}] e^{−iμt},
solves the BdG equations

    ω u =  (L + g n) u + g ψ₀² v,        −ω v = (L + g n) v + g ψ₀*² u,
    L = H − μ,   H = −½∇² + V + g n,   n = |ψ₀|².

For a real ψ₀ the combinations f± = u ± v decouple: ω f₋ = B f₊ and ω f₊ = A f₋ with A = H − μ and
B = H − μ + 2g n, so

    A B f₊ = ω² f₊.

For the ground state (A ≥ 0, A ψ₀ = 0) and g ≥ 0 (B > 0), AB is self-adjoint in the inner product ⟨x, y⟩_B = xᵀBy
(similar to the symmetric B^{1/2} A B^{1/2}) with eigenvalues ω² ≥ 0. Its zero mode f₀ = B⁻¹ψ₀ (the phase, or
Goldstone, mode) is removed by the constraint ψ₀ᵀ f₊ = 0 (= ⟨f₀, f₊⟩_B). The lowest ω² are found matrix-free:
A and B are applied with FFTs (the kinetic term diagonal in k), and a block LOBPCG (Knyazev 2001) in the
B-inner product, preconditioned by (k²/2 + c)⁻² in Fourier space, iterates in a ``lax.while_loop`` (pure JAX,
any backend). Modes are normalised to ∫(|u|² − |v|²) dV = 1. On a system with a device layout the fields of a block
(k, *grid) are sharded as ψ₀ and A, B, P use the distributed FFT (:mod:`ivhl_jax.numerics.distributed_fft`).

Gradients: the iteration is not differentiated; ω² is then re-evaluated as the Rayleigh quotient
(Bf)ᵀA(Bf)/(fᵀBf) of the converged f with the differentiable operators, which is stationary in f, so its
derivative with respect to V, g, ψ₀ and μ is the eigenvalue's (Hellmann–Feynman; a degenerate level's
derivative is well defined only for perturbations that keep the degeneracy).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float, Inexact

from ivhl_jax.core.validation import check_array, check_key, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.numerics.distributed_fft import host_readable
from ivhl_jax.physics.condensate.observables import SYSTEMS, chemical_potential
from ivhl_jax.physics.condensate.system import GPSystem, Grid

__all__ = ["BogoliubovModes", "bogoliubov"]


class BogoliubovModes(struct.PyTreeNode):
    """The lowest BdG excitations about a stationary state (see :func:`bogoliubov`).

    Attributes:
      omega: (n_modes,) excitation frequencies ω ≥ 0 (ω₀), ascending (√max(ω², 0)).
      omega_squared: (n_modes,) the eigenvalues ω² of AB (negative: a dynamically unstable or not-lowest state).
      u, v: (n_modes, *grid) real mode functions, ∫(u² − v²) dV = 1.
      residual: (n_modes,) relative residual ‖ABf − ω²f‖/(‖f‖ max(ω², ε)) of each mode.
      mu: the chemical potential μ used (of ψ₀).
      iterations: LOBPCG iterations done.
    """

    omega: Float[Array, " m"]
    omega_squared: Float[Array, " m"]
    u: Float[Array, " m *grid"]
    v: Float[Array, " m *grid"]
    residual: Float[Array, " m"]
    mu: Float[Array, ""]
    iterations: Any


def _kinetic_factor(grid: Grid, rdt: Any, layout: Any) -> jax.Array:
    """The Fourier multiplier k²/2 of the kinetic term; with a layout ``k²/2 − 1`` (the ``f − 1`` form that
    :func:`~ivhl_jax.numerics.distributed_fft.spectral_multiply` takes), built on the host and placed in the k-space
    blocks each device multiplies (:meth:`~ivhl_jax.numerics.distributed_fft.FFTLayout.place_factor`)."""
    half_k2 = 0.5 * grid.k_squared()
    if layout is None:
        return jnp.asarray(half_k2, rdt)
    return layout.place_factor(np.asarray(half_k2 - 1.0, rdt), grid.shape)


def _operators(grid: Grid, potential: jax.Array, g: jax.Array, psi0: jax.Array, mu: jax.Array, kinetic, layout):
    """(A, B, P) acting on a block (k, *grid) of real fields: A = H − μ, B = A + 2g n, P = (k²/2 + c)⁻², with
    ``kinetic`` from :func:`_kinetic_factor`. With a layout every FFT is the distributed one (a block sharded as
    the layout stays so, and the multipliers stay in their k-space blocks)."""
    rdt = psi0.dtype
    axes = tuple(range(1, grid.ndim + 1))
    n0 = psi0 * psi0
    local_a = jnp.asarray(potential, rdt) + g * n0 - mu
    local_b = local_a + 2 * g * n0
    # c ~ the interaction energy scale: (k²/2 + c)² ≈ AB for the short-wavelength part of the spectrum.
    c = jnp.maximum(jnp.max(jnp.abs(g) * n0), 1.0)
    if layout is None:
        half_k2, prec = kinetic, 1.0 / (kinetic + c) ** 2
    else:  # the "f − 1" forms, elementwise on the placed factor
        half_k2, prec = kinetic, 1.0 / (kinetic + 1.0 + c) ** 2 - 1.0

    def fourier(x, mult):
        if layout is None:
            return jnp.fft.ifftn(mult * jnp.fft.fftn(x, axes=axes), axes=axes).real
        cx = x.astype(jnp.result_type(rdt, jnp.complex64))
        return distributed_fft.spectral_multiply(cx, mult, layout).real

    def a_op(x):
        return fourier(x, half_k2) + local_a * x

    def b_op(x):
        return fourier(x, half_k2) + local_b * x

    def p_op(x):
        return fourier(x, prec)

    return a_op, b_op, p_op


def _dot(x: jax.Array, y: jax.Array) -> jax.Array:
    """The Gram matrix Σ_grid x_i y_j of two blocks (a, *grid), (b, *grid): (a, b)."""
    axes = tuple(range(1, x.ndim))
    return jnp.tensordot(x, y, axes=(axes, axes))


def _norms(x: jax.Array) -> jax.Array:
    """‖x_i‖ of each field of a block (k, *grid): (k,)."""
    return jnp.sqrt(jnp.sum(x * x, axis=tuple(range(1, x.ndim))))


def _col(v: jax.Array, ndim: int) -> jax.Array:
    """(k,) → (k, 1, …, 1): one number per field of a block with ``ndim`` grid axes."""
    return v.reshape(v.shape + (1,) * ndim)


def _combine(c: jax.Array, s: jax.Array) -> jax.Array:
    """Σ_j c_ji s_j: the fields cᵀs of a block s (m, *grid) with coefficients c (m, k)."""
    return jnp.tensordot(c.T, s, axes=1)


def _dot_rows(x: jax.Array, y: jax.Array) -> jax.Array:
    """Σ_grid x_i y_i of each field of two blocks (k, *grid): (k,)."""
    return jnp.sum(x * y, axis=tuple(range(1, x.ndim)))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _draw(key: jax.Array, shape: tuple[int, ...], rdt: Any, sharding: Any) -> jax.Array:
    """The random start block (k, *grid), standard normal, drawn in the blocks of ``sharding`` (None: one device);
    the same numbers either way (the partitionable counter-based generator)."""
    x = jax.random.normal(key, (shape[0], math.prod(shape[1:])), rdt).reshape(shape)
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _project(x: jax.Array, y: jax.Array) -> jax.Array:
    """Remove the ψ₀ component: x − y (yᵀx)/(yᵀy) (x a block (k, *grid), y grid-shaped)."""
    return x - _col(_dot(x, y[None])[:, 0] / jnp.sum(y * y), y.ndim) * y[None]


def _rayleigh_ritz(s, bs, abs_, k, eps):
    """Lowest k Ritz pairs of the pencil (S'BABS, S'BS): returns the coefficients C (3k, k) and θ (k,)."""
    gm = _dot(s, bs)
    gk = _dot(bs, abs_)
    gm, gk = 0.5 * (gm + gm.T), 0.5 * (gk + gk.T)
    d, u = jnp.linalg.eigh(gm)
    keep = d > eps * jnp.max(d)
    z = u * jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, d, 1.0)), 0.0)[None, :]
    kz = z.T @ gk @ z
    big = 1e3 * (jnp.max(jnp.abs(jnp.diag(kz))) + 1.0)
    kz = 0.5 * (kz + kz.T) + jnp.diag(jnp.where(keep, 0.0, big))
    theta, w = jnp.linalg.eigh(kz)
    return z @ w[:, :k], theta[:k]


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7, 11))
def _solve(grid: Grid, potential, g, psi0, mu, k: int, max_iter: int, n_check: int, x0, tol, kinetic, layout):
    """Block LOBPCG for the lowest k eigenpairs of AB in the B-inner product, orthogonal to ψ₀ (module docstring).

    Blocks are (k, *grid) fields; with a layout they are sharded as ψ₀ (the block axis whole on every device) and
    only the Gram matrices (3k × 3k) are reduced over the devices."""
    a_op, b_op, p_op = _operators(grid, potential, g, psi0, mu, kinetic, layout)
    y = psi0
    nd = grid.ndim
    rdt = y.dtype
    eps = jnp.asarray(100 * jnp.finfo(rdt).eps, rdt)

    def normalise(x):
        return x / _col(jnp.maximum(_norms(x), jnp.finfo(rdt).tiny), nd)

    def residuals(x, theta):
        bx = b_op(x)
        r = a_op(bx) - _col(theta, nd) * x
        rel = _norms(r) / (_norms(x) * jnp.maximum(jnp.abs(theta), 1e-3))
        return r, rel

    x = normalise(_project(x0, y))
    bx = b_op(x)
    c, theta = _rayleigh_ritz(x, bx, a_op(bx), k, eps)
    x = normalise(_combine(c, x))
    p = jnp.zeros_like(x)

    # Stop when the residuals of the wanted modes are below tol, or when their Ritz values have stopped moving
    # (3 iterations in a row within ``stall`` relative): a ψ₀ that is stationary only to O(dt) leaves a residual
    # floor ~‖Aψ₀‖ on the modes that overlap the phase mode, while their frequencies are already converged.
    stall = jnp.asarray(1e3 * jnp.finfo(rdt).eps, rdt)

    def body(carry):
        x, p, theta, _, still, it = carry
        r, rel = residuals(x, theta)
        w = normalise(_project(p_op(r), y))
        s = jnp.concatenate([x, w, normalise(p)], axis=0)
        bs = b_op(s)
        c, theta_new = _rayleigh_ritz(s, bs, a_op(bs), k, eps)
        x_new = normalise(_combine(c, s))
        p_new = _combine(c[k:], s[k:])
        change = jnp.max(jnp.abs(theta_new - theta)[:n_check] / jnp.maximum(jnp.abs(theta_new[:n_check]), 1e-3))
        still = jnp.where(change < stall, still + 1, 0)
        return x_new, p_new, theta_new, jnp.max(rel[:n_check]), still, it + 1

    def cond(carry):
        return (carry[3] > tol) & (carry[4] < 3) & (carry[5] < max_iter)

    x, p, theta, _, _, it = jax.lax.while_loop(cond, body, (x, p, theta, jnp.asarray(jnp.inf, rdt), 0, 0))
    _, rel = residuals(x, theta)
    order = jnp.argsort(theta)
    return x[order], rel[order], it


def bogoliubov(
    key: jax.Array,
    system: GPSystem,
    psi0: Inexact[Array, "*grid"],
    n_modes: int,
    *,
    tol: float | None = None,
    max_iterations: int = 1000,
    extra: int = 4,
) -> BogoliubovModes:
    """The ``n_modes`` lowest Bogoliubov excitations about the stationary state ψ₀ (module docstring).

    Args:
      key: PRNG key of the iteration's random start block (the spectrum does not depend on it beyond ``tol``).
      system: the :class:`GPSystem` (V, g; no rotation). g ≥ 0. With a ``layout`` ψ₀ is placed in its blocks and
        every FFT of the operators is the layout's distributed one: the modes come back in the same blocks (the
        block axis whole on every device) and no field is gathered onto one device; only the solver's small Gram
        matrices are summed over the devices.
      psi0: the stationary state, shape ``grid.shape``, real up to a global phase (the ground state, e.g. from
        :func:`~ivhl_jax.physics.condensate.ground_state`; its accuracy bounds the spectrum's: the Goldstone
        mode is removed exactly only for an exact stationary state). Its dtype (with the system's) sets the
        precision: float64 (``jax.enable_x64``) for ω to ~1e-8, float32 to ~1e-4.
      n_modes: how many excitations (the zero-frequency phase mode is excluded); 3(n_modes + extra) ≤ the
        number of grid points.
      tol: relative residual at which the iteration stops (default 1e-9 in float64, 1e-4 in float32).
      max_iterations: iteration budget (``iterations`` in the result says how many were done).
      extra: additional block vectors (speed up convergence and resolve degenerate levels at the edge).

    Returns:
      :class:`BogoliubovModes` (ω ascending, u, v of shape (n_modes, *grid), residuals, μ). jit/vmap-able over
      V, g and ψ₀ (the options are static); ω is differentiable (Hellmann–Feynman, module docstring).
    """
    _check_bdg_system(system)
    grid = system.grid
    layout = system.layout
    # (a field spread over several processes has no host copy: it was checked before it was placed)
    psi = check_array(psi0, "psi0", shape=grid.shape, kind="inexact", finite=host_readable(psi0))
    check_scalar(n_modes, "n_modes", integer=True, minimum=1)
    check_scalar(extra, "extra", integer=True, nonnegative=True)
    check_scalar(max_iterations, "max_iterations", integer=True, minimum=1)
    k = int(n_modes) + int(extra)
    if 3 * k > grid.size:
        raise ValueError(
            f"n_modes={n_modes} is too large for a grid of {grid.size} points: the block solver needs "
            f"3·(n_modes + extra) <= {grid.size}, so n_modes <= {grid.size // 3 - int(extra)}"
        )
    rdt = jnp.result_type(system.real_dtype, psi.real.dtype)
    if tol is None:
        tol = 1e-9 if rdt == jnp.float64 else 1e-4
    check_scalar(tol, "tol", positive=True)
    psi = _real_up_to_phase(psi, grid, rdt)
    psi = psi.astype(rdt)
    if layout is not None:  # ψ₀ in the layout's blocks (a traced ψ₀: a sharding constraint)
        psi = layout.place(psi, "psi0")
    cdt = jnp.result_type(rdt, jnp.complex64)
    mu = chemical_potential(psi.astype(cdt), system.replace(potential=jnp.asarray(system.potential, rdt)))
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)
    key = check_key(key)
    sg = jax.lax.stop_gradient
    nd = grid.ndim
    start = _draw(key, (k,) + grid.shape, jnp.dtype(rdt), None if layout is None else layout.sharding(nd + 1))
    start = start * (jnp.abs(sg(psi)) + 0.1 * jnp.max(jnp.abs(sg(psi))))[None]
    kinetic = _kinetic_factor(grid, rdt, layout)
    held = (sg(pot), sg(g), sg(psi), sg(mu))
    budget = (k, int(max_iterations), int(n_modes))
    f, rel, it = _solve(grid, *held, *budget, start, jnp.asarray(tol, rdt), kinetic, layout)
    f = sg(f[: int(n_modes)])
    omega, w2, u, v = _modes(f, grid, pot, g, psi, mu, kinetic, layout)
    return BogoliubovModes(omega=omega, omega_squared=w2, u=u, v=v, residual=rel[: int(n_modes)], mu=mu, iterations=it)


def _check_bdg_system(system: Any) -> None:
    """A scalar, non-rotating GP system with g ≥ 0 (what the real BdG problem solved here needs)."""
    if isinstance(system, SYSTEMS) and not isinstance(system, GPSystem):
        raise TypeError(
            f"bogoliubov solves the scalar BdG problem of a GPSystem, not of a {type(system).__name__} (its "
            "excitations couple the components or the dipolar potential)"
        )
    if not isinstance(system, GPSystem):
        raise TypeError(f"system must be a condensate GPSystem, got {type(system).__name__}")
    if system.rotating:
        raise ValueError("system.omega_rot must be 0: bogoliubov solves the non-rotating BdG problem (real psi0)")
    if is_concrete(system.g) and np.ndim(system.g) == 0 and float(np.asarray(system.g)) < 0:
        raise ValueError(
            f"system.g must be >= 0 (for g < 0 the operator B is not positive and the B-inner product "
            f"fails), got {float(np.asarray(system.g))}"
        )


def _real_up_to_phase(psi: jax.Array, grid: Grid, rdt: Any) -> jax.Array:
    """ψ₀ real up to a global phase, rotated by the phase at the density maximum (a complex ψ₀ that is not is
    refused: a state with flow, e.g. a vortex)."""
    if not jnp.iscomplexobj(psi):
        return psi
    # ψ at its largest |ψ|, picked by a mask and a sum (exact: one term is non-zero): an index into the
    # flattened field would gather a sharded ψ onto every device
    at = jnp.arange(grid.size).reshape(grid.shape) == jnp.argmax(jnp.abs(psi))
    ref = jnp.sum(jnp.where(at, psi, 0))
    psi = psi * (jnp.conj(ref) / jnp.maximum(jnp.abs(ref), jnp.finfo(rdt).tiny))
    if is_concrete(psi):
        im = float(jnp.max(jnp.abs(psi.imag)))
        if im > 1e-3 * float(jnp.max(jnp.abs(psi))):
            raise ValueError(
                f"psi0 must be real up to a global phase (a stationary state without flow; max |Im| "
                f"after removing the phase is {im:.3g}); bogoliubov does not treat vortex states"
            )
    return psi.real


def _modes(f, grid: Grid, pot, g, psi, mu, kinetic, layout) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(ω, ω², u, v) from the converged f: ω² the Rayleigh quotient at f (differentiable), u and v normalised to
    ∫(u² − v²) dV = 1."""
    nd = grid.ndim
    a_op, b_op, _ = _operators(grid, pot, g, psi, mu, kinetic, layout)
    bf = b_op(f)
    fbf = _dot_rows(f, bf)
    w2 = _dot_rows(bf, a_op(bf)) / fbf
    omega = jnp.sqrt(jnp.maximum(w2, 0.0))
    # ∫(u² − v²) dV = ∫ f₊ f₋ dV = fᵀBf dV / ω = 1 (f₋ = Bf₊/ω).
    safe_w = jnp.where(omega > 0, omega, 1.0)
    scale = jnp.sqrt(safe_w / (fbf * grid.cell_volume))
    fp = f * _col(scale, nd)
    fm = bf * _col(scale / safe_w, nd)
    return omega, w2, 0.5 * (fp + fm), 0.5 * (fp - fm)
