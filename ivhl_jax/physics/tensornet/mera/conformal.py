"""Conformal data of a scale-invariant MERA beyond the scaling dimensions: the OPE coefficients of the primaries
(:func:`ope_coefficients`) and the central charge (:func:`central_charge`).

**OPE coefficients** (the method of Pfeifer, Evenbly & Vidal, PRA 79, 040301 (2009), on the two-site causal cone
of the modified binary MERA). Every coarse site is made by one w (a B site) or one v (an A site), so each site is
the top of a one-site causal cone reaching down to the physical chain: the one-site scaling operators φ_a of the
two-layer map S_v∘S_w (:func:`~ivhl_jax.physics.tensornet.mera.scaling.scaling_superoperator`) are pure scaling
operators on every A site, and ψ_a = S_w(φ_a) on every B site. The bond under a disentangler (B site f1, A site f2)
keeps a two-site cone at every scale; its map 𝒮₂ has right eigenvectors R_n (two-site scaling operators, λ_n = 2^{−Δ_n})
and left eigenvectors L_n, and ``coef_n(O) = ⟨L_n, O⟩`` is how much of the scaling operator n a two-site operator O
on that bond carries at long distance. With lattice operators that are pure primaries of unknown normalisation,
ψ_a(p₁) = Σ_i N^B_{ia} Ô_i, φ_b(p₂) = Σ_j N^A_{jb} Ô_j (Ô orthonormal: ⟨Ô_i(x)Ô_j(y)⟩ = δ_ij |x−y|^{−2Δ}), three
measured quantities per primary multiplet X,

    K^B_X = coef_X(ψ_a ⊗ 1),  K^A_X = coef_X(1 ⊗ φ_a),  G_X = coef_𝟙(ψ_a ⊗ φ_b) = ⟨ψ_a(p₁) φ_b(p₂)⟩,

fix the normalisations: K = T_X N with T_X the coefficients of the normalised primary, and
G_X = N^Bᵀ N^A y^{−2Δ_X}, so T_X T_Xᵀ = y^{−2Δ_X} K^A G⁻¹ K^Bᵀ. The OPE ψ_a(p₁)φ_b(p₂) = Σ C_ijk y^{Δ_γ−Δ_α−Δ_β} Ô_k
+ descendants (which are other eigenvectors of 𝒮₂) then gives C_ijk from coef_γ(ψ_a ⊗ φ_b); the separation y of
the two sites cancels exactly, so no lattice geometry enters. C is returned as its basis-independent size: the
Frobenius norm over the multiplets divided by √m, m the number of equal entries the CFT's C tensor has in its
complex basis (1 for Ising σσε; 2 for Potts σσ†ε and σσσ, whose σ, σ† form a real doublet).

**Central charge** (finite-size scaling of the MERA's own coarse-grained Hamiltonian). Ascending the chain's term
through ℓ layers gives the two-site Hamiltonian h^{(ℓ)} = 𝒜^ℓ(h) of the level ℓ; on a ring of n level-ℓ sites,
H_eff = Σ h^{(ℓ)} is the chain's Hamiltonian on the ring of L = n·2^{ℓ+1} spins restricted to the periodic MERA
built from the same tensors (an isometry, so its eigenvalues are variational). A CFT on a ring has
E₀(L) = L e∞ − πvc/(6L) + O(L⁻³), so two consecutive levels (L and 2L) give, without e∞,

    c = 4L [E₀(2L) − 2E₀(L)] / (π v),

with v the velocity of the chain's excitations, held by the model with its CFT data (Ising −ΣXX − ΣZ: v = 2;
XX −¼Σ(XX + YY): v = 1; 3-state Potts −Σ(σσ† + h.c.) − Σ(τ + τ†): v = 3√3/2). The same formula on exact ring
energies is the check of the method itself (``tests/physics/mera/test_conformal.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.tensornet import blocks as S
from ivhl_jax.physics.tensornet import ops as T
from ivhl_jax.physics.tensornet.mera import cft as cft_records
from ivhl_jax.physics.tensornet.mera import symmetric as MS
from ivhl_jax.physics.tensornet.mera.config import MERA, check_mera, require_x64
from ivhl_jax.physics.tensornet.mera.models import Model, blocked_terms, check_model
from ivhl_jax.physics.tensornet.mera.scaling import scaling_superoperator, two_site_map
from ivhl_jax.physics.tensornet.mera.superoperators import ascend


def _x64(what: str = "the MERA's conformal data") -> None:
    require_x64(what)


def _si_layer(mera: MERA) -> tuple[jax.Array, jax.Array, jax.Array]:
    u, w, v = check_mera(mera).layer(mera.num_layers - 1)
    if w.shape[0] != w.shape[-1]:
        raise ValueError(f"the top layer must be scale invariant (chi_in = chi_out); got w of shape {w.shape}")
    # a symmetric MERA's block tensors as their dense embeddings: the conformal data do not depend on the basis
    return tuple(jnp.asarray(T.dense(x), jnp.float64) for x in (u, w, v))  # type: ignore[return-value]


# ------------------------------------------------------------------------------------ scaling operators


@dataclass(frozen=True)
class OneSiteOperators:
    """Scaling operators of the one-site cones, largest eigenvalue first: ``dims`` (n,), ``phi`` (n, χ, χ) on A
    sites (eigenvectors of S_v∘S_w, λ = 4^{−Δ}), ``psi`` (n, χ, χ) = S_w(φ) on B sites; operators o[a', a]."""

    dims: np.ndarray
    phi: np.ndarray
    psi: np.ndarray


def one_site_operators(mera: MERA, num: int = 8) -> OneSiteOperators:
    """The ``num`` leading one-site scaling operators (dense eigen-decomposition of the χ² × χ² map)."""
    _x64()
    check_scalar(num, "num", integer=True, minimum=1)
    u, w, v = _si_layer(mera)
    chi = int(w.shape[-1])
    s = np.asarray(scaling_superoperator(w, v))
    sw = np.asarray(scaling_superoperator(w))
    vals, vecs = np.linalg.eig(s)
    order = np.argsort(-np.abs(vals))[: int(num)]
    vals, vecs = vals[order], vecs[:, order]
    vecs = _real_basis(vals, vecs)
    phi = vecs.T.reshape(-1, chi, chi)
    psi = (sw @ vecs).T.reshape(-1, chi, chi)
    return OneSiteOperators(dims=-0.5 * np.log2(np.abs(vals)), phi=phi, psi=psi)


def _real_basis(vals: np.ndarray, vecs: np.ndarray) -> np.ndarray:
    """Real unit vectors spanning the same (real, invariant) eigenspaces: a complex pair (λ, λ̄) becomes the
    orthonormalised (Re x, Im x); a real eigenvalue's eigenvector (a complex multiple of a real one) is rotated
    real by the phase that maximises its real part."""
    out = np.array(vecs, dtype=complex)
    real = np.zeros(out.shape, float)
    done = np.zeros(len(vals), bool)
    for i in range(len(vals)):
        if done[i]:
            continue
        x = out[:, i]
        partner = None
        if abs(vals[i].imag) > 1e-12 * max(1.0, abs(vals[i])):
            partner = next(
                (
                    k
                    for k in range(i + 1, len(vals))
                    if not done[k] and abs(vals[k] - vals[i].conj()) < 1e-9 * max(1.0, abs(vals[i]))
                ),
                None,
            )
        if partner is not None:
            q, _ = np.linalg.qr(np.stack([x.real, x.imag], axis=1))
            real[:, i], real[:, partner] = q[:, 0], q[:, 1]
            done[partner] = True
        else:
            y = (x * np.exp(-0.5j * np.angle(np.sum(x * x)))).real
            real[:, i] = y / np.linalg.norm(y)
        done[i] = True
    return real


@dataclass(frozen=True)
class TwoSiteChannels:
    """Eigen-decomposition of the two-site scaling superoperator 𝒮₂ (largest |λ| first): ``dims`` (n,), right
    eigenvectors ``right`` (n, χ⁴) and the left ones ``left`` (n, χ⁴), real bases of the same invariant subspaces."""

    dims: np.ndarray
    right: np.ndarray
    left: np.ndarray
    chi: int

    def group(self, delta: float, size: int) -> np.ndarray:
        """Indices of the ``size`` channels nearest to Δ = ``delta``."""
        return np.sort(np.argsort(np.abs(self.dims - delta), kind="stable")[:size])

    def coefficients(self, idx: np.ndarray, ops: np.ndarray) -> np.ndarray:
        """coef_idx(O) for each operator O in ``ops`` (k, χ, χ, χ, χ): the components along R_idx of O's expansion
        in two-site scaling operators (biorthogonal projection, (L_idxᵀ R_idx)⁻¹ L_idxᵀ O), shape (len(idx), k)."""
        left, right = self.left[idx], self.right[idx]
        flat = np.asarray(ops).reshape(len(ops), -1)
        return np.linalg.solve(left @ right.T, left @ flat.T)


def two_site_channels(mera: MERA, num: int = 16) -> TwoSiteChannels:
    """Left and right eigenvectors of 𝒮₂
    (:func:`~ivhl_jax.physics.tensornet.mera.scaling.two_site_scaling_superoperator`) for the ``num`` largest |λ|: dense
    up to χ⁴ = 256, Arnoldi (scipy ``eigs``, matrix-free, the transpose by ``jax.linear_transpose``) above."""
    _x64()
    check_scalar(num, "num", integer=True, minimum=2)
    u, w, v = _si_layer(mera)
    chi = int(w.shape[-1])
    n = chi**4
    shape = (chi,) * 4

    @jax.jit
    def fwd(x: jax.Array) -> jax.Array:
        return two_site_map(x.reshape(shape), u, w, v).reshape(-1)

    bwd = jax.jit(jax.linear_transpose(fwd, jax.ShapeDtypeStruct((n,), jnp.float64)))
    k = min(int(num), n - 2)

    def decompose(f: Any) -> tuple[np.ndarray, np.ndarray]:
        if n <= 256:
            mat = np.asarray(jax.vmap(f)(jnp.eye(n, dtype=jnp.float64))).T
            vals, vecs = np.linalg.eig(mat)
        else:
            from scipy.sparse.linalg import LinearOperator, eigs

            op = LinearOperator(
                (n, n), matvec=lambda x: np.asarray(f(jnp.asarray(np.real(x), jnp.float64))), dtype=np.float64
            )
            vals, vecs = eigs(op, k=k + 2, which="LM", tol=1e-12, ncv=max(2 * k + 5, 48))
        order = np.argsort(-np.abs(vals))[:k]
        return vals[order], _real_basis(vals[order], vecs[:, order])

    vals, right = decompose(fwd)
    lvals, left = decompose(lambda x: bwd(x)[0])
    # pair each left eigenvector with the right one of the same eigenvalue (the two Arnoldi runs order ties freely)
    perm = _match(np.abs(vals), np.abs(lvals))
    return TwoSiteChannels(dims=-np.log2(np.abs(vals)), right=right.T, left=left[:, perm].T, chi=chi)


def _match(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """perm with b[perm] ≈ a (greedy nearest, each b used once)."""
    free = list(range(len(b)))
    perm = []
    for x in a:
        j = min(free, key=lambda i: abs(b[i] - x))
        free.remove(j)
        perm.append(j)
    return np.asarray(perm)


# ------------------------------------------------------------------------------------------ OPE


def _product(left_ops: np.ndarray, right_ops: np.ndarray) -> np.ndarray:
    """All products ψ_a ⊗ φ_b as two-site operators o[a', b', a, b], shape (len(ψ)·len(φ), χ, χ, χ, χ)."""
    chi = left_ops.shape[-1]
    return np.einsum("iac,jbd->ijabcd", left_ops, right_ops).reshape(-1, chi, chi, chi, chi)


@dataclass(frozen=True)
class _Primary:
    dims: np.ndarray  # one-site Δ of the multiplet
    phi: np.ndarray  # (g, χ, χ) on A sites
    psi: np.ndarray  # (g, χ, χ) on B sites
    channel: np.ndarray  # indices of its 𝒮₂ channels
    t_inv: np.ndarray  # T̃⁻¹ (g, g)
    nb_inv: np.ndarray  # Ñ^B⁻¹
    na_inv: np.ndarray  # Ñ^A⁻¹


_NOT_CONVERGED = (
    "the MERA is not at the critical fixed point (a stalled or symmetry-broken start): check its energy "
    "error, run more sweeps, start with mera.cold_start or grow it from a smaller chi (mera.grow)"
)


def _window(delta: float) -> float:
    """How far a measured Δ may lie from the primary's: at finite χ a descendant of another family can be nearer."""
    return max(0.1, 0.25 * delta)


def _channel_of(ch: TwoSiteChannels, ops: np.ndarray, delta: float, size: int, name: str = "") -> np.ndarray:
    """The ``size`` two-site channels that carry most of the one-site operators ``ops`` (placed on the bond's B
    site) among those with |Δ_n − Δ| ≤ max(0.1, Δ/4): at finite χ a channel of the same family (a descendant of
    another primary) can lie nearer in Δ than the operator's own."""
    near = np.nonzero(np.abs(ch.dims - delta) <= _window(delta))[0]
    near = near[ch.dims[near] > 1e-9] if delta > 0 else near  # the identity channel is not a primary's own
    if len(near) < size:
        raise ValueError(
            f"no {size} two-site scaling operator(s) for {name or 'the primary'} near Δ = {delta:.4g} "
            f"(two-site spectrum {np.round(ch.dims, 3).tolist()}): pass more channels (num_channels) "
            f"or converge the MERA"
        )
    weight = np.array([np.linalg.norm(ch.coefficients(np.array([n]), ops)) for n in near])
    return np.sort(near[np.argsort(-weight, kind="stable")[:size]])


def _primary(ops: OneSiteOperators, ch: TwoSiteChannels, delta: float, size: int, name: str = "") -> _Primary:
    idx = np.argsort(np.abs(ops.dims - delta), kind="stable")[:size]
    label = f"{name} (Δ = {delta:.4g})" if name else f"the primary at Δ = {delta:.4g}"
    if np.any(np.abs(ops.dims[idx] - delta) > _window(delta)):
        dims = np.round(ops.dims + 0.0, 3).tolist()
        raise ValueError(
            f"no one-site scaling operator matches {label}: the nearest {size} of the MERA's one-site "
            f"spectrum {dims} lie farther than {_window(delta):g}; {_NOT_CONVERGED}"
        )
    phi, psi = ops.phi[idx], ops.psi[idx]
    chi = phi.shape[-1]
    eye = np.eye(chi)
    on_b = _product(psi, eye[None])
    cidx = _channel_of(ch, on_b, float(np.mean(ops.dims[idx])), size, name)
    kb = ch.coefficients(cidx, on_b)
    ka = ch.coefficients(cidx, _product(eye[None], phi))
    ident = ch.group(0.0, 1)
    g = (
        ch.coefficients(ident, _product(psi, phi)).reshape(size, size)
        / ch.coefficients(ident, _product(eye[None], eye[None]))[0, 0]
    )
    q = ka @ np.linalg.solve(g, kb.T)
    q = 0.5 * (q + q.T)
    lam, vec = np.linalg.eigh(q)
    if np.any(lam <= 0):
        raise ValueError(
            f"the normalisation of {label} is not positive (eigenvalues {lam}): its one-site and "
            f"two-site scaling operators do not match; {_NOT_CONVERGED}"
        )
    t_inv = vec @ np.diag(lam**-0.5) @ vec.T
    return _Primary(
        dims=ops.dims[idx],
        phi=phi,
        psi=psi,
        channel=cidx,
        t_inv=t_inv,
        nb_inv=np.linalg.inv(t_inv @ kb),
        na_inv=np.linalg.inv(t_inv @ ka),
    )


def ope(
    mera: MERA,
    a: tuple[float, int],
    b: tuple[float, int],
    c: tuple[float, int],
    *,
    channels: TwoSiteChannels | None = None,
    num_channels: int = 16,
    names: tuple[str, str, str] = ("", "", ""),
) -> tuple[float, dict[str, Any]]:
    """‖C_αβγ‖: the Frobenius norm of the OPE coefficients of the primary multiplets α, β, γ, each given as
    (Δ, multiplicity): the multiplicity one-site scaling operators nearest to Δ and as many two-site channels
    (see the module docstring). Returns the norm and the dimensions used. Call inside ``jax.enable_x64(True)``.
    ``names``: the primaries' labels for the error raised when the MERA has no scaling operator within
    max(0.1, Δ/4) of one of them (an unconverged or symmetry-broken MERA)."""
    _x64()
    check_scalar(num_channels, "num_channels", integer=True, minimum=2)
    for name, x in (("a", a), ("b", b), ("c", c)):
        if not (isinstance(x, (tuple, list)) and len(x) == 2):
            raise TypeError(f"{name} must be (delta, multiplicity) of a primary, got {x!r}")
        check_scalar(x[0], f"{name}[0]", nonnegative=True)
        check_scalar(x[1], f"{name}[1]", integer=True, minimum=1)
    ops = one_site_operators(mera, num=max(12, a[1] + b[1] + c[1] + 4))
    ch = channels if channels is not None else two_site_channels(mera, num_channels)
    pa, pb, pc = (_primary(ops, ch, float(x[0]), int(x[1]), str(nm)) for x, nm in zip((a, b, c), names))
    coef = ch.coefficients(pc.channel, _product(pa.psi, pb.phi))  # (g_c, g_a·g_b)
    w = (pc.t_inv @ coef).reshape(len(pc.channel), len(pa.psi), len(pb.phi))
    tensor = np.einsum("ai,bj,kab->ijk", pa.nb_inv, pb.na_inv, w)
    used = {
        "a": pa.dims.tolist(),
        "b": pb.dims.tolist(),
        "c": pc.dims.tolist(),
        "channel": ch.dims[pc.channel].tolist(),
    }
    return float(np.linalg.norm(tensor)), used


def ope_coefficients(
    mera: MERA, cft: Any, *, num_channels: int = 16, channels: TwoSiteChannels | None = None
) -> dict[str, dict[str, Any]]:
    """OPE coefficients |C_αβγ| of the primaries of ``cft`` ("ising": σσε; "potts": σσε and σσσ; the records of
    :data:`~ivhl_jax.physics.tensornet.mera.cft.CFTS`) measured on the MERA's scale-invariant layer (:func:`ope`), each
    with the exact value and the scaling dimensions of the operators used. Call inside ``jax.enable_x64(True)``;
    ``channels`` reuses a :func:`two_site_channels` decomposition.

    On a symmetric MERA each entry also says whether the symmetry allows it (``allowed``): a coefficient whose
    charges do not add up (q_α + q_β ≠ q_γ) vanishes by the symmetry and is reported as ``measured`` 0.0 without
    a measurement."""
    _x64()
    rec = cft_records.get(cft, need="ope")
    check_scalar(num_channels, "num_channels", integer=True, minimum=2)
    group = check_mera(mera).w[-1].group if MS.is_symmetric(mera) else None
    if group is not None and group != S.group_from_name(rec.symmetry):
        raise ValueError(
            f"cft={rec.name!r} labels its operators by {rec.symmetry} charges, but the MERA's tensors are "
            f"{group.name}-symmetric"
        )
    ch: TwoSiteChannels | None = channels
    out: dict[str, dict[str, Any]] = {}
    for (a, b, c), exact, m in rec.ope:
        name = f"C_{a}{b}{c}"
        if group is not None:
            qa, qb, qc = (rec.charges(x)[0] for x in (a, b, c))
            if group.reduce(qa + qb - qc) != 0:
                out[name] = {"measured": 0.0, "exact": exact, "allowed": False}
                continue
        ch = ch if ch is not None else two_site_channels(mera, num_channels)
        norm, used = ope(mera, *(rec.primary(x) for x in (a, b, c)), channels=ch, names=(a, b, c))
        value = norm / math.sqrt(m)
        out[name] = {"measured": value, "exact": exact, "error": value - exact, "dims": used}
        if group is not None:
            out[name]["allowed"] = True
    return out


# ------------------------------------------------------------------------------------- central charge


def level_hamiltonian(mera: MERA, model: Model, level: int, symmetry: MS.Symmetry | None = None) -> tuple[Any, Any]:
    """h^{(ℓ)} = (h_AB, h_BA) of level ``level``: the model's blocked terms ascended through ``level`` layers (the
    transitional layers, then the scale-invariant one repeated). A symmetric MERA's are block tensors
    (:func:`~ivhl_jax.physics.tensornet.mera.symmetric.symmetric_terms`; ``symmetry``: the MERA's, needed for the spin
    charges of a model that is not one of the library's)."""
    check_mera(mera)
    check_scalar(level, "level", integer=True, nonnegative=True)
    model = check_model(model)
    h: tuple[Any, Any]
    if MS.is_symmetric(mera):
        sym = symmetry if symmetry is not None else MS.Symmetry(mera.w[0].group)
        h = MS.symmetric_terms(model, sym, "f64")
    else:
        h = blocked_terms(model, jnp.float64)
    top = mera.num_layers - 1
    for z in range(int(level)):
        layer = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), mera.layer(min(z, top)))
        h = ascend(h, layer)
    return h


