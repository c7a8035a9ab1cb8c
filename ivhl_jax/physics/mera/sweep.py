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

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ivhl_jax.core.validation import check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.mera.config import (
    MERA,
    Layer,
    MERAConfig,
    cast,
    check_mera,
    init_tensors,
    precision_dtype,
    require_x64,
)
from ivhl_jax.physics.mera.models import Model, blocked_parity, blocked_terms, check_model
from ivhl_jax.physics.mera.superoperators import (
    as_matrix,
    ascend,
    ascend_raw,
    check_ops,
    descend,
    fixed_point_density,
    mirror_wv,
    pair,
    reflect_u,
)
from ivhl_jax.physics.tn import contract


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
#: The environment networks of u, w and v, shared with the block-sparse symmetric MERA.
ENVIRONMENT_DIAGRAMS = {"u": _ENV_U, "w": _ENV_W, "v": _ENV_V}


def _h_terms(h: tuple[jax.Array, jax.Array]) -> list[tuple[jax.Array, jax.Array]]:
    """``h`` may carry a leading axis of several Hamiltonians (the SI layer's scales): their environments add."""
    if h[0].ndim == 5:
        return [(h[0][j], h[1][j]) for j in range(h[0].shape[0])]
    return [(h[0], h[1])]


def _env_u(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array], refsym: bool) -> jax.Array:
    """Γ_u = Σ_{k=1..3} Γ_u(t_k), (χ_in, χ_in, m, m). With ``refsym``: Γ_u(t3) = R Γ_u(t1), and the update's
    projection onto reflection-symmetric u is (1 + R)(Γ_u(t1) + ½Γ_u(t2)) (= ½(1 + R)Γ_u, the scale is irrelevant
    to the SVD update); two networks instead of three."""
    u, w, v = layer
    wb, vb = w.conj(), v.conj()
    env = jnp.zeros_like(u)
    for h_ab, h_ba in _h_terms(h):
        if refsym:
            x = contract(_ENV_U[1], wb, vb, h_ab, w, u, v, rho[1]) + 0.5 * contract(
                _ENV_U[2], wb, vb, h_ba, w, u, v, rho[1]
            )
            env = env + x + reflect_u(x)
        else:
            env = env + sum(
                (contract(_ENV_U[k], wb, vb, (h_ab, h_ba, h_ab)[k - 1], w, u, v, rho[1]) for k in (1, 2, 3)),
                jnp.zeros_like(u),
            )
    return env


def _env_wv(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array], which: str) -> jax.Array:
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
        env = (
            env
            + contract(_ENV_W[1], ub, vb, h_ab, w, u, v, rho[1])
            + mirror_wv(contract(_ENV_V[1], wb, ub, h_ab, w, u, v, rho[1]))
            + contract(_ENV_W[2], ub, vb, h_ba, w, u, v, rho[1])
            + contract(_ENV_W[4], vb, h_ba, v, w, rho[0])
        )
    return env


def _layer_energy(layer: Layer, h: tuple[jax.Array, jax.Array], rho: tuple[jax.Array, jax.Array]) -> jax.Array:
    """⟨ρ', 𝒜(h)⟩ (summed over stacked h); the reference the explicit environments are tested against."""
    u, w, v = layer
    total = jnp.zeros((), rho[0].dtype)
    for h_ab, h_ba in _h_terms(h):
        a, b = ascend_raw(h_ab, h_ba, u, w, v)
        total = total + pair(rho[0], a) + pair(rho[1], b)
    return total


def _update_layer(
    layer: Layer,
    h: tuple[jax.Array, jax.Array],
    rho: tuple[jax.Array, jax.Array],
    do_u: jax.Array,
    refsym: bool = False,
) -> Layer:
    """Evenbly–Vidal update of one layer: u from Γ_u (old u, w, v), then w (and v) from environments with the
    new u. With ``refsym`` v = mirror(w) and only w's environment is contracted."""
    u, w, v = layer
    u = jnp.where(do_u, _svd_update(_env_u((u, w, v), h, rho, refsym), 2), u)
    if refsym:
        w = _svd_update(_env_w_refsym((u, w, v), h, rho), 1)
        return u, w, mirror_wv(w)
    w = _svd_update(_env_wv((u, w, v), h, rho, "w"), 1)
    v = _svd_update(_env_wv((u, w, v), h, rho, "v"), 1)
    return u, w, v


def _bias(h: jax.Array) -> jax.Array:
    return jnp.max(jnp.linalg.eigvalsh(as_matrix(h)))


