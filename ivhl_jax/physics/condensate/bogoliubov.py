"""The Bogoliubov–de Gennes (BdG) spectrum of a stationary condensate of any system: :func:`bogoliubov`.

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`); frequencies in ω₀.

One definition for every system. A small perturbation of a stationary state ψ₀ (one chemical potential μ_c per
conserved component norm N_c), ψ = [ψ₀ + u e^{−iωt} + v* e^{iωt}] e^{−iμt}, solves the linearisation of
i ∂ψ/∂t = δE/δψ* about ψ₀, with E[ψ] the system's energy functional (:func:`~ivhl_jax.physics.condensate.energy`:
kinetic, trap, contact, dipolar, inter-component and any further term it holds). With ψ = x + iy on the grid
(cell volume dV) and K the Hessian of the Lagrangian 𝓛 = E − Σ_c μ_c N_c at ψ₀ with respect to (x, y),

    ∂/∂t (δx, δy) = (2 dV)⁻¹ J K (δx, δy),        J = [[0, 1], [−1, 0]],

whose eigenvalues are −iω. The same K gives the scalar GP equations ω u = (L + gn) u + gψ₀² v,
−ω v = (L + gn) v + gψ₀*² u (L = H − μ, H = −½∇² + V + g n, n = |ψ₀|²).

**Real ψ₀** (up to one phase per component; no rotation): K = 2 dV diag(B, A) with B the second variation in
the real direction and A in the imaginary one, and f± = u ± v decouple: ω f₋ = B f₊, ω f₊ = A f₋, so

    A B f₊ = ω² f₊.

For a scalar :class:`GPSystem` A = H − μ and B = H − μ + 2g n are applied analytically with FFTs (the kinetic term
diagonal in k). For every other system (dipolar, C-component mixtures: block operators over the components) A and
B are applied matrix-free as Hessian-vector products of the energy (``jax.linearize`` of ``jax.grad`` of 𝓛 at ψ₀),
so any term of the energy gets its BdG spectrum without a new derivation; ``operators="energy"`` applies these
generic operators to a GPSystem too (they agree with the analytic ones to round-off). μ_c = ⟨ψ₀_c, (∂E/∂ψ*)_c⟩/N_c
from the same gradient.

At a ground state (a minimum of E at fixed norms) A ≥ 0 with one null vector per component (ψ₀ restricted to the
component c: the phase, or Goldstone, modes) and B > 0 on the complement {f : ψ₀_cᵀ f = 0 for every c}; there
AB is self-adjoint in the inner product ⟨x, y⟩_B = xᵀBy (similar to the symmetric B^{1/2} A B^{1/2}) with
eigenvalues ω² ≥ 0 (ω² < 0: a dynamically unstable state, a roton past its softening). The Goldstone modes
f₀ = B⁻¹ψ₀_c are removed by those constraints (= ⟨f₀, f₊⟩_B). The lowest ω² are found by a block LOBPCG
(Knyazev 2001) in the B-inner product, preconditioned by (k²/2 + c)⁻² in Fourier space, iterating in a
``lax.while_loop`` (pure JAX, any backend). Where B itself softens (a roton approaching ω² = 0: B has an
eigenvalue ~ω²/A on the soft mode, which then weighs almost nothing in the B-inner product) the same iteration runs
on f₋ = Bf₊/ω instead (``metric="A"``): BA f₋ = ω² f₋, self-adjoint in the A-inner product, with f₊ = Af₋/ω.
Modes are normalised to ∫(|u|² − |v|²) dV = 1. On a GPSystem with a
device layout the fields of a block (k, *grid) are sharded as ψ₀ and A, B, P use the distributed FFT
(:mod:`ivhl_jax.numerics.distributed_fft`).

Gradients (real ψ₀): the iteration is not differentiated; ω² is then re-evaluated as the Rayleigh quotient
(Bf)ᵀA(Bf)/(fᵀBf) of the converged f with the differentiable operators, which is stationary in f, so its
derivative with respect to the system's parameters, ψ₀ and μ is the eigenvalue's (Hellmann–Feynman; a degenerate
level's derivative is well defined only for perturbations that keep the degeneracy).

**Complex ψ₀** (a state with flow, e.g. a vortex; or a rotating GPSystem, whose energy holds −Ω L_z): K is not
block-diagonal and an energetically unstable state (a vortex in a non-rotating trap) has modes of negative energy,
ω < 0 with positive norm ∫(|u|² − |v|²) dV > 0 (the anomalous, or Kelvin, mode). K is formed densely
(``jax.jacfwd`` of ``jax.grad`` of 𝓛: 2M × 2M for M complex unknowns) and (2dV)⁻¹JK diagonalised in float64 by
LAPACK (``scipy.linalg.eig``), for small grids only (M ≤ ``max_dense_points``; larger ones are refused). An
eigenvector (a, b) of (δx, δy) gives u = a + ib, v = a − ib. The modes returned are those of positive norm
(normalised to 1), ω ascending and signed, and each pair of complex frequencies (a dynamical instability, zero
norm) once, with its growth rate Im ω > 0; the Goldstone pair of each component (ω → 0, split by ~√ε for a ψ₀
stationary to ε) is dropped by |ω| < ``zero_tol``.
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

from ivhl_jax.core.validation import check_array, check_choice, check_key, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.numerics.distributed_fft import host_readable
from ivhl_jax.physics.condensate.mixture import MixtureSystem, Spin1System
from ivhl_jax.physics.condensate.observables import SYSTEMS, chemical_potential, energy
from ivhl_jax.physics.condensate.system import GPSystem, Grid

__all__ = ["BogoliubovModes", "bogoliubov"]


class BogoliubovModes(struct.PyTreeNode):
    """The lowest BdG excitations about a stationary state (see :func:`bogoliubov`); ``m`` modes, each a field of
    ψ₀'s shape (``*field``: the grid's, or (C, *grid) for a C-component mixture).

    Attributes:
      omega: (m,) frequencies ω (ω₀), ascending. Real ψ₀: √max(ω², 0) ≥ 0. Complex ψ₀: signed (ω < 0 with
        positive norm: a mode of negative energy, e.g. the anomalous mode of a vortex); Re ω of an unstable pair.
      omega_squared: (m,) ω² (real ψ₀: the eigenvalue of AB; negative: a dynamically unstable state).
      growth_rate: (m,) Im ω ≥ 0 (0 for a stable mode; real ψ₀: √max(−ω², 0)).
      u, v: (m, *field) mode functions, real for a real ψ₀ and complex otherwise.
      norm: (m,) ∫(|u|² − |v|²) dV: 1, or 0 for an unstable pair (complex ω).
      residual: (m,) relative residual of each mode (real ψ₀: ‖ABf − ω²f‖/(‖f‖ max(ω², ε)) of f = f₊, or of
        BA f₋ = ω² f₋ with ``metric="A"``; complex ψ₀: of the dense eigenpair).
      mu: the chemical potential μ of ψ₀ (one per component for a mixture: (C,)).
      iterations: LOBPCG iterations done (0 for the dense solve).
    """

    omega: Float[Array, " m"]
    omega_squared: Float[Array, " m"]
    growth_rate: Float[Array, " m"]
    u: Inexact[Array, " m *field"] = struct.field(pytree_node=True)  # (the fields of ψ₀'s shape: leaves too)
    v: Inexact[Array, " m *field"] = struct.field(pytree_node=True)
    norm: Float[Array, " m"]
    residual: Float[Array, " m"]
    mu: Float[Array, "*c"]
    iterations: Any


def _kinetic_factor(grid: Grid, rdt: Any, layout: Any) -> jax.Array:
    """The Fourier multiplier k²/2 of the kinetic term; with a layout ``k²/2 − 1`` (the ``f − 1`` form that
    :func:`~ivhl_jax.numerics.distributed_fft.spectral_multiply` takes), built on the host and placed in the k-space
    blocks each device multiplies (:meth:`~ivhl_jax.numerics.distributed_fft.FFTLayout.place_factor`)."""
    half_k2 = 0.5 * grid.k_squared()
    if layout is None:
        return jnp.asarray(half_k2, rdt)
    return layout.place_factor(np.asarray(half_k2 - 1.0, rdt), grid.shape)


def _gp_operators(grid: Grid, layout: Any, args: tuple[Any, ...]):
    """(A, B, P) of a scalar GPSystem, analytic, acting on a block (k, *grid) of real fields: A = H − μ,
    B = A + 2g n, P = (k²/2 + c)⁻²; ``args`` = (V, g, ψ₀, μ, kinetic) with ``kinetic`` from :func:`_kinetic_factor`.
    With a layout every FFT is the distributed one (a block sharded as the layout stays so, and the multipliers
    stay in their k-space blocks)."""
    potential, g, psi0, mu, kinetic = args
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


def _project(x: jax.Array, ys: jax.Array) -> jax.Array:
    """Remove the components along the mutually orthogonal fields ys (c, *field): x − Σ_i y_i (y_iᵀx)/(y_iᵀy_i)
    (x a block (k, *field))."""
    return x - _combine((_dot(x, ys) / _dot_rows(ys, ys)[None, :]).T, ys)


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


def _lagrangian_parts(system: Any, psi0: jax.Array) -> tuple[Any, jax.Array]:
    """The energy as a function of the real and imaginary parts, E(x, y) = E[x + iy] (the system's
    :func:`~ivhl_jax.physics.condensate.energy`, total), and the chemical potentials μ_c = xᵀ(∂E/∂x)/(2 dV xᵀx)
    per component at the real ψ₀ = x (shape () for a scalar field, (C,) for a mixture)."""
    dv = system.grid.cell_volume

    def e_of(x: jax.Array, y: jax.Array) -> jax.Array:
        return energy(jax.lax.complex(x, y), system)["total"]

    grad_x = jax.grad(e_of, argnums=0)(psi0, jnp.zeros_like(psi0))
    axes = tuple(range(psi0.ndim - system.grid.ndim, psi0.ndim))
    mu = jnp.sum(psi0 * grad_x, axis=axes) / (2 * dv * jnp.sum(psi0 * psi0, axis=axes))
    return e_of, mu


@jax.jit
def _energy_mu(system: Any, psi0: jax.Array) -> jax.Array:
    """μ_c of the real ψ₀ from the energy's gradient (:func:`_lagrangian_parts`)."""
    return _lagrangian_parts(system, psi0)[1]


