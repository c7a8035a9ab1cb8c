"""Scale-invariant modified binary MERA, variationally optimised (Evenbly–Vidal), for the critical Ising chain.

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

Layer offset (this matters): the coarse site made by v is an A' site and the one made by w a B' site, so the
coarse bond *inside* a cell, (w_m, v_m), is a B'A' bond and the one *between* cells, (v_m, w_{m+1}), an A'B'
bond; the next layer's cells are (v_{2k}, w_{2k+1}, v_{2k+1}, w_{2k+2}) and its disentanglers sit above this
layer's ones (as in Evenbly's mainVarMERA). The other offset (w output = A') lets the site at the origin of
every cell go up through w alone at all scales, and the variational optimum of the scale-invariant layer then
degenerates: w passes a fixed qubit of f0 upwards untouched, the one-site scaling superoperator gets several
eigenvalues ≈ 1 (Δ ≈ 0.001 instead of 1/8) and the top density matrix becomes nearly pure.

Operators and density matrices are two-site tensors ``o[a', b', a, b] = <a' b'| o |a b>`` on the two
inequivalent bonds AB and BA. The ascending superoperator 𝒜 maps the fine (h_AB, h_BA) to

    h'_BA = Ψ† [h_AB(f0,f1) + h_BA(f1,f2) + h_AB(f2,f3)] Ψ,      h'_AB = (v ⊗ w)† h_BA(f3,f4) (v ⊗ w),

and the descending superoperator 𝒟 = ½ 𝒜ᵀ is its adjoint (computed by ``jax.linear_transpose``, so the two
are consistent by construction): ``ρ_AB = ½[𝒟₁ + 𝒟₃](ρ'_BA)``, ``ρ_BA = ½[𝒟₂(ρ'_BA) + 𝒟₄(ρ'_AB)]``, which keeps
tr ρ = 1. The energy per unit cell is ⟨ρ_AB, h_AB⟩ + ⟨ρ_BA, h_BA⟩ at every level.

Model: H = −Σ_i X_i X_{i+1} − g Σ_i Z_i (same convention as :mod:`ivhl_jax.physics.exact`; critical g = 1, exact
e₀ = −4/π per site). Two physical spins are blocked into one MERA site (d = 4); the two-block term is
½h(p0,p1) + h(p1,p2) + ½h(p2,p3), so the energy per physical site is (⟨ρ_AB,h_AB⟩ + ⟨ρ_BA,h_BA⟩)/4.

Optimisation (one sweep): (1) a few power iterations of 𝒟 of the scale-invariant (SI) layer update the
steady-state ρ at the top of the transitional layers; (2) ρ is descended to the bottom and the energy is
measured; (3) bottom-up, each tensor x ∈ {u, w, v} is replaced by x = −U Vᵀ from the SVD Γ = U S Vᵀ of its
environment Γ = ∂E/∂x̄, E = ⟨ρ', 𝒜(h)⟩ (explicit contractions of the diagrams with x̄ removed, one network
each: autodiff would contract each diagram forward and backward). The Hamiltonian is shifted to be negative
definite so that every such update lowers the energy (E is concave in x̄).

The SI layer is optimised with the Hamiltonian ascended through the transitional layers (as in
Evenbly's mainVarMERA). All MERA routines are real-valued (the TFI Hamiltonian is real) and meant for
float64: wrap calls in ``with jax.enable_x64(True):`` (the drivers :func:`optimize` etc. do it for you).

Reflection symmetry (``refsym``, the default of :class:`MERAConfig`): R u = u, v = mirror(w), and R h = h for the
Ising terms, so the diagram with h on (f2, f3) is the mirror image of the one on (f0, f1): 𝒜, 𝒟 and the
environments contract one of the two and reflect it (XLA cost analysis of one sweep: 0.62× / 0.56× / 0.54× the
FLOPs of the autodiff, both-mirrors version at χ = 4 / 8 / 12, ``bench/results/mera_sweep_cost.json``).

Cold starts (``optimize``, ``ivhl sim mera``) are checked for a stuck start (:class:`StuckCheck`: an energy plateau
far from the exact energy, at step 300 and again every 100 steps up to 1000 while the error stays above 1e-3) and
re-initialised with a new key. One step is one sweep (``optimize(config, steps, steps_per_chunk=...)``).
Early sweeps may run in float32 (``policy="f32"``,
:func:`precision_dtype`) before a float64 finish (:func:`cast_mera`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.tn import contract

__all__ = [
    "MERAState",
    "SweepParams",
    "evenbly_vidal",
    "observe_energy",
    "MERA",
    "MERAConfig",
    "Layer",
    "ising_two_site_hamiltonian",
    "random_isometry",
    "init_mera",
    "ascend",
    "descend",
    "mera_layer",
    "pair",
    "fixed_point_density",
    "sweep",
    "energy_per_site",
    "scaling_superoperator",
    "scaling_dimensions",
    "grow",
    "isometry_errors",
    "optimize",
    "OptimizeResult",
    "StuckCheck",
    "cold_start",
    "compile_advance",
    "precision_dtype",
    "cast_mera",
    "E0_CRITICAL_ISING",
]

E0_CRITICAL_ISING = -4.0 / math.pi
_LOG = logging.getLogger(__name__)

Layer = tuple[jax.Array, jax.Array, jax.Array]  # (u, w, v)


class MERA(struct.PyTreeNode):
    """Variational state: transitional layers ``0..L-1`` then the scale-invariant layer ``L`` (last entry).

    Attributes:
      u, w, v: tuples of L+1 tensors, shapes (χ_in, χ_in, m, m), (χ_in, m, χ_out), (m, χ_in, χ_out).
      rho_ab, rho_ba: steady-state two-site density matrices at the top of the transitional layers, (χ,)*4.
      sweeps: number of sweeps done (int32 scalar).
    """

    u: tuple
    w: tuple
    v: tuple
    rho_ab: jax.Array
    rho_ba: jax.Array
    sweeps: jax.Array

    @property
    def num_layers(self) -> int:
        return len(self.u)

    def layer(self, z: int) -> Layer:
        return self.u[z], self.w[z], self.v[z]

    @property
    def chi(self) -> int:
        return int(self.w[-1].shape[-1])


@dataclasses.dataclass(frozen=True)
class MERAConfig:
    """Optimisation settings (hashable; static under jit).

    chi: bond dimension χ of the coarse sites; chi_mid: bond between u and w/v (≤ χ, default χ);
    layers: transitional layers below the scale-invariant one; g: transverse field (critical: 1);
    power_iters: 𝒟 iterations per sweep for the steady state; u_delay: sweeps before the
    disentanglers start to be updated (they start at the identity, as in mainVarMERA); refsym: impose
    reflection symmetry (v = w reflected, u = u reflected), which removes spurious minima; si_scales:
    number of scales j = 0..si_scales−1 whose environments Γ(ρ*, 2^{−j}𝒜^j h) are summed for the SI layer
    (1 = mainVarMERA, the default: measured best; 4 gave 3.4e-4 instead of 1.5e-4 at χ = 4 after 300 sweeps).
    """

    chi: int = 6
    chi_mid: int | None = None
    layers: int = 2
    g: float = 1.0
    power_iters: int = 4
    u_delay: int = 10
    refsym: bool = True
    si_scales: int = 1

    def validate(self) -> MERAConfig:
        check_scalar(self.chi, "chi", integer=True, minimum=2)
        if self.chi > 16:
            raise ValueError(f"chi={self.chi} > 16 exceeds what the blocked first layer (d=4, 4x4=16) can carry")
        if self.chi_mid is not None:
            check_scalar(self.chi_mid, "chi_mid", integer=True, minimum=2, maximum=self.chi)
        check_scalar(self.layers, "layers", integer=True, minimum=1)
        check_scalar(self.g, "g")
        check_scalar(self.power_iters, "power_iters", integer=True, minimum=1)
        check_scalar(self.u_delay, "u_delay", integer=True, nonnegative=True)
        return self

    @property
    def mid(self) -> int:
        return self.chi if self.chi_mid is None else self.chi_mid


# ------------------------------------------------------------------------------------------- Hamiltonian


def ising_two_site_hamiltonian(g: float = 1.0, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """Blocked two-site terms (h_AB, h_BA), each (4, 4, 4, 4), of H = −Σ XX − g Σ Z on 2-spin blocks.

    The term on blocks (p0 p1)(p2 p3) is ½h(p0,p1) + h(p1,p2) + ½h(p2,p3) with h(i,j) = −X_iX_j − g(Z_i+Z_j)/2,
    so Σ over neighbouring blocks reproduces H exactly. A blocks hold (p0, p1), B blocks hold their spins
    reversed, (p1, p0), as in Evenbly's mainVarMERA.
    """
    check_scalar(g, "g")
    x = np.array([[0.0, 1.0], [1.0, 0.0]])
    z = np.diag([1.0, -1.0])
    i2 = np.eye(2)
    bond = -np.kron(x, x) - 0.5 * g * (np.kron(z, i2) + np.kron(i2, z))
    h4 = 0.5 * np.kron(bond, np.eye(4)) + np.kron(np.kron(i2, bond), i2) + 0.5 * np.kron(np.eye(4), bond)
    # B blocks store their two spins in reversed order, so that a spatial reflection maps A ↔ B without
    # a relabelling inside the block (this is what makes v = reflect(w) a valid constraint).
    h8 = h4.reshape((2,) * 8)
    dt = dtype or jnp.result_type(float)
    h_ab = jnp.asarray(h8.transpose(0, 1, 3, 2, 4, 5, 7, 6).reshape(4, 4, 4, 4), dtype=dt)
    h_ba = jnp.asarray(h8.transpose(1, 0, 2, 3, 5, 4, 6, 7).reshape(4, 4, 4, 4), dtype=dt)
    return h_ab, h_ba


def _as_matrix(o: jax.Array) -> jax.Array:
    d = o.shape[0] * o.shape[1]
    return o.reshape(d, d)


# ---------------------------------------------------------------------------------------------- tensors


def random_isometry(key: jax.Array, rows: int, cols: int, dtype: Any = None) -> jax.Array:
    """A Haar-random (rows × cols) real isometry Q (QᵀQ = I), rows ≥ cols."""
    check_scalar(rows, "rows", integer=True, minimum=1)
    check_scalar(cols, "cols", integer=True, minimum=1)
    rows, cols = int(rows), int(cols)
    if cols > rows:
        raise ValueError(f"an isometry needs rows >= cols, got {rows} x {cols}")
    a = jax.random.normal(key, (rows, cols), dtype or jnp.result_type(float))
    q, r = jnp.linalg.qr(a)
    return q * jnp.sign(jnp.diagonal(r))[None, :]


def _polar(a: Any, xp: Any = jnp) -> Any:
    """Polar factor U Vᵀ of a = U S Vᵀ, in the array namespace ``xp`` (jax.numpy, or NumPy on the host)."""
    uu, _, vt = xp.linalg.svd(a, full_matrices=False)
    return uu @ vt


def init_mera(key: jax.Array, config: MERAConfig, d: int = 4) -> MERA:
    """Identity disentanglers, isometries = polar factor of a uniform(0,1) random matrix (a near-uniform
    coarse-graining, as mainVarMERA's ``rand`` start), maximally mixed top density matrices.

    A concrete ``key`` builds the start on the host (the draws are one compiled program, the polar factors LAPACK
    SVDs in NumPy); a traced one (``jit``, ``vmap`` over keys, ``eval_shape``) the same start inside the trace."""
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    config.validate()
    check_scalar(d, "d", integer=True, minimum=1)
    d = int(d)
    if not is_concrete(key):
        return _init_tensors(key, config, d)
    rows = np.asarray(_start_draws(key, config, d))
    us, ws, vs, rho = _assemble_start(rows, config, d, np)
    us, ws, vs, rho, sweeps = jax.device_put((us, ws, vs, rho, np.zeros((), np.int32)))
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, sweeps)


# A cold start compiled as one program cost ~0.6-0.9 s on a 2-core host, nearly all of it XLA compiling the
# threefry hash of each uniform draw separately (0.15-0.25 s each; jax_log_compiles); that was half of the χ = 6
# stage's time to an energy error of 1e-3. So the draws are one vmapped threefry (0.24 s to compile) and, for a
# concrete key, the polar factors are host SVDs (the same LAPACK gesdd XLA:CPU calls: in float64 the start is
# bit-identical to the traced one; in float32 it agrees to ~3e-7).
# Row k of the draws is uniform(split(key)[k], (size,)); its first r·c entries are uniform(split(key)[k], (r, c))
# flattened (threefry counters are the flat element indices), so the starts equal the earlier per-shape draws.


def _init_shapes(config: MERAConfig, d: int) -> list[tuple[int, int, int]]:
    """(χ_in, χ_mid, χ_out) of each layer of a cold start (the top one included)."""
    shapes, chi_in = [], d
    for _ in range(config.layers + 1):
        m = min(config.mid, chi_in)
        chi_out = min(config.chi, chi_in * m)
        shapes.append((chi_in, m, chi_out))
        chi_in = chi_out
    return shapes


def _start_draws(key: jax.Array, config: MERAConfig, d: int) -> jax.Array:
    """The cold start's uniform(0, 1) draws in the default float: two rows (w, v) per layer, each as long as the
    largest isometry."""
    size = max(chi_in * m * chi_out for chi_in, m, chi_out in _init_shapes(config, d))
    return _init_draws(key, 2 * (config.layers + 1), size, jnp.result_type(float))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_draws(key: jax.Array, n_keys: int, size: int, dtype: Any) -> jax.Array:
    """uniform(0, 1) draws [n_keys, size]: row k from the k-th key of ``split(key, n_keys)``."""
    return jax.vmap(lambda k: jax.random.uniform(k, (size,), dtype))(jax.random.split(key, n_keys))


def _assemble_start(rows: Any, config: MERAConfig, d: int, xp: Any) -> tuple[list[Any], list[Any], list[Any], Any]:
    """The cold start from its draws ``rows`` (:func:`_start_draws`) in the array namespace ``xp`` (NumPy on the
    host, jax.numpy in a trace): (u, w, v per layer, top density matrix)."""
    us, ws, vs = [], [], []
    shapes = _init_shapes(config, d)
    polar = functools.partial(_polar, xp=xp)
    for z, (chi_in, m, chi_out) in enumerate(shapes):
        e = xp.eye(chi_in, m, dtype=rows.dtype)  # truncated identity: columns orthonormal
        us.append(xp.einsum("ac,bd->abcd", e, e))
        size = chi_in * m * chi_out
        w = polar(rows[2 * z, :size].reshape(chi_in * m, chi_out)).reshape(chi_in, m, chi_out)
        ws.append(w)
        if config.refsym:
            vs.append(xp.transpose(w, (1, 0, 2)))
        else:
            vs.append(polar(rows[2 * z + 1, :size].reshape(m * chi_in, chi_out)).reshape(m, chi_in, chi_out))
    top = shapes[-1][2]
    rho = xp.eye(top * top, dtype=rows.dtype).reshape((top,) * 4) / top**2
    return us, ws, vs, rho


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init_tensors(key: jax.Array, config: MERAConfig, d: int) -> MERA:
    us, ws, vs, rho = _assemble_start(_start_draws(key, config, d), config, d, jnp)
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, jnp.zeros((), jnp.int32))


def isometry_errors(mera: MERA) -> dict[str, float]:
    """max |x†x − I| over all u, w, v (as maps from their upper legs to their lower legs)."""
    _check_mera(mera)
    def err(x: jax.Array, k: int) -> float:
        mat = np.asarray(x).reshape(-1, math.prod(x.shape[-k:]))
        return float(np.max(np.abs(mat.T.conj() @ mat - np.eye(mat.shape[1]))))

    return {
        "u": max(err(u, 2) for u in mera.u),
        "w": max(err(w, 1) for w in mera.w),
        "v": max(err(v, 1) for v in mera.v),
    }


# --------------------------------------------------------------------------------- superoperators


def _reflect(o: jax.Array) -> jax.Array:
    """Spatial reflection R of a two-site operator o[a', b', a, b] → o[b', a', b, a] (the bond read backwards)."""
    return jnp.transpose(o, (1, 0, 3, 2))


def _reflect_u(u: jax.Array) -> jax.Array:
    """Reflection of a disentangler u[f1, f2, m1, m2] → u[f2, f1, m2, m1] (the same map as :func:`_reflect`)."""
    return jnp.transpose(u, (1, 0, 3, 2))


def _mirror_wv(x: jax.Array) -> jax.Array:
    """w[f0, m1, B'] ↔ v[m2, f3, A']: the reflection maps a w to a v (and back) by swapping its fine legs."""
    return jnp.transpose(x, (1, 0, 2))


# The four diagrams of 𝒜 (fine ket f0..f3 = a b c d, mid ket m1 m2 = i j, coarse ket A B = p q; bra legs:
# e f (fine legs that h moved), k l (mid), r s (coarse)). Operand order: bras (w̄, ū, v̄), h, kets (w, u, v).
_T1 = "ekr,fckl,lds,efab,aip,bcij,jdq->rspq"  # h_AB on (f0, f1)
_T2 = "akr,efkl,lds,efbc,aip,bcij,jdq->rspq"  # h_BA on (f1, f2), its own mirror image
_T3 = "akr,bekl,lfs,efcd,aip,bcij,jdq->rspq"  # h_AB on (f2, f3) = the mirror image of _T1
# BA bond between cells: f3 of cell m (d, under v_m) and f0 of cell m+1 (a, under w_{m+1}); the disentanglers
# on either side are not touched by h and cancel (u†u = I). Operands: v̄, w̄, h_BA, v, w.
_T4 = "jer,fis,efda,jdp,aiq->rspq"


def _ascend_raw(h_ab: jax.Array, h_ba: jax.Array, u: jax.Array, w: jax.Array, v: jax.Array,
                refsym: bool = False, mirror: bool = True) -> tuple[jax.Array, jax.Array]:
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
    t3 = _reflect(t1) if refsym else contract(_T3, wb, ub, vb, h_ab, w, u, v)
    # Coarse labels (see the module docstring): (v_m, w_{m+1}) is the A'B' bond, (w_m, v_m) the B'A' bond.
    return t4, t1 + t2 + t3


def ascend(h: tuple[jax.Array, jax.Array], layer: Layer, refsym: bool = False) -> tuple[jax.Array, jax.Array]:
    """Ascending superoperator: fine (h_AB, h_BA) → coarse (h'_AB, h'_BA), each (χ,)*4 → (χ',)*4.

    ``refsym=True`` asserts reflection symmetry (R u = u with R: u[a, b, c, d] → u[b, a, d, c], v[m, f, A] =
    w[f, m, A], R h = h with R: o[a', b', a, b] → o[b', a', b, a]) and contracts one mirror diagram instead of
    two (t3 = R t1); the result equals the full 𝒜 to rounding when the assertion holds.
    """
    _check_ops(h, "h", layer)
    u, w, v = layer
    return _ascend_raw(h[0], h[1], u, w, v, refsym=refsym)


def _check_mera(mera: Any) -> MERA:
    if not isinstance(mera, MERA):
        raise TypeError(f"mera must be a MERA (from init_mera, grow or optimize), got {type(mera).__name__}")
    return mera


def _check_ops(ops: Any, name: str, layer: Any) -> None:
    """Eager shape check of a pair of two-site tensors against a layer (shapes are static even under jit)."""
    if not (isinstance(layer, (tuple, list)) and len(layer) == 3):
        raise TypeError("layer must be the triple (u, w, v), e.g. mera.layer(z)")
    if not (isinstance(ops, (tuple, list)) and len(ops) == 2):
        raise TypeError(f"{name} must be the pair ({name}_AB, {name}_BA) of two-site tensors, each (chi,)*4")
    u, w, v = layer
    chi_in = int(jnp.shape(w)[0])
    for i, x in enumerate(ops):
        if tuple(jnp.shape(x)) != (chi_in,) * 4:
            raise ValueError(f"{name}[{i}] must have shape {(chi_in,) * 4} to match the layer's fine bond "
                             f"dimension chi_in={chi_in} (w.shape[0]); got {tuple(jnp.shape(x))}")


def _swap(o: jax.Array) -> jax.Array:
    return jnp.transpose(o, (2, 3, 0, 1))


def descend(rho: tuple[jax.Array, jax.Array], layer: Layer, refsym: bool = False) -> tuple[jax.Array, jax.Array]:
    """Descending superoperator 𝒟 = ½𝒜ᵀ: coarse (ρ'_AB, ρ'_BA) → fine (ρ_AB, ρ_BA); preserves tr ρ = 1.

    Defined by ⟨𝒟(ρ'), h⟩ = ½⟨ρ', 𝒜(h)⟩ with ⟨ρ, h⟩ = tr(ρ h) (see :func:`pair`). ``refsym=True`` asserts
    that the layer and ρ' are reflection symmetric (see :func:`ascend`): then 𝒟₃(ρ') = R 𝒟₁(ρ'), so
    ρ_AB = ½(1 + R)𝒟₁(ρ'_BA) is formed from the transpose of t1 alone.
    """
    u, w, v = layer
    chi_out = int(jnp.shape(w)[-1])
    if not (isinstance(rho, (tuple, list)) and len(rho) == 2):
        raise TypeError("rho must be the pair (rho_AB, rho_BA) of two-site tensors, each (chi,)*4")
    for i, x in enumerate(rho):
        if tuple(jnp.shape(x)) != (chi_out,) * 4:
            raise ValueError(f"rho[{i}] must have shape {(chi_out,) * 4} to match the layer's coarse bond "
                             f"dimension chi_out={chi_out} (w.shape[-1]); got {tuple(jnp.shape(x))}")
    chi_in = u.shape[0] if u.shape[0] == w.shape[0] else w.shape[0]
    h_like = jax.ShapeDtypeStruct((chi_in,) * 4, rho[0].dtype)
    if refsym:
        # the half map (t4, t1 + t2): its transpose gives 𝒟₁ in the AB slot, and 𝒟₃ = R 𝒟₁ is added by hand.
        half = jax.linear_transpose(lambda ha, hb: _ascend_raw(ha, hb, u, w, v, mirror=False), h_like, h_like)
        g_ab, g_ba = half((_swap(rho[0]), _swap(rho[1])))
        g_ab = g_ab + _reflect(g_ab)
    else:
        transpose = jax.linear_transpose(lambda ha, hb: ascend((ha, hb), layer), h_like, h_like)
        g_ab, g_ba = transpose((_swap(rho[0]), _swap(rho[1])))
    return 0.5 * _swap(g_ab), 0.5 * _swap(g_ba)


def mera_layer(ops: tuple[jax.Array, jax.Array], layer: Layer, direction: str = "ascend",
               refsym: bool = False) -> tuple[jax.Array, jax.Array]:
    """One MERA layer applied to a pair of two-site tensors: ``"ascend"`` (operators, 𝒜) or ``"descend"``
    (density matrices, 𝒟). Layers compose: ``mera_layer(mera_layer(h, L0), L1)``. The honest replacement of
    the seed's ``contract_mera_layer`` (which was neither isometric nor composable)."""
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


def pair(rho: jax.Array, op: jax.Array) -> jax.Array:
    """tr(ρ o) for two-site tensors (out, out, in, in)."""
    for name, x in (("rho", rho), ("op", op)):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must be a two-site tensor of shape (chi, chi, chi, chi); got {jnp.shape(x)}")
    if tuple(jnp.shape(rho)) != tuple(jnp.shape(op)):
        raise ValueError(f"rho {tuple(jnp.shape(rho))} and op {tuple(jnp.shape(op))} must have the same shape")
    return jnp.einsum("abcd,cdab->", rho, op)


def _symmetrise(rho: jax.Array) -> jax.Array:
    rho = 0.5 * (rho + _swap(rho).conj())
    return rho / jnp.trace(_as_matrix(rho))


def fixed_point_density(layer: Layer, rho: tuple[jax.Array, jax.Array] | None = None,
                        iters: int = 50, refsym: bool = False) -> tuple[jax.Array, jax.Array]:
    """Steady state of the scale-invariant 𝒟 by power iteration (hermitised, unit trace); ``refsym`` as in
    :func:`descend` (then ``rho`` must be reflection symmetric too)."""
    if is_concrete(iters):
        check_scalar(iters, "iters", integer=True, nonnegative=True)
    chi = layer[1].shape[-1]
    if rho is None:
        eye = jnp.eye(chi * chi, dtype=layer[1].dtype).reshape((chi,) * 4) / chi**2
        rho = (eye, eye)

    def body(_: int, r: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        a, b = descend(r, layer, refsym)
        return _symmetrise(a), _symmetrise(b)

    return jax.lax.fori_loop(0, iters, body, rho)


# ------------------------------------------------------------------------------------------- optimisation


def _svd_update(env: jax.Array, k: int) -> jax.Array:
    """argmin_x tr(Γᵀ x) over isometries x (x†x = I on the last k legs): x = −U Vᵀ, Γ = U S Vᵀ."""
    shape = env.shape
    mat = env.reshape(-1, math.prod(shape[-k:]))
    uu, _, vt = jnp.linalg.svd(mat, full_matrices=False)
    return (-(uu @ vt)).reshape(shape)


# Environments Γ_x = ∂E/∂x̄ of the layer energy E = ⟨ρ'_AB, t4⟩ + ⟨ρ'_BA, t1 + t2 + t3⟩ (E is linear in each bra
# tensor x̄), contracted explicitly: one network per (diagram, tensor), with the coarse ρ' (labels p q r s) closing
# the coarse legs. Autodiff would contract each diagram forward and then backward (about twice the work), and
# once more for w and v after u has changed. Operands: the bras (w̄ ū v̄ minus the removed one), h, w, u, v, ρ'.
_ENV_U = {1: "ekr,lds,efab,aip,bcij,jdq,pqrs->fckl",   # (w̄, v̄, h_AB, w, u, v, ρ'_BA)
          2: "akr,lds,efbc,aip,bcij,jdq,pqrs->efkl",   # (w̄, v̄, h_BA, w, u, v, ρ'_BA)
          3: "akr,lfs,efcd,aip,bcij,jdq,pqrs->bekl"}   # (w̄, v̄, h_AB, w, u, v, ρ'_BA)
_ENV_W = {1: "fckl,lds,efab,aip,bcij,jdq,pqrs->ekr",   # (ū, v̄, h_AB, w, u, v, ρ'_BA)
          2: "efkl,lds,efbc,aip,bcij,jdq,pqrs->akr",
          3: "bekl,lfs,efcd,aip,bcij,jdq,pqrs->akr",
          4: "jer,efda,jdp,aiq,pqrs->fis"}             # (v̄, h_BA, v, w, ρ'_AB)
_ENV_V = {1: "ekr,fckl,efab,aip,bcij,jdq,pqrs->lds",   # (w̄, ū, h_AB, w, u, v, ρ'_BA)
          2: "akr,efkl,efbc,aip,bcij,jdq,pqrs->lds",
          3: "akr,bekl,efcd,aip,bcij,jdq,pqrs->lfs",
          4: "fis,efda,jdp,aiq,pqrs->jer"}             # (w̄, h_BA, v, w, ρ'_AB)


def _h_terms(h: tuple[jax.Array, jax.Array]) -> list[tuple[jax.Array, jax.Array]]:
    """``h`` may carry a leading axis of several Hamiltonians (the SI layer's scales): their environments add."""
    if h[0].ndim == 5:
        return [(h[0][j], h[1][j]) for j in range(h[0].shape[0])]
    return [(h[0], h[1])]


def _env_u(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array],
           refsym: bool) -> jax.Array:
    """Γ_u = Σ_{k=1..3} Γ_u(t_k), (χ_in, χ_in, m, m). With ``refsym``: Γ_u(t3) = R Γ_u(t1), and the update's
    projection onto reflection-symmetric u is (1 + R)(Γ_u(t1) + ½Γ_u(t2)) (= ½(1 + R)Γ_u, the scale is irrelevant
    to the SVD update); two networks instead of three."""
    u, w, v = layer
    wb, vb = w.conj(), v.conj()
    env = jnp.zeros_like(u)
    for h_ab, h_ba in _h_terms(h):
        if refsym:
            x = (contract(_ENV_U[1], wb, vb, h_ab, w, u, v, rho[1])
                 + 0.5 * contract(_ENV_U[2], wb, vb, h_ba, w, u, v, rho[1]))
            env = env + x + _reflect_u(x)
        else:
            env = env + sum((contract(_ENV_U[k], wb, vb, (h_ab, h_ba, h_ab)[k - 1], w, u, v, rho[1])
                             for k in (1, 2, 3)), jnp.zeros_like(u))
    return env


def _env_wv(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array],
            which: str) -> jax.Array:
    """Γ_w (``which="w"``) or Γ_v (``"v"``) summed over the four diagrams, (χ_in, m, χ_out) / (m, χ_in, χ_out)."""
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    env = jnp.zeros_like(w if which == "w" else v)
    for h_ab, h_ba in _h_terms(h):
        for k, hk in ((1, h_ab), (2, h_ba), (3, h_ab)):
            if which == "w":
                env = env + contract(_ENV_W[k], ub, vb, hk, w, u, v, rho[1])
            else:
                env = env + contract(_ENV_V[k], wb, ub, hk, w, u, v, rho[1])
        if which == "w":
            env = env + contract(_ENV_W[4], vb, h_ba, v, w, rho[0])
        else:
            env = env + contract(_ENV_V[4], wb, h_ba, v, w, rho[0])
    return env


def _env_w_refsym(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Γ of w when v = mirror(w): Γ_w + mirror(Γ_v) = 2[Γ_w(t1) + mirror Γ_v(t1) + Γ_w(t2) + Γ_w(t4)], because the
    mirror images map Γ_w(t3) ↔ mirror Γ_v(t1), and t2, t4 are their own mirror images (three 7-tensor networks and
    one small one instead of six and two). Returned without the factor 2."""
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    env = jnp.zeros_like(w)
    for h_ab, h_ba in _h_terms(h):
        env = (env + contract(_ENV_W[1], ub, vb, h_ab, w, u, v, rho[1])
               + _mirror_wv(contract(_ENV_V[1], wb, ub, h_ab, w, u, v, rho[1]))
               + contract(_ENV_W[2], ub, vb, h_ba, w, u, v, rho[1])
               + contract(_ENV_W[4], vb, h_ba, v, w, rho[0]))
    return env


def _layer_energy(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array]) -> jax.Array:
    """⟨ρ', 𝒜(h)⟩ (summed over stacked h); the reference the explicit environments are tested against."""
    u, w, v = layer
    total = jnp.zeros((), rho[0].dtype)
    for h_ab, h_ba in _h_terms(h):
        a, b = _ascend_raw(h_ab, h_ba, u, w, v)
        total = total + pair(rho[0], a) + pair(rho[1], b)
    return total


def _update_layer(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array],
                  do_u: jax.Array, refsym: bool = False) -> Layer:
    """Evenbly–Vidal update of one layer: u from Γ_u (old u, w, v), then w (and v) from environments with the
    new u. With ``refsym`` v = mirror(w) and only w's environment is contracted."""
    u, w, v = layer
    u = jnp.where(do_u, _svd_update(_env_u((u, w, v), h, rho, refsym), 2), u)
    if refsym:
        w = _svd_update(_env_w_refsym((u, w, v), h, rho), 1)
        return u, w, _mirror_wv(w)
    w = _svd_update(_env_wv((u, w, v), h, rho, "w"), 1)
    v = _svd_update(_env_wv((u, w, v), h, rho, "v"), 1)
    return u, w, v


def _bias(h: jax.Array) -> jax.Array:
    return jnp.max(jnp.linalg.eigvalsh(_as_matrix(h)))


def energy_per_site(mera: MERA, h: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Energy per physical site (blocked d=4 sites hold 2 spins): (⟨ρ_AB,h_AB⟩ + ⟨ρ_BA,h_BA⟩)/4 at the bottom."""
    _check_ops(h, "h", _check_mera(mera).layer(0))
    rho = (mera.rho_ab, mera.rho_ba)
    for z in reversed(range(mera.num_layers - 1)):
        rho = descend(rho, mera.layer(z))
    return (pair(rho[0], h[0]) + pair(rho[1], h[1])) / 4.0


def sweep(mera: MERA, h: tuple[jax.Array, jax.Array], power_iters: int = 4, u_delay: int = 10,
          refsym: bool = False, si_scales: int = 1) -> tuple[MERA, jax.Array]:
    """One Evenbly–Vidal sweep. Returns (new MERA, energy per site measured before the tensor updates).

    ``h`` is the unshifted bottom Hamiltonian (h_AB, h_BA); it is shifted internally to be negative definite.
    """
    _check_ops(h, "h", _check_mera(mera).layer(0))
    check_scalar(power_iters, "power_iters", integer=True, minimum=1)
    check_scalar(u_delay, "u_delay", integer=True, nonnegative=True)
    check_scalar(si_scales, "si_scales", integer=True, minimum=1)
    n = mera.num_layers
    si = mera.layer(n - 1)
    if refsym:
        # v = mirror(w) exactly (a grown or hand-made MERA may not have it yet); u is made symmetric by its first
        # update (its environment is symmetrised), so a non-symmetric u costs at most one approximate sweep.
        mera = mera.replace(v=tuple(_mirror_wv(w) for w in mera.w))
        si = mera.layer(n - 1)
    rho_top = fixed_point_density(si, (mera.rho_ab, mera.rho_ba), power_iters, refsym)
    if refsym:
        rho_top = (0.5 * (rho_top[0] + jnp.transpose(rho_top[0], (1, 0, 3, 2))),
                   0.5 * (rho_top[1] + jnp.transpose(rho_top[1], (1, 0, 3, 2))))
    rhos: list[Any] = [None] * n
    rhos[n - 1] = rho_top
    for z in reversed(range(n - 1)):
        rhos[z] = descend(rhos[z + 1], mera.layer(z), refsym)
    energy = (pair(rhos[0][0], h[0]) + pair(rhos[0][1], h[1])) / 4.0
    eye = jnp.eye(h[0].shape[0] ** 2, dtype=h[0].dtype).reshape(h[0].shape)
    hz = (h[0] - _bias(h[0]) * eye, h[1] - _bias(h[1]) * eye)
    do_u = mera.sweeps >= u_delay
    us, ws, vs = [], [], []
    for z in range(n):
        rho_above = rhos[z + 1] if z + 1 < n else rho_top
        if z == n - 1 and si_scales > 1:
            # Optional: the SI tensors act at every scale above, so one may sum the environments
            # Σ_j 2^{-j} Γ(ρ*, 𝒜^j h_top) of j extra copies of the layer at fixed steady state ρ*. With the
            # correct layer offset, j = 0 only (mainVarMERA, si_scales = 1) converges faster (measured).
            hs = [hz]
            for _ in range(si_scales - 1):
                hs.append(ascend(hs[-1], si, refsym))
            hz = (jnp.stack([hh[0] * 0.5**j for j, hh in enumerate(hs)]),
                  jnp.stack([hh[1] * 0.5**j for j, hh in enumerate(hs)]))
        layer = _update_layer(mera.layer(z), hz, rho_above, do_u, refsym)
        us.append(layer[0])
        ws.append(layer[1])
        vs.append(layer[2])
        if z + 1 < n:
            hz = ascend(hz, layer, refsym)
    new = MERA(tuple(us), tuple(ws), tuple(vs), rho_top[0], rho_top[1], mera.sweeps + 1)
    return new, energy


# ------------------------------------------------------------------------------------------- analysis


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


# One program: eagerly, its six small ops compiled one by one (~0.15 s, paid by every stuck-start report).
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
    _, w, v = mera.layer(mera.num_layers - 1)
    ev = np.linalg.eigvals(np.asarray(scaling_superoperator(w, v), dtype=np.float64))
    mag = np.sort(np.abs(ev))[::-1]
    return (-0.5 * np.log2(np.maximum(mag, 1e-300)))[:num]


# ------------------------------------------------------------------------------------------- bond growth


def _complete_isometry(key: jax.Array, mat: jax.Array, cols: int) -> jax.Array:
    """Extend an isometry's columns (rows × k, already padded to the new row count) to ``cols`` columns."""
    rows, k = mat.shape
    if cols == k:
        return mat
    extra = jax.random.normal(key, (rows, cols - k), mat.dtype)
    extra = extra - mat @ (mat.T @ extra)
    q, r = jnp.linalg.qr(extra)
    return jnp.concatenate([mat, q * jnp.sign(jnp.diagonal(r))[None, :]], axis=1)


def grow(mera: MERA, key: jax.Array, chi: int, chi_mid: int | None = None, mix: float = 1e-3,
         layers: int | None = None, refsym: bool = False) -> MERA:
    """Enlarge χ (and χ_mid) keeping the old tensors as a block: the energy is unchanged up to the small
    ``mix`` of the identity added to the top density matrix so that the new directions get weight.
    ``layers`` > current transitional layers inserts copies of the SI layer below it (as mainVarMERA).
    ``refsym``: keep reflection symmetry (v = mirror(w); u's new columns symmetrised, u ← polar(½(u + R u)), which
    leaves a symmetric old block unchanged), so the first sweep's one-mirror-diagram contractions are exact."""
    old_chi, old_mid = mera.chi, max(int(u.shape[-1]) for u in mera.u)
    check_scalar(chi, "chi", integer=True)
    chi = int(chi)
    if chi < old_chi:
        raise ValueError(f"chi={chi} is smaller than the MERA's current bond dimension {old_chi}: grow can only "
                         f"enlarge it; pass chi >= {old_chi} (or start a new MERA with init_mera)")
    if chi_mid is not None:
        check_scalar(chi_mid, "chi_mid", integer=True, maximum=chi)
        if chi_mid < old_mid:
            raise ValueError(f"chi_mid={chi_mid} is smaller than the MERA's current disentangler bond {old_mid}: "
                             f"grow can only enlarge it; pass chi_mid >= {old_mid} or None")
    check_scalar(mix, "mix", minimum=0.0, maximum=1.0)
    if layers is not None:
        check_scalar(layers, "layers", integer=True, minimum=1)
    mid = chi if chi_mid is None else int(chi_mid)
    return _grow_tensors(mera, key, chi, mid, float(mix), None if layers is None else int(layers), bool(refsym))


# One compiled program per (shapes, chi, mid, layers, refsym), for the reason given at _init_tensors: eagerly, the
# ~150 small ops of a χ 6 → 8 growth compiled one by one in ~3 s (jax_log_compiles), longer than the stage's compile.
@functools.partial(jax.jit, static_argnums=(2, 3, 5, 6))
def _grow_tensors(mera: MERA, key: jax.Array, chi: int, mid: int, mix: float, layers: int | None,
                  refsym: bool) -> MERA:
    if layers is not None and layers + 1 > mera.num_layers:
        extra = layers + 1 - mera.num_layers
        mera = mera.replace(u=mera.u[:-1] + (mera.u[-1],) * (extra + 1), w=mera.w[:-1] + (mera.w[-1],) * (extra + 1),
                            v=mera.v[:-1] + (mera.v[-1],) * (extra + 1))
    dtype = mera.w[0].dtype
    us, ws, vs = [], [], []
    chi_in = mera.w[0].shape[0]
    keys = jax.random.split(key, 3 * mera.num_layers)
    for z in range(mera.num_layers):
        u, w, v = mera.layer(z)
        m = min(mid, chi_in)
        chi_out = min(chi, chi_in * m)
        # u: old block kept on the old (padded) legs; new mid columns completed to an exact isometry.
        mat = jnp.zeros((chi_in, chi_in, m, m), dtype).at[: u.shape[0], : u.shape[1], : u.shape[2], : u.shape[3]].set(u)
        mat = mat.reshape(chi_in * chi_in, m * m)
        old_idx = ((np.arange(m)[:, None] < u.shape[2]) & (np.arange(m)[None, :] < u.shape[3])).reshape(-1)
        old_cols, new_cols = np.flatnonzero(old_idx), np.flatnonzero(~old_idx)
        done = _complete_isometry(keys[3 * z], mat[:, old_cols], m * m)
        mat = mat.at[:, old_cols].set(done[:, : len(old_cols)]).at[:, new_cols].set(done[:, len(old_cols):])
        up = mat.reshape(chi_in, chi_in, m, m)
        if refsym:
            up = _polar((0.5 * (up + _reflect_u(up))).reshape(chi_in * chi_in, m * m)).reshape(up.shape)
        wp = jnp.zeros((chi_in, m, w.shape[2]), dtype).at[: w.shape[0], : w.shape[1]].set(w).reshape(-1, w.shape[2])
        vp = jnp.zeros((m, chi_in, v.shape[2]), dtype).at[: v.shape[0], : v.shape[1]].set(v).reshape(-1, v.shape[2])
        ws.append(_complete_isometry(keys[3 * z + 1], wp, chi_out).reshape(chi_in, m, chi_out))
        if refsym:
            vs.append(_mirror_wv(ws[-1]))
        else:
            vs.append(_complete_isometry(keys[3 * z + 2], vp, chi_out).reshape(m, chi_in, chi_out))
        us.append(up)
        chi_in = chi_out

    def pad_rho(r: jax.Array) -> jax.Array:
        o = r.shape[0]
        big = jnp.zeros((chi_in,) * 4, dtype).at[:o, :o, :o, :o].set(r)
        eye = jnp.eye(chi_in * chi_in, dtype=dtype).reshape((chi_in,) * 4) / chi_in**2
        return (1.0 - mix) * big + mix * eye

    return MERA(tuple(us), tuple(ws), tuple(vs), pad_rho(mera.rho_ab), pad_rho(mera.rho_ba), mera.sweeps)


# ------------------------------------------------------------------------------------------- driver


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _advance(m: MERA, h: tuple[jax.Array, jax.Array], n: int, power_iters: int, u_delay: int, refsym: bool,
             si_scales: int) -> tuple[MERA, jax.Array]:
    step = lambda s, _: sweep(s, h, power_iters, u_delay, refsym, si_scales)
    return jax.lax.scan(step, m, None, length=n)


def _reject_renamed(func: str, kwargs: dict[str, Any], renamed: dict[str, str]) -> None:
    """TypeError for keywords of the old vocabulary (issue 12: ``steps``, one step = one sweep) or unknown ones."""
    for old in kwargs:
        if old in renamed:
            raise TypeError(f"{func}() got the keyword {old!r}, renamed to {renamed[old]!r} (one step = one sweep)")
        raise TypeError(f"{func}() got an unexpected keyword argument {old!r}")


def make_advance(h: tuple[jax.Array, jax.Array], steps_per_chunk: int | None = None, power_iters: int = 4,
                 u_delay: int = 10, refsym: bool = False, si_scales: int = 1, **renamed: Any
                 ) -> Callable[[MERA], tuple[MERA, jax.Array]]:
    """Jitted ``advance(mera) -> (mera, energies[steps_per_chunk])`` (a ``lax.scan`` over steps, one step = one
    Evenbly–Vidal sweep); compiled once per (shapes, settings) and shared between callers."""
    _reject_renamed("make_advance", renamed, {"sweeps_per_chunk": "steps_per_chunk"})
    if steps_per_chunk is None:
        raise TypeError("make_advance() missing the argument 'steps_per_chunk' (sweeps per compiled chunk)")
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    check_scalar(power_iters, "power_iters", integer=True, minimum=1)
    return functools.partial(_advance, h=h, n=steps_per_chunk, power_iters=power_iters, u_delay=u_delay,
                             refsym=refsym, si_scales=si_scales)


def compile_advance(config: MERAConfig, steps_per_chunk: int, dtype: Any = None, d: int = 4
                    ) -> Callable[[MERA], tuple[MERA, jax.Array]]:
    """Ahead-of-time compiled ``advance(mera) -> (mera, energies[steps_per_chunk])`` for MERAs of ``config``'s
    shapes (those of ``init_mera(key, config, d)`` and of ``grow`` to ``config``) in ``dtype`` (default float64),
    with the Ising Hamiltonian of ``config.g``. Needs no MERA: the shapes come from ``jax.eval_shape``, so the next
    stage of a χ ladder can be compiled in a background thread while this one runs (XLA compilation releases the
    GIL; ``ivhl sim mera --set compile_ahead=true``). The result is the same program as :func:`make_advance`'s and
    accepts only MERAs of exactly those shapes and dtypes (``TypeError`` otherwise)."""
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    config.validate()
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    with jax.enable_x64(True):  # thread-local: needed again in a worker thread
        dt = jnp.dtype(dtype or jnp.float64)
        h = ising_two_site_hamiltonian(config.g, dt)
        abstract = jax.eval_shape(lambda k: cast_mera(init_mera(k, config, d), dt), jax.random.key(0))
        static = (int(steps_per_chunk), config.power_iters, config.u_delay, config.refsym, config.si_scales)
        compiled = _advance.lower(abstract, h, *static).compile()

    def advance(mera: MERA) -> tuple[MERA, jax.Array]:
        with jax.enable_x64(True):
            if not all(is_concrete(x) for x in jax.tree.leaves(mera)):
                return _advance(mera, h, *static)  # traced (jax.eval_shape, jit): the same program, not compiled
            return compiled(mera, h)

    advance.abstract = abstract  # type: ignore[attr-defined]
    return advance


@dataclasses.dataclass(frozen=True)
class StuckCheck:
    """When a cold start counts as stuck (an energy plateau far from the bound), and how often to re-initialise.

    With ε(n) = E(n) − e₀ the energy error per site after n steps (one step = one sweep) and the progress
    p(n) = (ε(n − window) − ε(n)) / ε(n − window), a cold start is stuck at step n

    * n = ``after`` (the first check): if ε(n) > ``min_error`` and p(n) < ``min_progress``;
    * n = after + ``every``, after + 2·every, … ≤ ``until`` (the rechecks; ``every=0`` turns them off): if
      ε(n) > ``recheck_error`` and p(n) < ``min_progress``. Rechecks stop once ε ≤ ``recheck_error``.

    Then the MERA is re-initialised with the key ``fold_in(key, attempt)``, at most ``max_restarts`` times (if every
    attempt is stuck, the one with the lowest ε at its last check is kept).

    Defaults from measurements (2026-11-23, critical Ising, 29 cold starts: 8 / 6 / 4 seeds at χ = 4 / 6 / 8 with
    2 / 2 / 3 transitional layers, 8 at χ = 4 with one layer, 3 at χ/χ_mid = 6/4 with one layer;
    ``bench/results/mera_stuck_starts.json``): between steps 200 and 300 the error of the starts that went on to
    converge fell by 29–71 % (ε(300) = 5.6e-5 … 9.7e-4), that of the stalled ones changed by −15 % … +25 %
    (ε(300) = 2e-4 … 8.5e-3; Δσ = 0.3–1.6 instead of 1/8 at the end, or an escape only after 500–800 steps).
    Rechecks: from step 300 on every start that converged was below 1e-3 (at most 7.0e-4, χ = 6 seed 1 at step 300,
    falling by 47 % to step 400), while the plateaus of the published first stage (χ/χ_mid = 6/4, one layer) sit at
    2.1e-3 … 3.4e-3 for 500 steps or for good and those of χ = 4 with one layer at 3.7e-3 … 8.7e-3; a start that
    passes the first check while still falling from higher up and then idles at ≈ 2e-3 (the kept start of the
    default ``ivhl sim mera`` run idled from step 300 to 750) is caught by the recheck at step 400. ``recheck_error``
    is higher than ``min_error`` because healthy χ = 4 / one-layer starts level off at 2.7e-4 … 3e-4, which is
    above ``min_error`` but what that stage can reach.
    Known miss: cold starts at χ = 8 are all poor (Δσ = 0.6–0.9 after 300 steps) and two of four pass the check;
    start small and grow (the ladder of ``ivhl sim mera``).
    """

    after: int = 300
    window: int = 100
    min_error: float = 2e-4
    min_progress: float = 0.2
    max_restarts: int = 3
    every: int = 100
    until: int = 1000
    recheck_error: float = 1e-3

    def validate(self) -> StuckCheck:
        check_scalar(self.after, "after", integer=True, minimum=2)
        check_scalar(self.window, "window", integer=True, minimum=1, maximum=self.after - 1)
        check_scalar(self.min_error, "min_error", nonnegative=True)
        check_scalar(self.min_progress, "min_progress")
        check_scalar(self.max_restarts, "max_restarts", integer=True, nonnegative=True)
        check_scalar(self.every, "every", integer=True, nonnegative=True)
        check_scalar(self.until, "until", integer=True, minimum=self.after)
        check_scalar(self.recheck_error, "recheck_error", nonnegative=True)
        return self

    def checks(self, limit: int | None = None) -> list[int]:
        """The steps at which a start is checked (``after``, then every ``every`` up to ``until`` and ``limit``)."""
        end = self.until if limit is None else min(self.until, int(limit))
        if end < self.after:
            return []
        if not self.every:
            return [self.after]
        return list(range(self.after, end + 1, self.every))

    def reason(self, errors: np.ndarray, at: int | None = None) -> str | None:
        """Why the start whose energy errors per step are ``errors`` is stuck at step ``at`` (default ``after``, the
        first check; a later ``at`` applies the recheck threshold). None: it is not, or it has fewer than ``at``
        steps."""
        err = np.asarray(errors, dtype=np.float64)
        at = self.after if at is None else int(at)
        if err.shape[0] < at or at <= self.window:
            return None
        now, before = float(err[at - 1]), float(err[at - 1 - self.window])
        progress = (before - now) / before if before > 0 else 0.0
        bound = self.min_error if at == self.after else self.recheck_error
        if now <= bound or progress >= self.min_progress:
            return None
        return (f"energy error {now:.2e} > {bound:.1e} after {at} steps and it fell by only "
                f"{100 * progress:.0f} % (< {100 * self.min_progress:.0f} %) over the last {self.window}")


class OptimizeResult(tuple):
    """``(mera, energies, seconds)`` (unpacks as before) with ``.restarts``: one dict per re-initialised stuck start
    (attempt, chi, steps, energy_error, progress, delta_sigma, reason)."""

    restarts: list[dict[str, Any]]

    def __new__(cls, mera: MERA, energies: np.ndarray, seconds: float,
                restarts: list[dict[str, Any]] | None = None) -> OptimizeResult:
        out = super().__new__(cls, (mera, energies, seconds))
        out.restarts = list(restarts or [])
        return out


def _run_steps(mera: MERA, n: int, chunk: int, make: Callable[[int], Callable[[MERA], tuple[MERA, jax.Array]]],
               callback: Callable[[int, np.ndarray], None] | None = None, offset: int = 0
               ) -> tuple[MERA, np.ndarray]:
    """``n`` steps (sweeps) in compiled chunks of ``chunk`` (the remainder in one shorter chunk); energies on the
    host."""
    out = []
    done = 0
    while done < n:
        step = min(chunk, n - done)
        mera, e = make(step)(mera)
        e_host = np.asarray(e)
        out.append(e_host)
        done += step
        if callback is not None:
            callback(offset + done, e_host)
    return mera, (np.concatenate(out) if out else np.zeros((0,)))


def cold_start(config: MERAConfig, key: jax.Array, e0: float,
               advance: Callable[[int], Callable[[MERA], tuple[MERA, jax.Array]]], chunk: int,
               check: StuckCheck | None = None, log: Callable[[str], None] | None = None, dtype: Any = None,
               limit: int | None = None) -> tuple[MERA, np.ndarray, list[dict[str, Any]]]:
    """Initialise and run steps (sweeps) up to each check of ``check`` (:meth:`StuckCheck.checks`); re-initialise
    (key ``fold_in(key, attempt)``) whenever a check finds the start stuck.

    ``advance(n)`` returns the compiled n-step function (e.g. ``lambda n: make_advance(h, n, ...)``), ``e0`` is
    the exact energy per site the errors are measured against, ``limit`` the most steps an attempt may run (the
    caller's total; default ``check.until``). Returns (mera of the kept attempt after its last check, its energies
    per step, one record per re-initialisation); the kept attempt has run ``check.after`` steps or more (up to
    ``limit``). Each re-initialisation is logged (``log``, default a warning on the ``ivhl_jax.physics.mera``
    logger). ``dtype``: of the initial tensors (default float64; must match ``advance``'s Hamiltonian). Call it
    inside ``jax.enable_x64``.
    """
    check = (check or StuckCheck()).validate()
    log = log or _LOG.warning
    points = check.checks(limit)
    if not points:
        raise ValueError(f"cold_start: limit={limit} is below the first check at step {check.after}")
    restarts: list[dict[str, Any]] = []
    best: tuple[float, MERA, np.ndarray] | None = None
    for attempt in range(check.max_restarts + 1):
        k = key if attempt == 0 else jax.random.fold_in(key, attempt)
        # drawn in the default float (float64 under x64) and cast, so a seed gives the same start in every dtype
        mera = cast_mera(init_mera(k, config), dtype or jnp.float64)
        parts: list[np.ndarray] = []
        done, reason = 0, None
        for at in points:
            mera, e = _run_steps(mera, at - done, chunk, advance)
            parts.append(e)
            done = at
            err = np.concatenate(parts) - e0
            reason = check.reason(err, at)
            if reason is not None or float(err[-1]) <= check.recheck_error:
                break
        e = np.concatenate(parts)
        if reason is None:
            return mera, e, restarts
        now = float(err[done - 1])
        if best is None or now < best[0]:
            best = (now, mera, e)
        before = float(err[done - 1 - check.window])
        restarts.append({"attempt": attempt, "chi": config.chi, "steps": done, "energy_error": now,
                         "progress": (before - now) / before, "delta_sigma": float(scaling_dimensions(mera, 2)[1]),
                         "reason": reason})
        last = attempt == check.max_restarts
        log(f"MERA chi={config.chi}: stuck start (attempt {attempt}): {reason}; "
            + ("keeping the best attempt" if last else f"re-initialising with key fold_in(key, {attempt + 1})"))
    assert best is not None
    return best[1], best[2], restarts


def optimize(config: MERAConfig, steps: int | None = None, *, key: jax.Array | None = None,
             mera: MERA | None = None, steps_per_chunk: int = 50,
             callback: Callable[[int, np.ndarray], None] | None = None, stuck: StuckCheck | None = StuckCheck(),
             policy: Any = None, **renamed: Any) -> OptimizeResult:
    """Run ``steps`` Evenbly–Vidal sweeps (one step = one sweep; x64 enabled only inside this call), compiled in
    chunks of ``steps_per_chunk``. Returns ``(mera, energies, seconds)`` as an :class:`OptimizeResult`
    (``.restarts`` lists re-initialised stuck starts).

    ``energies`` are per physical site, one per step (measured at the start of each sweep). A cold start
    (``mera=None``) with at least ``stuck.after`` steps is checked for a stuck start, at step ``stuck.after`` and
    every ``stuck.every`` steps after it, and re-initialised (:class:`StuckCheck`; ``stuck=None`` turns it off);
    the energies are those of the kept attempt. ``callback(step, energies_of_chunk)`` after each chunk (once for
    the checked cold start). ``policy``: None or ``"f64"`` (float64, the default), ``"f32"`` (float32 contractions
    and SVDs, for early sweeps: they stall near an energy error of 1e-5, see :func:`precision_dtype`); the returned
    MERA has that dtype. The old keywords ``sweeps``/``sweeps_per_chunk`` raise a TypeError naming the new ones.
    """
    _reject_renamed("optimize", renamed, {"sweeps": "steps", "sweeps_per_chunk": "steps_per_chunk"})
    if steps is None:
        raise TypeError("optimize() missing the argument 'steps' (Evenbly–Vidal sweeps to run)")
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    config.validate()
    check_scalar(steps, "steps", integer=True, minimum=1)
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    if stuck is not None:
        stuck.validate()
    steps, steps_per_chunk = int(steps), int(steps_per_chunk)
    with jax.enable_x64(True):
        dtype = precision_dtype(policy)
        h = ising_two_site_hamiltonian(config.g, dtype)
        make = lambda n: make_advance(h, n, config.power_iters, config.u_delay, config.refsym, config.si_scales)
        t0 = time.perf_counter()
        restarts: list[dict[str, Any]] = []
        first = np.zeros((0,))
        if mera is None:
            key = jax.random.key(0) if key is None else key
            if stuck is not None and steps >= stuck.after:
                e0 = E0_CRITICAL_ISING if config.g == 1.0 else _tfi_e0(config.g)
                mera, first, restarts = cold_start(config, key, e0, make, steps_per_chunk, stuck, dtype=dtype,
                                                   limit=steps)
                if callback is not None:
                    callback(first.shape[0], first)
            else:
                mera = init_mera(key, config)
        mera = cast_mera(mera, dtype)
        mera, rest = _run_steps(mera, steps - first.shape[0], steps_per_chunk, make, callback,
                                offset=first.shape[0])
        energies = np.concatenate([first, rest]) if first.size else rest  # keep the sweep's dtype
        return OptimizeResult(mera, energies, time.perf_counter() - t0, restarts)


def _tfi_e0(g: float) -> float:
    from ivhl_jax.physics.exact import tfi_energy_density

    return tfi_energy_density(g)


def precision_dtype(policy: Any) -> Any:
    """The dtype a MERA sweep runs in for a precision ``policy``: None, ``"f64"`` or a float64-compute
    :class:`~ivhl_jax.core.precision.Policy` → float64; ``"f32"`` / float32 compute → float32.

    Every contraction, SVD and eigen-decomposition of the sweep runs in that dtype (the tensors are cast to it).
    bf16/f16 are refused: the SVD updates (x = −U Vᵀ must be an isometry to the working precision) and the
    eigenvalue shift of h need ≥ 24 mantissa bits (and the CPU SVD rejects bfloat16). float32 sweeps stall near
    an energy error of 1e-5 per site (χ = 6: 1.10e-5 against 7.7e-6 in float64 after the same sweeps,
    ``bench/results/mera_precision_ladder.json``) and run 0.55–0.9× the float64 time per sweep
    (``bench/results/mera_precision_sweep.json``): for the early sweeps and small χ stages of a ladder only,
    followed by a float64 finish (:func:`cast_mera`).
    """
    if policy is None:
        return jnp.float64
    from ivhl_jax.core import precision as P

    pol = P.get_policy(policy, argname="policy") if isinstance(policy, str) else policy
    if not isinstance(pol, P.Policy):
        raise TypeError(f"policy must be None, a preset name or a precision.Policy; got {type(policy).__name__}")
    dt = jnp.dtype(pol.compute_dtype)
    if dt == jnp.dtype(jnp.float64):
        return jnp.float64
    if dt == jnp.dtype(jnp.float32):
        return jnp.float32
    raise ValueError(f"policy={policy!r}: MERA sweeps support float32 or float64 compute, got {dt.name}; the SVD "
                     "updates need >= 24 mantissa bits (use 'f32' for fast early sweeps, 'f64' to finish)")


def cast_mera(mera: MERA, dtype: Any) -> MERA:
    """The MERA with every tensor and density matrix in ``dtype`` (f32 → f64 for the float64 finish of a
    mixed-precision ladder; the isometries are exact to float32 rounding after the cast and are re-made exact by
    the next update's SVD)."""
    _check_mera(mera)
    try:
        ok = jnp.issubdtype(jnp.dtype(dtype), jnp.inexact)
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"dtype must be a floating or complex dtype such as jnp.float64, got {dtype!r}")
    c = lambda x: jnp.asarray(x, dtype)
    return mera.replace(u=tuple(map(c, mera.u)), w=tuple(map(c, mera.w)), v=tuple(map(c, mera.v)),
                        rho_ab=c(mera.rho_ab), rho_ba=c(mera.rho_ba))


# ------------------------------------------------------------------------------------------- stepper


class SweepParams(struct.PyTreeNode):
    """What one Evenbly–Vidal sweep reads: the bottom two-site Hamiltonian ``h = (h_AB, h_BA)``, each
    (d, d, d, d), traced; and the :class:`MERAConfig` (static: its settings change the compiled sweep)."""

    h: tuple[jax.Array, jax.Array]
    config: MERAConfig = struct.field(pytree_node=False)


class MERAState(struct.PyTreeNode):
    """The stepper's state: the MERA and the energy per site measured at the start of the last sweep."""

    mera: MERA
    energy: jax.Array


def _ev_step(state: MERAState, params: SweepParams) -> MERAState:
    c = params.config
    m, e = sweep(state.mera, params.h, c.power_iters, c.u_delay, c.refsym, c.si_scales)
    return MERAState(mera=m, energy=e)


def _ev_init(params: SweepParams, key: jax.Array | None = None, mera: MERA | None = None) -> MERAState:
    if mera is None:
        mera = init_mera(jax.random.key(0) if key is None else key, params.config, d=params.h[0].shape[0])
    return MERAState(mera=mera, energy=jnp.asarray(jnp.nan, params.h[0].dtype))


def observe_energy(state: MERAState, params: SweepParams) -> jax.Array:
    """Energy per site of the last sweep (the ``observe`` for ``trajectory``)."""
    del params
    return state.energy


def evenbly_vidal(h: tuple[jax.Array, jax.Array], config: MERAConfig) -> Stepper[MERAState, SweepParams]:
    """Stepper for the Evenbly–Vidal optimisation: ``step`` is one :func:`sweep` with ``config``'s settings,
    ``init(key=None, mera=None)`` a fresh (or the given) MERA. ``trajectory(evenbly_vidal(h, cfg), state,
    n, observe=observe_energy)`` gives the same energies as :func:`make_advance`. Run it in float64
    (``jax.enable_x64``) for the accuracies quoted in the module docstring."""
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    config.validate()
    if not (isinstance(h, tuple) and len(h) == 2):
        raise TypeError("h must be the pair (h_AB, h_BA) of two-site Hamiltonians, e.g. ising_two_site_hamiltonian()")
    for name, x in zip(("h[0]", "h[1]"), h):
        if jnp.ndim(x) != 4 or len(set(jnp.shape(x))) != 1:
            raise ValueError(f"{name} must have shape (d, d, d, d); got {jnp.shape(x)}")
    return Stepper(step_fn=_ev_step, params=SweepParams(h=(h[0], h[1]), config=config), init_fn=_ev_init,
                   name="mera.evenbly_vidal")

