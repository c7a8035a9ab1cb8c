"""The scale-invariant MERA with block-sparse symmetric tensors (Z_n, U(1); :mod:`ivhl_jax.physics.symmetric`).

A chain whose two-site term h conserves a charge (Ising: the Z2 parity ∏Z; XX: U(1), the total S^z) has a MERA
whose every tensor conserves it. Each bond then splits into charge sectors, chosen per layer by the user
(:class:`Symmetry`), and each tensor is stored as its allowed blocks: a Z2 contraction costs about a quarter of
the dense one and the SVD updates are block diagonal.

The sweep is the dense Evenbly–Vidal sweep (:mod:`~ivhl_jax.physics.mera.sweep`) on the same diagrams
(:data:`~ivhl_jax.physics.mera.superoperators.ASCEND_DIAGRAMS`,
:data:`~ivhl_jax.physics.mera.sweep.ENVIRONMENT_DIAGRAMS`), contracted block by block: the steady-state ρ by
power iteration of 𝒟 = ½𝒜ᵀ (the transposed diagrams, :func:`descend`), the energy, then u, w, v per
layer from the polar factors of their environments, x = −U Vᵀ block by block (the polar factor of a
block-diagonal matrix is block diagonal, so the dense update of a symmetric environment is the same tensor).
Embedded in dense tensors (:func:`to_dense`), a symmetric MERA is a dense MERA of the same energy, and the
dense sweep from it follows the symmetric sweep.

Conventions: the blocked site (two spins p0 p1, dimension d²) carries the charge q(p0) + q(p1) (for U(1) less
q_min + q_max of a spin, so the charges are centred: S^z of the block); its basis is sorted by charge
(:func:`physical_permutation`). Flows: operators o[a', b', a, b] (+, +, −, −), u[f1, f2, m1, m2] (+, +, −, −),
w[f0, m1, B'] and v[m2, f3, A'] (+, +, −).

Use it through the dense stepper's builder: ``mera.evenbly_vidal(model, MERAConfig(..., symmetry=Symmetry(...)))``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ivhl_jax.core.validation import check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics import symmetric as S
from ivhl_jax.physics.mera.config import MERA, MERAConfig, precision_dtype, require_x64
from ivhl_jax.physics.mera.models import Model, blocked_terms, check_model
from ivhl_jax.physics.mera.superoperators import ASCEND_DIAGRAMS
from ivhl_jax.physics.mera.sweep import ENVIRONMENT_DIAGRAMS, MERAState
from ivhl_jax.physics.symmetric import BlockTensor

_T1, _T2, _T3, _T4 = ASCEND_DIAGRAMS
_ENV_U, _ENV_W, _ENV_V = (ENVIRONMENT_DIAGRAMS[k] for k in "uwv")

#: The symmetry of the library's models and the charge of each spin basis state (Ising: Z2, |↑⟩ even; XX: U(1),
#: the number of ↓ spins, centred per block; Potts in its charge basis, :func:`potts_charge_basis`: Z3, the
#: eigenvalue ω^k of τ. Z3 is not diagonal in the σ basis of :func:`~ivhl_jax.physics.mera.models.potts`).
DEFAULT_SPIN_CHARGES = {"ising": ("Z2", (0, 1)), "xx": ("U1", (0, 1)), "potts_z3": ("Z3", (0, 1, 2))}


def potts_charge_basis(f: float = 1.0) -> Model:
    """The 3-state Potts chain of :func:`~ivhl_jax.physics.mera.models.potts` in the basis where its Z3 charge is
    diagonal (the Fourier transform of the σ basis: τ = diag(1, ω, ω²), σ the cyclic shift S|k⟩ = |k+1⟩):
    H = −Σ (S_i S_{i+1}ᵀ + S_iᵀ S_{i+1}) − f Σ 2cos(2πk_i/3), real, with the same spectrum, e₀ and CFT; the
    charge of |k⟩ is k (its default :class:`Symmetry` is ``Symmetry("Z3", ...)``)."""
    from ivhl_jax.physics.mera.models import E0_CRITICAL_POTTS, POTTS_CFT

    check_scalar(f, "f")
    f = float(f)
    shift = np.roll(np.eye(3), 1, axis=0)
    bond = -(np.kron(shift, shift.T) + np.kron(shift.T, shift))
    site = -np.diag(2.0 * np.cos(2.0 * np.pi * np.arange(3) / 3.0))
    term = bond + 0.5 * f * (np.kron(site, np.eye(3)) + np.kron(np.eye(3), site))
    return Model(
        term=term.reshape(3, 3, 3, 3),
        name=f"potts_z3(f={f:g})",
        e0=E0_CRITICAL_POTTS if f == 1.0 else None,
        cft=POTTS_CFT if f == 1.0 else (),
    )


def _sector_tuple(value: Any, group: S.Group, name: str) -> tuple[tuple[int, int], ...]:
    leg = S.make_leg(value, group, name=name)
    return tuple(zip(leg.charges, leg.dims))


@dataclasses.dataclass(frozen=True)
class Symmetry:
    """The symmetry of a MERA and its charge sectors (hashable: it is part of the static :class:`MERAConfig`).

    group: "Z2", "Z3", …, "U1" (or a :class:`~ivhl_jax.physics.symmetric.Group`).
    sectors: the sectors of the bond above each layer, ``{charge: dim}``: one mapping for every layer, or one per
      layer (``layers + 1``, bottom first; the last two equal). Each layer's dims must add up to its χ.
    mid_sectors: the same for χ_mid (u's output bond); None: the layer's input sectors (χ_mid = χ_in).
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
                if name == "sectors":
                    raise ValueError("Symmetry needs sectors: {charge: dim} (or one mapping per layer)")
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
    """The blocked terms (h_AB, h_BA) of :func:`~ivhl_jax.physics.mera.models.blocked_terms` in the charge-sorted
    basis, as block tensors (legs (P, P, P†, P†)), in the dtype of ``policy``
    (:func:`~ivhl_jax.physics.mera.config.precision_dtype`)."""
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
    g = sym.group
    shapes = config.layer_shapes(model.d * model.d)
    n = len(shapes)
    outs, mids = sym.per_layer("sectors", n), sym.per_layer("mid_sectors", n)
    inp = physical_leg(model, sym)
    res = []
    for z, ((chi_in, m, chi_out), so, sm) in enumerate(zip(shapes, outs, mids)):
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


def _u_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.inp, ll.inp, ll.mid.dual(), ll.mid.dual())