def energy_per_site(mera: MERA, h: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Energy per physical site (each blocked site holds 2 spins): (⟨ρ_AB,h_AB⟩ + ⟨ρ_BA,h_BA⟩)/4 at the bottom."""
    check_ops(h, "h", check_mera(mera).layer(0))  # the arguments first, then the precision rule
    require_x64("mera.energy_per_site")
    rho = (mera.rho_ab, mera.rho_ba)
    for z in reversed(range(mera.num_layers - 1)):
        rho = descend(rho, mera.layer(z))
    return (pair(rho[0], h[0]) + pair(rho[1], h[1])) / 4.0


def sweep(
    mera: MERA,
    h: tuple[jax.Array, jax.Array],
    power_iters: int = 4,
    u_delay: int = 10,
    refsym: bool = False,
    si_scales: int = 1,
) -> tuple[MERA, jax.Array]:
    """One Evenbly–Vidal sweep. Returns (new MERA, energy per site measured before the tensor updates).

    ``h`` is the unshifted bottom Hamiltonian (h_AB, h_BA); it is shifted internally to be negative definite.
    """
    check_ops(h, "h", check_mera(mera).layer(0))
    check_scalar(power_iters, "power_iters", integer=True, minimum=1)
    check_scalar(u_delay, "u_delay", integer=True, nonnegative=True)
    check_scalar(si_scales, "si_scales", integer=True, minimum=1)
    n = mera.num_layers
    si = mera.layer(n - 1)
    if refsym:
        # v = mirror(w) exactly (a grown or hand-made MERA may not have it yet); u is made symmetric by its first
        # update (its environment is symmetrised), so a non-symmetric u costs at most one approximate sweep.
        mera = mera.replace(v=tuple(mirror_wv(w) for w in mera.w))
        si = mera.layer(n - 1)
    rho_top = fixed_point_density(si, (mera.rho_ab, mera.rho_ba), power_iters, refsym)
    if refsym:
        rho_top = (
            0.5 * (rho_top[0] + jnp.transpose(rho_top[0], (1, 0, 3, 2))),
            0.5 * (rho_top[1] + jnp.transpose(rho_top[1], (1, 0, 3, 2))),
        )
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
            # Σ_j 2^{-j} Γ(ρ*, 𝒜^j h_top) of j extra copies of the layer at fixed steady state ρ*; j = 0 only
            # (mainVarMERA, si_scales = 1, the default) converges faster.
            hs = [hz]
            for _ in range(si_scales - 1):
                hs.append(ascend(hs[-1], si, refsym))
            hz = (
                jnp.stack([hh[0] * 0.5**j for j, hh in enumerate(hs)]),
                jnp.stack([hh[1] * 0.5**j for j, hh in enumerate(hs)]),
            )
        layer = _update_layer(mera.layer(z), hz, rho_above, do_u, refsym)
        us.append(layer[0])
        ws.append(layer[1])
        vs.append(layer[2])
        if z + 1 < n:
            hz = ascend(hz, layer, refsym)
    new = MERA(tuple(us), tuple(ws), tuple(vs), rho_top[0], rho_top[1], mera.sweeps + 1)
    return new, energy


# ------------------------------------------------------------------------------------------- stepper


class EvenblyVidalParams(struct.PyTreeNode):
    """What one Evenbly–Vidal sweep reads: the blocked two-site Hamiltonian ``h = (h_AB, h_BA)``, each
    (d², d², d², d²) for spins of dimension d, traced (built once from the model by :func:`evenbly_vidal`); and the
    :class:`MERAConfig` (static: its settings change the compiled sweep)."""

    h: tuple[jax.Array, jax.Array]
    config: MERAConfig = struct.field(pytree_node=False)
    parity: tuple | None = struct.field(pytree_node=False, default=None)  # the model's, on a blocked site


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
    dtype = params.h[0].dtype
    d = int(params.h[0].shape[0])
    if mera is None:
        if key is None:
            raise TypeError(
                "mera.evenbly_vidal.init needs key (a PRNG key, e.g. jax.random.key(0)) for a fresh MERA, or mera= "
                "to continue from one"
            )
        # drawn in the default float (float64 under x64) and cast, so a seed gives the same start in every dtype
        mera = init_tensors(key, params.config, d=d, parity=params.parity)
    else:
        check_mera(mera)
        if mera.d != d:
            raise ValueError(f"mera has bottom sites of dimension {mera.d}, the stepper's model needs {d}")
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
    if config.symmetry is not None:  # block-sparse symmetric tensors (checks its arguments, then the precision)
        from ivhl_jax.physics.mera.symmetric import evenbly_vidal_symmetric

        return evenbly_vidal_symmetric(model, config, policy=policy)
    if dtype == jnp.float64:
        require_x64("mera.evenbly_vidal", f32="or pass policy='f32' for float32 sweeps")
    h = blocked_terms(model, dtype)
    return Stepper.create(
        _ev_step,
        EvenblyVidalParams(h=h, config=config, parity=blocked_parity(model)),
        init_fn=_ev_init,
        name="mera.evenbly_vidal",
    )
