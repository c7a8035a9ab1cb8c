"""The scale-invariant MERA with block-sparse symmetric tensors (Z_n, U(1); :mod:`ivhl_jax.physics.tensornet.blocks`).

A chain whose two-site term h conserves a charge (Ising: the Z2 parity ∏Z; XX: U(1), the total S^z) has a MERA
whose every tensor conserves it. Each bond then splits into charge sectors, chosen per layer by the user
(:class:`Symmetry`), and each tensor is stored as its allowed blocks: a Z2 contraction costs about a quarter of
the dense one and the SVD updates are block diagonal.

The superoperators, the sweep, the energy and the scaling superoperators are the dense MERA's own
(:mod:`~ivhl_jax.physics.tensornet.mera.superoperators`, :mod:`~ivhl_jax.physics.tensornet.mera.sweep`), written against
the tensor operations that a dense array and a :class:`~ivhl_jax.physics.tensornet.blocks.BlockTensor` both provide
(:mod:`ivhl_jax.physics.tensornet.ops`): on block tensors every contraction runs block by block and every update
x = −U Vᵀ is the polar factor of a block-diagonal matrix (block diagonal, so the dense update of a symmetric
environment is the same tensor). This module holds what only a symmetric MERA has: its :class:`Symmetry`, the
charge-sorted blocked terms, the legs of every layer, the cold start, bond growth with sectors chosen from the
spectra, and the charge labels of its conformal data.
Embedded in dense tensors (:func:`to_dense`), a symmetric MERA is a dense MERA of the same energy, and the
dense sweep from it follows the symmetric sweep.

Conventions: the blocked site (two spins p0 p1, dimension d²) carries the charge q(p0) + q(p1) (for U(1) less
q_min + q_max of a spin, so the charges are centred: S^z of the block); its basis is sorted by charge
(:func:`physical_permutation`). Flows: operators o[a', b', a, b] (+, +, −, −), u[f1, f2, m1, m2] (+, +, −, −),
w[f0, m1, B'] and v[m2, f3, A'] (+, +, −).

Use it through the stepper's builder: ``mera.evenbly_vidal(model, MERAConfig(..., symmetry=Symmetry(...)))``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_key, check_scalar
from ivhl_jax.physics.tensornet import blocks as S
from ivhl_jax.physics.tensornet.blocks import BlockTensor
from ivhl_jax.physics.tensornet.mera.config import (
    MERA,
    MERAConfig,
    check_mera,
    layer_shapes,
    precision_dtype,
    require_x64,
)
from ivhl_jax.physics.tensornet.mera.models import Model, blocked_terms, check_model, potts_chain
from ivhl_jax.physics.tensornet.mera.superoperators import descend, mirror_wv, reflect

#: The symmetry of the library's models and the charge of each spin basis state (Ising: Z2, |↑⟩ even; XX: U(1),
#: the number of ↓ spins, centred per block; Potts in its charge basis, :func:`potts_charge_basis`: Z3, the
#: eigenvalue ω^k of τ. Z3 is not diagonal in the σ basis of :func:`~ivhl_jax.physics.tensornet.mera.models.potts`).
DEFAULT_SPIN_CHARGES = {"ising": ("Z2", (0, 1)), "xx": ("U1", (0, 1)), "potts_z3": ("Z3", (0, 1, 2))}


def potts_charge_basis(f: float = 1.0) -> Model:
    """The 3-state Potts chain of :func:`~ivhl_jax.physics.tensornet.mera.models.potts` in the basis where its Z3 charge
    is diagonal (the Fourier transform of the σ basis: τ = diag(1, ω, ω²), σ the cyclic shift S|k⟩ = |k+1⟩):
    H = −Σ (S_i S_{i+1}ᵀ + S_iᵀ S_{i+1}) − f Σ 2cos(2πk_i/3), real, with the same spectrum, e₀ and CFT; the
    charge of |k⟩ is k (its default :class:`Symmetry` is ``Symmetry("Z3", ...)``)."""
    shift = np.roll(np.eye(3), 1, axis=0)
    bond = -(np.kron(shift, shift.T) + np.kron(shift.T, shift))
    return potts_chain(bond, -np.diag(2.0 * np.cos(2.0 * np.pi * np.arange(3) / 3.0)), f, "potts_z3")


def _sector_tuple(value: Any, group: S.Group, name: str) -> tuple[tuple[int, int], ...]:
    leg = S.make_leg(value, group, name=name)
    return tuple(zip(leg.charges, leg.dims))


@dataclasses.dataclass(frozen=True)
class Symmetry:
    """The symmetry of a MERA and its charge sectors (hashable: it is part of the static :class:`MERAConfig`).

    group: "Z2", "Z3", …, "U1" (or a :class:`~ivhl_jax.physics.tensornet.blocks.Group`).
    sectors: the sectors of the bond above each layer, ``{charge: dim}``: one mapping for every layer, or one per
      layer (``layers + 1``, bottom first; the last two equal). Each layer's dims must add up to its χ. None:
      each layer's χ split over the charges in proportion to what its isometry can carry
      (:func:`default_sectors`); a ladder then grows them from the spectra (:func:`grow_by_spectrum`).
    mid_sectors: the same for χ_mid (u's output bond); None: the layer's input sectors (χ_mid = χ_in), or
      χ_mid split over them in proportion.
    spin_charges: the charge of each spin basis state (length d; the model's term must conserve it); None: the
      library model's default (:data:`DEFAULT_SPIN_CHARGES`).
    """

    group: Any = "Z2"
    sectors: Any = None
    mid_sectors: Any = None
    spin_charges: tuple | None = None

    def __post_init__(self) -> None:
        g = S.group_from_name(self.group)
        object.__setattr__(self, "group", g)
        for name in ("sectors", "mid_sectors"):
            val = getattr(self, name)
            if val is None:
                continue
            if isinstance(val, dict) or (
                isinstance(val, (tuple, list))
                and val
                and isinstance(val[0], (tuple, list))
                and len(val[0]) == 2
                and not isinstance(val[0][0], (tuple, list, dict))
            ):
                object.__setattr__(self, name, _sector_tuple(val, g, name))
            elif isinstance(val, (tuple, list)):
                object.__setattr__(
                    self,
                    name,
                    tuple(None if v is None else _sector_tuple(v, g, f"{name}[{i}]") for i, v in enumerate(val)),
                )
            else:
                raise ValueError(f"{name} must be {{charge: dim}} or one such mapping per layer, got {val!r}")
        if self.spin_charges is not None:
            sc = tuple(self.spin_charges)
            for q in sc:
                g.check_charge(q, "spin_charges")
            object.__setattr__(self, "spin_charges", sc)

    def per_layer(self, name: str, n: int) -> tuple[Any, ...]:
        val = getattr(self, name)
        if val is None:
            return (None,) * n
        if val and val[0] is not None and isinstance(val[0][0], (int, np.integer)):  # one mapping, every layer
            return (val,) * n
        if len(val) != n:
            raise ValueError(f"symmetry.{name} needs one mapping per layer ({n}, bottom first), got {len(val)}")
        return tuple(val)

    def check_config(self, config: MERAConfig) -> None:
        """What can be checked without the model: the scale-invariant layer's sectors add up to its χ."""
        top = self.per_layer("sectors", config.layers + 1)[-1]
        if top is None:
            return
        total = sum(d for _, d in top)
        if total != config.top_chi:
            raise ValueError(
                f"symmetry.sectors of the scale-invariant layer add up to {total} ({dict(top)}), but "
                f"chi={config.top_chi}: give sectors whose dims sum to chi"
            )


def spin_charges(model: Model, symmetry: Symmetry) -> tuple[int, ...]:
    """The charge of each spin basis state: ``symmetry.spin_charges`` or the model's default."""
    if symmetry.spin_charges is not None:
        sc = symmetry.spin_charges
    else:
        family = model.name.split("(")[0]
        if family not in DEFAULT_SPIN_CHARGES or S.group_from_name(DEFAULT_SPIN_CHARGES[family][0]) != symmetry.group:
            raise ValueError(
                f"no default {symmetry.group.name} charges for the model {model.name}: pass "
                "Symmetry(spin_charges=...) (the charge of each spin basis state)"
            )
        sc = DEFAULT_SPIN_CHARGES[family][1]
    if len(sc) != model.d:
        raise ValueError(f"symmetry.spin_charges has {len(sc)} entries, the model's spins have d={model.d} states")
    return tuple(int(q) for q in sc)


def _block_charges(model: Model, symmetry: Symmetry) -> np.ndarray:
    q = np.asarray(spin_charges(model, symmetry), np.int64)
    c = (q[:, None] + q[None, :]).reshape(-1)
    if symmetry.group.order:
        return c % symmetry.group.order
    return c - (q.min() + q.max())


def physical_permutation(model: Model, symmetry: Symmetry) -> np.ndarray:
    """The blocked site's basis sorted by charge: index k of the charge-sorted basis is the model's ``perm[k]``."""
    return np.argsort(_block_charges(model, symmetry), kind="stable")


def physical_leg(model: Model, symmetry: Symmetry) -> S.Leg:
    c = _block_charges(model, symmetry)
    charges, counts = np.unique(c, return_counts=True)
    return S.Leg(tuple(int(x) for x in charges), tuple(int(x) for x in counts), 1)


def check_commutes(model: Model, symmetry: Symmetry, atol: float = 1e-12) -> None:
    """ValueError (one line) when the model's term does not conserve the charge: some ⟨a'b'|h|ab⟩ ≠ 0 with
    q(a') + q(b') ≠ q(a) + q(b)."""
    q = np.asarray(spin_charges(model, symmetry), np.int64)
    t = np.asarray(model.term, np.float64)
    diff = q[:, None, None, None] + q[None, :, None, None] - q[None, None, :, None] - q[None, None, None, :]
    if symmetry.group.order:
        diff = diff % symmetry.group.order
    bad = float(np.abs(t[diff != 0]).max()) if (diff != 0).any() else 0.0
    if bad > atol * max(1.0, float(np.abs(t).max())):
        raise ValueError(
            f"model {model.name} does not commute with the {symmetry.group.name} symmetry of spin charges "
            f"{tuple(int(x) for x in q)}: |<a'b'|h|ab>| = {bad:.2e} between different charges"
        )


def symmetric_terms(model: Model, symmetry: Symmetry, policy: Any = None) -> tuple[BlockTensor, BlockTensor]:
    """The blocked terms (h_AB, h_BA) of :func:`~ivhl_jax.physics.tensornet.mera.models.blocked_terms` in the
    charge-sorted basis, as block tensors (legs (P, P, P†, P†)), in the dtype of ``policy``
    (:func:`~ivhl_jax.physics.tensornet.mera.config.precision_dtype`)."""
    check_commutes(model, symmetry)
    dtype = precision_dtype(policy)
    perm = physical_permutation(model, symmetry)
    leg = physical_leg(model, symmetry)
    legs = (leg, leg, leg.dual(), leg.dual())
    out = []
    for h in blocked_terms(model, dtype):
        hp = np.asarray(h)[np.ix_(perm, perm, perm, perm)]
        out.append(S.from_dense(hp, legs, symmetry.group, 0, name="the blocked term"))
    return out[0], out[1]


# ------------------------------------------------------------------------------------------ structure


@dataclasses.dataclass(frozen=True)
class LayerLegs:
    """The legs of one layer: its input (fine) bond, u's output bond and its output (coarse) bond."""

    inp: S.Leg
    mid: S.Leg
    out: S.Leg


def layer_legs(model: Model, config: MERAConfig) -> tuple[LayerLegs, ...]:
    """The legs of every layer from ``config.symmetry``; ValueErrors (one line) name ``symmetry.sectors`` /
    ``symmetry.mid_sectors`` when a layer's dims do not add up to its χ / χ_mid or a sector cannot be carried."""
    sym = config.symmetry
    return legs_from(physical_leg(model, sym), sym, config.layer_shapes(model.d * model.d))


def legs_from(inp: S.Leg, sym: Symmetry, shapes: Any) -> tuple[LayerLegs, ...]:
    """:func:`layer_legs` from the bottom leg ``inp`` and the (χ_in, χ_mid, χ_out) of every layer."""
    g = sym.group
    n = len(shapes)
    outs, mids = sym.per_layer("sectors", n), sym.per_layer("mid_sectors", n)
    res = []
    for z, ((chi_in, m, chi_out), so, sm) in enumerate(zip(shapes, outs, mids)):
        if sm is None and m < chi_in:
            sm = default_sectors(dict(zip(inp.charges, inp.dims)), m, g)
        if so is None:
            mid_leg = inp if sm is None else _leg(dict(sm))
            so = (
                tuple(zip(inp.charges, inp.dims))
                if z == n - 1
                else default_sectors(S.fused_dims((inp, mid_leg), g), chi_out, g)
            )
        tot = sum(d for _, d in so)
        if tot != chi_out:
            raise ValueError(
                f"symmetry.sectors[{z}] add up to {tot} ({dict(so)}), but layer {z} has chi={chi_out}: "
                "give sectors whose dims sum to chi"
            )
        if sm is None:
            if m != chi_in:
                raise ValueError(
                    f"layer {z} has chi_mid={m} < chi_in={chi_in}: pass symmetry.mid_sectors (dims "
                    f"summing to {m}; the input sectors are {dict(zip(inp.charges, inp.dims))})"
                )
            mid = inp
        else:
            tm = sum(d for _, d in sm)
            if tm != m:
                raise ValueError(
                    f"symmetry.mid_sectors[{z}] add up to {tm} ({dict(sm)}), but layer {z} has chi_mid={m}"
                )
            mid = S.Leg(tuple(q for q, _ in sm), tuple(d for _, d in sm), 1)
        for q, d in zip(mid.charges, mid.dims):
            if d > inp.sector_dim(q):
                raise ValueError(
                    f"symmetry.mid_sectors[{z}]: charge {q} has {d} states, more than the "
                    f"{inp.sector_dim(q)} of layer {z}'s input bond (u starts as the identity on each "
                    "sector)"
                )
        out = S.Leg(tuple(q for q, _ in so), tuple(d for _, d in so), 1)
        avail = S.fused_dims((inp, mid), g)
        for q, d in zip(out.charges, out.dims):
            if d > avail.get(q, 0):
                raise ValueError(
                    f"symmetry.sectors[{z}]: charge {q} has {d} states, but the isometry w of layer {z} "
                    f"can carry at most {avail.get(q, 0)} of that charge"
                )
        if z == n - 1 and (out.charges, out.dims) != (inp.charges, inp.dims):
            raise ValueError(
                f"symmetry.sectors: the scale-invariant layer maps its bond to itself, so its sectors "
                f"({dict(so)}) must equal the ones below ({dict(zip(inp.charges, inp.dims))})"
            )
        res.append(LayerLegs(inp, mid, out))
        inp = out
    return tuple(res)


def default_sectors(cap: dict[int, int], n: int, group: S.Group | None = None) -> tuple[tuple[int, int], ...]:
    """``n`` states split over the charges in proportion to ``cap`` (what a bond can carry of each charge; the
    largest remainders, nearer charge 0 first on a tie, take the states left), each at most ``cap[q]``.

    ``group``: a charge q and its conjugate −q that the bond can carry equally often get equally many states — the
    states left go to such a pair together, a last odd one to a self-conjugate charge (0) — so the split of a
    bond symmetric under q → −q (every bond of a charge-conjugation-symmetric chain, XX or Potts) stays symmetric;
    only when no self-conjugate charge has room is a pair split."""
    total = sum(cap.values())
    if n > total:
        raise ValueError(f"chi={n} is more states than the layer can carry ({total})")
    exact = {q: n * c / total for q, c in cap.items()}
    count = {q: min(cap[q], int(x)) for q, x in exact.items()}
    units: list[tuple[int, ...]] = []
    for q in cap:
        qc = q if group is None else group.reduce(-q)
        if qc == q or cap.get(qc) != cap[q]:
            units.append((q,))
        elif q < qc:
            units.append((q, qc))
    order = sorted(units, key=lambda u: (-(exact[u[0]] - int(exact[u[0]])), abs(u[0]), u[0]))
    while sum(count.values()) < n:
        left = n - sum(count.values())
        fits = [u for u in order if len(u) <= left and all(count[q] < cap[q] for q in u)]
        unit = fits[0] if fits else (next(q for u in order for q in u if count[q] < cap[q]),)
        for q in unit:
            count[q] += 1
        order = order[1:] + order[:1]
    return tuple((q, d) for q, d in sorted(count.items()) if d)


def _u_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.inp, ll.inp, ll.mid.dual(), ll.mid.dual())


def _w_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.inp, ll.mid, ll.out.dual())