def _w_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.inp, ll.mid, ll.out.dual())


def _v_legs(ll: LayerLegs) -> tuple[S.Leg, ...]:
    return (ll.mid, ll.inp, ll.out.dual())


def _op_legs(leg: S.Leg) -> tuple[S.Leg, ...]:
    return (leg, leg, leg.dual(), leg.dual())


def init_symmetric(key: jax.Array, model: Model, config: MERAConfig, *, policy: Any = None) -> MERA:
    """Cold start as :func:`~ivhl_jax.physics.mera.config.init_mera`, block by block: u the identity on each
    sector (truncated to χ_mid), w the polar factor of uniform(0, 1) blocks, v = mirror(w) with ``refsym`` (else
    its own draw), ρ = 𝟙/χ² at the top.

    ``key``: a PRNG key (required: there is no default start); ``policy``: the precision
    (:func:`~ivhl_jax.physics.mera.config.precision_dtype`: None / ``"f64"`` float64, ``"f32"`` float32)."""
    check_key(key)
    if not isinstance(config, MERAConfig) or not isinstance(config.symmetry, Symmetry):
        raise TypeError("config must be a MERAConfig with a mera.Symmetry (config.symmetry)")
    lls = layer_legs(check_model(model), config)
    dtype = jnp.dtype(precision_dtype(policy))
    if dtype == jnp.float64:
        require_x64("mera.symmetric.init_symmetric", f32="or pass policy='f32'")
    return _init_symmetric(key, lls, config.symmetry.group, bool(config.refsym), dtype)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _init_symmetric(key: jax.Array, lls: tuple[LayerLegs, ...], group: S.Group, refsym: bool, dtype: Any) -> MERA:
    us, ws, vs = [], [], []
    keys = jax.random.split(key, 2 * len(lls))
    for z, ll in enumerate(lls):
        legs = _u_legs(ll)
        ub = {}
        for k in S.allowed_keys(legs, group, 0):
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
        vs.append(_mirror_wv(ws[-1]) if refsym else draw(keys[2 * z + 1], _v_legs(ll)))
    top = lls[-1].out
    rho = S.identity(top, group, 2, dtype) / float(top.dim**2)
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, jnp.zeros((), jnp.int32))  # type: ignore[arg-type]


