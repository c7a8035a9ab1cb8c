"""Scaling superoperators of the scale-invariant layer and the scaling dimensions they give."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.mera.config import MERA, check_mera, require_x64
from ivhl_jax.physics.mera.superoperators import ASCEND_DIAGRAMS
from ivhl_jax.physics.tn import contract


def scaling_superoperator(w: jax.Array, v: jax.Array | None = None) -> jax.Array:
    """One-site scaling superoperator, a matrix acting on vec(o) with o[a', a].

    ``w`` only: S_w(o) = w†(o ⊗ 1)w, the map of an operator on a w's fine leg (f0) to the B' site above it,
    (χ_out², χ_in²). With ``v``: the two-layer map S = S_v ∘ S_w, where S_v(o) = v†(1 ⊗ o)v. The site at f0
    goes up through w to a B' site, which in the next layer's cell (v, w, v, w) can be a v's fine leg (f3),
    which goes up through v to an A' site at an f0 position again: a one-site causal cone two layers (a factor
    4 in scale) deep, so S's eigenvalues are λ = 4^{−Δ}.
    """
    if jnp.ndim(w) != 3:
        raise ValueError(f"w must be an isometry of shape (chi_in, chi_in, chi_out); got {jnp.shape(w)}")
    if v is not None and tuple(jnp.shape(v)) != (w.shape[1], w.shape[0], w.shape[2]):
        # v is w's mirror image: its two fine legs in the other order
        raise ValueError(
            f"v must have shape {(w.shape[1], w.shape[0], w.shape[2])} (w's mirror image); got {jnp.shape(v)}"
        )
    return _scaling_superoperator(w, v)


# One program: eagerly, its six small ops would each be compiled on first use.
@jax.jit
def _scaling_superoperator(w: jax.Array, v: jax.Array | None) -> jax.Array:
    chi_out, chi_in = w.shape[-1], w.shape[0]
    s = jnp.einsum("eir,aip->rpea", w.conj(), w).reshape(chi_out * chi_out, chi_in * chi_in)
    if v is None:
        return s
    sv = jnp.einsum("ier,iap->rpea", v.conj(), v).reshape(v.shape[-1] ** 2, v.shape[1] ** 2)
    return sv @ s


def scaling_dimensions(mera: MERA, num: int = 10) -> np.ndarray:
    """Scaling dimensions Δ = −log₄|λ| of the SI layer's two-layer one-site scaling superoperator S_v ∘ S_w
    (see :func:`scaling_superoperator`), sorted ascending; the identity gives Δ = 0 exactly (S is unital).
    Returned as float64 NumPy (``num`` smallest); the identity's Δ, ±1e-16 from rounding (printed −0.000 when
    negative), is returned as 0.0 (every |Δ| < 1e-12). Needs ``jax.enable_x64``
    (:func:`~ivhl_jax.physics.mera.config.require_x64`)."""
    check_scalar(num, "num", integer=True, minimum=1)  # the arguments first, then the precision rule
    require_x64("mera.scaling_dimensions")
    num = int(num)
    _, w, v = check_mera(mera).layer(mera.num_layers - 1)
    ev = np.linalg.eigvals(np.asarray(scaling_superoperator(w, v), dtype=np.float64))
    mag = np.sort(np.abs(ev))[::-1]
    return _no_negative_zero(-0.5 * np.log2(np.maximum(mag, 1e-300)))[:num]


def _no_negative_zero(x: np.ndarray) -> np.ndarray:
    """``x`` with every |x| < 1e-12 (the identity's Δ = 0 up to rounding, of either sign) as +0.0, so it prints
    as 0 (never −0.000)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.abs(x) < 1e-12, 0.0, x)


# --------------------------------------------------------------------------------- two-site operators


