"""Ascending and descending superoperators of one modified-binary MERA layer, and the layer maps built on them.

Geometry (one layer, one unit cell m; fine sites f0 f1 f2 f3 = A B A B):

           B'_m                 A'_m                        w: (f0, m1) -> B'_m         w[f0, m1, B']
           ┌──w──┐              ┌──v──┐                     v: (m2, f3) -> A'_m         v[m2, f3, A']
           │     m1 ┌──────┐ m2 │     │                     u: (f1, f2) -> (m1, m2)     u[f1, f2, m1, m2]
           │        └──u───┘    │     │
           f0       f1     f2   f3    (f4 = f0 of cell m+1)

Read downwards, a layer is the isometry Ψ = (w ⊗ v)·(1 ⊗ u ⊗ 1) from two coarse sites to four fine sites,
with ``w†w = I``, ``v†v = I``, ``u†u = I`` (u unitary when χ_mid = χ_in). Disentanglers sit on every second
bond (the fine BA bonds f1 f2), so two-site operators stay two-site (modified binary MERA, Evenbly & Vidal,
PRB 79, 144108 (2009); cost O(χ⁸) at most per contraction, found by opt_einsum).

Layer offset: the coarse site made by v is an A' site and the one made by w a B' site, so the coarse bond
*inside* a cell, (w_m, v_m), is a B'A' bond and the one *between* cells, (v_m, w_{m+1}), an A'B' bond; the next
layer's cells are (v_{2k}, w_{2k+1}, v_{2k+1}, w_{2k+2}) and its disentanglers sit above this layer's ones (as
in Evenbly's mainVarMERA). The other offset (w output = A') lets the site at the origin of every cell go up
through w alone at all scales, and the variational optimum of the scale-invariant layer then degenerates (w
passes a fixed qubit of f0 upwards untouched; spurious scaling dimensions near 0).

Operators and density matrices are two-site tensors ``o[a', b', a, b] = <a' b'| o |a b>`` on the two
inequivalent bonds AB and BA. The ascending superoperator 𝒜 maps the fine (h_AB, h_BA) to

    h'_BA = Ψ† [h_AB(f0,f1) + h_BA(f1,f2) + h_AB(f2,f3)] Ψ,      h'_AB = (v ⊗ w)† h_BA(f3,f4) (v ⊗ w),

and the descending superoperator 𝒟 = ½ 𝒜ᵀ is its adjoint (the networks of 𝒜 with h removed and ρ' added,
:func:`descend_diagram`): ``ρ_AB = ½[𝒟₁ + 𝒟₃](ρ'_BA)``, ``ρ_BA = ½[𝒟₂(ρ'_BA) + 𝒟₄(ρ'_AB)]``, which keeps
tr ρ = 1. The energy per unit cell is ⟨ρ_AB, h_AB⟩ + ⟨ρ_BA, h_BA⟩ at every level.

Reflection symmetry (``refsym``): R u = u, v = mirror(w) and R h = h, so the diagram with h on (f2, f3) is the
mirror image of the one on (f0, f1): 𝒜, 𝒟 and the environments contract one of the two and reflect it.

Every function here is written against the operations of :mod:`ivhl_jax.physics.tensornet.ops`, so it takes dense
arrays or block-sparse symmetric tensors (:class:`~ivhl_jax.physics.tensornet.blocks.BlockTensor`) alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.physics.tensornet import ops as T
from ivhl_jax.physics.tensornet.mera.config import Layer
from ivhl_jax.physics.tensornet.ops import contract


def as_matrix(o: jax.Array) -> jax.Array:
    d = o.shape[0] * o.shape[1]
    return o.reshape(d, d)


def reflect(o: Any) -> Any:
    """Spatial reflection R of a two-site operator o[a', b', a, b] → o[b', a', b, a] (the bond read backwards), or
    of a disentangler u[f1, f2, m1, m2] → u[f2, f1, m2, m1] (the same map)."""
    return o.transpose((1, 0, 3, 2))


reflect_u = reflect


def mirror_wv(x: Any) -> Any:
    """w[f0, m1, B'] ↔ v[m2, f3, A']: the reflection maps a w to a v (and back) by swapping its fine legs."""
    return x.transpose((1, 0, 2))


# The four diagrams of 𝒜 (fine ket f0..f3 = a b c d, mid ket m1 m2 = i j, coarse ket A B = p q; bra legs:
# e f (fine legs that h moved), k l (mid), r s (coarse)). Operand order: bras (w̄, ū, v̄), h, kets (w, u, v).
_T1 = "ekr,fckl,lds,efab,aip,bcij,jdq->rspq"  # h_AB on (f0, f1)
_T2 = "akr,efkl,lds,efbc,aip,bcij,jdq->rspq"  # h_BA on (f1, f2), its own mirror image
_T3 = "akr,bekl,lfs,efcd,aip,bcij,jdq->rspq"  # h_AB on (f2, f3) = the mirror image of _T1
# BA bond between cells: f3 of cell m (d, under v_m) and f0 of cell m+1 (a, under w_{m+1}); the disentanglers
# on either side are not touched by h and cancel (u†u = I). Operands: v̄, w̄, h_BA, v, w.
_T4 = "jer,fis,efda,jdp,aiq->rspq"
#: The four diagrams of 𝒜 (t1..t4).
ASCEND_DIAGRAMS = (_T1, _T2, _T3, _T4)


def descend_diagram(spec: str, h_pos: int) -> str:
    """The network of 𝒟ₖ from the ascending diagram tₖ: ⟨ρ', tₖ(h)⟩ = Σ ρ'[p q r s] tₖ[r s p q] (:func:`pair`) is
    linear in h, so ∂/∂h is the diagram with h removed and ρ' (labels: tₖ's output, halves swapped) added; its
    open legs are h's, read as an operator with the halves swapped (h[e f a b] → ρ[a b e f])."""
    lhs, out = spec.split("->")
    ops = lhs.split(",")
    h = ops.pop(h_pos)
    return ",".join(ops + [out[2:] + out[:2]]) + "->" + h[2:] + h[:2]