def is_symmetric(mera: Any) -> bool:
    """Whether ``mera`` holds block-sparse symmetric tensors."""
    return isinstance(mera, MERA) and isinstance(mera.w[0], BlockTensor)


def to_dense(mera: Any, model: Model | None = None, symmetry: Symmetry | None = None) -> MERA:
    """The dense MERA of the same tensors (:meth:`BlockTensor.to_dense`). With ``model`` and ``symmetry`` the
    bottom legs are returned to the model's own basis (then every dense tool applies: :func:`energy_per_site`
    with ``blocked_terms(model)``, the central charge, the dense stepper's ``init(mera=...)``)."""
    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA (from a stepper whose config has a symmetry)")
    d = jax.tree_util.tree_map(
        lambda x: x.to_dense() if isinstance(x, BlockTensor) else x, mera, is_leaf=lambda x: isinstance(x, BlockTensor)
    )
    if model is None:
        return d
    if symmetry is None:
        raise ValueError("to_dense needs the symmetry with the model (to undo the charge sorting of the bottom basis)")
    inv = np.argsort(physical_permutation(check_model(model), symmetry))
    u0 = d.u[0][inv][:, inv]
    w0 = d.w[0][inv]
    v0 = d.v[0][:, inv]
    return d.replace(u=(u0,) + d.u[1:], w=(w0,) + d.w[1:], v=(v0,) + d.v[1:])


# -------------------------------------------------------------------------------------- superoperators


def _reflect(o: BlockTensor) -> BlockTensor:
    return o.transpose((1, 0, 3, 2))


def _mirror_wv(x: BlockTensor) -> BlockTensor:
    return x.transpose((1, 0, 2))


def _swap_dual(o: BlockTensor) -> BlockTensor:
    """o[a', b', a, b] → o[a, b, a', b'] read with operator flows (the pairing ⟨ρ, h⟩ = Σ swap(ρ)·h)."""
    return o.transpose((2, 3, 0, 1)).dual()


def _tree_sum(xs: list[BlockTensor]) -> BlockTensor:
    return functools.reduce(lambda a, b: a + b, xs)


def ascend_raw(
    h_ab: BlockTensor,
    h_ba: BlockTensor,
    u: BlockTensor,
    w: BlockTensor,
    v: BlockTensor,
    refsym: bool = False,
    mirror: bool = True,
) -> tuple[BlockTensor, BlockTensor]:
    """𝒜 = (t4, t1 + t2 + t3) block by block (the dense ``_ascend_raw``)."""
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    t1 = S.contract(_T1, wb, ub, vb, h_ab, w, u, v)
    t2 = S.contract(_T2, wb, ub, vb, h_ba, w, u, v)
    t4 = S.contract(_T4, vb, wb, h_ba, v, w)
    if not mirror:
        return t4, t1 + t2
    t3 = _reflect(t1) if refsym else S.contract(_T3, wb, ub, vb, h_ab, w, u, v)
    return t4, t1 + t2 + t3


def ascend(
    h: tuple[BlockTensor, BlockTensor], layer: tuple[BlockTensor, BlockTensor, BlockTensor], refsym: bool = False
) -> tuple[BlockTensor, BlockTensor]:
    u, w, v = layer
    return ascend_raw(h[0], h[1], u, w, v, refsym=refsym)