def _v_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.mid, ll.inp, ll.out.dual())


def _op_legs(leg: S.Leg) -> tuple[S.Leg, ...]:
    return (leg, leg, leg.dual(), leg.dual())


def init_symmetric(key: jax.Array, model: Model, config: MERAConfig, *, policy: Any = None) -> MERA:
    """Cold start as :func:`~ivhl_jax.physics.tensornet.mera.config.init_mera`, block by block: u the identity on each
    sector (truncated to χ_mid), w the polar factor of uniform(0, 1) blocks, v = mirror(w) with ``refsym`` (else
    its own draw), ρ = 𝟙/χ² at the top.

    ``key``: a PRNG key (required: there is no default start); ``policy``: the precision
    (:func:`~ivhl_jax.physics.tensornet.mera.config.precision_dtype`: None / ``"f64"`` float64, ``"f32"`` float32)."""
    check_key(key)
    if not isinstance(config, MERAConfig) or not isinstance(config.symmetry, Symmetry):
        raise TypeError("config must be a MERAConfig with a mera.Symmetry (config.symmetry)")
    lls = layer_legs(check_model(model), config)
    dtype = jnp.dtype(precision_dtype(policy))
    if dtype == jnp.float64:
        require_x64("mera.symmetric.init_symmetric", f32="or pass policy='f32'")
    return init_from_legs(key, lls, config.symmetry.group, bool(config.refsym), dtype)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def init_from_legs(key: jax.Array, lls: tuple[LayerLegs, ...], group: S.Group, refsym: bool, dtype: Any) -> MERA:
    """The cold start of :func:`init_symmetric` from the legs of every layer (:func:`layer_legs`), compiled once
    per structure."""
    us, ws, vs = [], [], []
    keys = jax.random.split(key, 2 * len(lls))
    for z, ll in enumerate(lls):
        legs = _u_legs(ll)
        ub = {}
        for k in S.allowed_sectors(legs, group, 0):
            e1 = jnp.eye(ll.inp.sector_dim(k[0]), ll.mid.sector_dim(k[2]), dtype=dtype) * (k[0] == k[2])
            e2 = jnp.eye(ll.inp.sector_dim(k[1]), ll.mid.sector_dim(k[3]), dtype=dtype) * (k[1] == k[3])
            ub[k] = jnp.einsum("ac,bd->abcd", e1, e2)
        us.append(BlockTensor(ub, legs, group, 0))

        def draw(kk: jax.Array, legs: tuple[S.Leg, ...]) -> BlockTensor:
            t = S.zeros(legs, group, 0, dtype)
            rng = jax.random.split(kk, max(1, len(t.blocks)))
            t = BlockTensor(
                {
                    # drawn in the default float and cast, so a key gives the same start in every dtype
                    k: jax.random.uniform(r, b.shape, jnp.result_type(float)).astype(dtype)
                    for r, (k, b) in zip(rng, t.blocks.items())
                },
                t.legs,
                group,
                0,
            )
            return S.polar(t, 1)

        ws.append(draw(keys[2 * z], _w_legs(ll)))
        vs.append(mirror_wv(ws[-1]) if refsym else draw(keys[2 * z + 1], _v_legs(ll)))
    top = lls[-1].out
    rho = S.identity(top, group, 2, dtype) / float(top.dim**2)
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, jnp.zeros((), jnp.int32))  # type: ignore[arg-type]


