"""Translation-invariant nearest-neighbour chains for the MERA: a model is a Hermitian two-site term h on spins of
dimension d, H = Σ_i h(i, i+1); the library blocks two spins into one MERA site of dimension d².

Provided: the transverse-field Ising chain (:func:`ising`, H = −Σ X_i X_{i+1} − g Σ Z_i, critical at g = 1 with
e₀ = −4/π per site), the XX chain (:func:`xx`, H = −¼ Σ (X_i X_{i+1} + Y_i Y_{i+1}), e₀ = −1/π), the 3-state Potts
chain (:func:`potts`, H = −Σ (σ_i σ_{i+1}† + h.c.) − f Σ (τ_i + τ_i†), critical at f = 1 with
e₀ = −(4/3 + 2√3/π) per site) and any real Hermitian term (:func:`two_site`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ivhl_jax.core.validation import check_scalar, is_concrete
from ivhl_jax.physics.tensornet.mera.cft import CFT, CFTS

E0_CRITICAL_ISING = -4.0 / math.pi
E0_XX = -1.0 / math.pi
E0_CRITICAL_POTTS = -(4.0 / 3.0 + 2.0 * math.sqrt(3.0) / math.pi)


class Model(struct.PyTreeNode):
    """A chain H = Σ_i h(i, i+1): the two-site term ``term[a', b', a, b] = <a' b'| h |a b>`` (d, d, d, d), real
    and Hermitian (traced), with a name and, where known, the exact ground-state energy per site ``e0`` and the
    conformal field theory of its critical point (``cft``, static: the :class:`~ivhl_jax.physics.tensornet.mera.cft.CFT`
    record with the central charge, the velocity of the chain's excitations, the scaling operators and the OPE
    coefficients; None off criticality).

    ``parity``: a Z₂ symmetry of the chain, a real symmetric involution P (P² = 1, (d, d) as nested tuples) on one
    spin with [h, P ⊗ P] = 0, or None. The cold start of :func:`~ivhl_jax.physics.tensornet.mera.evenbly_vidal` is made
    symmetric under it (:func:`~ivhl_jax.physics.tensornet.mera.init_tensors`), which keeps the optimisation out of
    symmetry-broken minima."""

    term: Any  # float64 NumPy when built from concrete values, an array in a trace
    name: str = struct.field(pytree_node=False, default="custom")
    e0: float | None = struct.field(pytree_node=False, default=None)
    cft: CFT | None = struct.field(pytree_node=False, default=None)
    parity: tuple | None = struct.field(pytree_node=False, default=None)

    @property
    def d(self) -> int:
        """The spin dimension (the MERA's blocked sites have d²)."""
        return int(self.term.shape[0])

    @property
    def reflection_symmetric(self) -> bool:
        """h(a, b) = h(b, a): the term read backwards is itself (needed by ``MERAConfig(refsym=True)``)."""
        t = np.asarray(self.term)
        return bool(np.allclose(t, t.transpose(1, 0, 3, 2), atol=1e-12 * max(1.0, float(np.abs(t).max()))))


def two_site(term: Any, name: str = "custom", e0: float | None = None, parity: Any = None) -> Model:
    """A model from a user's two-site term (d, d, d, d), ``term[a', b', a, b] = <a' b'| h |a b>``.

    Validated (ValueError/TypeError naming ``term``): four equal axes, d ≥ 2, finite, real (the sweep is
    real-valued: write a complex Hermitian term in a basis where it is real) and Hermitian to 1e-12.
    ``parity``: optional Z₂ symmetry of the term, a real symmetric (d, d) involution P with [h, P ⊗ P] = 0
    (checked to 1e-10; e.g. diag(1, −1) for a spin-flip symmetry along Z): the cold start is then symmetric
    (:func:`~ivhl_jax.physics.tensornet.mera.init_tensors`). Without it the start is unsymmetric and may stall in a
    symmetry-broken state: run it through :func:`~ivhl_jax.physics.tensornet.mera.cold_start`.
    """
    if is_concrete(term):
        arr = np.asarray(term)
        if not np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_:
            raise TypeError(f"term must be a numeric array of shape (d, d, d, d), got dtype {arr.dtype}")
        if arr.ndim != 4 or len(set(arr.shape)) != 1 or arr.shape[0] < 2:
            raise ValueError(
                f"term must have shape (d, d, d, d) with d >= 2 (the two-site operator on spins of "
                f"dimension d), got {arr.shape}"
            )
        if np.iscomplexobj(arr):
            if np.abs(arr.imag).max() > 0:
                raise ValueError(
                    "term must be real (the MERA sweep is real-valued); write the Hermitian term in a "
                    "basis where it is real"
                )
            arr = arr.real
        if not np.all(np.isfinite(arr)):
            raise ValueError("term contains NaN or inf values")
        d = arr.shape[0]
        mat = arr.reshape(d * d, d * d)
        scale = max(1.0, float(np.abs(mat).max()))
        if np.abs(mat - mat.T).max() > 1e-12 * scale:
            raise ValueError(f"term must be Hermitian (h = h†); max |h − h†| = {np.abs(mat - mat.T).max():.2e}")
        term = arr
    if e0 is not None:
        check_scalar(e0, "e0")
    # a concrete term stays a float64 NumPy array: building a model never starts JAX's backend (``ivhl sim mera``
    # pins XLA's host threads before that); blocked_terms casts it to the sweep's dtype
    par = None
    if parity is not None:
        if not is_concrete(term):
            raise ValueError("parity needs a concrete term (it is checked against it)")
        par = _check_parity(parity, term)
    return Model(
        term=np.asarray(term, np.float64) if is_concrete(term) else term,
        name=str(name),
        e0=None if e0 is None else float(e0),
        parity=par,
    )


def _check_parity(parity: Any, term: Any) -> tuple:
    """``parity`` (see :func:`two_site`) as nested tuples, after its checks against ``term``."""
    t = np.asarray(term, np.float64)
    d = t.shape[0]
    p = np.asarray(parity, dtype=np.float64)
    if p.shape != (d, d) or not np.all(np.isfinite(p)):
        raise ValueError(f"parity must be a finite real ({d}, {d}) matrix acting on one spin, got shape {p.shape}")
    if np.abs(p @ p - np.eye(d)).max() > 1e-10 or np.abs(p - p.T).max() > 1e-10:
        raise ValueError("parity must be a real symmetric involution (P = P^T, P @ P = 1), e.g. diag(1, -1)")
    pp, h = np.kron(p, p), t.reshape(d * d, d * d)
    if np.abs(pp @ h - h @ pp).max() > 1e-10 * max(1.0, float(np.abs(h).max())):
        raise ValueError("parity must commute with the term ([h, P (x) P] = 0): it is not a symmetry of this chain")
    return tuple(tuple(float(x) for x in row) for row in p)


_X = np.array([[0.0, 1.0], [1.0, 0.0]])
_Z = np.diag([1.0, -1.0])
_I2 = np.eye(2)
_SPIN_FLIP = ((1.0, 0.0), (0.0, -1.0))  # Π Z_i: commutes with XX, YY and Z


def _tfi_e0(g: float) -> float:
    from ivhl_jax.physics.exact import tfi_energy_density

    return tfi_energy_density(g)


def ising(g: float = 1.0) -> Model:
    """Transverse-field Ising chain H = −Σ X_i X_{i+1} − g Σ Z_i (term −XX − g(Z⊗1 + 1⊗Z)/2); critical g = 1,
    e₀(g) from the free-fermion solution (−4/π at g = 1)."""
    check_scalar(g, "g")
    g = float(g)
    term = -np.kron(_X, _X) - 0.5 * g * (np.kron(_Z, _I2) + np.kron(_I2, _Z))
    return Model(
        term=term.reshape(2, 2, 2, 2),
        name=f"ising(g={g:g})",
        e0=E0_CRITICAL_ISING if g == 1.0 else _tfi_e0(g),
        cft=CFTS["ising"] if g == 1.0 else None,
        parity=_SPIN_FLIP,
    )


def xx() -> Model:
    """XX chain H = −¼ Σ (X_i X_{i+1} + Y_i Y_{i+1}) (free fermions with hopping ½: e₀ = −1/π per site; a c = 1
    Luttinger liquid)."""
    y_y = np.array([[0, 0, 0, -1], [0, 0, 1, 0], [0, 1, 0, 0], [-1, 0, 0, 0]], dtype=float)  # Y⊗Y (real)
    term = -0.25 * (np.kron(_X, _X) + y_y)
    # no parity start: with Z2 charges fixed on every bond (⌈2χ/3⌉ even) its U(1) sectors converge worse than from
    # the unsymmetric start (test_other_chains_converge_to_their_exact_energy)
    return Model(term=term.reshape(2, 2, 2, 2), name="xx", e0=E0_XX, cft=CFTS["xx"])


def potts(f: float = 1.0) -> Model:
    """3-state Potts chain H = −Σ (σ_i σ_{i+1}† + σ_i† σ_{i+1}) − f Σ (τ_i + τ_i†), σ = diag(1, ω, ω²), τ the cyclic
    shift; in the σ basis the term is real: −2 cos(2π(a − b)/3) δ on the bond and −f(τ + τ†)/2 on each site.
    Critical at f = 1, e₀ = −(4/3 + 2√3/π) per site (exact, for the critical self-dual point)."""
    a = np.arange(3)
    bond = np.diag((-2.0 * np.cos(2 * np.pi * (a[:, None] - a[None, :]) / 3)).reshape(-1))
    shift = np.roll(np.eye(3), 1, axis=0)
    # no parity start: charge conjugation (a real Z2 of this basis) with fixed bond charges loses σ (Δ 0.085 and
    # 0.84 instead of 2/15 twice); the unsymmetric start converges (test_other_chains_converge_to_their_exact_energy)
    return potts_chain(bond, -(shift + shift.T), f, "potts")


def potts_chain(bond: np.ndarray, site: np.ndarray, f: float, name: str) -> Model:
    """The 3-state Potts chain in a given basis: the two-site term ``bond`` (9 × 9) + f (site ⊗ 1 + 1 ⊗ site)/2
    with the one-site term ``site`` (3 × 3), named ``name(f=…)``; at the critical f = 1 with its exact e₀ and CFT
    (:func:`potts` in the σ basis, :func:`~ivhl_jax.physics.tensornet.mera.symmetric.potts_charge_basis` in the
    charge basis)."""
    check_scalar(f, "f")
    f = float(f)
    term = bond + 0.5 * f * (np.kron(site, np.eye(3)) + np.kron(np.eye(3), site))
    return Model(
        term=term.reshape(3, 3, 3, 3),
        name=f"{name}(f={f:g})",
        e0=E0_CRITICAL_POTTS if f == 1.0 else None,
        cft=CFTS["potts"] if f == 1.0 else None,
    )


def blocked_parity(model: Model) -> tuple | None:
    """The model's parity on one blocked site (two spins), P ⊗ P as nested tuples (d², d²), or None."""
    if model.parity is None:
        return None
    p = np.asarray(model.parity)
    return tuple(tuple(float(x) for x in row) for row in np.kron(p, p))


def check_model(model: Any, name: str = "model") -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (tuple, list)):
        raise TypeError(
            f"{name} must be a mera model (mera.ising(), mera.xx(), mera.potts() or mera.two_site(term) "
            "for your own two-site term); got a pair: the library blocks the two-site spin term into "
            "the (h_AB, h_BA) pair of d^2-dimensional sites itself"
        )
    raise TypeError(
        f"{name} must be a mera model (mera.ising(), mera.xx(), mera.potts() or mera.two_site(term)); "
        f"got {type(model).__name__}"
    )