def _descend_diagram(spec: str, h_pos: int) -> str:
    """The network of 𝒟ₖ from the ascending diagram tₖ: ⟨ρ', tₖ(h)⟩ = Σ ρ'[p q r s] tₖ[r s p q] (:func:`pair`) is
    linear in h, so ∂/∂h is the diagram with h removed and ρ' (labels: tₖ's output, halves swapped) added; its
    open legs are h's, read as an operator with the halves swapped (h[e f a b] → ρ[a b e f])."""
    lhs, out = spec.split("->")
    ops = lhs.split(",")
    h = ops.pop(h_pos)
    return ",".join(ops + [out[2:] + out[:2]]) + "->" + h[2:] + h[:2]


#: The networks of 𝒟₁..𝒟₄ (operands: those of tₖ without h, then ρ'): ρ_AB = ½[𝒟₁ + 𝒟₃](ρ'_BA),
#: ρ_BA = ½[𝒟₂(ρ'_BA) + 𝒟₄(ρ'_AB)].
_D1, _D2, _D3, _D4 = (_descend_diagram(t, 2 if t is _T4 else 3) for t in ASCEND_DIAGRAMS)


def descend(
    rho: tuple[BlockTensor, BlockTensor], layer: tuple[BlockTensor, BlockTensor, BlockTensor], refsym: bool = False
) -> tuple[BlockTensor, BlockTensor]:
    """𝒟 = ½𝒜ᵀ, as the dense :func:`~ivhl_jax.physics.mera.superoperators.descend`, contracted as the transposed
    networks :data:`_D1`..:data:`_D4` (each one block-sparse network, as the ascending ones: the transpose of the
    block map by ``jax.linear_transpose`` would scatter every block of every product back with a pad).
    ``refsym``: 𝒟₃(ρ') = R 𝒟₁(ρ') is not contracted."""
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    r_ab, r_ba = rho
    d1 = S.contract(_D1, wb, ub, vb, w, u, v, r_ba)
    d3 = _reflect(d1) if refsym else S.contract(_D3, wb, ub, vb, w, u, v, r_ba)
    d2 = S.contract(_D2, wb, ub, vb, w, u, v, r_ba)
    d4 = S.contract(_D4, vb, wb, v, w, r_ab)
    return (d1 + d3) * 0.5, (d2 + d4) * 0.5


def pair(rho: BlockTensor, op: BlockTensor) -> jax.Array:
    """tr(ρ o)."""
    return S.scalar(S.contract("abcd,cdab->", rho, op))


def _symmetrise(rho: BlockTensor) -> BlockTensor:
    rho = (rho + _swap_dual(rho)) * 0.5  # ρ ← ½(ρ + ρ†) (real)
    return rho / S.trace(rho)


def fixed_point_density(
    layer: tuple[BlockTensor, BlockTensor, BlockTensor],
    rho: tuple[BlockTensor, BlockTensor],
    iters: int,
    refsym: bool = False,
) -> tuple[BlockTensor, BlockTensor]:
    def body(_: int, r: tuple[BlockTensor, BlockTensor]) -> tuple[BlockTensor, BlockTensor]:
        a, b = descend(r, layer, refsym)
        return _symmetrise(a), _symmetrise(b)

    return jax.lax.fori_loop(0, iters, body, rho)


# ------------------------------------------------------------------------------------------------ sweep


def _svd_update(env: BlockTensor, k: int) -> BlockTensor:
    """x = −U Vᵀ of Γ = ∂E/∂x̄ block by block (Γ's open legs are the partners of x̄'s: x's structure)."""
    return -S.polar(env, k)


def _env_u(layer: Any, hs: list[tuple[BlockTensor, BlockTensor]], rho: Any, refsym: bool) -> BlockTensor:
    u, w, v = layer
    wb, vb = w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        if refsym:
            x = (
                S.contract(_ENV_U[1], wb, vb, h_ab, w, u, v, rho[1])
                + S.contract(_ENV_U[2], wb, vb, h_ba, w, u, v, rho[1]) * 0.5
            )
            terms.append(x + _reflect(x))
        else:
            terms += [S.contract(_ENV_U[k], wb, vb, (h_ab, h_ba, h_ab)[k - 1], w, u, v, rho[1]) for k in (1, 2, 3)]
    return _tree_sum(terms)