def is_symmetric(mera: Any) -> bool:
    """Whether ``mera`` holds block-sparse symmetric tensors."""
    return isinstance(mera, MERA) and isinstance(mera.w[0], BlockTensor)


def to_dense(mera: Any, model: Model | None = None, symmetry: Symmetry | None = None) -> MERA:
    """The dense MERA of the same tensors (:meth:`BlockTensor.to_dense`). With ``model`` and ``symmetry`` the
    bottom legs are returned to the model's own basis (then every dense tool applies: :func:`energy_per_site`
    with ``blocked_terms(model)``, the central charge, the dense stepper's ``init(mera=...)``). A dense MERA is
    returned as it is. ``symmetry`` may be left out for the library's models (their default spin charges)."""
    check_mera(mera)
    if not is_symmetric(mera):
        return mera
    d = jax.tree_util.tree_map(
        lambda x: x.to_dense() if isinstance(x, BlockTensor) else x, mera, is_leaf=lambda x: isinstance(x, BlockTensor)
    )
    if model is None:
        return d
    if symmetry is None:
        symmetry = Symmetry(mera.w[0].group)
    inv = np.argsort(physical_permutation(check_model(model), symmetry))
    u0 = d.u[0][inv][:, inv]
    w0 = d.w[0][inv]
    v0 = d.v[0][:, inv]
    return d.replace(u=(u0,) + d.u[1:], w=(w0,) + d.w[1:], v=(v0,) + d.v[1:])