def ring_energies(h: tuple[Any, Any], sites: int = 4, k: int = 1) -> np.ndarray:
    """The ``k`` lowest eigenvalues of H = Σ_m [h_BA(B_m, A_m) + h_AB(A_m, B_{m+1})] on a periodic ring of ``sites``
    (even, ≥ 4) sites B_0 A_0 B_1 A_1 … of one level (Lanczos, scipy ``eigsh``; dense up to 256 states)."""
    check_scalar(sites, "sites", integer=True, minimum=4)
    if sites % 2:
        raise ValueError(f"sites must be even (B A pairs), got {sites}")
    if not (isinstance(h, (tuple, list)) and len(h) == 2):
        raise TypeError("h must be the pair (h_AB, h_BA) of two-site terms, each (chi, chi, chi, chi)")
    h_ab, h_ba = (np.asarray(T.dense(x), np.float64) for x in h)
    if h_ab.ndim != 4 or len(set(h_ab.shape)) != 1 or h_ab.shape != h_ba.shape:
        raise ValueError(f"h must be two terms of one shape (chi, chi, chi, chi); got {h_ab.shape} and {h_ba.shape}")
    chi = h_ab.shape[0]
    n = chi**sites
    mats = [h_ba.reshape(chi * chi, chi * chi), h_ab.reshape(chi * chi, chi * chi)]

    def matvec(x: np.ndarray) -> np.ndarray:
        psi = np.asarray(x, np.float64).reshape((chi,) * sites)
        out = np.zeros_like(psi)
        for i in range(sites):
            j = (i + 1) % sites
            # move sites (i, j) to the front, apply the bond term, move them back
            moved = np.moveaxis(psi, (i, j), (0, 1)).reshape(chi * chi, -1)
            out += np.moveaxis((mats[i % 2] @ moved).reshape(psi.shape), (0, 1), (i, j))
        return out.reshape(-1)

    if n <= 256:
        mat = np.stack([matvec(e) for e in np.eye(n)], axis=1)
        return np.linalg.eigvalsh(0.5 * (mat + mat.T))[:k]
    from scipy.sparse.linalg import LinearOperator, eigsh

    vals = eigsh(
        LinearOperator((n, n), matvec=matvec, dtype=np.float64), k=k, which="SA", tol=1e-12, return_eigenvectors=False
    )
    return np.sort(vals)


