"""The one door into a CDT Markov chain: the stepper :func:`metropolis` and :func:`observe`.

One step of the stepper is one *sweep*: a fixed number of Metropolis attempts, fixed before the chain runs
(:class:`MetropolisParams`, :func:`metropolis`), never read from the chain's current state (a sweep whose length
depended on the volume it started from would measure small triangulations more often than their weight).
The chain's PRNG key lives in its state (:class:`Chain`). ``trajectory(metropolis(lam, ...), chain, sweeps,
save_every=m, observe=observe)`` runs a chain, ``jax.vmap`` over chains runs many, and ``chunked`` drives long
runs with checkpoints. Static choices (engine, proposal scheme, attempts per sweep, the biased first-hit
stop) are static fields of :class:`MetropolisParams`; the couplings ``lam``, ``eps``, ``target`` are traced (a new
value never recompiles) and may be arrays of one shape: a batch of parameter sets for ``jax.vmap``.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_couplings, check_key, check_scalar, concrete_max, is_concrete
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.cdt import moves
from ivhl_jax.physics.cdt.observables import measurements
from ivhl_jax.physics.cdt.state import BUFFER_MAX_CAPACITY, LN2, CDTState, buffer_layout, initial_state

__all__ = [
    "MetropolisParams",
    "Chain",
    "ENGINES",
    "PROPOSALS",
    "metropolis",
    "observe",
    "at_target_mean",
    "at_target_mean_error",
    "max_capacity",
    "default_attempts",
    "default_capacity",
]

ENGINES = ("jax", "host", "pallas")
PROPOSALS = ("uniform", "lists")


class MetropolisParams(flax.struct.PyTreeNode):
    """Action and schedule: ``S = lam N2 + eps (N2 - target)^2``; built and checked by :func:`metropolis`.

    ``attempts_per_sweep`` (static): move attempts in one sweep, a number fixed before the chain runs; 0 (the
    default) lets :func:`metropolis`'s ``init`` fix it for the chain it builds (:attr:`Chain.attempts_per_sweep`):
    the target N2 with volume fixing (``eps > 0``), else N2 = 2 T l of the starting torus; never the N2 of the
    state a sweep starts from. ``engine`` (static): ``"jax"`` (pure XLA, any device) or ``"host"`` (the compiled
    CPU kernel of :mod:`ivhl_jax.physics.cdt.host`, needs ``numba``) or ``"pallas"`` (one Pallas kernel launch
    per sweep for all chains, :mod:`ivhl_jax.physics.cdt.pallas_engine`: compiled on a GPU, run in Pallas's
    interpreter on every other platform, exact but slow there). The fixed-volume ensemble: with volume fixing
    the quadratic term only steers N2 towards ``target``; the chain's stationary law restricted to N2 == target
    is the fixed-volume ensemble (the action is constant there), so it is measured on the states of sweeps of
    fixed length that are at the target (``observe``'s ``at_target``) and on no others. ``stop_at_first_hit``
    (static, default False): each sweep instead continues (at most ten times its attempts more) until N2 first
    equals the target, 2d-cdt's convention; a sweep that does not get there increments ``missed_target``.
    That rule is **biased**: a first-hit state is weighted by how easily its configuration leaves and re-enters
    the target volume (against exact enumeration at T = 3, N0 = 12 it moves the mean number of vertices of
    coordination 4 by +5 % on the JAX engine and -2 % on the host engine, many standard errors); it is kept
    to compare with 2d-cdt, never for measurements. ``proposal`` (static): ``"uniform"`` (the moves of
    :mod:`ivhl_jax.physics.cdt.moves`, both engines) or ``"lists"`` (host engine only): proposals drawn from the
    lists of possible moves, as in 2d-cdt, so that almost every attempt is accepted (a flip of a uniform
    flippable triangle, accepted with ``min(1, F/F')``, F the number of flippable triangles; an insertion on a
    uniform link, accepted with ``min(1, e^{-dS} N0/(N4+1))``; the removal of a uniform order-4 vertex, accepted
    with ``min(1, e^{-dS} N4/(N0-1))``, N4 the number of order-4 vertices; an insertion creates exactly one
    order-4 vertex, so N4(T') = N4 + 1 and these are the Metropolis-Hastings ratios of the move lists).
    """

    lam: jax.Array | float = LN2 + 0.1
    eps: jax.Array | float = 0.0
    target: jax.Array | float = 0.0
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=0)
    engine: str = flax.struct.field(pytree_node=False, default="jax")
    stop_at_first_hit: bool = flax.struct.field(pytree_node=False, default=False)
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


def _validate(params: Any) -> None:
    """Every check that depends on the physics and the step; values only where concrete (a vmapped sweep of
    couplings is checked where it was built)."""
    if not isinstance(params, MetropolisParams):
        raise TypeError(f"params must be MetropolisParams (built by cdt.metropolis); got {type(params).__name__}")
    if params.engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {params.engine!r}")
    if params.engine == "host":
        from ivhl_jax.physics.cdt import host

        host.require()
    if params.proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {params.proposal!r}")
    if params.proposal == "lists" and params.engine != "host":
        raise ValueError(
            "proposal='lists' needs engine='host' (the JAX engine keeps no move lists); use proposal='uniform'"
        )
    if not isinstance(params.stop_at_first_hit, bool):
        raise TypeError(f"stop_at_first_hit must be a bool, got {params.stop_at_first_hit!r}")
    check_scalar(params.attempts_per_sweep, "attempts_per_sweep", integer=True, nonnegative=True)
    values = {"lam": params.lam, "eps": params.eps, "target": params.target}
    if not all(is_concrete(v) for v in values.values()):
        return
    for name, v in values.items():
        for x in np.asarray(v).reshape(-1):
            check_scalar(x, name, nonnegative=name != "lam")
    try:
        lam, eps, target = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in values.values()))
    except ValueError:
        raise ValueError(
            f"lam, eps and target must broadcast to one shape, got shapes {tuple(np.shape(v) for v in values.values())}"
        ) from None
    bad = (eps == 0) & (lam <= LN2)
    if bad.any():
        raise ValueError(
            f"lam={lam[bad].flat[0]} <= ln 2 = {LN2:.6f} without volume fixing: the volume diverges; "
            "use lam > ln 2 or set eps > 0 and a target volume"
        )
    if ((eps > 0) & (target <= 0)).any():
        raise ValueError("volume fixing (eps > 0) needs target > 0 (the target number of triangles N2)")
    odd = (eps > 0) & (target % 2 != 0)
    if odd.any():
        raise ValueError(
            f"volume fixing (eps > 0) needs an even target number of triangles N2 = 2 N0 (the fixed-volume "
            f"ensemble is the states at N2 == target), got target={target[odd].flat[0]:g}"
        )
    if params.stop_at_first_hit and ((eps <= 0) | (target <= 0)).any():
        raise ValueError("stop_at_first_hit needs volume fixing: eps > 0 and an even target > 0")


class Chain(flax.struct.PyTreeNode):
    """State of one Markov chain of :func:`metropolis`: its PRNG key, its triangulation ``geometry`` and
    ``attempts_per_sweep`` (static), the length of its sweeps fixed by ``init`` (used where
    ``params.attempts_per_sweep`` is 0; 0 here means not fixed, a chain built by hand)."""

    key: jax.Array
    geometry: CDTState
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=0)


def _attempts(chain: Chain, params: MetropolisParams) -> int:
    """The attempts of one sweep: ``params.attempts_per_sweep``, else the chain's own (fixed by ``init``)."""
    n = int(params.attempts_per_sweep) or int(chain.attempts_per_sweep)
    if n < 1:
        raise ValueError(
            "the sweep length is not fixed: params.attempts_per_sweep and chain.attempts_per_sweep are "
            "both 0; build the chain with the stepper's init(...) or pass attempts_per_sweep to "
            "cdt.metropolis"
        )
    return n


_BLOCK = 4096  # attempts per block of random words: bounds the memory of many vmapped chains


def _jax_sweep(key: jax.Array, state: CDTState, params: Any, n: int | None = None) -> CDTState:
    """One sweep on the JAX engine: ``n`` Metropolis attempts (default ``params.attempts_per_sweep``; a fixed
    count, never the state's N2), then (with ``params.stop_at_first_hit``, biased) more until N2 == target, at most
    ``10 n``; pure, O(1) work per attempt. Random words come from ``key`` in blocks of 4096 attempts.
    """
    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    c0 = state.vertex_capacity
    target_n0 = jnp.asarray(params.target, jnp.float32).astype(jnp.int32) // 2 if params.stop_at_first_hit else None
    n = moves.sweep_length(n, params)
    buf = state.buf
    full, rest = divmod(n, _BLOCK)
    if full:

        def block(b, buf):
            bits = jax.random.bits(jax.random.fold_in(key, b), (_BLOCK, 2), jnp.uint32)
            return moves.attempts(buf, bits, params, lay, c0)

        buf = jax.lax.fori_loop(0, full, block, buf)
    if rest:
        bits = jax.random.bits(jax.random.fold_in(key, full), (rest, 2), jnp.uint32)
        buf = moves.attempts(buf, bits, params, lay, c0)
    if target_n0 is not None:
        extra = moves.EXTRA_ATTEMPTS * n
        buf = _until_target(buf, jax.random.fold_in(key, full + 1), target_n0, extra, params, lay, c0)
    return state.replace(buf=buf)


def _until_target(buf, key, target_n0, max_extra, params, lay, c0):
    """Attempts until n0 == target_n0, at most ``max_extra`` (rounded up to whole blocks); a miss increments
    ``missed_target``. A while loop over blocks of 256 attempts, each a no-op once the target is reached:
    under vmap a while loop selects between old and new carry of every chain each iteration (O(capacity)),
    so the iterations must be few; the gating keeps the stop exact (``move_writes(stop_n0=...)``)."""
    o_n0, o_miss = lay["n0"][0], lay["missed_target"][0]
    block = 256

    def cond(c):
        b, i = c
        return (b[o_n0] != target_n0) & (i < max_extra)

    def body(c):
        b, i = c
        bits = jax.random.bits(jax.random.fold_in(key, i), (block, 2), jnp.uint32)
        return moves.attempts(b, bits, params, lay, c0, stop_n0=target_n0), i + block

    buf, _ = jax.lax.while_loop(cond, body, (buf, jnp.int32(0)))
    return buf.at[o_miss].add((buf[o_n0] != target_n0).astype(jnp.int32))


def _step(chain: Chain, params: MetropolisParams) -> Chain:
    """One sweep of a fixed number of attempts (:func:`_attempts`) with a fresh subkey; the engine is a static
    field of ``params``."""
    n = _attempts(chain, params)
    key, sub = jax.random.split(chain.key)
    if params.engine == "pallas":
        from ivhl_jax.physics.cdt import pallas_engine

        sweep = pallas_engine.sweep_state
    elif params.engine == "host":
        from ivhl_jax.physics.cdt import host

        sweep = host.sweep_state
    else:
        sweep = _jax_sweep
    return chain.replace(key=key, geometry=sweep(sub, chain.geometry, params, n))


#: Default capacity without volume fixing: 2 T (3 + (lam - ln 2)^(-1/2)) + 25/(lam - ln 2) vertex slots (twice a
#: bound on <N0> = T <l>, <l> < 3 + (lam - ln 2)^(-1/2), plus 25/(lam - ln 2): the law of N0 falls as
#: exp(-2 (lam - ln 2) N0), so the margin leaves a weight of order e^-50 beyond the capacity).
_TAIL = 25.0


def default_capacity(params: MetropolisParams, n_slices: int, length: int) -> int:
    """Vertex slots :func:`metropolis`'s ``init`` gives a chain of ``n_slices`` slices of ``length`` vertices.

    With volume fixing (``eps > 0``): ``max(4 N0, target)`` (N0 = T l; the target N2 is twice the target N0).
    Without: ``max(4 N0, 2 T (3 + d^(-1/2)) + 25/d)``, ``d = lam - ln 2`` (smallest ``lam`` of a batch): the
    grand-canonical volume is unbounded, its law falls as ``exp(-2 d N0)``, and an insertion that does not fit
    is rejected (the chain then samples the volume law cut at the capacity, and ``overflow`` is set). At most
    what the engine addresses (:func:`max_capacity`). A traced ``lam`` without volume fixing has no default
    (pass ``capacity``)."""
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    t, n0 = int(n_slices), int(n_slices) * int(length)
    eps, target = concrete_max(params.eps), concrete_max(params.target)
    if params.stop_at_first_hit or (eps is not None and eps > 0):
        if target is None:
            raise ValueError("the default capacity needs a concrete target (traced here); pass capacity")
        cap = max(4 * n0, int(target))
    else:
        lam = None if not is_concrete(params.lam) else float(np.min(np.asarray(params.lam)))
        if lam is None:
            raise ValueError(
                "the default capacity needs a concrete lam without volume fixing (it grows as lam "
                "approaches ln 2; lam is traced here); pass capacity"
            )
        d = lam - LN2
        cap = max(4 * n0, math.ceil(2 * t * (3.0 + d**-0.5) + _TAIL / d))
    return min(cap, max_capacity(params.engine), BUFFER_MAX_CAPACITY)


def default_attempts(params: MetropolisParams, n_slices: int, length: int) -> int:
    """Attempts per sweep of a chain that ``init`` starts on ``n_slices`` slices of ``length`` vertices:
    ``params.attempts_per_sweep`` if set, else the target N2 with volume fixing (``eps > 0``; the largest of a
    batch), else N2 = 2 T l of the starting torus. Fixed before the chain runs:
    a sweep never depends on the state it starts from."""
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    if params.attempts_per_sweep:
        return int(params.attempts_per_sweep)
    eps, target = concrete_max(params.eps), concrete_max(params.target)
    if params.stop_at_first_hit or (eps is not None and eps > 0):
        if target is None:
            raise ValueError(
                "attempts_per_sweep=0 takes the target N2 with volume fixing, but target is traced "
                "here; pass attempts_per_sweep to cdt.metropolis"
            )
        return max(int(target), 1)
    return 2 * int(n_slices) * int(length)


def _init(params: MetropolisParams, key: jax.Array, n_slices: int, length: int, capacity: int | None = None) -> Chain:
    check_key(key, "key")
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    limit = max_capacity(params.engine)
    n0 = int(n_slices) * int(length)
    if capacity is None:
        capacity = default_capacity(params, n_slices, length)
    check_scalar(capacity, "capacity", integer=True, minimum=n0)
    if int(capacity) > limit:
        raise ValueError(
            f"capacity={int(capacity)} vertex slots exceeds what the {params.engine} engine's index draw "
            f"addresses ({limit}); use capacity <= {limit}" + (" or engine='host'" if params.engine == "jax" else "")
        )
    target, eps = concrete_max(params.target), concrete_max(params.eps)
    if (params.stop_at_first_hit or (eps is not None and eps > 0)) and target:
        need = int(target) // 2 + 1
        if int(capacity) < need:
            raise ValueError(
                f"capacity={int(capacity)} vertex slots is too few for the target N2 = {target:g} "
                f"(N0 = N2/2 = {need - 1}); use capacity >= {2 * need}"
            )
    return Chain(
        key=key,
        geometry=initial_state(n_slices, length, capacity),
        attempts_per_sweep=default_attempts(params, n_slices, length),
    )


def metropolis(
    lam: Any,
    *,
    eps: Any = 0.0,
    target: Any = 0.0,
    attempts_per_sweep: int = 0,
    engine: str = "jax",
    stop_at_first_hit: bool = False,
    proposal: str | None = None,
) -> Stepper[Chain, MetropolisParams]:
    """Stepper for the Metropolis chain of the action ``S = lam N2 + eps (N2 - target)^2``: ``step(chain)`` is one
    sweep of a fixed number of attempts with a fresh subkey split from ``chain.key``: ``attempts_per_sweep``, or
    when that is 0 the chain's own ``chain.attempts_per_sweep``, fixed by ``init`` (:func:`default_attempts`: the
    target N2 with volume fixing, else N2 = 2 T l of the starting torus). The length of a sweep never depends on
    the state it starts from. Without volume fixing (``eps=0``) the chain needs ``lam > ln 2``.

    ``lam``, ``eps`` and ``target`` are numbers, arrays, or traced values (``metropolis`` inside
    ``jax.vmap``/``jit``): arrays are broadcast to one shape, so the parameters are a batch of parameter sets
    (``jax.vmap`` over the stepper runs one chain per set); concrete values are checked element by element, traced
    ones cannot be. With volume fixing (``eps > 0``, an even ``target``) the fixed-volume ensemble is the measurements
    with ``observe``'s ``at_target`` (N2 == target) after sweeps of fixed length; ``stop_at_first_hit=True``
    is 2d-cdt's biased rule (:class:`MetropolisParams`). ``proposal`` defaults to ``"lists"`` for the
    host engine and ``"uniform"`` for the JAX engine (:class:`MetropolisParams` describes the static settings).

    ``init(key, n_slices, length, capacity=None)`` builds a :class:`Chain` on the regular torus of ``n_slices``
    slices of ``length`` vertices with ``capacity`` vertex slots (default :func:`default_capacity`: ``max(4 N0,
    target)`` with volume fixing, room for the grand-canonical volume law without; at most what the engine
    addresses, :func:`max_capacity`). ``trajectory(metropolis(lam, ...), chain, sweeps, save_every=m,
    observe=observe)`` compiles once per shapes and static settings (``lam``, ``eps``, ``target`` are traced).
    Many chains: ``jax.vmap(lambda k: stepper.init(k, T, l, C))(keys)`` and ``jax.vmap`` of the trajectory. A
    batch of couplings (arrays of one shape): ``jax.vmap`` over the stepper and a chain per parameter set,
    ``jax.vmap(lambda s, c: trajectory(s, c, ...))(stepper, chains)``.
    """
    check_scalar(attempts_per_sweep, "attempts_per_sweep", integer=True, nonnegative=True)  # before int()
    params = MetropolisParams(
        **check_couplings({"lam": lam, "eps": eps, "target": target}, signed=("lam",)),
        attempts_per_sweep=int(attempts_per_sweep),
        engine=engine,
        stop_at_first_hit=stop_at_first_hit,
        proposal=("lists" if engine == "host" else "uniform") if proposal is None else proposal,
    )
    _validate(params)  # the engine, the proposal, the flag and the couplings' physics
    return Stepper.create(_step, params, init_fn=_init, name="cdt.metropolis")


def observe(chain: Chain, params: MetropolisParams) -> dict[str, jax.Array]:
    """Cheap per-measurement observables of a chain (the ``observe`` of :func:`metropolis`): slice lengths
    ``lengths`` (T,), ``n2``, ``n0``, the coordination histogram ``coordination`` (33,), the largest timelike
    degree, the ``overflow`` and ``missed_target`` flags, the per-move ``attempts``/``accepts`` counters and
    ``at_target``: whether the measurement belongs to the fixed-volume ensemble (N2 == target with volume
    fixing, ``eps > 0``; always True without). Fixed-volume averages are over the measurements with
    ``at_target`` only (the chain's law restricted to N2 == target; :func:`at_target_mean`)."""
    if not isinstance(chain, Chain):
        raise TypeError(
            f"chain must be a cdt.Chain (the state of cdt.metropolis; its triangulation is "
            f"chain.geometry), got {type(chain).__name__}"
        )
    if not isinstance(params, MetropolisParams):
        raise TypeError(f"params must be MetropolisParams (built by cdt.metropolis); got {type(params).__name__}")
    out = measurements(chain.geometry)
    target = jnp.round(jnp.asarray(params.target, jnp.float32)).astype(jnp.int32)
    out["at_target"] = (jnp.asarray(params.eps) <= 0) | (chain.geometry.n2 == target)
    return out


def at_target_mean(values: Any, at_target: Any, axis: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Mean of ``values`` over the measurements with ``at_target`` (the fixed-volume ensemble), NumPy.

    ``at_target`` (bool) has the leading shape of ``values`` (e.g. ``(chains, measurements)`` for
    ``values`` of shape ``(chains, measurements, T)``); ``axis``: the axes of ``values`` averaged over (default:
    those of ``at_target``, so a profile (T,) comes back). An average with no measurement at the target is NaN:
    raise the number of sweeps."""
    v = np.asarray(values, np.float64)
    m = np.asarray(at_target, bool)
    if v.shape[: m.ndim] != m.shape:
        raise ValueError(f"at_target of shape {m.shape} must lead the shape of values {v.shape}")
    w = m.reshape(m.shape + (1,) * (v.ndim - m.ndim)).astype(np.float64)
    axes = tuple(range(m.ndim)) if axis is None else axis
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(np.where(w > 0, v, 0.0), axis=axes) / np.sum(np.broadcast_to(w, v.shape), axis=axes)


def at_target_mean_error(values: Any, at_target: Any) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-volume mean of ``values`` (chains, measurements, ...) over the measurements with ``at_target``
    (chains, measurements) of independent chains, and its standard error, NumPy float64.

    The mean is the ratio ``sum_c S_c / sum_c K_c`` (``S_c`` the sum of chain c's values at the target, ``K_c``
    their number; every measurement at the target weighs the same); the error is the delta-method error of that
    ratio over the chains, ``sqrt(C/(C-1) sum_c (S_c - mean K_c)^2) / sum_c K_c``, which holds whatever the
    autocorrelation within a chain (the chains must be many, tens at least, and each long against its
    autocorrelation time)."""
    v = np.asarray(values, np.float64)
    m = np.asarray(at_target, bool)
    if m.ndim != 2 or v.shape[:2] != m.shape:
        raise ValueError(
            f"values (chains, measurements, ...) and at_target (chains, measurements) must share their two leading "
            f"axes, got shapes {v.shape} and {m.shape}"
        )
    if m.shape[0] < 2:
        raise ValueError(f"the error needs at least 2 independent chains, got {m.shape[0]}")
    w = m.reshape(m.shape + (1,) * (v.ndim - 2)).astype(np.float64)
    s_c, k_c = (np.where(w > 0, v, 0.0)).sum(1), w.sum(1)
    total = k_c.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s_c.sum(0) / total
        c = m.shape[0]
        err = np.sqrt(np.sum((s_c - mean * k_c) ** 2, 0) * c / (c - 1)) / total
    return mean, err