# ------------------------------------------------------------------------------------------ bond growth


def level_densities(mera: Any) -> list[tuple[BlockTensor, BlockTensor]]:
    """The two-site density matrices (ρ_AB, ρ_BA) at the input of every layer, bottom first: entry z is the
    density on layer z's input bond (entry L, the scale-invariant layer's, is the stored top ρ; below it
    ρ^(z) = 𝒟_z(ρ^(z+1)))."""
    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA")
    n = mera.num_layers
    rhos: list[Any] = [None] * n
    rhos[n - 1] = (mera.rho_ab, mera.rho_ba)
    for z in reversed(range(n - 1)):
        rhos[z] = descend(rhos[z + 1], mera.layer(z))
    return rhos


def _charged_eigs(rho: BlockTensor, k: int) -> list[tuple[float, int]]:
    """(eigenvalue, charge) of a charge-0 density matrix on k legs (outs then ins), the charge of an eigenvector
    the fused charge Σ q of its k (outgoing) legs; largest first."""
    group = rho.group
    out = []
    for q_cols, ev in S.block_eigvalsh(rho).items():
        q = group.reduce(-q_cols)  # the rows' (outgoing legs') fused charge
        out += [(float(x), q) for x in np.asarray(ev, np.float64)]
    return sorted(out, key=lambda t: (-t[0], t[1]))