def central_charge_from_energies(e_small: float, e_large: float, spins: int, velocity: float) -> float:
    """c = 4L [E₀(2L) − 2E₀(L)] / (π v) from the ground-state energies of rings of L = ``spins`` and 2L spins."""
    check_scalar(spins, "spins", integer=True, minimum=1)
    check_scalar(velocity, "velocity", positive=True)
    return 4.0 * spins * (e_large - 2.0 * e_small) / (math.pi * velocity)


def central_charge(
    mera: MERA,
    model: Model,
    *,
    velocity: float | None = None,
    levels: tuple[int, ...] | None = None,
    sites: int = 4,
    symmetry: MS.Symmetry | None = None,
) -> dict[str, Any]:
    """Central charge from the MERA's coarse-grained Hamiltonian on rings of ``sites`` sites at consecutive levels
    (see the module docstring). ``velocity``: of the chain's excitations (default: the exact value of the
    library's critical Ising, XX and Potts chains; required for other models). ``levels``: the levels ℓ whose
    rings are diagonalised (default: four, from the top of the transitional layers). Returns the estimate of each
    consecutive pair, ``c`` from the first pair (the smallest rings: the MERA's energy error grows with the ring
    while the Casimir term shrinks, so larger rings are not better at finite χ; the other pairs show how far the
    estimate moves) and the ring energies. ``symmetry``: a symmetric MERA's, for the spin charges of a model that
    is not one of the library's (:func:`level_hamiltonian`)."""
    _x64()
    model = check_model(model)
    if velocity is None:
        velocity = model.cft.velocity if model.cft is not None else None
        if velocity is None:
            raise ValueError(
                f"velocity is needed for {model.name!r} (the library knows it only for the critical "
                f"ising, xx and potts chains): pass velocity=v of the chain's excitations"
            )
    check_scalar(velocity, "velocity", positive=True)
    first = max(1, mera.num_layers - 1)
    levels = tuple(range(first, first + 4)) if levels is None else tuple(int(x) for x in levels)
    if len(levels) < 2 or any(b != a + 1 for a, b in zip(levels, levels[1:])):
        raise ValueError(f"levels must be at least two consecutive levels, got {levels}")
    energies, spins = [], []
    for lev in levels:
        energies.append(float(ring_energies(level_hamiltonian(mera, model, lev, symmetry), sites, 1)[0]))
        spins.append(sites * 2 ** (lev + 1))
    pairs = [
        {
            "spins": (spins[i], spins[i + 1]),
            "c": central_charge_from_energies(energies[i], energies[i + 1], spins[i], velocity),
        }
        for i in range(len(levels) - 1)
    ]
    exact = model.cft.c if model.cft is not None else None
    return {
        "c": pairs[0]["c"],
        "exact": exact,
        "velocity": velocity,
        "levels": levels,
        "spins": spins,
        "ring_energies": energies,
        "pairs": pairs,
        "method": "c = 4L[E0(2L) - 2E0(L)]/(pi v): ground states of the coarse-grained Hamiltonian on rings of "
        f"{sites} sites at consecutive levels",
    }
