"""Exact discrete ground states: preconditioned Riemannian conjugate gradient on the norm sphere.

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`).

The ground state minimises the discretised energy E[ψ] that :func:`~ivhl_jax.physics.condensate.energy` defines
(spectral kinetic term, the same grid sums) on the manifold of the conserved norms: ∫|ψ|² dV = N for a scalar or
dipolar condensate, every N_i for a mixture, N (and M = ∫F_z dV when given) for spin-1. The minimiser is the
exact discrete ground state: Hψ = Σ_a λ_a (∂c_a/∂ψ*) with no time-step bias (the imaginary-time flow's fixed point
carries an error linear in dt). Method (Antoine, Levitt & Tang, J. Comput. Phys. 343, 92 (2017)):

- ψ is held as a real vector x (ψ itself for a real problem, which stays real; (Re ψ, Im ψ) otherwise), so the
  gradient ∇ₓE = 2 dV (Re Hψ, Im Hψ) comes from ``jax.grad`` of the energy (the Wirtinger derivative ∂E/∂ψ*);
- every constraint is a weighted norm c_a = dV Σ_m w_am ‖x_m‖² (m the component): the Riemannian gradient
  r = ∇E − Σ_a λ_a n_a is ∇E projected orthogonally to the normals n_a = w_a x (a small Gram solve gives the
  Lagrange multipliers λ_a, the chemical potentials), and the stopping test is the relative residual
  ‖r‖/‖∇E‖ = ‖Hψ − μψ‖/‖Hψ‖ (:func:`~ivhl_jax.physics.condensate.residual`'s convention, one μ per constraint);
- the direction is the preconditioned Polak–Ribière conjugate gradient d = −Π P r + β Π d_old, β = max(0,
  ⟨r − r_old, P r⟩ / ⟨r_old, P r_old⟩), restarted (β = 0) when d is not a descent direction, with the kinetic
  preconditioner P = (α + ½k²)⁻¹ (α the larger of the mean chemical potential and the mean kinetic energy per
  particle) applied in Fourier space and Π the projection onto the tangent space;
- the step follows the retraction R (rescaling to the held norms) along φ(θ) = E[R(x + θd)]: a Newton step
  θ = −φ'(0)/φ''(0) (φ'' by forward-over-forward differentiation), then Armijo backtracking (at most
  :data:`MAX_BACKTRACKS` quarterings), all in one jitted ``lax.while_loop``.

The solve stops when the residual is ≤ ``tol``, after ``max_iter`` iterations, when the line search finds no
decrease :data:`MAX_STALLS` times running (the energy is at round-off), or when the residual has set no new low
(nor the energy fallen beyond round-off) for :data:`MAX_STAGNANT` iterations (its round-off floor: ~1e-6 in
float32, where a smaller ``tol`` is never met).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.precision import Policy, complex_state_dtype
from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.numerics import splitstep
from ivhl_jax.physics.condensate._descent import real_part
from ivhl_jax.physics.condensate.dipolar import DipolarSystem
from ivhl_jax.physics.condensate.mixture import MixtureSystem, Spin1System
from ivhl_jax.physics.condensate.observables import energy

__all__ = [
    "riemannian_ground_state",
    "constrained_residual",
    "MAX_BACKTRACKS",
    "MAX_STALLS",
    "MAX_STAGNANT",
    "FLOAT32_RESIDUAL",
]

#: Armijo backtracking steps (each a quartering of θ) before an iteration counts as stalled.
MAX_BACKTRACKS = 8
#: Stalled iterations in a row (no decrease of the energy found) after which the solve stops: the energy is at
#: its round-off floor.
MAX_STALLS = 3
#: Iterations without progress (neither a new lowest residual, below 0.99 of the best so far, nor an energy
#: decrease of more than 64 ulps since the last progress) after which the solve stops: the residual has reached
#: its round-off floor (float32: ~1e-6, where steps are still accepted on a flat energy). The energy condition
#: keeps a slow solve going (a Thomas–Fermi state's residual may plateau while E still falls). Near the float32
#: floor the residual wanders: a 1D g = 0 trap from an offset guess passes 1e-5 only at iteration 537, more than
#: 200 iterations after an earlier low.
MAX_STAGNANT = 1000
#: Default residual tolerance in float32: the float32 residual ‖Hψ − μψ‖/‖Hψ‖ bottoms out at a few 1e-6 (FFT
#: round-off of Hψ), so the solve stops on stalls there.
FLOAT32_RESIDUAL = 1e-5
#: Default residual tolerance in float64.
FLOAT64_RESIDUAL = 1e-11


class Manifold(NamedTuple):
    """The static description of the constraint set (hashable: a static argument of the compiled solve).

    ``weights``: one tuple of per-component weights w_am per constraint (an empty tuple of components for a
    single-component state); ``spin_m``: the second constraint is the spin-1 magnetisation (retraction below);
    ``real``: ψ is held real; ``ncomp``: the number of leading component axes (0 or 1); ``ndim``: grid axes."""

    weights: tuple[tuple[float, ...], ...]
    spin_m: bool
    real: bool
    ncomp: int
    ndim: int


def _to_psi(x: jax.Array, m: Manifold, cdt: Any) -> jax.Array:
    return x.astype(cdt) if m.real else jax.lax.complex(x[0], x[1]).astype(cdt)


def _from_psi(psi: jax.Array, m: Manifold) -> jax.Array:
    return psi.real if m.real else jnp.stack([psi.real, psi.imag])


def _comp_axis(m: Manifold) -> int:
    return 0 if m.real else 1


def _weight(w: tuple[float, ...], x: jax.Array, m: Manifold) -> jax.Array:
    """The per-component weights w broadcast against x (component axis after the Re/Im axis)."""
    if not w:
        return jnp.ones((), x.dtype)
    shape = [1] * x.ndim
    shape[_comp_axis(m)] = len(w)
    return jnp.asarray(w, x.dtype).reshape(shape)


def _normals(x: jax.Array, m: Manifold) -> jax.Array:
    """n_a = w_a x, the gradients (up to 2 dV) of the constraints, stacked (n_constraints, *x.shape)."""
    return jnp.stack([_weight(w, x, m) * x for w in m.weights])


def _project(v: jax.Array, normals: jax.Array) -> jax.Array:
    """v orthogonal to every normal (the tangent part): v − Σ_a c_a n_a with G c = ⟨n, v⟩, G_ab = ⟨n_a, n_b⟩."""
    flat = normals.reshape(normals.shape[0], -1)
    gram = flat @ flat.T
    coef = jnp.linalg.solve(gram, flat @ v.reshape(-1))
    return v - jnp.tensordot(coef, normals, axes=1)


def _retract(x: jax.Array, targets: jax.Array, m: Manifold) -> jax.Array:
    """x rescaled onto the constraint set (the retraction; identity to second order along tangent steps).

    One norm: one factor; per-component norms: one factor per component; spin-1 with M: the total norm first, then
    ψ₊₁ and ψ₋₁ rescaled (a², c²) at fixed N₊ + N₋ so that N₊ − N₋ = M."""
    if len(m.weights) == 1 and (m.ncomp == 0 or len(set(m.weights[0])) == 1):
        return splitstep.project_norm(x, targets[0])
    if not m.spin_m:  # one norm per component
        ax = _comp_axis(m)
        other = tuple(a for a in range(x.ndim) if a != ax)
        return splitstep.project_norm(x, targets, other).reshape(x.shape)
    x = splitstep.project_norm(x, targets[0])
    ax = _comp_axis(m)
    other = tuple(a for a in range(x.ndim) if a != ax)
    comp = splitstep.sumsq(x, other)  # (3,)
    tiny = jnp.finfo(x.dtype).tiny
    pm = comp[0] + comp[2]
    a2 = jnp.maximum(pm + targets[1], 0.0) / (2 * comp[0] + tiny)
    c2 = jnp.maximum(pm - targets[1], 0.0) / (2 * comp[2] + tiny)
    scale = jnp.stack([jnp.sqrt(a2), jnp.ones_like(a2), jnp.sqrt(c2)])
    return x * scale.reshape([3 if i == ax else 1 for i in range(x.ndim)])


def _precondition(v: jax.Array, alpha: jax.Array, k2: jax.Array, m: Manifold) -> jax.Array:
    """P v = F⁻¹[(α + ½k²)⁻¹ F v] over the grid axes (a real, even kernel: real in, real out)."""
    axes = tuple(range(v.ndim - m.ndim, v.ndim))
    vk = jnp.fft.fftn(v, axes=axes)
    return jnp.fft.ifftn(vk / (alpha + 0.5 * k2), axes=axes).real.astype(v.dtype)


def _inner(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.sum(a * b)


class _Iterate(NamedTuple):
    x: jax.Array
    e: jax.Array
    grad: jax.Array
    r: jax.Array  # the Riemannian gradient at x (tangent)
    pr: jax.Array  # Π P r
    rpr: jax.Array  # ⟨r, P r⟩
    r_old: jax.Array  # the previous iterate's r and ⟨r, P r⟩ (Polak–Ribière)
    rpr_old: jax.Array
    d: jax.Array  # the last search direction (zero: restart)
    it: jax.Array
    stalls: jax.Array
    best: jax.Array  # the lowest residual so far, the energy at the last progress and that iteration
    e_mark: jax.Array
    best_it: jax.Array
    res: jax.Array
    delta: jax.Array
    moved: jax.Array


def _alpha(x: jax.Array, grad: jax.Array, k2: jax.Array, dv: float, m: Manifold) -> jax.Array:
    """α of the preconditioner: max(mean μ = ⟨x, ∇E⟩ / (2 dV ‖x‖²), mean kinetic energy per particle ½⟨k²⟩)."""
    axes = tuple(range(x.ndim - m.ndim, x.ndim))
    xk = jnp.fft.fftn(x, axes=axes)
    pk = xk.real**2 + xk.imag**2
    ekin = 0.5 * jnp.sum(k2 * pk) / jnp.sum(pk)
    mu = _inner(x, grad) / (2 * dv * _inner(x, x))
    return jnp.maximum(mu, ekin)


def _gradient_parts(x: jax.Array, grad: jax.Array, k2: jax.Array, dv: float, m: Manifold) -> tuple[Any, ...]:
    """(r, Π P r, ⟨r, P r⟩, relative residual ‖r‖/‖∇E‖) at x."""
    normals = _normals(x, m)
    r = _project(grad, normals)
    pr = _project(_precondition(r, _alpha(x, grad, k2, dv, m), k2, m), normals)
    res = jnp.sqrt(_inner(r, r) / _inner(grad, grad))
    return r, pr, _inner(r, pr), res


def _line_search(
    fun: Any, x: jax.Array, e0: jax.Array, slope: jax.Array, d: jax.Array, targets: jax.Array, m: Manifold
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """A Newton step on φ(θ) = E[R(x + θd)] then Armijo backtracking; returns (x_new, E_new, ∇E_new, θ, ok)."""

    def phi(t: jax.Array) -> jax.Array:
        return fun(_retract(x + t * d, targets, m))

    def dphi(t: jax.Array) -> jax.Array:
        return jax.jvp(phi, (t,), (jnp.ones_like(t),))[1]

    zero = jnp.zeros((), x.dtype)
    curv = jax.jvp(dphi, (zero,), (jnp.ones_like(zero),))[1]
    # No positive curvature along d: a step that moves ψ by ~10 % of its norm, then backtracking.
    fallback = 0.1 * jnp.sqrt(_inner(x, x) / _inner(d, d))
    theta0 = jnp.where(curv > 0, -slope / jnp.where(curv > 0, curv, 1.0), fallback)
    slack = 8 * jnp.finfo(x.dtype).eps * jnp.abs(e0)
    vg = jax.value_and_grad(fun)

    def trial(theta: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        xn = _retract(x + theta * d, targets, m)
        en, gn = vg(xn)
        return xn, en, gn

    def accepted(en: jax.Array, gn: jax.Array, theta: jax.Array) -> jax.Array:
        # Armijo, or, where the energy change is at round-off (a sum over the grid: E is accurate to ~100 eps·|E| (a
        # dipolar one), its slope to far better), a slope along d that has fallen: what lets the residual fall
        # below √eps.
        armijo = en <= e0 + 1e-4 * theta * slope + slack
        flat = (en <= e0 + 128 * slack) & (jnp.abs(_inner(gn, d)) <= 0.5 * jnp.abs(slope))
        return (armijo | flat) & jnp.isfinite(en)

    def bad(xs: Any) -> jax.Array:
        _, en, gn, theta, k = xs
        return ~accepted(en, gn, theta) & (k < MAX_BACKTRACKS)

    def shrink(xs: Any) -> Any:
        theta = xs[3] * 0.25
        return (*trial(theta), theta, xs[4] + 1)

    xn, en, gn, theta, k = jax.lax.while_loop(bad, shrink, (*trial(theta0), theta0, jnp.zeros((), jnp.int32)))
    ok = accepted(en, gn, theta)
    return xn, en, gn, theta, ok


def _step(s: _Iterate, fun: Any, targets: jax.Array, k2: jax.Array, dv: float, m: Manifold) -> _Iterate:
    """One conjugate-gradient iteration: direction, line search, the new gradient parts."""
    beta = jnp.maximum(_inner(s.r - s.r_old, s.pr) / s.rpr_old, 0.0)
    d = -s.pr + beta * _project(s.d, _normals(s.x, m))  # the old direction transported by projection
    slope = _inner(s.grad, d)
    restart = ~(slope < 0)  # not a descent direction: steepest (preconditioned) descent
    d = jnp.where(restart, -s.pr, d)
    slope = jnp.where(restart, -s.rpr, slope)
    xn, en, gn, _, ok = _line_search(fun, s.x, s.e, slope, d, targets, m)
    xn, en, gn = (jnp.where(ok, a, b) for a, b in ((xn, s.x), (en, s.e), (gn, s.grad)))
    r, pr, rpr, res = _gradient_parts(xn, gn, k2, dv, m)
    progress = (res < 0.99 * s.best) | (en < s.e_mark - 64 * jnp.finfo(en.dtype).eps * jnp.abs(en))
    return _Iterate(
        x=xn,
        e=en,
        grad=gn,
        r=r,
        pr=pr,
        rpr=rpr,
        r_old=s.r,
        rpr_old=s.rpr,
        d=jnp.where(ok, d, jnp.zeros_like(d)),  # a stalled step restarts the conjugate direction
        it=s.it + 1,
        stalls=jnp.where(ok, 0, s.stalls + 1),
        best=jnp.minimum(res, s.best),
        e_mark=jnp.where(progress, en, s.e_mark),
        best_it=jnp.where(progress, s.it + 1, s.best_it),
        res=res,
        delta=jnp.abs(en - s.e) / jnp.abs(en),
        moved=jnp.sqrt(_inner(xn - s.x, xn - s.x) / _inner(xn, xn)),
    )


def _multipliers(x: jax.Array, grad: jax.Array, dv: float, m: Manifold) -> jax.Array:
    """The Lagrange multipliers λ_a of ∇E = Σ_a λ_a ∇c_a (∇c_a = 2 dV n_a): the chemical potential(s) μ (and the
    magnetisation's multiplier for spin-1 with M)."""
    normals = _normals(x, m)
    flat = normals.reshape(normals.shape[0], -1)
    return jnp.linalg.solve(flat @ flat.T, flat @ grad.reshape(-1)) / (2 * dv)


def _stationarity(x: jax.Array, fun: Any, targets: jax.Array, m: Manifold) -> jax.Array:
    """The map whose root is the ground state (for implicit differentiation): the Riemannian gradient (tangent)
    plus Σ_a (c_a − t_a) n_a (normal: zero exactly on the constraint set); its Jacobian at a non-degenerate
    minimum is the Lagrangian's Hessian on the tangent space and 2 Gram(n) on the normal space, both invertible."""
    grad = jax.grad(fun)(x)
    normals = _normals(x, m)
    flat = normals.reshape(normals.shape[0], -1)
    violation = flat @ x.reshape(-1) - targets  # n_a · x = c_a (in grid-sum units)
    return _project(grad, normals) + jnp.tensordot(violation, normals, axes=1)


def _loop(fun: Any, x0: jax.Array, targets: jax.Array, tol: Any, max_iter: Any, k2: jax.Array, dv: float, m: Manifold):
    x = _retract(x0, targets, m)
    e, grad = jax.value_and_grad(fun)(x)
    r, pr, rpr, res = _gradient_parts(x, grad, k2, dv, m)
    i0 = jnp.zeros((), jnp.int32)
    inf = jnp.asarray(jnp.inf, x.dtype)
    state = _Iterate(x, e, grad, r, pr, rpr, r, rpr, jnp.zeros_like(x), i0, i0, res, e, i0, res, inf, inf)

    def going(s: _Iterate) -> jax.Array:
        stagnant = s.it - s.best_it >= MAX_STAGNANT
        return (s.res > tol) & (s.it < max_iter) & (s.stalls < MAX_STALLS) & ~stagnant & jnp.isfinite(s.e)

    s = jax.lax.while_loop(going, lambda s: _step(s, fun, targets, k2, dv, m), state)
    return s.x, {"steps": s.it, "delta": s.delta, "moved": s.moved}


def _energy_of(system: Any, m: Manifold) -> Any:
    def fun(x: jax.Array) -> jax.Array:
        return energy(_to_psi(x, m, jnp.result_type(x.dtype, jnp.complex64)), system)["total"]

    return fun


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _implicit(system: Any, targets: jax.Array, x: jax.Array, alpha: jax.Array, k2: jax.Array, m: Manifold) -> Any:
    """The solved x (identity forward) with the implicit-function derivative of F(x; system, N) = 0
    (:func:`_stationarity`) in reverse mode: the adjoint Jᵀw = x̄ (J = ∂F/∂x) by GMRES preconditioned with
    P = (α + ½k²)⁻¹, then (system̄, N̄) = −(∂F/∂(system, N))ᵀ w."""
    return x


def _implicit_fwd(system: Any, targets: Any, x: Any, alpha: Any, k2: Any, m: Manifold) -> Any:
    return x, (system, targets, x, alpha, k2)


def _implicit_bwd(m: Manifold, res: Any, x_bar: jax.Array) -> Any:
    system, targets, x, alpha, k2 = res

    def f(sys_: Any, t: jax.Array, y: jax.Array) -> jax.Array:
        return _stationarity(y, _energy_of(sys_, m), t, m)

    _, vjp_x = jax.vjp(lambda y: f(system, targets, y), x)

    def transposed(w: jax.Array) -> jax.Array:
        return vjp_x(w)[0]

    def prec(v: jax.Array) -> jax.Array:
        return _precondition(v, alpha, k2, m)

    w = jax.scipy.sparse.linalg.gmres(transposed, x_bar, tol=1e-12, restart=50, maxiter=40, M=prec)[0]
    _, vjp_p = jax.vjp(lambda sys_, t: f(sys_, t, x), system, targets)
    sys_bar, t_bar = vjp_p(-w)
    return sys_bar, t_bar, jnp.zeros_like(x), jnp.zeros_like(alpha), jnp.zeros_like(k2)


_implicit.defvjp(_implicit_fwd, _implicit_bwd)


@functools.partial(jax.jit, static_argnames=("manifold",))
def _solve(
    system: Any, x0: jax.Array, targets: jax.Array, tol: Any, max_iter: Any, *, manifold: Manifold
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The solve; a real problem's result is differentiable in reverse mode by the implicit function theorem
    (:func:`_implicit`) with respect to the system's leaves and the held norms."""
    m = manifold
    grid = system.grid
    dv = grid.cell_volume
    k2 = jnp.asarray(grid.k_squared(), x0.dtype)

    fun = _energy_of(system, m)
    if m.real:
        # The iteration runs on constants (a while_loop is not reverse-differentiable); _implicit adds the
        # derivative of its result.
        stop = jax.lax.stop_gradient
        fun_fixed = _energy_of(stop(system), m)
        x, stats = _loop(fun_fixed, stop(x0), stop(targets), tol, max_iter, k2, dv, m)
        start = _retract(x0, targets, m)  # (the preconditioner's shift, from the guess: it sets speed, not result)
        alpha = stop(_alpha(start, jax.grad(fun_fixed)(start), k2, dv, m))
        x = _implicit(system, targets, x, alpha, k2, m)
    else:
        # A complex ψ has a free global phase (and spin-1 a free spin rotation about z): zero modes of the
        # Hessian, so no implicit derivative exists; reverse mode stops at the loop with JAX's error, as it does
        # through the flow.
        x, stats = _loop(fun, x0, targets, tol, max_iter, k2, dv, m)
    e, grad = jax.value_and_grad(fun)(x)
    normals = _normals(x, m)
    r = _project(grad, normals)
    res = jnp.sqrt(_inner(r, r) / _inner(grad, grad))
    return x, {
        **stats,
        "energy": e,
        "residual": res,
        "converged": res <= tol,
        "finite": jnp.all(jnp.isfinite(x)) & jnp.isfinite(e),
        "multipliers": _multipliers(x, grad, dv, m),
    }


def _cast(system: Any, policy: str | Policy | None) -> Any:
    """``system`` with every leaf in the real dtype of ``policy``'s complex state (None: the system's own)."""
    cdt = complex_state_dtype(policy, like=system.potential, routine="the Riemannian ground-state solver")
    rdt = jnp.finfo(cdt).dtype
    return jax.tree.map(lambda a: jnp.asarray(a, rdt), system)


def _manifold(system: Any, magnetization: Any) -> Manifold:
    ndim = system.grid.ndim
    if isinstance(system, MixtureSystem):
        c = system.n_components
        rows = tuple(tuple(float(i == j) for j in range(c)) for i in range(c))
        return Manifold(rows, False, True, 1, ndim)
    if isinstance(system, Spin1System):
        spin = ((1.0, 1.0, 1.0),) + (((1.0, 0.0, -1.0),) if magnetization is not None else ())
        return Manifold(spin, magnetization is not None, False, 1, ndim)
    real = isinstance(system, DipolarSystem) or not system.rotating
    return Manifold(((),), False, real, 0, ndim)


def _targets(system: Any, m: Manifold, norm: Any, magnetization: Any) -> jax.Array:
    """The held constraint values in units of the grid sums: N_a / dV."""
    rdt = system.real_dtype
    dv = jnp.asarray(system.grid.cell_volume, rdt)
    n = jnp.asarray(norm, rdt)
    if isinstance(system, MixtureSystem):
        if n.ndim not in (0, 1) or (n.ndim == 1 and n.shape[0] != system.n_components):
            raise ValueError(
                f"norm must be one number or {system.n_components} (one per component), got shape {n.shape}"
            )
        return jnp.broadcast_to(n, (system.n_components,)) / dv
    if n.ndim != 0:
        raise ValueError(f"norm must be one number (the particle number N), got shape {n.shape}")
    if m.spin_m:
        if is_concrete(magnetization) and is_concrete(norm) and not abs(float(magnetization)) < float(norm):
            raise ValueError(f"magnetization must satisfy |M| < N = {float(norm)}, got {float(magnetization)}")
        return jnp.stack([n, jnp.asarray(magnetization, rdt)]) / dv
    return n[None] / dv


def _default_start(system: Any) -> jax.Array:
    """The flow's default guesses: a unit-width Gaussian (per component; spin-1 times the generic spinor
    (0.6, 0.5 + 0.4i, 0.3)/|·|, neither polar nor ferromagnetic)."""
    grid = system.grid
    arg = sum(grid._bcast(x * x / 2, a) for a, x in enumerate(grid.coords))
    gauss = np.exp(-np.asarray(arg)) * np.ones(grid.shape)
    if isinstance(system, MixtureSystem):
        return jnp.asarray(np.stack([gauss] * system.n_components), system.complex_dtype)
    if isinstance(system, Spin1System):
        zeta = np.array([0.6, 0.5 + 0.4j, 0.3])
        zeta = zeta / np.linalg.norm(zeta)
        return jnp.asarray(zeta.reshape((3,) + (1,) * grid.ndim) * gauss, system.complex_dtype)
    return jnp.asarray(gauss, system.complex_dtype)


def _start(system: Any, m: Manifold, psi0: Any, key: Any, noise: Any) -> jax.Array:
    """The start vector x₀: ψ₀ (checked: the state's shape, finite, no held group empty) plus the optional complex
    noise, in the real representation (a real problem's ψ₀ loses its phase ½ arg Σψ² per component first)."""
    grid = system.grid
    shape = ((len(m.weights[0]),) if m.ncomp else ()) + grid.shape
    if psi0 is None:
        psi = _default_start(system)
    else:
        psi = jnp.asarray(psi0)
        if tuple(psi.shape) != shape or not jnp.issubdtype(psi.dtype, jnp.inexact):
            raise ValueError(f"psi0 must be a float or complex array of shape {shape}, got {psi.dtype}{psi.shape}")
        psi = psi.astype(system.complex_dtype)
        if is_concrete(psi):
            host = np.asarray(psi)
            if not np.all(np.isfinite(host)):
                raise ValueError("psi0 contains NaN or inf values; pass a finite initial guess")
            sums = (np.abs(host) ** 2).reshape((shape[0], -1)).sum(axis=1) if m.ncomp else [np.sum(np.abs(host) ** 2)]
            empty = [i for i, v in enumerate(sums) if not v > 0]
            if len(empty) == len(sums) or (isinstance(system, MixtureSystem) and empty):
                raise ValueError(f"psi0 is zero everywhere (component(s) {empty}); pass a non-zero initial guess")
            if m.spin_m and (empty.count(0) or empty.count(2)):
                raise ValueError(
                    "psi0 needs non-zero m = +1 and m = -1 components to hold a magnetization; pass a guess with all "
                    "three components populated"
                )
    if noise is not None:
        kr, ki = jax.random.split(key)
        rdt = system.real_dtype
        amp = jnp.max(jnp.abs(psi)) * jnp.asarray(noise, rdt)
        psi = psi + (amp * jax.lax.complex(jax.random.normal(kr, shape, rdt), jax.random.normal(ki, shape, rdt)))
    if m.real:
        psi = real_part(psi, tuple(range(m.ncomp, psi.ndim)) if m.ncomp else None)
    return _from_psi(psi, m)


def _positive(psi: jax.Array, m: Manifold) -> jax.Array:
    """A real result with each component's Σψ made positive (a nodeless ground state is then ≥ 0)."""
    if not m.real:
        return psi
    axes = tuple(range(m.ncomp, psi.ndim))
    return psi * jnp.where(jnp.sum(psi.real, axis=axes, keepdims=True) < 0, -1, 1).astype(psi.real.dtype)


def riemannian_ground_state(
    system: Any,
    norm: Any = 1.0,
    tol: float | None = None,
    max_iter: int = 100_000,
    *,
    psi0: Any = None,
    key: jax.Array | None = None,
    noise: Any = 0.0,
    magnetization: Any = None,
    policy: str | Policy | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The exact discrete ground state of any condensate system by preconditioned Riemannian conjugate gradient
    (module docstring): ``condensate.ground_state(system, ..., method="cg")``.

    Args:
      system: a GPSystem (Ω ≠ 0: the rotating-frame ground state, ψ complex), MixtureSystem (every N_i held),
        Spin1System (N held, and M with ``magnetization``; ψ complex) or DipolarSystem; without a ``layout`` (the
        solve runs on one device).
      norm: N (a mixture: one number or one per component).
      tol: the relative residual ‖Hψ − μψ‖/‖Hψ‖ at which the solve stops (None: 1e-11 in float64,
        :data:`FLOAT32_RESIDUAL` in float32, where the solve usually stops on stalls at its round-off floor).
      max_iter: iteration cap (each iteration ≈ four energy-gradient evaluations).
      psi0: initial guess of the state's shape (default: the flow's Gaussian guesses); a real problem keeps ψ
        real (a complex guess loses its phase ½ arg Σψ² per component and its imaginary part once).
      key, noise: a GPSystem's relative amplitude of complex noise added to the guess, and its PRNG key.
      magnetization: a Spin1System's M = ∫F_z dV held (|M| < N), or None (M free).
      policy: None (the system's dtype) or ``"f32"`` / ``"f64"``; ψ is returned in the policy's output dtype.

    Returns:
      (ψ, info): ψ complex of the state's shape (real problems: zero imaginary part, each component positive);
      info = {"steps" (iterations), "energy", "mu" (the Lagrange multipliers: μ, μ_i per mixture component, (μ, λ_M)
      for spin-1 with M; a scalar when there is one), "residual", "delta" and "moved" (the last relative change of E
      and of ψ), "converged" (residual ≤ tol), "finite"}.
    """
    from ivhl_jax.physics.condensate.system import cast_output

    if getattr(system, "layout", None) is not None:
        raise ValueError("method='cg' runs on one device: pass a system without a layout (or use method='flow')")
    if not isinstance(system, Spin1System) and magnetization is not None:
        raise ValueError(f"magnetization applies to a Spin1System, not to a {type(system).__name__}; drop it")
    use_noise = not (is_concrete(noise) and float(np.asarray(noise)) == 0.0)
    if (use_noise or key is not None) and isinstance(system, (MixtureSystem, Spin1System, DipolarSystem)):
        raise ValueError(
            f"key and noise apply to a GPSystem, not to a {type(system).__name__}; drop them (or pass psi0)"
        )
    if use_noise and key is None:
        raise ValueError(
            f"noise={noise} needs a PRNG key: pass key=jax.random.key(seed) (without one the noise would be silently "
            "ignored)"
        )
    if np.ndim(norm) == 0:
        check_scalar(norm, "norm", positive=True)
    elif is_concrete(norm) and not np.all(np.asarray(norm) > 0):
        raise ValueError(f"norm must be > 0 for every component, got {np.asarray(norm).tolist()}")
    check_scalar(max_iter, "max_iter", integer=True, minimum=1)
    system = _cast(system, policy)
    rdt = system.real_dtype
    if tol is None:
        tol = FLOAT32_RESIDUAL if np.dtype(rdt).itemsize <= 4 else FLOAT64_RESIDUAL
    check_scalar(tol, "tol", positive=True)
    m = _manifold(system, magnetization)
    targets = _targets(system, m, norm, magnetization)
    x0 = _start(system, m, psi0, key, noise if use_noise else None)
    x, info = _solve(system, x0, targets, jnp.asarray(tol, rdt), int(max_iter), manifold=m)
    if is_concrete(info["finite"]) and not bool(info["finite"]):
        raise ValueError("the conjugate-gradient ground-state solve broke down (NaN/inf); check the system and psi0")
    mu = info.pop("multipliers")
    info["mu"] = mu[0] if mu.shape[0] == 1 else mu
    psi = _positive(_to_psi(x, m, system.complex_dtype), m)
    return cast_output(psi, policy), info


def constrained_residual(system: Any, psi: Any, *, magnetization: Any = None) -> tuple[jax.Array, jax.Array]:
    """(‖Hψ − Σ_a λ_a ∂c_a/∂ψ*‖/‖Hψ‖, λ) of any state of any condensate system: the residual the solver stops on,
    with one multiplier per held norm (μ; μ_i per mixture component; (μ, λ_M) for spin-1 with ``magnetization``
    held), Hψ = ∂E/∂ψ* of :func:`~ivhl_jax.physics.condensate.energy`. For a GPSystem it is
    :func:`~ivhl_jax.physics.condensate.residual`. A real problem's ψ is measured by its real part."""
    m = _manifold(system, magnetization)
    psi = jnp.asarray(psi).astype(system.complex_dtype)
    x = _from_psi(psi, m)

    def fun(y: jax.Array) -> jax.Array:
        return energy(_to_psi(y, m, system.complex_dtype), system)["total"]

    grad = jax.grad(fun)(x)
    r = _project(grad, _normals(x, m))
    return jnp.sqrt(_inner(r, r) / _inner(grad, grad)), _multipliers(x, grad, system.grid.cell_volume, m)