def _pick(
    ranked: list[tuple[float, int]],
    n: int,
    cap: dict[int, int],
    group: S.Group | None = None,
    floor: dict[int, int] | None = None,
) -> dict[int, int]:
    """The charges of the ``n`` largest eigenvalues of ``ranked``, each charge at most ``cap[q]`` states and at
    least ``floor[q]`` (the bond's present sectors: a ladder only grows them); when the ranking runs out, the
    remaining states go to the charges with the most room left.

    ``group``: keep every charge q and its conjugate −q equal in dimension (a charge-conjugation-symmetric model,
    whose spectra in q and −q agree): the k-th eigenvalues of q and −q are taken together, ranked by their mean,
    and an odd remainder goes to a self-conjugate charge (0); only when no self-conjugate charge has room left is
    a pair split."""
    units: list[tuple[float, tuple[int, ...]]]
    if group is None:
        units = [(lam, (q,)) for lam, q in ranked]
    else:
        by_q: dict[int, list[float]] = {}
        for lam, q in ranked:
            by_q.setdefault(q, []).append(lam)
        units = []
        for q, vals in by_q.items():
            qc = group.reduce(-q)
            if qc == q:
                units += [(lam, (q,)) for lam in vals]
            elif q < qc:
                units += [(0.5 * (a + b), (q, qc)) for a, b in zip(vals, by_q.get(qc, []))]
        units.sort(key=lambda t: (-t[0], t[1]))

    def room(q: int) -> int:
        return cap.get(q, 0) - count.get(q, 0)

    count: dict[int, int] = dict(floor or {})
    total = sum(count.values())
    seen: dict[int, int] = {}
    for _, qs in units:
        if total >= n:
            break
        # the first floor[q] eigenvectors of a charge are kept already (the bond's old states)
        need = [q for q in qs if seen.get(q, 0) >= count.get(q, 0)]
        for q in qs:
            seen[q] = seen.get(q, 0) + 1
        if need and total + len(need) <= n and all(room(q) > 0 for q in need):
            for q in need:
                count[q] = count.get(q, 0) + 1
            total += len(need)
    while total < n:
        options: list[tuple[int, ...]] = [(q,) for q in sorted(cap) if room(q) > 0]
        if group is not None:
            paired: list[tuple[int, ...]] = [
                (q, group.reduce(-q)) if q != group.reduce(-q) else (q,)
                for q in sorted(cap)
                if q <= group.reduce(-q) and all(room(x) > 0 for x in {q, group.reduce(-q)})
            ]
            fits: list[tuple[int, ...]] = [qs for qs in paired if len(qs) <= n - total]
            if not fits and n - total == 1:
                # one state left and no self-conjugate charge with room: give one self-conjugate state back for a
                # pair (one more state in all) rather than split a pair
                taken = [q for q in sorted(count) if q == group.reduce(-q) and count[q] > (floor or {}).get(q, 0)]
                two: list[tuple[int, ...]] = [qs for qs in paired if len(qs) == 2]
                if taken and two:
                    count[taken[0]] -= 1
                    total -= 1
                    fits = two
            options = fits or options
        if not options:
            raise ValueError(f"chi={n} is more states than the layer can carry ({sum(cap.values())})")
        qs = max(options, key=lambda t: min(room(q) for q in t))
        for q in qs:
            count[q] = count.get(q, 0) + 1
        total += len(qs)
    return dict(sorted(count.items()))


def charge_conjugation_symmetric(model: Model, symmetry: Symmetry, atol: float = 1e-12) -> bool:
    """Whether the model's term commutes with charge conjugation C: the spin-state permutation that maps the k-th
    state of charge q to the k-th state of charge −q (U(1): q_min + q_max − q of the spin charges; Z_n: −q mod n).
    XX (the spin flip) and the Z3 Potts chain in its charge basis have it; then the reduced density matrices'
    spectra in q and −q agree and :func:`spectrum_sectors` keeps ±q equal (``pairs``)."""
    q = np.asarray(spin_charges(model, symmetry), np.int64)
    g = symmetry.group
    conj = (q.min() + q.max() - q) if g.order == 0 else (-q) % g.order
    perm = np.empty(len(q), np.int64)
    for c in np.unique(q):
        src, dst = np.flatnonzero(q == c), np.flatnonzero(q == conj[q == c][0])
        if len(src) != len(dst):
            return False
        perm[src] = dst
    t = np.asarray(model.term, np.float64)
    tc = t[np.ix_(perm, perm, perm, perm)]
    return bool(np.abs(tc - t).max() <= atol * max(1.0, float(np.abs(t).max())))


