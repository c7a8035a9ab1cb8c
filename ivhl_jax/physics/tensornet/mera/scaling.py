"""Scaling superoperators of the scale-invariant layer and the scaling dimensions they give (of a dense or a
symmetric MERA; a symmetric MERA's carry the charge of each scaling operator)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.tensornet import blocks as S
from ivhl_jax.physics.tensornet import ops as T
from ivhl_jax.physics.tensornet.mera import cft as cft_records
from ivhl_jax.physics.tensornet.mera.cft import Operator
from ivhl_jax.physics.tensornet.mera.config import MERA, check_mera, require_x64
from ivhl_jax.physics.tensornet.mera.superoperators import ASCEND_DIAGRAMS
from ivhl_jax.physics.tensornet.ops import contract


def scaling_superoperator(w: Any, v: Any = None) -> jax.Array:
    """One-site scaling superoperator, a matrix acting on vec(o) with o[a', a].

    ``w`` only: S_w(o) = w†(o ⊗ 1)w, the map of an operator on a w's fine leg (f0) to the B' site above it,
    (χ_out², χ_in²). With ``v``: the two-layer map S = S_v ∘ S_w, where S_v(o) = v†(1 ⊗ o)v. The site at f0
    goes up through w to a B' site, which in the next layer's cell (v, w, v, w) can be a v's fine leg (f3),
    which goes up through v to an A' site at an f0 position again: a one-site causal cone two layers (a factor
    4 in scale) deep, so S's eigenvalues are λ = 4^{−Δ}. Block tensors (a symmetric MERA's) are read as their
    dense embeddings (sectors in each leg's order).
    """
    if T.is_block(w, v):
        w, v = w.to_dense(), (None if v is None else v.to_dense())
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


def scaling_dimensions(mera: MERA, num: int = 10, *, charges: bool = False) -> Any:
    """Scaling dimensions Δ = −log₄|λ| of the SI layer's two-layer one-site scaling superoperator S_v ∘ S_w
    (see :func:`scaling_superoperator`), sorted ascending; the identity gives Δ = 0 exactly (S is unital).
    Returned as float64 NumPy (``num`` smallest); the identity's Δ, ±1e-16 from rounding (printed −0.000 when
    negative), is returned as 0.0 (every |Δ| < 1e-12). Needs ``jax.enable_x64``
    (:func:`~ivhl_jax.physics.tensornet.mera.config.require_x64`).

    A symmetric MERA's S maps an operator of charge q = q(a') − q(a) to one of the same charge (its matrix is
    block diagonal, one block per charge): its spectrum is computed charge by charge. ``charges=True`` returns
    (Δ, charge of each scaling operator); a dense MERA's charges are all 0 (the trivial group)."""
    check_scalar(num, "num", integer=True, minimum=1)  # the arguments first, then the precision rule
    require_x64("mera.scaling_dimensions")
    num = int(num)
    _, w, v = check_mera(mera).layer(mera.num_layers - 1)
    s = np.asarray(scaling_superoperator(w, v), dtype=np.float64)
    oq = operator_charges(w)
    dims, qs = [], []
    for q in np.unique(oq):
        idx = np.flatnonzero(oq == q)
        ev = np.linalg.eigvals(s[np.ix_(idx, idx)])
        dims.append(-0.5 * np.log2(np.maximum(np.abs(ev), 1e-300)))
        qs.append(np.full(len(idx), q))
    d, c = np.concatenate(dims), np.concatenate(qs)
    order = np.argsort(d, kind="stable")[:num]
    out = _no_negative_zero(d[order])
    return (out, c[order]) if charges else out