@jax.jit
def two_site_map(o: jax.Array, u: jax.Array, w: jax.Array, v: jax.Array) -> jax.Array:
    """𝒮₂(o): the diagram t2 of :mod:`~ivhl_jax.physics.mera.superoperators` with ``o`` on the fine BA bond under u."""
    return contract(ASCEND_DIAGRAMS[1], w.conj(), u.conj(), v.conj(), o, w, u, v)


def two_site_scaling_superoperator(mera: MERA) -> Callable[[np.ndarray], np.ndarray]:
    """The two-site scaling superoperator 𝒮₂ of the scale-invariant layer as a matrix-free map on vec(o),
    o[a', b', a, b] a two-site operator on the BA bond under a disentangler.

    The coarse B'A' bond made by one cell's (w, v) lies under a disentangler of the next layer when the cell index
    is odd; the cell at index −1 stays odd at every scale, so a two-site operator there keeps a two-site causal
    cone and one layer maps it by 𝒮₂(o) = (w ⊗ v)† u† (1 ⊗ o ⊗ 1) u (w ⊗ v) (the diagram t2 of 𝒜). Scaling
    operators are its eigenvectors, with eigenvalues λ = 2^{−Δ} (one layer halves distances). Returns
    ``matvec(x) -> y`` on float64 NumPy vectors of length χ⁴.
    """
    u, w, v = (jnp.asarray(x, jnp.float64) for x in check_mera(mera).layer(mera.num_layers - 1))
    chi = int(w.shape[-1])

    def matvec(x: np.ndarray) -> np.ndarray:
        o = jnp.asarray(np.asarray(x).real.reshape((chi,) * 4), jnp.float64)
        return np.asarray(two_site_map(o, u, w, v)).reshape(-1)

    return matvec