def spectrum_sectors(mera: Any, symmetry: Symmetry, chi: Any, chi_mid: Any = None, *, pairs: bool = False) -> Symmetry:
    """The sectors of a larger bond dimension chosen from the reduced density matrices' spectra, charge by charge.

    ``chi``/``chi_mid`` as in :class:`~ivhl_jax.physics.tensornet.mera.config.MERAConfig` for the MERA's number of
    layers (an int, capped per layer at what the layer can carry, or one per layer). Bottom-up, for each layer z whose
    χ_out grows, the bond above it keeps the eigenvectors of the largest eigenvalues of the two-site density
    matrix ½(ρ_AB + ρ_BA) of the level it coarse-grains (``χ_out`` of the χ_in² eigenvalues, pooled across the
    charge sectors; an eigenvalue counts for the fused charge q₁ + q₂ of its two sites): the states a blocking
    of two sites into one would keep. The scale-invariant bond (above the last transitional layer and the SI
    layer) uses the fixed-point ρ at the top. Each charge is capped at what the layer's isometry can carry
    (the fused dimension of its input and χ_mid bonds). A χ_mid that grows keeps, per charge, the states of the
    largest eigenvalues of the one-site density tr₂ ρ of its level (at most the input bond's sector). A bond
    whose dimension does not change keeps its sectors. ``pairs``: every charge q and its conjugate −q get the
    same dimension (for a charge-conjugation-symmetric model, :func:`charge_conjugation_symmetric`; the
    eigenvalues of q and −q are taken in pairs, an odd remainder goes to charge 0).

    Returns a :class:`Symmetry` (the group and spin charges of ``symmetry``, one sectors / mid_sectors mapping per
    layer) for ``MERAConfig(chi=..., chi_mid=..., layers=mera.num_layers - 1, symmetry=...)``; the matching
    config's ``layer_shapes`` gives the χ per layer (:func:`grow_by_spectrum` does both and grows the MERA).
    """
    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA")
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a mera.Symmetry, got {type(symmetry).__name__}")
    group = mera.w[0].group
    if group != symmetry.group:
        raise ValueError(f"symmetry is {symmetry.group.name} but the MERA's tensors are {group.name}")
    n = mera.num_layers
    shapes = layer_shapes(chi, chi_mid, n - 1, mera.d)
    ins = [w.legs[0].with_flow(1) for w in mera.w]
    mids = [u.legs[2].with_flow(1) for u in mera.u]
    outs = [w.legs[2].with_flow(1) for w in mera.w]
    for z, (_, m, c) in enumerate(shapes):
        if c < outs[z].dim or m < mids[z].dim:
            raise ValueError(
                f"chi={chi}, chi_mid={chi_mid}: layer {z} would shrink from (chi_mid, chi) = "
                f"({mids[z].dim}, {outs[z].dim}) to ({m}, {c}); a ladder only grows the bonds"
            )
    rhos = level_densities(mera)
    conj = group if pairs else None
    inp = ins[0]
    sectors, mid_sectors = [], []
    for z, (_, m, chi_out) in enumerate(shapes):
        if z == n - 1:  # the SI layer maps its bond to itself
            out_leg = inp
            new_mid = _mid_sectors(mids[z], m, inp, rhos[z], conj)
        else:
            new_mid = _mid_sectors(mids[z], m, inp, rhos[z], conj)
            if chi_out == outs[z].dim and all(inp.sector_dim(q) >= ins[z].sector_dim(q) for q in ins[z].charges):
                out_leg = outs[z]
            else:
                level = n - 1 if z == n - 2 else z
                ra, rb = rhos[level]
                cap = S.fused_dims((inp, new_mid), group)
                floor = dict(zip(outs[z].charges, outs[z].dims))
                out_leg = _leg(_pick(_charged_eigs((ra + rb) * 0.5, 2), chi_out, cap, conj, floor))
        sectors.append(tuple(zip(out_leg.charges, out_leg.dims)))
        mid_sectors.append(tuple(zip(new_mid.charges, new_mid.dims)))
        inp = out_leg
    return Symmetry(symmetry.group, tuple(sectors), tuple(mid_sectors), symmetry.spin_charges)


def _leg(counts: dict[int, int]) -> S.Leg:
    items = sorted((q, d) for q, d in counts.items() if d)
    return S.Leg(tuple(q for q, _ in items), tuple(d for _, d in items), 1)


def _mid_sectors(
    old_mid: S.Leg, m: int, inp: S.Leg, rho: tuple[BlockTensor, BlockTensor], conj: S.Group | None = None
) -> S.Leg:
    """χ_mid's sectors: the old ones if its size is unchanged, else the ``m`` largest eigenvalues of the one-site
    density of the level, per charge, at most the (new) input bond's sector."""
    cap = dict(zip(inp.charges, inp.dims))
    if m == old_mid.dim and all(old_mid.sector_dim(q) <= cap.get(q, 0) for q in old_mid.charges):
        return old_mid
    if m == inp.dim:
        return inp
    ra, rb = rho
    eye = S.identity(ra.legs[1].with_flow(1), ra.group, 1, ra.dtype)
    one = S.contract("abcd,db->ac", (ra + rb) * 0.5, eye)  # tr₂ ρ
    return _leg(_pick(_charged_eigs(one, 1), m, cap, conj, dict(zip(old_mid.charges, old_mid.dims))))