def _env_wv(layer: Any, hs: list[tuple[BlockTensor, BlockTensor]], rho: Any, which: str) -> BlockTensor:
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        for k, hk in ((1, h_ab), (2, h_ba), (3, h_ab)):
            if which == "w":
                terms.append(S.contract(_ENV_W[k], ub, vb, hk, w, u, v, rho[1]))
            else:
                terms.append(S.contract(_ENV_V[k], wb, ub, hk, w, u, v, rho[1]))
        if which == "w":
            terms.append(S.contract(_ENV_W[4], vb, h_ba, v, w, rho[0]))
        else:
            terms.append(S.contract(_ENV_V[4], wb, h_ba, v, w, rho[0]))
    return _tree_sum(terms)


def _env_w_refsym(layer: Any, hs: list[tuple[BlockTensor, BlockTensor]], rho: Any) -> BlockTensor:
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        terms += [
            S.contract(_ENV_W[1], ub, vb, h_ab, w, u, v, rho[1]),
            _mirror_wv(S.contract(_ENV_V[1], wb, ub, h_ab, w, u, v, rho[1])),
            S.contract(_ENV_W[2], ub, vb, h_ba, w, u, v, rho[1]),
            S.contract(_ENV_W[4], vb, h_ba, v, w, rho[0]),
        ]
    return _tree_sum(terms)


def _update_layer(
    layer: Any, hs: list[tuple[BlockTensor, BlockTensor]], rho: Any, do_u: jax.Array, refsym: bool
) -> tuple[BlockTensor, BlockTensor, BlockTensor]:
    u, w, v = layer
    new_u = _svd_update(_env_u((u, w, v), hs, rho, refsym), 2)
    u = jax.tree_util.tree_map(lambda a, b: jnp.where(do_u, a, b), new_u, u)
    if refsym:
        w = _svd_update(_env_w_refsym((u, w, v), hs, rho), 1)
        return u, w, _mirror_wv(w)
    w = _svd_update(_env_wv((u, w, v), hs, rho, "w"), 1)
    v = _svd_update(_env_wv((u, w, v), hs, rho, "v"), 1)
    return u, w, v


def _bias(h: BlockTensor) -> jax.Array:
    return jnp.max(jnp.stack([jnp.max(e) for e in S.block_eigvalsh(h).values()]))


def energy_per_site(mera: Any, h: tuple[BlockTensor, BlockTensor]) -> jax.Array:
    """(⟨ρ_AB, h_AB⟩ + ⟨ρ_BA, h_BA⟩)/4 at the bottom (h from :func:`symmetric_terms`)."""
    rho = (mera.rho_ab, mera.rho_ba)
    for z in reversed(range(mera.num_layers - 1)):
        rho = descend(rho, mera.layer(z))
    return (pair(rho[0], h[0]) + pair(rho[1], h[1])) / 4.0


