"""Scaling superoperators of the scale-invariant layer and the scaling dimensions they give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.mera.config import MERA, check_mera


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
        raise ValueError(f"v must have shape {(w.shape[1], w.shape[0], w.shape[2])} (w's mirror image); "
                         f"got {jnp.shape(v)}")
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
    Returned as float64 NumPy (``num`` smallest)."""
    check_scalar(num, "num", integer=True, minimum=1)
    num = int(num)
    _, w, v = check_mera(mera).layer(mera.num_layers - 1)
    ev = np.linalg.eigvals(np.asarray(scaling_superoperator(w, v), dtype=np.float64))
    mag = np.sort(np.abs(ev))[::-1]
    return (-0.5 * np.log2(np.maximum(mag, 1e-300)))[:num]