def insert_layers(mera: Any, layers: int) -> MERA:
    """The symmetric MERA with ``layers`` transitional layers: copies of the scale-invariant layer inserted below it
    (as the dense :func:`~ivhl_jax.physics.tensornet.mera.ladder.grow`; the same tensors, so at the fixed point of the
    SI layer's 𝒟 the energy is unchanged). Fewer layers than the MERA's: returned as it is."""
    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA")
    check_scalar(layers, "layers", integer=True, minimum=1)
    extra = int(layers) + 1 - mera.num_layers
    if extra <= 0:
        return mera
    return mera.replace(
        u=mera.u[:-1] + (mera.u[-1],) * (extra + 1),
        w=mera.w[:-1] + (mera.w[-1],) * (extra + 1),
        v=mera.v[:-1] + (mera.v[-1],) * (extra + 1),
    )


def grow_symmetric(mera: Any, key: jax.Array, model: Model, config: MERAConfig, mix: float = 1e-3) -> MERA:
    """The symmetric MERA enlarged to the bonds of ``config`` (its symmetry's sectors; a config with more layers
    first inserts copies of the scale-invariant layer below it, :func:`insert_layers`), keeping every old block:
    u, w, v are padded with zeros and each fused-charge block's new columns completed to an exact isometry
    (random, orthogonal to the old columns; with ``config.refsym`` u ← polar(½(u + R u)), v = mirror(w)); the top
    density matrices become (1 − ``mix``) ρ (padded) + ``mix`` 𝟙/χ². With ``mix=0`` the
    energy is unchanged (the new states carry no weight until the next sweep). Every sector must be at least
    as large as the MERA's (ValueError naming ``config.symmetry``)."""
    check_key(key)
    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA")
    if not isinstance(config, MERAConfig) or not isinstance(config.symmetry, Symmetry):
        raise TypeError("config must be a MERAConfig with a mera.Symmetry")
    check_scalar(mix, "mix", minimum=0.0, maximum=1.0)
    lls = layer_legs(check_model(model), config)
    if len(lls) < mera.num_layers:
        raise ValueError(
            f"config has {len(lls) - 1} transitional layers, the MERA {mera.num_layers - 1}: grow_symmetric can only "
            "add layers (pass config.layers >= the MERA's)"
        )
    return grow_to_legs(mera, key, lls, float(mix), bool(config.refsym))


def grow_to_legs(mera: Any, key: jax.Array, lls: tuple[LayerLegs, ...], mix: float, refsym: bool) -> MERA:
    """:func:`grow_symmetric` to the legs ``lls`` of every layer (:func:`layer_legs`)."""
    mera = insert_layers(mera, len(lls) - 1)
    for z, ll in enumerate(lls):
        u, w, _ = mera.layer(z)
        for name, old, new in (("inp", w.legs[0], ll.inp), ("mid", u.legs[2], ll.mid), ("out", w.legs[2], ll.out)):
            small = [q for q in old.charges if new.sector_dim(q) < old.sector_dim(q)]
            if small:
                raise ValueError(
                    f"config.symmetry: layer {z}'s {name} bond would shrink in charge {small[0]} "
                    f"({old.sector_dim(small[0])} -> {new.sector_dim(small[0])} states); grow_symmetric can only "
                    "enlarge sectors"
                )
    return _grow_symmetric(mera, key, lls, mix, refsym)


def grow_spectral(
    mera: Any,
    key: jax.Array,
    chi: Any,
    chi_mid: Any = None,
    mix: float = 1e-3,
    layers: int | None = None,
    refsym: bool = False,
    model: Model | None = None,
) -> MERA:
    """The symmetric MERA grown to ``chi``/``chi_mid`` (as :func:`~ivhl_jax.physics.tensornet.mera.ladder.grow`), each
    bond's sectors chosen from the reduced density matrices' spectra (:func:`spectrum_sectors`; with ``model``, a
    charge-conjugation-symmetric chain keeps ±q sectors equal); ``layers`` more than the MERA's inserts copies of
    the scale-invariant layer first. The stepper continues from it with ``init(mera=...)``: its sweep runs on the
    MERA's own sectors."""
    check_key(key)
    check_scalar(mix, "mix", minimum=0.0, maximum=1.0)
    group = mera.w[0].group
    sym = Symmetry(group)
    pairs = model is not None and charge_conjugation_symmetric(check_model(model), sym)
    if layers is not None:
        mera = insert_layers(mera, layers)
    new = spectrum_sectors(mera, sym, chi, chi_mid, pairs=pairs)
    shapes = layer_shapes(chi, chi_mid, mera.num_layers - 1, mera.d)
    lls = legs_from(mera.w[0].legs[0].with_flow(1), new, shapes)
    return grow_to_legs(mera, key, lls, float(mix), bool(refsym))


def _old_columns(t: BlockTensor, new_legs: tuple[S.Leg, ...], k: int) -> dict[int, np.ndarray]:
    """For each fused column charge of the padded tensor's matrix
    (:func:`~ivhl_jax.physics.tensornet.blocks.matrix_blocks` with its last k legs as columns): a boolean mask of the
    columns that hold the old tensor's columns (NumPy, from the static legs)."""
    old_legs, cols = t.legs[-k:], new_legs[-k:]
    out = {}
    for q, parts in S.fused_layout(cols, t.group).items():
        masks = []
        for ck, _, size in parts:
            new_shape = tuple(leg.sector_dim(c) for leg, c in zip(cols, ck))
            m = np.zeros(new_shape, bool)
            m[tuple(slice(0, leg.sector_dim(c)) for leg, c in zip(old_legs, ck))] = True
            masks.append(m.reshape(size))
        out[q] = np.concatenate(masks)
    return out