def charged_scaling_dimensions(mera: MERA, num: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The ``num`` smallest scaling dimensions and the charge of each (:func:`scaling_dimensions` with
    ``charges=True``)."""
    return scaling_dimensions(mera, num, charges=True)


def operator_charges(w: Any) -> np.ndarray:
    """The charge q(a') − q(a) of every one-site operator entry o[a', a] (flattened a'·χ + a) on the bond above
    the isometry ``w``: 0 for a dense one."""
    if not T.is_block(w):
        return np.zeros(int(w.shape[-1]) ** 2, np.int64)
    c = w.legs[-1].charge_of_index()
    diff = c[:, None] - c[None, :]
    return (diff % w.group.order if w.group.order else diff).reshape(-1)


def charge_block_leakage(mera: MERA) -> float:
    """max |S[i, j]| between operator entries of different charge, relative to max |S| (0 for a symmetric MERA:
    the check that S is block diagonal in charge)."""
    _, w, v = check_mera(mera).layer(mera.num_layers - 1)
    s = np.asarray(scaling_superoperator(w, v), np.float64)
    oq = operator_charges(w)
    off = oq[:, None] != oq[None, :]
    return float(np.abs(s[off]).max() / np.abs(s).max()) if off.any() else 0.0


def _no_negative_zero(x: np.ndarray) -> np.ndarray:
    """``x`` with every |x| < 1e-12 (the identity's Δ = 0 up to rounding, of either sign) as +0.0, so it prints
    as 0 (never −0.000)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.abs(x) < 1e-12, 0.0, x)


# --------------------------------------------------------------------------------- two-site operators


@jax.jit
def two_site_map(o: jax.Array, u: jax.Array, w: jax.Array, v: jax.Array) -> jax.Array:
    """𝒮₂(o): the diagram t2 of :mod:`~ivhl_jax.physics.tensornet.mera.superoperators` with ``o`` on the fine BA bond
    under u."""
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
    u, w, v = (jnp.asarray(T.dense(x), jnp.float64) for x in check_mera(mera).layer(mera.num_layers - 1))
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


def _row(d: float, q: int | None, op: Operator | None) -> dict[str, Any]:
    row: dict[str, Any] = {"delta": float(d)}
    if q is not None:
        row["charge"] = int(q)
    if op is None:
        return {**row, "label": None, "exact": None, "primary": None, "descendant": None}
    return {**row, "label": op.label, "exact": op.delta, "primary": op.primary, "descendant": op.descendant}


def identify(dims: Any, cft: Any, charges: Any = None) -> list[dict[str, Any]]:
    """Each measured Δ matched to the nearest operator of the CFT ``cft`` (a name of :data:`~ivhl_jax.physics.
    mera.cft.CFTS`, "ising", "potts", "xx", or a record; each CFT operator used once, in order of distance): its
    label, exact Δ, the primary it belongs to, and whether it is that primary or a descendant. With ``charges``
    (one per Δ, under the CFT's lattice symmetry) only operators of the same charge match, and each row holds
    its ``charge``."""
    rec = cft_records.get(cft)
    group = S.group_from_name(rec.symmetry)
    table = list(rec.operators)
    free = list(range(len(table)))
    dims = np.asarray(dims, dtype=np.float64)
    qs = [None] * len(dims) if charges is None else [int(q) for q in np.asarray(charges)]
    if len(qs) != len(dims):
        raise ValueError(f"charges has {len(qs)} entries, dims {len(dims)}: give one charge per scaling dimension")
    out: list[dict[str, Any]] = []
    for d, q in zip(dims, qs):
        ok = [i for i in free if q is None or any(group.reduce(c) == group.reduce(q) for c in table[i].charges)]
        if not ok:
            out.append(_row(d, q, None))
            continue
        j = min(ok, key=lambda i: abs(table[i].delta - d))
        free.remove(j)
        out.append(_row(d, q, table[j]))
    return out


def conformal_table(mera: MERA, cft: Any, num: int = 10) -> list[dict[str, Any]]:
    """The ``num`` smallest scaling dimensions of the MERA (:func:`scaling_dimensions`) matched to the operators of
    ``cft`` (:func:`identify`): ``delta``, ``label``, ``exact``, ``primary``, ``descendant``; a symmetric MERA's
    rows hold each operator's ``charge`` too and match only operators of that charge (its group must be the
    CFT's lattice symmetry)."""
    rec = cft_records.get(cft)
    w: Any = check_mera(mera).w[-1]
    if not T.is_block(w):
        return identify(scaling_dimensions(mera, num), rec)
    if w.group != S.group_from_name(rec.symmetry):
        raise ValueError(
            f"cft={rec.name!r} labels its operators by {rec.symmetry} charges, but the MERA's tensors are "
            f"{w.group.name}-symmetric"
        )
    dims, charges = scaling_dimensions(mera, num, charges=True)
    return identify(dims, rec, charges)