def _energy_operators(system: Any, args: tuple[Any, ...]):
    """(A, B, P) of any system as Hessian-vector products of its energy at the real ψ₀ (module docstring), acting
    on a block (k, *field): A d = (∂²E/∂y²) d/(2dV) − μ d, B d = (∂²E/∂x²) d/(2dV) − μ d (μ per component),
    P = (k²/2 + c)⁻² with c = max(1, max|μ_c|); ``args`` = (ψ₀, μ)."""
    psi0, mu = args
    grid = system.grid
    nd = grid.ndim
    rdt = psi0.dtype
    dv = grid.cell_volume
    e_of, _ = _lagrangian_parts(system, psi0)
    zero = jnp.zeros_like(psi0)
    _, hxx = jax.linearize(jax.grad(lambda x: e_of(x, zero)), psi0)
    _, hyy = jax.linearize(jax.grad(lambda y: e_of(psi0, y)), zero)
    mu_f = mu.reshape(mu.shape + (1,) * nd)
    axes = tuple(range(psi0.ndim + 1 - nd, psi0.ndim + 1))
    c = jnp.maximum(jnp.max(jnp.abs(mu)), 1.0)
    prec = 1.0 / (jnp.asarray(0.5 * grid.k_squared(), rdt) + c) ** 2

    def a_op(x):
        return jax.vmap(hyy)(x) / (2 * dv) - mu_f * x

    def b_op(x):
        return jax.vmap(hxx)(x) / (2 * dv) - mu_f * x

    def p_op(x):
        return jnp.fft.ifftn(prec * jnp.fft.fftn(x, axes=axes), axes=axes).real

    return a_op, b_op, p_op