def _pad(t: BlockTensor, new_legs: tuple[S.Leg, ...]) -> BlockTensor:
    blocks = {}
    for sector in S.allowed_sectors(new_legs, t.group, t.charge):
        shape = tuple(leg.sector_dim(q) for leg, q in zip(new_legs, sector))
        b = jnp.zeros(shape, t.dtype)
        if sector in t.blocks:
            b = b.at[tuple(slice(0, n) for n in t.blocks[sector].shape)].set(t.blocks[sector])
        blocks[sector] = b
    return BlockTensor(blocks, new_legs, t.group, t.charge)


def _complete(key: jax.Array, t: BlockTensor, new_legs: tuple[S.Leg, ...], k: int) -> BlockTensor:
    """``t`` padded to ``new_legs``, each fused-charge block's new columns drawn orthogonal to the old ones (QR):
    an exact isometry from the last k legs that equals ``t`` on its old columns."""
    padded = _pad(t, new_legs)
    old = _old_columns(t, new_legs, k)
    mats = S.matrix_blocks(padded, k)
    keys = jax.random.split(key, max(1, len(mats)))
    out = {}
    for r, (q, mat) in zip(keys, sorted(mats.items())):
        keep, new = np.flatnonzero(old[q]), np.flatnonzero(~old[q])
        if not len(new):
            out[q] = mat
            continue
        base = mat[:, keep]
        extra = jax.random.normal(r, (mat.shape[0], len(new)), mat.dtype)
        extra = extra - base @ (base.T @ extra)
        qq, rr = jnp.linalg.qr(extra)
        out[q] = mat.at[:, new].set(qq * jnp.sign(jnp.diagonal(rr))[None, :])
    return S.from_matrix_blocks(out, padded, k)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _grow_symmetric(mera: Any, key: jax.Array, lls: tuple[LayerLegs, ...], mix: float, refsym: bool) -> MERA:
    us, ws, vs = [], [], []
    keys = jax.random.split(key, 3 * len(lls))
    for z, ll in enumerate(lls):
        u, w, v = mera.layer(z)
        un = _complete(keys[3 * z], u, _u_legs(ll), 2)
        if refsym:
            un = S.polar((un + reflect(un)) * 0.5, 2)
        wn = _complete(keys[3 * z + 1], w, _w_legs(ll), 1)
        vn = mirror_wv(wn) if refsym else _complete(keys[3 * z + 2], v, _v_legs(ll), 1)
        us.append(un)
        ws.append(wn)
        vs.append(vn)
    top = lls[-1].out
    eye = S.identity(top, mera.w[0].group, 2, mera.rho_ab.dtype) / float(top.dim**2)

    def pad_rho(r: BlockTensor) -> BlockTensor:
        return _pad(r, _op_legs(top)) * (1.0 - mix) + eye * mix

    return MERA(tuple(us), tuple(ws), tuple(vs), pad_rho(mera.rho_ab), pad_rho(mera.rho_ba), mera.sweeps)  # type: ignore[arg-type]


def grow_by_spectrum(
    mera: Any,
    key: jax.Array,
    model: Model,
    config: MERAConfig,
    chi: Any,
    chi_mid: Any = None,
    mix: float = 1e-3,
    layers: int | None = None,
) -> tuple[MERA, MERAConfig]:
    """One step of a symmetric bond-dimension ladder: the sectors of ``chi``/``chi_mid`` from the reduced density
    matrices' spectra (:func:`spectrum_sectors`), the config of the next stage (``config`` with those χ and
    sectors) and the grown MERA (:func:`grow_symmetric`). A charge-conjugation-symmetric model
    (:func:`charge_conjugation_symmetric`: XX, Potts) keeps ±q sectors equal. ``layers`` (more than the MERA's
    transitional layers): copies of the scale-invariant layer are inserted below it first (:func:`insert_layers`),
    as the dense ladder does, and ``chi``/``chi_mid`` are read for that many layers. Returns (MERA, config) for
    ``mera.evenbly_vidal(model, config).init(mera=...)``."""
    if not isinstance(config, MERAConfig) or not isinstance(config.symmetry, Symmetry):
        raise TypeError("config must be the MERAConfig (with a mera.Symmetry) the MERA was optimised with")
    model = check_model(model)
    if layers is not None:
        mera = insert_layers(mera, layers)
    pairs = charge_conjugation_symmetric(model, config.symmetry)
    sym = spectrum_sectors(mera, config.symmetry, chi, chi_mid, pairs=pairs)
    shapes = layer_shapes(chi, chi_mid, mera.num_layers - 1, mera.d)
    new = dataclasses.replace(
        config,
        chi=tuple(c for _, _, c in shapes),
        chi_mid=tuple(m for _, m, _ in shapes),
        layers=mera.num_layers - 1,
        symmetry=sym,
    )
    return grow_symmetric(mera, key, model, new, mix), new


# ------------------------------------------------------------------------------------- conformal data


def sector_spectrum(mera: Any) -> dict[int, np.ndarray]:
    """The eigenvalues of the top one-site reduced density matrix (ρ_AB traced over its second site) in each
    charge sector, descending: the spectrum that shows how many states each sector deserves."""
    dense = np.asarray(mera.rho_ab.to_dense())
    rho1 = np.einsum("abcb->ac", dense)
    c = mera.rho_ab.legs[0].charge_of_index()
    return {
        int(q): np.sort(np.linalg.eigvalsh(rho1[np.ix_(np.flatnonzero(c == q), np.flatnonzero(c == q))]))[::-1]
        for q in np.unique(c)
    }