#: The networks of 𝒟₁..𝒟₄ (operands: those of tₖ without h, then ρ'): ρ_AB = ½[𝒟₁ + 𝒟₃](ρ'_BA),
#: ρ_BA = ½[𝒟₂(ρ'_BA) + 𝒟₄(ρ'_AB)].
DESCEND_DIAGRAMS = tuple(descend_diagram(t, 2 if t is _T4 else 3) for t in ASCEND_DIAGRAMS)
_D1, _D2, _D3, _D4 = DESCEND_DIAGRAMS


def ascend_raw(
    h_ab: jax.Array,
    h_ba: jax.Array,
    u: jax.Array,
    w: jax.Array,
    v: jax.Array,
    refsym: bool = False,
    mirror: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """𝒜 = (t4, t1 + t2 + t3) (coarse AB, coarse BA); see the diagrams ``_T1``..``_T4``.

    ``refsym``: the layer and h are reflection symmetric (R u = u, v = mirror(w), R h = h), so the mirror
    diagram is t3 = R t1 and is not contracted (one 7-tensor network of three saved). ``mirror=False`` drops
    t3 altogether (the half map whose transpose :func:`descend` reflects).
    """
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    t1 = contract(_T1, wb, ub, vb, h_ab, w, u, v)
    t2 = contract(_T2, wb, ub, vb, h_ba, w, u, v)
    t4 = contract(_T4, vb, wb, h_ba, v, w)
    if not mirror:
        return t4, t1 + t2
    t3 = reflect(t1) if refsym else contract(_T3, wb, ub, vb, h_ab, w, u, v)
    # Coarse labels (see the module docstring): (v_m, w_{m+1}) is the A'B' bond, (w_m, v_m) the B'A' bond.
    return t4, t1 + t2 + t3


def ascend(h: tuple[Any, Any], layer: Layer, refsym: bool = False) -> tuple[Any, Any]:
    """Ascending superoperator: fine (h_AB, h_BA) → coarse (h'_AB, h'_BA), each (χ,)*4 → (χ',)*4.

    ``refsym=True`` asserts reflection symmetry (R u = u with R: u[a, b, c, d] → u[b, a, d, c], v[m, f, A] =
    w[f, m, A], R h = h with R: o[a', b', a, b] → o[b', a', b, a]) and contracts one mirror diagram instead of
    two (t3 = R t1); the result equals the full 𝒜 to rounding when the assertion holds.
    """
    check_ops(h, "h", layer)
    u, w, v = layer
    return ascend_raw(h[0], h[1], u, w, v, refsym=refsym)


def check_ops(ops: Any, name: str, layer: Any) -> None:
    """Eager shape check of a pair of two-site tensors against a layer (shapes are static even under jit)."""
    if not (isinstance(layer, (tuple, list)) and len(layer) == 3):
        raise TypeError("layer must be the triple (u, w, v), e.g. mera.layer(z)")
    if not (isinstance(ops, (tuple, list)) and len(ops) == 2):
        raise TypeError(f"{name} must be the pair ({name}_AB, {name}_BA) of two-site tensors, each (chi,)*4")
    u, w, v = layer
    chi_in = int(_shape(w)[0])
    for i, x in enumerate(ops):
        if _shape(x) != (chi_in,) * 4:
            raise ValueError(
                f"{name}[{i}] must have shape {(chi_in,) * 4} to match the layer's fine bond "
                f"dimension chi_in={chi_in} (w.shape[0]); got {_shape(x)}"
            )
    if T.is_block(*ops) != T.is_block(w):
        kinds = ("block-sparse", "dense")
        raise TypeError(
            f"{name} is {kinds[not T.is_block(*ops)]} but the MERA is {kinds[not T.is_block(w)]}: pass the "
            "stepper's own terms (stepper.params.h)"
        )


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in (x.shape if hasattr(x, "shape") else jnp.shape(x)))