def _operators(static: tuple[Any, ...], args: tuple[Any, ...]):
    """(A, B, P) of the problem: ``static`` = ("gp", grid, layout) for the analytic scalar GP operators
    (:func:`_gp_operators`), ("energy", system) for the energy's Hessian (:func:`_energy_operators`; ``system``
    travels in ``args`` = (system, ψ₀, μ))."""
    if static[0] == "gp":
        return _gp_operators(static[1], static[2], args)
    return _energy_operators(args[0], args[1:])


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5, 8))
def _solve(static, args, ys, k: int, max_iter: int, n_check: int, x0, tol, metric: str = "B"):
    """Block LOBPCG for the lowest k eigenpairs of AB in the B-inner product, B-orthogonal to the Goldstone modes
    (module docstring): the fields of the block are orthogonal to every constraint field in ``ys`` (c, *field).
    ``metric="A"``: the same iteration with A and B exchanged, the lowest eigenpairs g = f₋ of BA in the
    A-inner product (ψ₀, A's null field, projected out), whose f₊ ∝ Ag the caller forms.

    Blocks are (k, *field) fields; with a layout they are sharded as ψ₀ (the block axis whole on every device) and
    only the Gram matrices (3k × 3k) are reduced over the devices."""
    a_op, b_op, p_op = _operators(static, args)
    if metric == "A":
        a_op, b_op = b_op, a_op
    nd = ys.ndim - 1
    rdt = ys.dtype
    eps = jnp.asarray(100 * jnp.finfo(rdt).eps, rdt)

    def normalise(x):
        return x / _col(jnp.maximum(_norms(x), jnp.finfo(rdt).tiny), nd)

    def residuals(x, theta):
        bx = b_op(x)
        r = a_op(bx) - _col(theta, nd) * x
        rel = _norms(r) / (_norms(x) * jnp.maximum(jnp.abs(theta), 1e-3))
        return r, rel

    x = normalise(_project(x0, ys))
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
        w = normalise(_project(p_op(r), ys))
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
    system: Any,
    psi0: Inexact[Array, "*field"],
    n_modes: int,
    *,
    tol: float | None = None,
    max_iterations: int = 1000,
    extra: int = 4,
    operators: str = "auto",
    metric: str = "B",
    max_dense_points: int = 2048,
    zero_tol: float = 1e-3,
) -> BogoliubovModes:
    """The ``n_modes`` lowest Bogoliubov excitations about the stationary state ψ₀ of any condensate system
    (module docstring): the family's one BdG door.

    Args:
      key: PRNG key of the iteration's random start block (the spectrum does not depend on it beyond ``tol``).
      system: a :class:`GPSystem` (Ω = 0 for the matrix-free solve; a rotating one is solved densely), a
        :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` or a
        :class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem` (a Spin1System is refused). With a GPSystem's
        ``layout`` ψ₀ is placed in its blocks and every FFT of the operators is the layout's distributed one: the
        modes come back in the same blocks and no field is gathered.
      psi0: the stationary state, of the system's state shape (the grid's; (C, *grid) for a mixture). Real up
        to one phase per component (the ground state, e.g. from :func:`~ivhl_jax.physics.condensate.ground_state`
        with ``method="cg"``; its accuracy bounds the spectrum's: the Goldstone modes are removed exactly only for
        an exact stationary state): the matrix-free solve, jit/vmap-able. With flow (a concrete complex ψ₀,
        e.g. a vortex) or a rotating system: the dense solve (host, float64 LAPACK, not traced); a traced ψ₀ is taken
        as real up to its phase (its flow cannot be seen under a trace). The dtype (with
        the system's) sets the precision: float64 (``jax.enable_x64``) for ω to ~1e-8, float32 to ~1e-4.
      n_modes: how many excitations (the zero-frequency phase modes are excluded); matrix-free:
        3(n_modes + extra) ≤ the number of unknowns.
      tol: matrix-free: relative residual at which the iteration stops (default 1e-9 in float64, 1e-4 in float32).
      max_iterations: matrix-free iteration budget (``iterations`` in the result says how many were done).
      extra: additional block vectors (speed up convergence and resolve degenerate levels at the edge).
      operators: ``"auto"`` (analytic for a GPSystem, the energy's Hessian otherwise), ``"analytic"`` (a
        GPSystem's only) or ``"energy"`` (Hessian-vector products of :func:`~ivhl_jax.physics.condensate.energy`).
      metric: matrix-free: ``"B"`` iterates on f₊ in the B-inner product (module docstring); ``"A"`` on
        f₋ = Bf₊/ω, the lowest eigenvectors of BA in the A-inner product (ψ₀, A's null field, projected out), then
        f₊ = Af₋/ω. Same spectrum; use ``"A"`` near a roton (or any) softening in the density channel, where B has
        an eigenvalue → 0 with ω² and the soft mode weighs almost nothing in the B-inner product, so that the
        B iteration stalls on the next modes (A stays well conditioned there: A ≈ k²/2 on the roton).
      max_dense_points: the dense solve's limit on the complex unknowns M (memory ~32 M² bytes, time ~M³).
      zero_tol: dense solve: modes with |ω| < zero_tol are the Goldstone pairs (dropped); |Im ω| ≤ zero_tol
        counts as stable.

    Returns:
      :class:`BogoliubovModes`. Matrix-free: ω ascending ≥ 0, ω differentiable (Hellmann–Feynman, module
      docstring), the options static. Dense: the positive-norm modes and unstable pairs, ω ascending and signed.
    """
    _check_bdg_system(system)
    grid = system.grid
    shape = _field_shape(system)
    # (a field spread over several processes has no host copy: it was checked before it was placed)
    psi = check_array(psi0, "psi0", shape=shape, kind="inexact", finite=host_readable(psi0))
    check_scalar(n_modes, "n_modes", integer=True, minimum=1)
    check_choice(operators, "operators", ("auto", "analytic", "energy"))
    check_choice(metric, "metric", ("A", "B"))
    if operators == "analytic" and not isinstance(system, GPSystem):
        raise ValueError(f"operators='analytic' applies to a GPSystem, not to a {type(system).__name__}; use 'auto'")
    rdt = jnp.result_type(system.real_dtype, psi.real.dtype)
    psi = _align_phase(psi, grid, rdt)
    if getattr(system, "rotating", False) or (is_concrete(psi) and _has_flow(psi)):
        check_scalar(max_dense_points, "max_dense_points", integer=True, minimum=1)
        check_scalar(zero_tol, "zero_tol", positive=True)
        return _dense_bogoliubov(system, psi, int(n_modes), int(max_dense_points), float(zero_tol))
    if operators != "energy" and isinstance(system, GPSystem):
        _check_gp_coupling(system)
    budget, tol = _matrix_free_budget(psi.size, n_modes, extra, max_iterations, tol, rdt)
    return _real_bogoliubov(check_key(key), system, psi.real.astype(rdt), budget, tol, operators, metric)


