"""One Evenbly–Vidal sweep of a scale-invariant modified binary MERA and its stepper (the one way to run sweeps).

Optimisation (one sweep): (1) a few power iterations of 𝒟 of the scale-invariant (SI) layer update the
steady-state ρ at the top of the transitional layers; (2) ρ is descended to the bottom and the energy is
measured; (3) bottom-up, each tensor x ∈ {u, w, v} is replaced by x = −U Vᵀ from the SVD Γ = U S Vᵀ of its
environment Γ = ∂E/∂x̄, E = ⟨ρ', 𝒜(h)⟩ (explicit contractions of the diagrams with x̄ removed, one network
each: autodiff would contract each diagram forward and backward). The Hamiltonian is shifted to be negative
definite so that every such update lowers the energy (E is concave in x̄). The SI layer is optimised with the
Hamiltonian ascended through the transitional layers (as in Evenbly's mainVarMERA).

The energy per physical site is (⟨ρ_AB,h_AB⟩ + ⟨ρ_BA,h_BA⟩)/4 at the bottom (a unit cell of two blocked sites holds
four spins). All routines are real-valued and run in float64 (``with jax.enable_x64(True):``, which every MERA
entry point asks for); float32 sweeps (``policy="f32"``) stop improving near 1e-5 per site.

Run sweeps with the stepper::

    with jax.enable_x64(True):
        stepper = mera.evenbly_vidal(mera.ising(), mera.MERAConfig(chi=6, chi_mid=4, layers=1))
        state, energies = trajectory(stepper, stepper.init(jax.random.key(0)), 500, observe=mera.observe)

and ``chunked(stepper, n)`` with :func:`ivhl_jax.run.runner.run_chunked` for checkpoints.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ivhl_jax.core.validation import check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.tensornet import ops as T
from ivhl_jax.physics.tensornet.mera import symmetric as MS
from ivhl_jax.physics.tensornet.mera.config import (
    MERA,
    Layer,
    MERAConfig,
    cast,
    check_mera,
    init_tensors,
    precision_dtype,
    require_x64,
)
from ivhl_jax.physics.tensornet.mera.models import Model, blocked_parity, blocked_terms, check_model
from ivhl_jax.physics.tensornet.mera.superoperators import (
    ascend,
    ascend_raw,
    check_ops,
    descend,
    fixed_point_density,
    mirror_wv,
    pair,
    reflect,
)
from ivhl_jax.physics.tensornet.ops import contract


def _svd_update(env: Any, k: int) -> Any:
    """argmin_x tr(Γᵀ x) over isometries x (x†x = I on the last k legs): x = −U Vᵀ, Γ = U S Vᵀ."""
    return -T.polar(env, k)


# Environments Γ_x = ∂E/∂x̄ of the layer energy E = ⟨ρ'_AB, t4⟩ + ⟨ρ'_BA, t1 + t2 + t3⟩ (E is linear in each bra
# tensor x̄), contracted explicitly: one network per (diagram, tensor), with the coarse ρ' (labels p q r s) closing
# the coarse legs. Autodiff would contract each diagram forward and then backward (about twice the work), and
# once more for w and v after u has changed. Operands: the bras (w̄ ū v̄ minus the removed one), h, w, u, v, ρ'.
_ENV_U = {
    1: "ekr,lds,efab,aip,bcij,jdq,pqrs->fckl",  # (w̄, v̄, h_AB, w, u, v, ρ'_BA)
    2: "akr,lds,efbc,aip,bcij,jdq,pqrs->efkl",  # (w̄, v̄, h_BA, w, u, v, ρ'_BA)
    3: "akr,lfs,efcd,aip,bcij,jdq,pqrs->bekl",
}  # (w̄, v̄, h_AB, w, u, v, ρ'_BA)
_ENV_W = {
    1: "fckl,lds,efab,aip,bcij,jdq,pqrs->ekr",  # (ū, v̄, h_AB, w, u, v, ρ'_BA)
    2: "efkl,lds,efbc,aip,bcij,jdq,pqrs->akr",
    3: "bekl,lfs,efcd,aip,bcij,jdq,pqrs->akr",
    4: "jer,efda,jdp,aiq,pqrs->fis",
}  # (v̄, h_BA, v, w, ρ'_AB)
_ENV_V = {
    1: "ekr,fckl,efab,aip,bcij,jdq,pqrs->lds",  # (w̄, ū, h_AB, w, u, v, ρ'_BA)
    2: "akr,efkl,efbc,aip,bcij,jdq,pqrs->lds",
    3: "akr,bekl,efcd,aip,bcij,jdq,pqrs->lfs",
    4: "fis,efda,jdp,aiq,pqrs->jer",
}  # (w̄, h_BA, v, w, ρ'_AB)
#: The environment networks of u, w and v.
ENVIRONMENT_DIAGRAMS = {"u": _ENV_U, "w": _ENV_W, "v": _ENV_V}

# The Hamiltonians a layer's environments are summed over: one (h_AB, h_BA) pair, or the SI layer's scales.
Terms = list[tuple[Any, Any]]


def _env_u(layer: Layer, hs: Terms, rho: tuple[Any, Any], refsym: bool) -> Any:
    """Γ_u = Σ_{k=1..3} Γ_u(t_k), (χ_in, χ_in, m, m). With ``refsym``: Γ_u(t3) = R Γ_u(t1), and the update's
    projection onto reflection-symmetric u is (1 + R)(Γ_u(t1) + ½Γ_u(t2)) (= ½(1 + R)Γ_u, the scale is irrelevant
    to the SVD update); two networks instead of three."""
    u, w, v = layer
    wb, vb = w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        if refsym:
            x = (
                contract(_ENV_U[1], wb, vb, h_ab, w, u, v, rho[1])
                + contract(_ENV_U[2], wb, vb, h_ba, w, u, v, rho[1]) * 0.5
            )
            terms.append(x + reflect(x))
        else:
            terms += [contract(_ENV_U[k], wb, vb, (h_ab, h_ba, h_ab)[k - 1], w, u, v, rho[1]) for k in (1, 2, 3)]
    return T.tree_sum(terms)


def _env_wv(layer: Layer, hs: Terms, rho: tuple[Any, Any], which: str) -> Any:
    """Γ_w (``which="w"``) or Γ_v (``"v"``) summed over the four diagrams, (χ_in, m, χ_out) / (m, χ_in, χ_out)."""
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        for k, hk in ((1, h_ab), (2, h_ba), (3, h_ab)):
            if which == "w":
                terms.append(contract(_ENV_W[k], ub, vb, hk, w, u, v, rho[1]))
            else:
                terms.append(contract(_ENV_V[k], wb, ub, hk, w, u, v, rho[1]))
        if which == "w":
            terms.append(contract(_ENV_W[4], vb, h_ba, v, w, rho[0]))
        else:
            terms.append(contract(_ENV_V[4], wb, h_ba, v, w, rho[0]))
    return T.tree_sum(terms)


def _env_w_refsym(layer: Layer, hs: Terms, rho: tuple[Any, Any]) -> Any:
    """Γ of w when v = mirror(w): Γ_w + mirror(Γ_v) = 2[Γ_w(t1) + mirror Γ_v(t1) + Γ_w(t2) + Γ_w(t4)], because the
    mirror images map Γ_w(t3) ↔ mirror Γ_v(t1), and t2, t4 are their own mirror images (three 7-tensor networks and
    one small one instead of six and two). Returned without the factor 2."""
    u, w, v = layer
    ub, wb, vb = u.conj(), w.conj(), v.conj()
    terms = []
    for h_ab, h_ba in hs:
        terms += [
            contract(_ENV_W[1], ub, vb, h_ab, w, u, v, rho[1]),
            mirror_wv(contract(_ENV_V[1], wb, ub, h_ab, w, u, v, rho[1])),
            contract(_ENV_W[2], ub, vb, h_ba, w, u, v, rho[1]),
            contract(_ENV_W[4], vb, h_ba, v, w, rho[0]),
        ]
    return T.tree_sum(terms)


def _layer_energy(layer: Layer, hs: Terms, rho: tuple[Any, Any]) -> jax.Array:
    """⟨ρ', 𝒜(h)⟩ (summed over the terms); the reference the explicit environments are tested against."""
    u, w, v = layer
    total = jnp.zeros((), rho[0].dtype)
    for h_ab, h_ba in hs:
        a, b = ascend_raw(h_ab, h_ba, u, w, v)
        total = total + pair(rho[0], a) + pair(rho[1], b)
    return total


