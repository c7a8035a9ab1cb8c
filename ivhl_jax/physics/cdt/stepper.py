"""The one door into a CDT Markov chain: :func:`make_params`, the stepper :func:`metropolis` and :func:`observe`.

One step of the stepper is one *sweep* of Metropolis attempts; the chain's PRNG key lives in its state
(:class:`Chain`). ``trajectory(metropolis(params), chain, sweeps, save_every=m, observe=observe)`` runs a
chain, ``jax.vmap`` over chains runs many, and ``chunked`` drives long runs with checkpoints. Static
choices (engine, proposal scheme, attempts per sweep, stopping at the target volume) are static fields of
:class:`CDTParams`; the couplings ``lam``, ``eps``, ``target`` are traced (a new value never recompiles).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ivhl_jax.core.validation import check_key, check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.cdt import moves
from ivhl_jax.physics.cdt.observables import measurements
from ivhl_jax.physics.cdt.state import BUFFER_MAX_CAPACITY, LN2, CDTState, buffer_layout, initial_state

__all__ = ["CDTParams", "Chain", "ENGINES", "PROPOSALS", "make_params", "metropolis", "observe", "max_capacity"]

ENGINES = ("jax", "host", "pallas")
PROPOSALS = ("uniform", "lists")


class CDTParams(flax.struct.PyTreeNode):
    """Action and schedule: ``S = lam N2 + eps (N2 - target)^2``; build it with :func:`make_params`.

    ``attempts_per_sweep`` (static): move attempts in one sweep; 0 means N2 at the start of the sweep (the
    sweep of the literature). ``engine`` (static): ``"jax"`` (pure XLA, any device) or ``"host"`` (the
    compiled CPU kernel of :mod:`ivhl_jax.physics.cdt.host`, needs ``numba``) or ``"pallas"`` (one Pallas
    kernel launch per sweep for all chains, :mod:`ivhl_jax.physics.cdt.pallas_engine`: compiled on a GPU, run
    in Pallas's interpreter on every other platform, exact but slow there). ``stop_at_target`` (static):
    with volume fixing the quadratic term only steers N2 towards ``target``; the fixed-volume ensemble is
    measured where N2 equals it, so each sweep continues (at most ten times its attempts more) until N2 ==
    target, the convention of the reference code 2d-cdt; a sweep that does not get there increments
    ``missed_target``. ``proposal`` (static): ``"uniform"`` (the moves of :mod:`ivhl_jax.physics.cdt.moves`,
    both engines) or ``"lists"`` (host engine only): proposals drawn from the lists of possible moves, as in
    2d-cdt, so that almost every attempt is accepted (a flip of a uniform flippable triangle, accepted with
    ``min(1, F/F')``, F the number of flippable triangles; an insertion on a uniform link, accepted with
    ``min(1, e^{-dS} N0/(N4+1))``; the removal of a uniform order-4 vertex, accepted with
    ``min(1, e^{-dS} N4/(N0-1))``, N4 the number of order-4 vertices; an insertion creates exactly one
    order-4 vertex, so N4(T') = N4 + 1 and these are the Metropolis-Hastings ratios of the move lists).
    """

    lam: jax.Array | float = LN2 + 0.1
    eps: jax.Array | float = 0.0
    target: jax.Array | float = 0.0
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=0)
    engine: str = flax.struct.field(pytree_node=False, default="jax")
    stop_at_target: bool = flax.struct.field(pytree_node=False, default=False)
    proposal: str = flax.struct.field(pytree_node=False, default="uniform")


def max_capacity(engine: str) -> int:
    """Most vertex slots the engine's index draw addresses (``"jax"``: 2^16; ``"host"``: 2^27, the buffer's
    int32 limit)."""
    if engine == "host":
        from ivhl_jax.physics.cdt import host

        return host.MAX_VERTEX_CAPACITY
    if engine in ("jax", "pallas"):  # the Pallas engine runs the JAX engine's moves and index draw
        return moves.MAX_VERTEX_CAPACITY
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def make_params(lam: float, *, eps: float = 0.0, target: float = 0.0, attempts_per_sweep: int = 0,
                engine: str = "jax", stop_at_target: bool | None = None, proposal: str | None = None) -> CDTParams:
    """Validated :class:`CDTParams`. Without volume fixing (``eps=0``) the chain needs ``lam > ln 2``.

    ``attempts_per_sweep`` defaults to 0: a sweep is N2 attempts (N2 at its start). ``stop_at_target``
    defaults to ``eps > 0`` (then ``target`` must be an even number of triangles); ``proposal`` to
    ``"lists"`` for the host engine and ``"uniform"`` for the JAX engine.
    """
    check_scalar(lam, "lam")
    check_scalar(eps, "eps", nonnegative=True)
    check_scalar(target, "target", nonnegative=True)
    check_scalar(attempts_per_sweep, "attempts_per_sweep", integer=True, nonnegative=True)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if proposal is None:
        proposal = "lists" if engine == "host" else "uniform"
    stop = bool(eps > 0) if stop_at_target is None else stop_at_target
    params = CDTParams(lam=float(lam), eps=float(eps), target=float(target), attempts_per_sweep=int(attempts_per_sweep),
                       engine=engine, stop_at_target=stop, proposal=proposal)
    _validate(params)
    return params


def _validate(params: Any) -> None:
    """Every check that depends on the physics and the step; values only where concrete (a vmapped sweep of
    couplings is checked where it was built)."""
    if not isinstance(params, CDTParams):
        raise TypeError(f"params must be CDTParams (from cdt.make_params); got {type(params).__name__}")
    if params.engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {params.engine!r}")
    if params.engine == "host":
        from ivhl_jax.physics.cdt import host

        host.require()
    if params.proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {params.proposal!r}")
    if params.proposal == "lists" and params.engine != "host":
        raise ValueError("proposal='lists' needs engine='host' (the JAX engine keeps no move lists); "
                         "use proposal='uniform'")
    if not isinstance(params.stop_at_target, bool):
        raise TypeError(f"stop_at_target must be a bool, got {params.stop_at_target!r}")
    check_scalar(params.attempts_per_sweep, "attempts_per_sweep", integer=True, nonnegative=True)
    values = {"lam": params.lam, "eps": params.eps, "target": params.target}
    if any(isinstance(v, jax.core.Tracer) or jnp.ndim(v) != 0 for v in values.values()):
        return
    check_scalar(values["lam"], "lam")
    check_scalar(values["eps"], "eps", nonnegative=True)
    check_scalar(values["target"], "target", nonnegative=True)
    lam, eps, target = (float(v) for v in values.values())
    if eps == 0 and lam <= LN2:
        raise ValueError(f"lam={lam} <= ln 2 = {LN2:.6f} without volume fixing: the volume diverges; "
                         "use lam > ln 2 or set eps > 0 and a target volume")
    if eps > 0 and target <= 0:
        raise ValueError("volume fixing (eps > 0) needs target > 0 (the target number of triangles N2)")
    if params.stop_at_target and (target <= 0 or target % 2):
        raise ValueError(f"stop_at_target needs an even target number of triangles N2 = 2 N0, got target={target:g}")


class Chain(flax.struct.PyTreeNode):
    """State of one Markov chain of :func:`metropolis`: its PRNG key and its triangulation ``geometry``."""

    key: jax.Array
    geometry: CDTState


def _host_sweep(key: jax.Array, state: CDTState, params: CDTParams) -> CDTState:
    from ivhl_jax.physics.cdt import host

    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    if params.stop_at_target:
        target_n0 = jnp.asarray(params.target, jnp.float32).astype(jnp.int32) // 2
        extra = moves._EXTRA
    else:
        target_n0, extra = jnp.int32(-1), 0
    buf = host.sweep(state.buf, seed, params, params.attempts_per_sweep, lay, state.vertex_capacity, target_n0, extra)
    return state.replace(buf=buf)


def _step(chain: Chain, params: CDTParams) -> Chain:
    """One sweep with a fresh subkey; the engine is a static field of ``params``."""
    key, sub = jax.random.split(chain.key)
    if params.engine == "pallas":
        from ivhl_jax.physics.cdt import pallas_engine

        sweep = pallas_engine.sweep_state
    else:
        sweep = _host_sweep if params.engine == "host" else moves.sweep
    return Chain(key=key, geometry=sweep(sub, chain.geometry, params))


def _init(params: CDTParams, key: jax.Array, n_slices: int, length: int, capacity: int | None = None) -> Chain:
    check_key(key, "key")
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    limit = max_capacity(params.engine)
    n0 = int(n_slices) * int(length)
    target = float(params.target) if is_concrete(params.target) and jnp.ndim(params.target) == 0 else 0.0
    if capacity is None:
        capacity = min(max(4 * n0, int(target)), limit, BUFFER_MAX_CAPACITY)
    check_scalar(capacity, "capacity", integer=True, minimum=n0)
    if int(capacity) > limit:
        raise ValueError(f"capacity={int(capacity)} vertex slots exceeds what the {params.engine} engine's index draw "
                         f"addresses ({limit}); use capacity <= {limit}"
                         + (" or engine='host'" if params.engine == "jax" else ""))
    if params.stop_at_target and target:
        need = int(target) // 2 + 1
        if int(capacity) < need:
            raise ValueError(f"capacity={int(capacity)} vertex slots is too few for the target N2 = {target:g} "
                             f"(N0 = N2/2 = {need - 1}); use capacity >= {2 * need}")
    return Chain(key=key, geometry=initial_state(n_slices, length, capacity))


def metropolis(params: CDTParams) -> Stepper[Chain, CDTParams]:
    """Stepper for the Metropolis chain: ``step(chain)`` is one sweep (``params.attempts_per_sweep`` attempts,
    or N2 when 0) with a fresh subkey split from ``chain.key``.

    ``init(key, n_slices, length, capacity=None)`` builds a :class:`Chain` on the regular torus of ``n_slices``
    slices of ``length`` vertices with ``capacity`` vertex slots (default ``max(4 N0, target)``, at most what
    the engine addresses, :func:`max_capacity`). ``trajectory(metropolis(p), chain, sweeps, save_every=m,
    observe=observe)`` compiles once per shapes and static settings (``lam``, ``eps``, ``target`` are traced).
    Many chains: ``jax.vmap(lambda k: stepper.init(k, T, l, C))(keys)`` and ``jax.vmap`` of the trajectory.
    """
    _validate(params)
    return Stepper(step_fn=_step, params=params, init_fn=_init, name="cdt.metropolis")


def observe(chain: Chain, params: CDTParams) -> dict[str, jax.Array]:
    """Cheap per-measurement observables of a chain (the ``observe`` of :func:`metropolis`): slice lengths
    ``lengths`` (T,), ``n2``, ``n0``, the coordination histogram ``coordination`` (33,), the largest timelike
    degree, the ``overflow`` and ``missed_target`` flags and the per-move ``attempts``/``accepts`` counters."""
    del params
    if not isinstance(chain, Chain):
        raise TypeError(f"chain must be a cdt.Chain (the state of cdt.metropolis; its triangulation is "
                        f"chain.geometry), got {type(chain).__name__}")
    return measurements(chain.geometry)