def _matrix_free_budget(
    size: int, n_modes: int, extra: int, max_iterations: int, tol: float | None, rdt: Any
) -> tuple[tuple[int, int, int], float]:
    """The matrix-free solve's validated (block size, iteration budget, modes) and tolerance (None: 1e-9 in
    float64, 1e-4 in float32) for a state of ``size`` unknowns."""
    check_scalar(extra, "extra", integer=True, nonnegative=True)
    check_scalar(max_iterations, "max_iterations", integer=True, minimum=1)
    k = int(n_modes) + int(extra)
    if 3 * k > size:
        raise ValueError(
            f"n_modes={n_modes} is too large for a state of {size} unknowns: the block solver needs "
            f"3·(n_modes + extra) <= {size}, so n_modes <= {size // 3 - int(extra)}"
        )
    if tol is None:
        tol = 1e-9 if rdt == jnp.float64 else 1e-4
    check_scalar(tol, "tol", positive=True)
    return (k, int(max_iterations), int(n_modes)), float(tol)


def _real_bogoliubov(
    key: jax.Array, system: Any, psi: jax.Array, budget: tuple[int, int, int], tol, operators, metric: str = "B"
):
    """The matrix-free solve about the real ψ₀ ``psi`` (module docstring); ``budget`` = (k, max_iter, n_modes)."""
    grid = system.grid
    layout = getattr(system, "layout", None)
    rdt = psi.dtype
    nd = psi.ndim
    if isinstance(system, GPSystem) and operators != "energy":
        if layout is not None:  # ψ₀ in the layout's blocks (a traced ψ₀: a sharding constraint)
            psi = layout.place(psi, "psi0")
        cdt = jnp.result_type(rdt, jnp.complex64)
        pot = jnp.asarray(system.potential, rdt)
        mu = chemical_potential(psi.astype(cdt), system.replace(potential=pot))
        static: tuple[Any, ...] = ("gp", grid, layout)
        args: tuple[Any, ...] = (pot, jnp.asarray(system.g, rdt), psi, mu, _kinetic_factor(grid, rdt, layout))
    else:
        if layout is not None:
            raise ValueError(
                f"the energy-Hessian BdG operators of a {type(system).__name__} run on one device: pass the system "
                "without a layout"
            )
        mu = _energy_mu(system, psi)
        static, args = ("energy",), (system, psi, mu)
    # one constraint field per component: ψ₀ restricted to that component
    ys = (
        psi[None]
        if nd == grid.ndim
        else jnp.eye(psi.shape[0], dtype=rdt).reshape((psi.shape[0],) * 2 + (1,) * grid.ndim) * psi[None]
    )
    sg = jax.lax.stop_gradient
    k, max_iter, n_modes = budget
    start = _draw(key, (k,) + psi.shape, jnp.dtype(rdt), None if layout is None else layout.sharding(nd + 1))
    start = start * (jnp.abs(sg(psi)) + 0.1 * jnp.max(jnp.abs(sg(psi))))[None]
    f, rel, it = _solve(static, sg(args), sg(ys), k, max_iter, n_modes, start, jnp.asarray(tol, rdt), metric)
    if metric == "A":  # f₊ ∝ A f₋ (the residual reported stays that of BA f₋ = ω² f₋, the problem iterated)
        f = _plus_from_minus(f[:n_modes], static, sg(args))
    f = sg(f[:n_modes])
    omega, w2, u, v = _modes(f, static, args, grid.cell_volume)
    norm = _dot_rows(u, u) * grid.cell_volume - _dot_rows(v, v) * grid.cell_volume
    growth = jnp.sqrt(jnp.maximum(-w2, 0.0))
    return BogoliubovModes(omega, w2, growth, u, v, norm, rel[:n_modes], mu, it)  # the fields in their order