def _update_layer(layer: Layer, hs: Terms, rho: tuple[Any, Any], do_u: jax.Array, refsym: bool = False) -> Layer:
    """Evenbly–Vidal update of one layer: u from Γ_u (old u, w, v), then w (and v) from environments with the
    new u. With ``refsym`` v = mirror(w) and only w's environment is contracted."""
    u, w, v = layer
    u = T.where(do_u, _svd_update(_env_u((u, w, v), hs, rho, refsym), 2), u)
    if refsym:
        w = _svd_update(_env_w_refsym((u, w, v), hs, rho), 1)
        return u, w, mirror_wv(w)
    w = _svd_update(_env_wv((u, w, v), hs, rho, "w"), 1)
    v = _svd_update(_env_wv((u, w, v), hs, rho, "v"), 1)
    return u, w, v


def energy_per_site(mera: MERA, h: tuple[Any, Any]) -> jax.Array:
    """Energy per physical site (each blocked site holds 2 spins): (⟨ρ_AB,h_AB⟩ + ⟨ρ_BA,h_BA⟩)/4 at the bottom.

    ``h``: the blocked terms (h_AB, h_BA) of the MERA's kind: dense arrays
    (:func:`~ivhl_jax.physics.tensornet.mera.models.blocked_terms`) for a dense MERA, block tensors for a symmetric one
    (either way the stepper's ``stepper.params.h``)."""
    check_ops(h, "h", check_mera(mera).layer(0))  # the arguments first, then the precision rule
    require_x64("mera.energy_per_site")
    rho = (mera.rho_ab, mera.rho_ba)
    for z in reversed(range(mera.num_layers - 1)):
        rho = descend(rho, mera.layer(z))
    return (pair(rho[0], h[0]) + pair(rho[1], h[1])) / 4.0