def two_site_scaling_dimensions(mera: MERA, num: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """The ``num`` smallest scaling dimensions Δ = −log₂|λ| of :func:`two_site_scaling_superoperator` (Arnoldi,
    scipy ``eigs``; dense ``eig`` below χ⁴ = 256) and the reflection parity of each scaling operator (+1 even,
    −1 odd under o[a', b', a, b] → o[b', a', b, a]; 0 where a degenerate pair mixes both). Call inside
    ``jax.enable_x64(True)``."""
    check_scalar(num, "num", integer=True, minimum=1)
    require_x64("mera.scaling.two_site_scaling_dimensions")
    matvec = two_site_scaling_superoperator(mera)
    chi = int(check_mera(mera).chi)
    n = chi**4
    k = min(int(num), n - 2)
    if n <= 256:
        mat = np.stack([matvec(e) for e in np.eye(n)], axis=1)
        vals, vecs = np.linalg.eig(mat)
    else:
        from scipy.sparse.linalg import LinearOperator, eigs

        op = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
        vals, vecs = eigs(op, k=k, which="LM", tol=1e-12, ncv=max(2 * k + 1, 40))
    order = np.argsort(-np.abs(vals))[:k]
    vals, vecs = vals[order], vecs[:, order]
    dims = _no_negative_zero(-np.log2(np.maximum(np.abs(vals), 1e-300)))
    parity = np.zeros(len(dims))
    for i in range(len(dims)):
        x = vecs[:, i].reshape((chi,) * 4)
        r = np.transpose(x, (1, 0, 3, 2))
        p = float(np.real(np.vdot(x, r)) / np.real(np.vdot(x, x)))
        parity[i] = np.sign(p) if abs(abs(p) - 1) < 1e-3 else 0.0
    return dims, parity


# ------------------------------------------------------------------------------------------ CFT data

#: Low-lying scaling operators of the critical models' CFTs: (Δ, label, primary it descends from).
CFT_OPERATORS: dict[str, list[tuple[float, str, str]]] = {
    # Ising (c = 1/2): the Virasoro towers of 1, σ (1/16, 1/16) and ε (1/2, 1/2) to level 2
    "ising": [
        (0.0, "1", "1"),
        (0.125, "σ", "σ"),
        (1.0, "ε", "ε"),
        (1.125, "∂σ", "σ"),
        (1.125, "∂̄σ", "σ"),
        (2.0, "T", "1"),
        (2.0, "T̄", "1"),
        (2.0, "∂ε", "ε"),
        (2.0, "∂̄ε", "ε"),
        (2.125, "∂²σ", "σ"),
        (2.125, "∂∂̄σ", "σ"),
        (2.125, "∂̄²σ", "σ"),
    ],
    # 3-state Potts (c = 4/5): σ, σ† (1/15, 1/15), ε (2/5, 2/5), Z, Z† (2/3, 2/3) and level-1 descendants
    "potts": [
        (0.0, "1", "1"),
        (2 / 15, "σ", "σ"),
        (2 / 15, "σ†", "σ†"),
        (0.8, "ε", "ε"),
        (17 / 15, "∂σ", "σ"),
        (17 / 15, "∂̄σ", "σ"),
        (17 / 15, "∂σ†", "σ†"),
        (17 / 15, "∂̄σ†", "σ†"),
        (4 / 3, "Z", "Z"),
        (4 / 3, "Z†", "Z†"),
        (1.8, "∂ε", "ε"),
        (1.8, "∂̄ε", "ε"),
        (2.0, "T", "1"),
        (2.0, "T̄", "1"),
    ],
    # XX chain: the c = 1 compact boson at the free-fermion radius. Its primaries are the vertex operators V(n,m),
    # U(1) charge n (S^z) and winding m, with Δ = n²/4 + m² and spin n·m, and the currents J, J̄ (Δ = 1); the list
    # is complete up to Δ = 5/4 (17 operators; exact diagonalisation of the periodic chain has the same levels
    # and charges, tests/physics/mera/test_symmetric.py).
    "xx": [
        (0.0, "1", "1"),
        (0.25, "V(1,0)", "V(1,0)"),
        (0.25, "V(-1,0)", "V(-1,0)"),
        (1.0, "V(2,0)", "V(2,0)"),
        (1.0, "V(-2,0)", "V(-2,0)"),
        (1.0, "V(0,1)", "V(0,1)"),
        (1.0, "V(0,-1)", "V(0,-1)"),
        (1.0, "J", "J"),
        (1.0, "J̄", "J̄"),
        (1.25, "V(1,1)", "V(1,1)"),
        (1.25, "V(1,-1)", "V(1,-1)"),
        (1.25, "V(-1,1)", "V(-1,1)"),
        (1.25, "V(-1,-1)", "V(-1,-1)"),
        (1.25, "∂V(1,0)", "V(1,0)"),
        (1.25, "∂̄V(1,0)", "V(1,0)"),
        (1.25, "∂V(-1,0)", "V(-1,0)"),
        (1.25, "∂̄V(-1,0)", "V(-1,0)"),
    ],
}


def identify(dims: Any, cft: str) -> list[dict[str, Any]]:
    """Each measured Δ matched to the nearest operator of the CFT ``cft`` ("ising", "potts", "xx"; each CFT
    operator used once, in order of distance): its label, exact Δ, the primary it belongs to, and whether it is
    that primary or a descendant."""
    if cft not in CFT_OPERATORS:
        raise ValueError(f"cft must be one of {sorted(CFT_OPERATORS)}, got {cft!r}")
    table = list(CFT_OPERATORS[cft])
    free = list(range(len(table)))
    out: list[dict[str, Any]] = []
    for d in np.asarray(dims, dtype=np.float64):
        if not free:
            out.append({"delta": float(d), "label": None, "exact": None, "primary": None, "descendant": None})
            continue
        j = min(free, key=lambda i: abs(table[i][0] - d))
        free.remove(j)
        exact, label, primary = table[j]
        out.append(
            {"delta": float(d), "label": label, "exact": exact, "primary": primary, "descendant": label != primary}
        )
    return out
