"""Exact diagonalisation of small transverse-field Ising (TFI) chains, matrix-free, in JAX.

Convention used throughout ivhl_jax (the MERA uses the same one):

    H = −J Σ_i X_i X_{i+1} − g Σ_i Z_i          (X, Z Pauli matrices; energies in units of J)

critical at g = J. The infinite chain has ground-state energy per site

    e₀(g) = −(1/π) ∫₀^π √(J² + g² − 2 J g cos k) dk,        e₀(g = J = 1) = −4/π.

States are tensors of shape (2,)*n (site 0 is the first axis, i.e. the most significant bit of a flat
index), so they plug straight into :func:`ivhl_jax.physics.tensornet.tn.entanglement_entropy`. ``H·ψ`` is applied
without building H (Z_i is a ±1 sign along axis i; X_i X_{i+1} is a flip of axes i and i+1), so n = 16
(65 536 amplitudes) costs a few milliseconds per product; the ground state comes from Lanczos with full
re-orthogonalisation (``lax.fori_loop``), checked against dense ``numpy.linalg.eigh`` and the free-fermion
solution in the tests. Use float64 (``with jax.enable_x64(True):``) when you need better than ~1e-6.

Any translation-invariant nearest-neighbour chain H = Σ_i h(i, i+1) with a two-site term ``term[a', b', a, b]``
(d, d, d, d) on spins of dimension d: :func:`chain_apply` (H·ψ, ψ of shape (d,)*n) and :func:`chain_ground_state`
(the same Lanczos), as used for the MERA's models (:mod:`ivhl_jax.physics.tensornet.mera.models`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Inexact, Num

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete

__all__ = [
    "chain_apply",
    "chain_ground_state",
    "tfi_apply",
    "tfi_dense",
    "lanczos_ground_state",
    "tfi_ground_state",
    "tfi_energy_density",
    "tfi_finite_ground_energy",
    "MAX_SITES",
]

MAX_SITES = 22  # 4M amplitudes; beyond that use a tensor network


def _check_chain(n: int, J: float, g: float) -> int:
    n = int(check_scalar(n, "n", integer=True, minimum=2))
    if n > MAX_SITES:
        raise ValueError(f"n={n} sites is too large for exact diagonalisation (max {MAX_SITES}); use the MERA")
    check_scalar(J, "J")
    check_scalar(g, "g")
    return n


def tfi_apply(
    psi: Num[ArrayLike, "*sites"], J: float = 1.0, g: float = 1.0, periodic: bool = True
) -> Inexact[Array, "*sites"]:
    """H·ψ for the TFI chain, ψ of shape (2,)*n (n = ψ.ndim). Jittable; linear in ψ; vmap over a batch axis.

    A ψ of another shape, or (outside a trace) with NaN/inf entries, raises a ValueError naming ``psi``.
    """
    psi = check_array(psi, "psi", kind="numeric", finite=True)
    if psi.ndim < 1 or any(s != 2 for s in psi.shape):
        raise ValueError(f"psi must have shape (2,)*n, one axis of size 2 per site, got {tuple(psi.shape)}")
    check_scalar(J, "J")
    check_scalar(g, "g")
    n = psi.ndim
    out = jnp.zeros_like(psi)
    sign_shape = [1] * n
    z = jnp.asarray([1.0, -1.0], dtype=psi.real.dtype)
    for i in range(n):
        shape = list(sign_shape)
        shape[i] = 2
        out = out - g * z.reshape(shape) * psi
    bonds = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if periodic and n > 2 else [])
    for i, j in bonds:
        out = out - J * jnp.flip(psi, axis=(i, j))
    return out


def tfi_dense(n: int, J: float = 1.0, g: float = 1.0, periodic: bool = True) -> Float[np.ndarray, "dim dim"]:
    """Dense float64 NumPy Hamiltonian (2^n × 2^n), an independent reference built from Kronecker products."""
    n = _check_chain(n, J, g)
    if n > 14:
        raise ValueError(f"tfi_dense(n={n}) would need {(2**n) ** 2 * 8 / 2**30:.0f} GiB; use tfi_ground_state")
    x = np.array([[0.0, 1.0], [1.0, 0.0]])
    z = np.diag([1.0, -1.0])

    def op(single: dict[int, np.ndarray]) -> np.ndarray:
        out = np.ones((1, 1))
        for k in range(n):
            out = np.kron(out, single.get(k, np.eye(2)))
        return out

    h = np.zeros((2**n, 2**n))
    for i in range(n):
        h -= g * op({i: z})
    bonds = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if periodic and n > 2 else [])
    for i, j in bonds:
        h -= J * op({i: x, j: x})
    return h


def lanczos_ground_state(
    matvec: Callable[[jax.Array], jax.Array], v0: Inexact[ArrayLike, "*shape"], num_iter: int = 80
) -> tuple[Float[Array, ""], Inexact[Array, "*shape"]]:
    """Lowest eigenpair of a Hermitian linear map by Lanczos with full re-orthogonalisation.

    Args:
      matvec: ψ ↦ Hψ on arrays shaped like ``v0``.
      v0: starting vector (any shape; random is best: it must overlap the ground state).
      num_iter: Krylov dimension (capped at v0.size).

    Returns:
      (E₀, ψ₀) with ψ₀ normalised, shaped like ``v0``.

    Raises:
      ValueError: naming ``v0`` (outside a trace) when it holds NaN/inf or is zero, and naming
        ``num_iter`` when that is not a positive integer: both would otherwise return NaN or fail deep
        inside the loop.
    """
    check_scalar(num_iter, "num_iter", integer=True, minimum=1)
    v0 = check_array(v0, "v0", kind="inexact", finite=True)
    if v0.size == 0:
        raise ValueError("v0 must have at least one entry")
    if is_concrete(v0) and not np.any(np.asarray(v0) != 0):
        raise ValueError("v0 is zero everywhere, so it cannot be normalised; pass a random starting vector")
    shape = v0.shape
    dim = v0.size
    k = int(min(num_iter, dim))
    dtype = v0.dtype
    v = v0.reshape(-1) / jnp.linalg.norm(v0)
    basis = jnp.zeros((k, dim), dtype).at[0].set(v)
    alphas = jnp.zeros((k,), v.real.dtype)
    betas = jnp.zeros((k,), v.real.dtype)
    tiny = jnp.finfo(v.real.dtype).tiny ** 0.5

    def body(j, carry):
        basis, alphas, betas = carry
        vj = basis[j]
        w = matvec(vj.reshape(shape)).reshape(-1)
        a = jnp.real(jnp.vdot(vj, w))
        # Two passes of classical Gram-Schmidt against the whole basis keep the Krylov vectors orthogonal
        # (no ghost eigenvalues); rows not yet filled are zero and drop out.
        for _ in range(2):
            w = w - basis.T @ (jnp.conj(basis) @ w)
        b = jnp.linalg.norm(w)
        nxt = jnp.where(b > tiny, w / jnp.where(b > tiny, b, 1.0), 0.0)
        basis = jax.lax.cond(j + 1 < k, lambda B: B.at[jnp.minimum(j + 1, k - 1)].set(nxt), lambda B: B, basis)
        return basis, alphas.at[j].set(a), betas.at[j].set(b)

    basis, alphas, betas = jax.lax.fori_loop(0, k, body, (basis, alphas, betas))
    tri = jnp.diag(alphas) + jnp.diag(betas[: k - 1], 1) + jnp.diag(betas[: k - 1], -1)
    evals, evecs = jnp.linalg.eigh(tri)
    psi = basis.T @ evecs[:, 0].astype(dtype)
    psi = psi / jnp.linalg.norm(psi)
    return evals[0], psi.reshape(shape)


def tfi_ground_state(
    n: int, J: float = 1.0, g: float = 1.0, periodic: bool = True, *, num_iter: int = 80, seed: int = 0
) -> tuple[Float[Array, ""], Float[Array, "*sites"]]:
    """Ground state of the n-site TFI chain (matrix-free Lanczos). Returns (E₀ total, ψ of shape (2,)*n).

    Runs in the default float dtype (float64 under ``jax.enable_x64(True)``).
    """
    n = _check_chain(n, J, g)
    check_scalar(num_iter, "num_iter", integer=True, minimum=1)
    v0 = jax.random.normal(jax.random.key(seed), (2,) * n, dtype=jnp.result_type(float))
    dt = v0.dtype
    return _ground_jit(v0, jnp.asarray(J, dt), jnp.asarray(g, dt), bool(periodic), int(num_iter))


@jax.jit(static_argnums=(3, 4))
def _ground_jit(v0, J, g, periodic, num_iter):  # J, g traced: one compilation per (n, periodic, num_iter)
    return lanczos_ground_state(lambda p: tfi_apply(p, J, g, periodic), v0, num_iter)


def tfi_energy_density(g: float = 1.0, J: float = 1.0, *, nodes: int = 256) -> float:
    """Exact ground-state energy per site of the infinite TFI chain (Gauss–Legendre quadrature, float64)."""
    check_scalar(g, "g")
    check_scalar(J, "J")
    check_scalar(nodes, "nodes", integer=True, minimum=1)
    x, wq = np.polynomial.legendre.leggauss(int(nodes))
    k = 0.5 * math.pi * (x + 1.0)
    eps = np.sqrt(J * J + g * g - 2.0 * J * g * np.cos(k))
    return float(-0.5 * np.sum(wq * eps))


def tfi_finite_ground_energy(n: int, J: float = 1.0, g: float = 1.0) -> float:
    """Exact ground energy of the periodic n-site TFI chain from free fermions (even-parity sector).

    E₀ = −Σ_k √(J² + g² − 2Jg cos k) over k = π(2m+1)/n, m = 0..n−1 (antiperiodic fermions), valid for J, g ≥ 0.
    """
    n = _check_chain(n, J, g) if n <= MAX_SITES else int(n)
    k = np.pi * (2 * np.arange(n) + 1) / n
    return float(-np.sum(np.sqrt(J * J + g * g - 2.0 * J * g * np.cos(k))))


def _check_term(term: Num[ArrayLike, "d d d d"]) -> jax.Array:
    term = check_array(term, "term", kind="numeric", finite=True)
    if term.ndim != 4 or len(set(term.shape)) != 1:
        raise ValueError(f"term must have shape (d, d, d, d) (a two-site operator), got {tuple(term.shape)}")
    return term


def chain_apply(
    psi: Num[ArrayLike, "*sites"], term: Num[ArrayLike, "d d d d"], periodic: bool = True
) -> Inexact[Array, "*sites"]:
    """H·ψ for H = Σ_i h(i, i+1) (periodic: the bond (n−1, 0) too), ψ of shape (d,)*n, ``term[a', b', a, b]`` =
    <a' b'| h |a b> of shape (d, d, d, d). Jittable, linear in ψ."""
    psi = check_array(psi, "psi", kind="numeric", finite=True)
    term = _check_term(term)
    d = term.shape[0]
    if psi.ndim < 2 or any(s != d for s in psi.shape):
        raise ValueError(f"psi must have shape (d,)*n with d = {d} (the term's), got {tuple(psi.shape)}")
    n = psi.ndim
    out = jnp.zeros(psi.shape, jnp.result_type(psi, term))
    bonds = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if periodic and n > 2 else [])
    for i, j in bonds:
        hp = jnp.tensordot(term, psi, axes=((2, 3), (i, j)))  # (a', b', rest...) with i, j removed
        out = out + jnp.moveaxis(hp, (0, 1), (i, j))
    return out


def chain_ground_state(
    term: Num[ArrayLike, "d d d d"], n: int, periodic: bool = True, *, num_iter: int = 80, seed: int = 0
) -> tuple[Float[Array, ""], Inexact[Array, "*sites"]]:
    """Ground state of the n-site chain H = Σ_i h(i, i+1) (matrix-free Lanczos). Returns (E₀ total, ψ of shape
    (d,)*n). Runs in the default float dtype (float64 under ``jax.enable_x64(True)``); d^n ≤ 4M amplitudes."""
    term = _check_term(term)
    d = int(term.shape[0])
    check_scalar(n, "n", integer=True, minimum=2)
    n = int(n)
    if d**n > 2**MAX_SITES:
        raise ValueError(
            f"n={n} sites of dimension {d} ({d**n} amplitudes) is too large for exact "
            f"diagonalisation (max {2**MAX_SITES}); use the MERA"
        )
    check_scalar(num_iter, "num_iter", integer=True, minimum=1)
    v0 = jax.random.normal(jax.random.key(seed), (d,) * n, dtype=jnp.result_type(float))
    return _chain_jit(v0, jnp.asarray(term, v0.dtype), bool(periodic), int(num_iter))


@jax.jit(static_argnums=(2, 3))
def _chain_jit(v0, term, periodic, num_iter):  # term traced: one compilation per (d, n, periodic, num_iter)
    return lanczos_ground_state(lambda p: chain_apply(p, term, periodic), v0, num_iter)