def sweep(
    mera: MERA,
    h: tuple[Any, Any],
    power_iters: int = 4,
    u_delay: int = 10,
    refsym: bool = False,
    si_scales: int = 1,
) -> tuple[MERA, jax.Array]:
    """One Evenbly–Vidal sweep of a dense or block-sparse symmetric MERA (the same code:
    :mod:`ivhl_jax.physics.tensornet.ops`). Returns (new MERA, energy per site measured before the tensor updates).

    ``h`` is the unshifted bottom Hamiltonian (h_AB, h_BA) of the MERA's kind; it is shifted internally to be
    negative definite.
    """
    check_ops(h, "h", check_mera(mera).layer(0))
    check_scalar(power_iters, "power_iters", integer=True, minimum=1)
    check_scalar(u_delay, "u_delay", integer=True, nonnegative=True)
    check_scalar(si_scales, "si_scales", integer=True, minimum=1)
    n = mera.num_layers
    if refsym:
        # v = mirror(w) exactly (a grown or hand-made MERA may not have it yet); u is made symmetric by its first
        # update (its environment is symmetrised), so a non-symmetric u costs at most one approximate sweep.
        mera = mera.replace(v=tuple(mirror_wv(w) for w in mera.w))
    si = mera.layer(n - 1)
    rho_top = fixed_point_density(si, (mera.rho_ab, mera.rho_ba), power_iters, refsym)
    if refsym:
        rho_top = ((rho_top[0] + reflect(rho_top[0])) * 0.5, (rho_top[1] + reflect(rho_top[1])) * 0.5)
    rhos: list[Any] = [None] * n
    rhos[n - 1] = rho_top
    for z in reversed(range(n - 1)):
        rhos[z] = descend(rhos[z + 1], mera.layer(z), refsym)
    energy = (pair(rhos[0][0], h[0]) + pair(rhos[0][1], h[1])) / 4.0
    eye = T.operator_identity(h[0])
    hz: Terms = [(h[0] - eye * T.max_eigenvalue(h[0]), h[1] - eye * T.max_eigenvalue(h[1]))]
    do_u = mera.sweeps >= u_delay
    us, ws, vs = [], [], []
    for z in range(n):
        rho_above = rhos[z + 1] if z + 1 < n else rho_top
        if z == n - 1 and si_scales > 1:
            # Optional: the SI tensors act at every scale above, so one may sum the environments
            # Σ_j 2^{-j} Γ(ρ*, 𝒜^j h_top) of j extra copies of the layer at fixed steady state ρ*; j = 0 only
            # (mainVarMERA, si_scales = 1, the default) converges faster.
            for _ in range(si_scales - 1):
                hz.append(ascend(hz[-1], si, refsym))
            hz = [(a * 0.5**j, b * 0.5**j) for j, (a, b) in enumerate(hz)]
        layer = _update_layer(mera.layer(z), hz, rho_above, do_u, refsym)
        us.append(layer[0])
        ws.append(layer[1])
        vs.append(layer[2])
        if z + 1 < n:
            hz = [ascend(hz[0], layer, refsym)]
    new = MERA(tuple(us), tuple(ws), tuple(vs), rho_top[0], rho_top[1], mera.sweeps + 1)
    return new, energy