def descend(rho: tuple[Any, Any], layer: Layer, refsym: bool = False) -> tuple[Any, Any]:
    """Descending superoperator 𝒟 = ½𝒜ᵀ: coarse (ρ'_AB, ρ'_BA) → fine (ρ_AB, ρ_BA); preserves tr ρ = 1.

    Defined by ⟨𝒟(ρ'), h⟩ = ½⟨ρ', 𝒜(h)⟩ with ⟨ρ, h⟩ = tr(ρ h) (see :func:`pair`), contracted as the transposed
    networks :data:`DESCEND_DIAGRAMS`. ``refsym=True`` asserts that the layer and ρ' are reflection symmetric
    (see :func:`ascend`): then 𝒟₃(ρ') = R 𝒟₁(ρ') is not contracted.
    """
    u, w, v = layer
    chi_out = int(_shape(w)[-1])
    if not (isinstance(rho, (tuple, list)) and len(rho) == 2):
        raise TypeError("rho must be the pair (rho_AB, rho_BA) of two-site tensors, each (chi,)*4")
    for i, x in enumerate(rho):
        if _shape(x) != (chi_out,) * 4:
            raise ValueError(
                f"rho[{i}] must have shape {(chi_out,) * 4} to match the layer's coarse bond "
                f"dimension chi_out={chi_out} (w.shape[-1]); got {_shape(x)}"
            )
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    r_ab, r_ba = rho
    d1 = contract(_D1, wb, ub, vb, w, u, v, r_ba)
    d3 = reflect(d1) if refsym else contract(_D3, wb, ub, vb, w, u, v, r_ba)
    d2 = contract(_D2, wb, ub, vb, w, u, v, r_ba)
    d4 = contract(_D4, vb, wb, v, w, r_ab)
    return (d1 + d3) * 0.5, (d2 + d4) * 0.5


def mera_layer(
    ops: tuple[jax.Array, jax.Array], layer: Layer, direction: str = "ascend", refsym: bool = False
) -> tuple[jax.Array, jax.Array]:
    """One MERA layer applied to a pair of two-site tensors: ``"ascend"`` (operators, 𝒜) or ``"descend"``
    (density matrices, 𝒟). Layers compose: ``mera_layer(mera_layer(h, L0), L1)``."""
    if direction == "ascend":
        return ascend(ops, layer, refsym)
    if direction == "descend":
        return descend(ops, layer, refsym)
    raise ValueError(f"direction must be 'ascend' or 'descend', got {direction!r}")


def fine_grain_state(psi: jax.Array, layer: Layer) -> jax.Array:
    """Apply one layer's isometry to a pure state of N coarse sites, shape (χ,)*N, N even, ordered along the chain
    as the tensors that make them, w_0 v_0 w_1 v_1 ... (= B'_0 A'_0 B'_1 A'_1 ...).

    Returns the 2N-site fine state, shape (χ_in,)*(2N); the norm is preserved because Ψ is an isometry.
    """
    u, w, v = layer
    n = psi.ndim
    if n % 2:
        raise ValueError(f"psi needs an even number of coarse sites (A B pairs), got {n}")
    cell = contract("aip,bcij,jdq->abcdpq", w, u, v)  # Ψ[f0 f1 f2 f3, A B]
    out = psi
    for _ in range(n // 2):
        # contract the first two (coarse) axes with Ψ, append the four fine legs at the end: cycling keeps order.
        out = jnp.tensordot(out, cell, axes=((0, 1), (4, 5)))
    return out


def pair(rho: Any, op: Any) -> jax.Array:
    """tr(ρ o) for two-site tensors (out, out, in, in)."""
    for name, x in (("rho", rho), ("op", op)):
        if len(_shape(x)) != 4:
            raise ValueError(f"{name} must be a two-site tensor of shape (chi, chi, chi, chi); got {_shape(x)}")
    if _shape(rho) != _shape(op):
        raise ValueError(f"rho {_shape(rho)} and op {_shape(op)} must have the same shape")
    return T.pair(rho, op)


def _swap(o: Any) -> Any:
    """o[a', b', a, b] → o[a, b, a', b'] (outputs and inputs exchanged)."""
    return o.transpose((2, 3, 0, 1))


def _symmetrise(rho: Any) -> Any:
    rho = (rho + _swap(rho).conj()) * 0.5  # ρ ← ½(ρ + ρ†)
    return rho / T.trace(rho)


def fixed_point_density(
    layer: Layer, rho: tuple[Any, Any] | None = None, iters: int = 50, refsym: bool = False
) -> tuple[Any, Any]:
    """Steady state of the scale-invariant 𝒟 by power iteration (hermitised, unit trace); ``refsym`` as in
    :func:`descend` (then ``rho`` must be reflection symmetric too)."""
    if is_concrete(iters):
        check_scalar(iters, "iters", integer=True, nonnegative=True)
    if rho is None:
        w = layer[1]
        eye = T.bond_identity(w, -1, 2) / float(w.shape[-1] ** 2)
        rho = (eye, eye)

    def body(_: int, r: tuple[Any, Any]) -> tuple[Any, Any]:
        a, b = descend(r, layer, refsym)
        return _symmetrise(a), _symmetrise(b)

    return jax.lax.fori_loop(0, iters, body, rho)