def sweep(
    mera: Any,
    h: tuple[BlockTensor, BlockTensor],
    power_iters: int = 4,
    u_delay: int = 10,
    refsym: bool = False,
    si_scales: int = 1,
) -> tuple[MERA, jax.Array]:
    """One Evenbly–Vidal sweep of a symmetric MERA (the dense :func:`~ivhl_jax.physics.mera.sweep.sweep`, block by
    block). Returns (new MERA, energy per site measured before the updates)."""
    n = mera.num_layers
    if refsym:
        mera = mera.replace(v=tuple(_mirror_wv(w) for w in mera.w))
    si = mera.layer(n - 1)
    rho_top = fixed_point_density(si, (mera.rho_ab, mera.rho_ba), power_iters, refsym)
    if refsym:
        rho_top = ((rho_top[0] + _reflect(rho_top[0])) * 0.5, (rho_top[1] + _reflect(rho_top[1])) * 0.5)
    rhos: list[Any] = [None] * n
    rhos[n - 1] = rho_top
    for z in reversed(range(n - 1)):
        rhos[z] = descend(rhos[z + 1], mera.layer(z), refsym)
    energy = (pair(rhos[0][0], h[0]) + pair(rhos[0][1], h[1])) / 4.0
    eye = S.identity(h[0].legs[0], h[0].group, 2, h[0].dtype)
    hz = [(h[0] - eye * _bias(h[0]), h[1] - eye * _bias(h[1]))]
    do_u = mera.sweeps >= u_delay
    us, ws, vs = [], [], []
    for z in range(n):
        rho_above = rhos[z + 1] if z + 1 < n else rho_top
        if z == n - 1 and si_scales > 1:
            hs = [hz[0]]
            for _ in range(si_scales - 1):
                hs.append(ascend(hs[-1], si, refsym))
            hz = [(a * 0.5**j, b * 0.5**j) for j, (a, b) in enumerate(hs)]
        layer = _update_layer(mera.layer(z), hz, rho_above, do_u, refsym)
        us.append(layer[0])
        ws.append(layer[1])
        vs.append(layer[2])
        if z + 1 < n:
            hz = [ascend(hz[0], layer, refsym)]
    new = MERA(tuple(us), tuple(ws), tuple(vs), rho_top[0], rho_top[1], mera.sweeps + 1)  # type: ignore[arg-type]
    return new, energy


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

    ``chi``/``chi_mid`` as in :class:`~ivhl_jax.physics.mera.config.MERAConfig` for the MERA's number of layers
    (an int, capped per layer at what the layer can carry, or one per layer). Bottom-up, for each layer z whose
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
    from ivhl_jax.physics.mera.config import layer_shapes

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
    (as the dense :func:`~ivhl_jax.physics.mera.ladder.grow`; the same tensors, so at the fixed point of the SI
    layer's 𝒟 the energy is unchanged). Fewer layers than the MERA's: returned as it is."""
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
    return _grow_symmetric(mera, key, lls, float(mix), bool(config.refsym))


def _old_columns(t: BlockTensor, new_legs: tuple[S.Leg, ...], k: int) -> dict[int, np.ndarray]:
    """For each fused column charge of the padded tensor's matrix (:func:`~ivhl_jax.physics.symmetric.matrix_blocks`
    with its last k legs as columns): a boolean mask of the columns that hold the old tensor's columns (NumPy,
    from the static legs)."""
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
    for key in S.allowed_keys(new_legs, t.group, t.charge):
        shape = tuple(leg.sector_dim(q) for leg, q in zip(new_legs, key))
        b = jnp.zeros(shape, t.dtype)
        if key in t.blocks:
            b = b.at[tuple(slice(0, n) for n in t.blocks[key].shape)].set(t.blocks[key])
        blocks[key] = b
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
            un = S.polar((un + _reflect(un)) * 0.5, 2)
        wn = _complete(keys[3 * z + 1], w, _w_legs(ll), 1)
        vn = _mirror_wv(wn) if refsym else _complete(keys[3 * z + 2], v, _v_legs(ll), 1)
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
    from ivhl_jax.physics.mera.config import layer_shapes

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


# ---------------------------------------------------------------------------------------------- stepper


class SymmetricSweepParams(struct.PyTreeNode):
    """What one symmetric sweep reads: the blocked terms as block tensors (traced), the config and the legs of
    every layer (:func:`layer_legs`; static and hashable: the model itself, which holds an array, is not kept)."""

    h: tuple
    config: MERAConfig = struct.field(pytree_node=False)
    legs: tuple = struct.field(pytree_node=False)


def _step(state: MERAState, params: SymmetricSweepParams) -> MERAState:
    c = params.config
    m, e = sweep(state.mera, params.h, c.power_iters, c.u_delay, c.refsym, c.si_scales)
    return MERAState(mera=m, energy=e)


def _init(params: SymmetricSweepParams, key: jax.Array | None = None, mera: Any | None = None) -> MERAState:
    """``init(key)``: a fresh symmetric MERA from ``key`` (:func:`init_symmetric`; there is no default key);
    ``init(mera=m)``: continue from the symmetric MERA ``m`` (cast to the sweep's dtype)."""
    dtype = params.h[0].dtype
    if mera is None:
        if key is None:
            raise TypeError(
                "mera.evenbly_vidal[symmetric].init needs key (a PRNG key, e.g. jax.random.key(0)) for a fresh "
                "MERA, or mera= to continue from one"
            )
        check_key(key)
        c = params.config
        mera = _init_symmetric(key, params.legs, c.symmetry.group, bool(c.refsym), jnp.dtype(dtype))
    elif not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA for a stepper whose config has a symmetry (or pass none)")
    elif mera.w[0].dtype != dtype:
        mera = jax.tree_util.tree_map(
            lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, mera
        )
    return MERAState(mera=mera, energy=jnp.zeros((), dtype))


def evenbly_vidal_symmetric(model: Model, config: MERAConfig, *, policy: Any = None) -> Stepper:
    """The stepper of :func:`~ivhl_jax.physics.mera.sweep.evenbly_vidal` for a config with a symmetry (that
    builder dispatches here): the model is checked to conserve the charge, the sectors to add up and fit.
    ``policy``: the precision, as the dense stepper's (:func:`~ivhl_jax.physics.mera.config.precision_dtype`)."""
    model = check_model(model)
    sym = config.symmetry
    if not isinstance(sym, Symmetry):
        raise TypeError(f"config.symmetry must be a mera.Symmetry, got {type(sym).__name__}")
    check_commutes(model, sym)
    legs = layer_legs(model, config)
    dtype = precision_dtype(policy)
    if jnp.dtype(dtype) == jnp.float64:
        require_x64("mera.evenbly_vidal", f32="or pass policy='f32' for float32 sweeps")
    h = symmetric_terms(model, sym, policy)
    return Stepper.create(
        _step,
        SymmetricSweepParams(h=h, config=config, legs=legs),
        init_fn=_init,
        name="mera.evenbly_vidal[symmetric]",
    )


# ------------------------------------------------------------------------------------- conformal data


def operator_charges(leg: S.Leg, group: S.Group) -> np.ndarray:
    """The charge q(a') − q(a) of every one-site operator entry o[a', a] (flattened a'·χ + a)."""
    c = leg.charge_of_index()
    diff = c[:, None] - c[None, :]
    return (diff % group.order if group.order else diff).reshape(-1)


def charged_scaling_dimensions(mera: Any, num: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Scaling dimensions Δ = −log₄|λ| of the two-layer one-site scaling superoperator S_v∘S_w, computed in each
    charge sector (S maps an operator of charge q = q(a') − q(a) to one of the same charge: its matrix is block
    diagonal, one block per charge) and merged: the ``num`` smallest Δ with the charge of each operator."""
    from ivhl_jax.physics.mera.scaling import scaling_superoperator

    if not is_symmetric(mera):
        raise TypeError("mera must be a symmetric MERA")
    check_scalar(num, "num", integer=True, minimum=1)
    _, w, v = mera.layer(mera.num_layers - 1)
    leg = w.legs[-1].with_flow(1)
    s = np.asarray(scaling_superoperator(w.to_dense(), v.to_dense()), np.float64)
    oq = operator_charges(leg, w.group)
    dims, charges = [], []
    for q in np.unique(oq):
        idx = np.flatnonzero(oq == q)
        ev = np.linalg.eigvals(s[np.ix_(idx, idx)])
        dims.append(-0.5 * np.log2(np.maximum(np.abs(ev), 1e-300)))
        charges.append(np.full(len(idx), q))
    d, c = np.concatenate(dims), np.concatenate(charges)
    order = np.argsort(d, kind="stable")[: int(num)]
    return d[order], c[order]


def charge_block_leakage(mera: Any) -> float:
    """max |S[i, j]| between operator entries of different charge, relative to max |S| (0 for a symmetric MERA:
    the check that S is block diagonal in charge)."""
    from ivhl_jax.physics.mera.scaling import scaling_superoperator

    _, w, v = mera.layer(mera.num_layers - 1)
    s = np.asarray(scaling_superoperator(w.to_dense(), v.to_dense()), np.float64)
    oq = operator_charges(w.legs[-1].with_flow(1), w.group)
    off = oq[:, None] != oq[None, :]
    return float(np.abs(s[off]).max() / np.abs(s).max()) if off.any() else 0.0


#: The charge of each primary of the critical models' CFTs under the lattice symmetry (Ising: σ odd, 1 and ε
#: even; XX: the vertex operator V(n,m) carries the U(1) charge n (S^z), the currents J, J̄ none).
CFT_CHARGES: dict[str, dict[str, tuple[int, ...]]] = {
    "ising": {"1": (0,), "σ": (1,), "ε": (0,)},
    "xx": {
        "1": (0,),
        "J": (0,),
        "J̄": (0,),
        **{f"V({n},{m})": (n,) for n, m in ((1, 0), (-1, 0), (2, 0), (-2, 0), (0, 1), (0, -1))},
        **{f"V({n},{m})": (n,) for n in (1, -1) for m in (1, -1)},
    },
    # 3-state Potts (in the charge basis of potts_charge_basis): σ and Z carry ±1, σ†, Z† the opposite, ε none
    "potts": {"1": (0,), "ε": (0,), "σ": (1, 2), "σ†": (1, 2), "Z": (1, 2), "Z†": (1, 2)},
}


def conformal_table(mera: Any, cft: str, num: int = 10) -> list[dict[str, Any]]:
    """Each measured Δ with its charge, matched to the nearest CFT operator *of the same charge* (each used once):
    ``delta``, ``charge``, ``label``, ``exact``, ``primary``, ``descendant``."""
    from ivhl_jax.physics.mera.scaling import CFT_OPERATORS

    if cft not in CFT_CHARGES:
        raise ValueError(f"cft must be one of {sorted(CFT_CHARGES)} (the CFTs with tabulated charges), got {cft!r}")
    dims, charges = charged_scaling_dimensions(mera, num)
    group = mera.w[-1].group
    table = list(CFT_OPERATORS[cft])
    free = list(range(len(table)))
    out: list[dict[str, Any]] = []
    for d, q in zip(dims, charges):
        ok = [
            i
            for i in free
            if any(group.reduce(c) == group.reduce(int(q)) for c in CFT_CHARGES[cft].get(table[i][2], ()))
        ]
        if not ok:
            out.append(
                {"delta": float(d), "charge": int(q), "label": None, "exact": None, "primary": None, "descendant": None}
            )
            continue
        j = min(ok, key=lambda i: abs(table[i][0] - d))
        free.remove(j)
        exact, label, primary = table[j]
        out.append(
            {
                "delta": float(d),
                "charge": int(q),
                "label": label,
                "exact": exact,
                "primary": primary,
                "descendant": label != primary,
            }
        )
    return out


def ope_coefficients(mera: Any, model: Model, cft: str, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """OPE coefficients of ``cft``'s primaries on the symmetric MERA: a coefficient C_αβγ whose charges do not add
    up (q_α + q_β ≠ q_γ) vanishes by the symmetry and is reported as ``{"allowed": False, "measured": 0.0}``; the
    allowed ones are measured by :func:`~ivhl_jax.physics.mera.conformal.ope_coefficients` on the dense
    embedding."""
    from ivhl_jax.physics.mera.conformal import CFT_OPE
    from ivhl_jax.physics.mera.conformal import ope_coefficients as dense_ope

    if cft not in CFT_CHARGES or cft not in CFT_OPE:
        raise ValueError(f"cft must be one of {sorted(set(CFT_CHARGES) & set(CFT_OPE))}, got {cft!r}")
    group = mera.w[-1].group
    measured = dense_ope(to_dense(mera), cft, **kwargs)
    out = {}
    for (a, b, c), _ in CFT_OPE[cft].items():
        name = f"C_{a}{b}{c}"
        qa, qb, qc = (CFT_CHARGES[cft][x][0] for x in (a, b, c))
        if group.reduce(qa + qb - qc) != 0:
            out[name] = {"allowed": False, "measured": 0.0}
        else:
            out[name] = dict(measured.get(name, {}), allowed=True)
    del model
    return out


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