def _field_shape(system: Any) -> tuple[int, ...]:
    """The state's shape: the grid's, or (C, *grid) for a mixture."""
    if isinstance(system, MixtureSystem):
        return (system.n_components,) + system.grid.shape
    return system.grid.shape


def _check_bdg_system(system: Any) -> None:
    """A GP, dipolar or mixture system (what the BdG problems solved here cover)."""
    if isinstance(system, Spin1System):
        raise TypeError(
            "bogoliubov does not treat a Spin1System (its spin-mixing excitations and the magnetisation's "
            "Goldstone mode are not covered); it takes a GPSystem, DipolarSystem or MixtureSystem"
        )
    if not isinstance(system, SYSTEMS):
        raise TypeError(
            f"system must be a condensate GPSystem, DipolarSystem or MixtureSystem, got {type(system).__name__}"
        )


def _check_gp_coupling(system: GPSystem) -> None:
    """g ≥ 0 for the analytic scalar operators (B > 0 on the complement of ψ₀)."""
    if is_concrete(system.g) and np.ndim(system.g) == 0 and float(np.asarray(system.g)) < 0:
        raise ValueError(
            f"system.g must be >= 0 (for g < 0 the operator B is not positive and the B-inner product "
            f"fails), got {float(np.asarray(system.g))}"
        )