# ------------------------------------------------------------------------------------------- stepper


class EvenblyVidalParams(struct.PyTreeNode):
    """What one Evenbly–Vidal sweep reads: the blocked two-site Hamiltonian ``h = (h_AB, h_BA)``, each
    (d², d², d², d²) for spins of dimension d, traced (built once from the model by :func:`evenbly_vidal`: dense
    arrays, or block tensors in the charge-sorted basis when the config has a symmetry); and the
    :class:`MERAConfig` (static: its settings change the compiled sweep)."""

    h: tuple[Any, Any]
    config: MERAConfig = struct.field(pytree_node=False)
    parity: tuple | None = struct.field(pytree_node=False, default=None)  # the model's, on a blocked site
    # a symmetric MERA's (config.symmetry): the legs of every layer (mera.symmetric.layer_legs), h block tensors
    legs: tuple | None = struct.field(pytree_node=False, default=None)


class MERAState(struct.PyTreeNode):
    """The stepper's state: the MERA and the energy per site measured at the start of the last sweep (0 before the
    first sweep)."""

    mera: MERA
    energy: jax.Array


def _ev_step(state: MERAState, params: EvenblyVidalParams) -> MERAState:
    c = params.config
    m, e = sweep(state.mera, params.h, c.power_iters, c.u_delay, c.refsym, c.si_scales)
    return MERAState(mera=m, energy=e)


def _ev_init(params: EvenblyVidalParams, key: jax.Array | None = None, mera: MERA | None = None) -> MERAState:
    if key is not None:
        check_key(key, "key")
    h0 = params.h[0]
    dtype = h0.dtype
    d = int(h0.shape[0])
    if mera is None:
        if key is None:
            raise TypeError(
                "mera.evenbly_vidal.init needs key (a PRNG key, e.g. jax.random.key(0)) for a fresh MERA, or mera= "
                "to continue from one"
            )
        c = params.config
        if params.legs is not None:
            mera = MS.init_from_legs(key, params.legs, c.symmetry.group, bool(c.refsym), jnp.dtype(dtype))
        else:
            # drawn in the default float (float64 under x64) and cast, so a seed gives the same start in every dtype
            mera = init_tensors(key, c, d=d, parity=params.parity)
    else:
        check_mera(mera)
        if MS.is_symmetric(mera) != (params.legs is not None):
            raise TypeError(
                "mera must be a symmetric MERA for a stepper whose config has a symmetry, a dense one otherwise "
                "(mera.to_dense embeds a symmetric MERA)"
            )
        if mera.d != d:
            raise ValueError(f"mera has bottom sites of dimension {mera.d}, the stepper's model needs {d}")
        if params.legs is not None and mera.w[0].legs[0].with_flow(1) != h0.legs[0]:
            raise ValueError(
                f"mera's bottom sectors {mera.w[0].legs[0].charges} / {mera.w[0].legs[0].dims} are not the "
                f"model's {h0.legs[0].charges} / {h0.legs[0].dims} (another model or symmetry)"
            )
    if mera.w[0].dtype != dtype:
        mera = cast(mera, dtype)
    return MERAState(mera=mera, energy=jnp.zeros((), dtype))