def blocked_terms(model: Model, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """The blocked two-site terms (h_AB, h_BA), each (d², d², d², d²), of ``model`` on 2-spin blocks.

    The term on blocks (p0 p1)(p2 p3) is ½h(p0,p1) + h(p1,p2) + ½h(p2,p3), so Σ over neighbouring blocks
    reproduces H exactly. A blocks hold (p0, p1), B blocks hold their spins reversed, (p1, p0), as in Evenbly's
    mainVarMERA, so that a spatial reflection maps A ↔ B without a relabelling inside the block (this is what
    makes v = reflect(w) a valid constraint for a reflection-symmetric term).
    """
    model = check_model(model)
    d = model.d
    dt = dtype or jnp.result_type(float)
    # NumPy float64 for a concrete term (exact, and no eager op compiled per shape); jax.numpy in a trace
    xp: Any = np if is_concrete(model.term) else jnp
    h = xp.asarray(model.term, np.float64 if xp is np else dt).reshape(d * d, d * d)
    eye, eye2 = xp.eye(d, dtype=h.dtype), xp.eye(d * d, dtype=h.dtype)
    h4 = 0.5 * xp.kron(h, eye2) + xp.kron(xp.kron(eye, h), eye) + 0.5 * xp.kron(eye2, h)
    h8 = h4.reshape((d,) * 8)
    dd = d * d
    h_ab = h8.transpose(0, 1, 3, 2, 4, 5, 7, 6).reshape(dd, dd, dd, dd)
    h_ba = h8.transpose(1, 0, 2, 3, 5, 4, 6, 7).reshape(dd, dd, dd, dd)
    return jnp.asarray(h_ab, dt), jnp.asarray(h_ba, dt)


def ising_two_site_hamiltonian(g: float = 1.0, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """The blocked terms (h_AB, h_BA), each (4, 4, 4, 4), of the Ising chain: ``blocked_terms(ising(g), dtype)``."""
    return blocked_terms(ising(g), dtype)