def _align_phase(psi: jax.Array, grid: Grid, rdt: Any) -> jax.Array:
    """ψ₀ (complex) with each component rotated by the phase at its density maximum: real when ψ₀ is real up to
    one phase per component."""
    psi = psi.astype(jnp.result_type(rdt, jnp.complex64))
    if psi.ndim > grid.ndim:  # a mixture: one phase per component
        return jnp.stack([_align_phase(p, grid, rdt) for p in psi])
    # ψ at its largest |ψ|, picked by a mask and a sum (exact: one term is non-zero): an index into the
    # flattened field would gather a sharded ψ onto every device
    at = jnp.arange(grid.size).reshape(grid.shape) == jnp.argmax(jnp.abs(psi))
    ref = jnp.sum(jnp.where(at, psi, 0))
    return psi * (jnp.conj(ref) / jnp.maximum(jnp.abs(ref), jnp.finfo(rdt).tiny))


def _has_flow(psi: jax.Array) -> bool:
    """A phase-aligned ψ₀ that is not real (max |Im ψ| > 1e-3 max |ψ|): a state with flow."""
    return float(jnp.max(jnp.abs(psi.imag))) > 1e-3 * float(jnp.max(jnp.abs(psi)))


@functools.partial(jax.jit, static_argnums=(1,))
def _plus_from_minus(g, static, args) -> jax.Array:
    """f₊ = A g (normalised) from converged f₋ fields g (the ``metric="A"`` iteration)."""
    f = _operators(static, args)[0](g)
    return f / _col(jnp.maximum(_norms(f), jnp.finfo(f.dtype).tiny), g.ndim - 1)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _modes(f, static, args, dv) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(ω, ω², u, v) from the converged f: ω² the Rayleigh quotient at f (differentiable), u and v normalised to
    ∫(u² − v²) dV = 1."""
    nd = f.ndim - 1
    a_op, b_op, _ = _operators(static, args)
    bf = b_op(f)
    fbf = _dot_rows(f, bf)
    w2 = _dot_rows(bf, a_op(bf)) / fbf
    omega = jnp.sqrt(jnp.maximum(w2, 0.0))
    # ∫(u² − v²) dV = ∫ f₊ f₋ dV = fᵀBf dV / ω = 1 (f₋ = Bf₊/ω).
    safe_w = jnp.where(omega > 0, omega, 1.0)
    scale = jnp.sqrt(safe_w / (fbf * dv))
    fp = f * _col(scale, nd)
    fm = bf * _col(scale / safe_w, nd)
    return omega, w2, 0.5 * (fp + fm), 0.5 * (fp - fm)


# ----------------------------------------------------------------------------------------------
# The dense solve about a complex ψ₀
# ----------------------------------------------------------------------------------------------
@jax.jit
def _dense_hessian(system: Any, psi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(K, μ): the Hessian of 𝓛 = E − Σ_c μ_c N_c in the real coordinates z = (Re ψ, Im ψ) flattened (2M × 2M),
    and μ_c = Re⟨ψ_c, ∂E/∂ψ*_c⟩/N_c."""
    shape, m = psi.shape, psi.size
    grid = system.grid
    dv = grid.cell_volume

    def e_of(z: jax.Array) -> jax.Array:
        return energy(jax.lax.complex(z[:m], z[m:]).reshape(shape), system)["total"]

    z0 = jnp.concatenate([psi.real.reshape(-1), psi.imag.reshape(-1)])
    grad = jax.grad(e_of)
    g0 = grad(z0)
    axes = tuple(range(len(shape) - grid.ndim, len(shape)))
    gc = jax.lax.complex(g0[:m], g0[m:]).reshape(shape)
    mu = jnp.sum((jnp.conj(psi) * gc).real, axis=axes) / (2 * dv * jnp.sum(jnp.abs(psi) ** 2, axis=axes))
    mu_z = jnp.tile(jnp.broadcast_to(mu.reshape(mu.shape + (1,) * grid.ndim), shape).reshape(-1), 2)
    return jax.jacfwd(grad)(z0) - jnp.diag(2 * dv * mu_z), mu