def observe(state: MERAState, params: EvenblyVidalParams) -> jax.Array:
    """The energy per site measured at the start of the last sweep (the family's ``observe`` for
    ``trajectory``/``chunked``)."""
    del params
    return state.energy


def evenbly_vidal(model: Model, config: MERAConfig, *, policy: Any = None) -> Stepper[MERAState, EvenblyVidalParams]:
    """Stepper for the Evenbly–Vidal optimisation of ``model`` (:func:`ising`, :func:`xx`, :func:`potts`,
    :func:`two_site`): ``step`` is one :func:`sweep` with ``config``'s settings on the model's blocked terms
    (d² sites), ``init(key)`` a fresh MERA drawn from ``key`` (symmetric under the model's ``parity``, see
    :func:`init_tensors`), or ``init(mera=m)`` the given one cast to the sweep's dtype (there is no default key:
    neither a key nor a MERA is a TypeError naming ``key``).

    ``policy``: the precision of the sweep (:func:`precision_dtype`): None or ``"f64"`` (the default) float64,
    which needs ``jax.enable_x64`` (a RuntimeError says so, as every MERA entry point does); ``"f32"`` float32
    for fast early sweeps of a ladder (they stop improving near an energy error of 1e-5). Checks here: the model
    (a pair or an array is refused, naming ``model``), bond dimensions every layer can carry on d² sites (naming
    ``chi``/``chi_mid``), and ``config.refsym`` only for a reflection-symmetric term.

    ``config.symmetry`` (a :class:`~ivhl_jax.physics.tensornet.mera.symmetric.Symmetry`): the same sweep on block-sparse
    symmetric tensors (the model checked to conserve the charge, the sectors to add up and fit); ``init(key)``
    draws a symmetric MERA, ``init(mera=m)`` continues a symmetric one (its own sectors, e.g. from :func:`grow`).
    """
    model = check_model(model)
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    config.validate()
    config.layer_shapes(model.d * model.d)
    if config.refsym and not model.reflection_symmetric:
        raise ValueError(
            f"config.refsym=True needs a reflection-symmetric term (h(a, b) = h(b, a)); {model.name}'s "
            "is not: pass MERAConfig(refsym=False)"
        )
    dtype = precision_dtype(policy)
    legs = None
    if config.symmetry is not None:  # block-sparse symmetric tensors: the charge conserved, the sectors fit
        if not isinstance(config.symmetry, MS.Symmetry):
            raise TypeError(f"config.symmetry must be a mera.Symmetry, got {type(config.symmetry).__name__}")
        MS.check_commutes(model, config.symmetry)
        legs = MS.layer_legs(model, config)
    if dtype == jnp.float64:
        require_x64("mera.evenbly_vidal", f32="or pass policy='f32' for float32 sweeps")
    h: tuple[Any, Any]
    if legs is None:
        h = blocked_terms(model, dtype)
    else:
        h = MS.symmetric_terms(model, config.symmetry, policy)  # type: ignore[arg-type]  # checked above
    return Stepper.create(
        _ev_step,
        EvenblyVidalParams(h=h, config=config, parity=blocked_parity(model), legs=legs),
        init_fn=_ev_init,
        name="mera.evenbly_vidal" if legs is None else "mera.evenbly_vidal[symmetric]",
    )