def _dense_bogoliubov(system: Any, psi: jax.Array, n_modes: int, max_points: int, zero_tol: float) -> BogoliubovModes:
    """The BdG spectrum about a complex ψ₀ by a dense float64 diagonalisation of (2dV)⁻¹JK (module docstring)."""
    import scipy.linalg

    m = psi.size
    if m > max_points:
        raise ValueError(
            f"psi0 has flow (complex) or the system rotates, which needs the dense BdG solve, limited to "
            f"max_dense_points={max_points} complex unknowns; this state has {m}: use a coarser grid or raise "
            "max_dense_points (memory ~32·M² bytes, time ~M³)"
        )
    if not is_concrete(psi):
        raise ValueError("psi0 must be concrete (not traced) for the dense BdG solve of a complex psi0")
    kmat, mu = _dense_hessian(system, psi)
    dv = system.grid.cell_volume
    kmat = np.asarray(kmat, np.float64)
    dyn = np.concatenate([kmat[m:], -kmat[:m]], axis=0) / (2 * dv)
    lam, vec = scipy.linalg.eig(dyn)
    w = 1j * lam  # e^{λt} = e^{−iωt}
    u, v = vec[:m] + 1j * vec[m:], vec[:m] - 1j * vec[m:]
    norm = (np.sum(np.abs(u) ** 2, axis=0) - np.sum(np.abs(v) ** 2, axis=0)) * dv
    total = (np.sum(np.abs(u) ** 2, axis=0) + np.sum(np.abs(v) ** 2, axis=0)) * dv
    stable = np.abs(w.imag) <= zero_tol
    keep = (np.abs(w) >= zero_tol) & ((stable & (norm > 1e-6 * total)) | ((w.imag > zero_tol) & (w.real > -zero_tol)))
    idx = np.flatnonzero(keep)[np.argsort(w.real[keep], kind="stable")][:n_modes]
    if idx.size < n_modes:
        raise ValueError(f"n_modes={n_modes} exceeds the {idx.size} excitations of this state; ask for fewer")
    res = np.linalg.norm(dyn @ vec[:, idx] - vec[:, idx] * lam[idx], axis=0) / np.maximum(np.abs(lam[idx]), 1e-3)
    scale = 1.0 / np.sqrt(np.where(stable[idx], np.abs(norm[idx]), total[idx]))
    cdt = jnp.result_type(psi.dtype, jnp.complex64)
    shape = (idx.size,) + psi.shape
    return BogoliubovModes(
        omega=jnp.asarray(w.real[idx]),
        omega_squared=jnp.asarray((w[idx] ** 2).real),
        growth_rate=jnp.asarray(np.maximum(w.imag[idx], 0.0) * ~stable[idx]),
        u=jnp.asarray((u[:, idx] * scale).T.reshape(shape), cdt),
        v=jnp.asarray((v[:, idx] * scale).T.reshape(shape), cdt),
        norm=jnp.asarray(norm[idx] * scale**2),
        residual=jnp.asarray(res),
        mu=mu,
        iterations=0,
    )
