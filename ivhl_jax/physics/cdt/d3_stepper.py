"""The one door into a 2+1D CDT Markov chain: the stepper :func:`metropolis_3d` and :func:`observe_3d`.

Triangulations of S² × S¹ (``T`` periodic slices, each a triangulated 2-sphere) by (3,1), (1,3) and (2,2)
tetrahedra (:mod:`~ivhl_jax.physics.cdt.d3_state`), the action ``S = -k0 N0 + k3 N3 + eps (N_fix - target)^2``
and the moves (2,6)/(6,2), (4,4), (2,3)/(3,2) with their Metropolis–Hastings ratios
(:mod:`~ivhl_jax.physics.cdt.d3_host`, where the ratios are derived). The couplings mean what they mean in the
reference code JorenB/3d-cdt: ``k0``, ``k3`` multiply N0 and N3; the volume term is quadratic with the
reference's ``epsilon = 4e-5``; ``target`` counts the (3,1) tetrahedra (the reference's ``volfixswitch 0``,
``fix="n31"``: the total spatial area, ``sum(slice_volumes)``) or all tetrahedra (``fix="n3"``, ``volfixswitch
1``); one sweep is ``attempts_per_sweep`` attempts, the reference's ``ksteps * 1000`` (its example config:
``ksteps 1000``, 10^6 attempts). The reference also tunes ``k3`` during thermalisation so that the volume
settles at the target; here ``k3`` is fixed: pass the value the reference's tuning ends at.

The builder is named after its scheme like every builder (``cdt.metropolis`` runs the 1+1D chain); the suffix
names the dimension because the 2+1D chain is another family in the same ``cdt`` namespace, with its own
parameters (:class:`Metropolis3dParams`) and state (:class:`Chain3d`).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_couplings, check_key, check_scalar, concrete_max, is_concrete
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.cdt.d3_state import ENGINES, MAX_TETRA_CAPACITY, CDT3State, SweepPlan, initial_state

__all__ = [
    "Metropolis3dParams",
    "Chain3d",
    "metropolis_3d",
    "observe_3d",
    "default_capacity_3d",
    "REFERENCE_EPSILON",
    "REFERENCE_SWEEP",
]

#: The reference's volume-fixing coefficient (``Simulation::epsilon``, fixed in its source).
REFERENCE_EPSILON = 4e-5
#: Attempts of one reference sweep with its example config (``ksteps 1000`` x 1000).
REFERENCE_SWEEP = 1_000_000
FIXES = ("n31", "n3")
MEASURES = ("action", "reference")
_EXTRA = 10  # stop_at_target: at most this many times a sweep's attempts more


class Metropolis3dParams(flax.struct.PyTreeNode):
    """Couplings and schedule of :func:`metropolis_3d` (built and checked there).

    ``k0``, ``k3``, ``eps``, ``target`` (traced; scalars or arrays of one shape, a batch for ``jax.vmap``; they reach
    the kernel as float32, so a ``k3`` agrees with the reference's double to about 1e-7):
    ``S = -k0 N0 + k3 N3 + eps (N_fix - target)^2`` (no volume term when ``target`` is 0). Static:
    ``attempts_per_sweep``; ``fix`` (``"n31"``: ``N_fix`` the number of (3,1) tetrahedra, ``"n3"``: all);
    ``measure`` (``"action"``: detailed balance with respect to ``e^{-S}``; ``"reference"``: the reference
    code's (2,6)/(6,2) ratios, whose stationary law is ``e^{-S}`` times a function of N(3,1), see
    :mod:`~ivhl_jax.physics.cdt.d3_host`); ``stop_at_target``: after its attempts a sweep continues (at most ten
    times as many more) until ``N_fix == target``, the reference's rule before each measurement (a first-hit
    rule, biased towards configurations that re-enter the target easily; a miss increments
    ``missed_target``); ``engine``: ``"host"`` (numba through a callback) or ``"jax"`` (pure XLA,
    :mod:`~ivhl_jax.physics.cdt.d3_jax`: the same chain, for many chains under ``vmap`` on any device)."""

    k0: jax.Array | float = 0.0
    k3: jax.Array | float = 0.0
    eps: jax.Array | float = REFERENCE_EPSILON
    target: jax.Array | float = 0.0
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=REFERENCE_SWEEP)
    fix: str = flax.struct.field(pytree_node=False, default="n31")
    measure: str = flax.struct.field(pytree_node=False, default="action")
    stop_at_target: bool = flax.struct.field(pytree_node=False, default=False)
    engine: str = flax.struct.field(pytree_node=False, default="host")


class Chain3d(flax.struct.PyTreeNode):
    """State of one 2+1D chain: its PRNG key and its triangulation ``geometry``."""

    key: jax.Array
    geometry: CDT3State


def default_capacity_3d(params: Metropolis3dParams, n_slices: int) -> int:
    """Tetrahedron slots :func:`metropolis_3d`'s ``init`` gives a chain: with ``fix="n31"`` ``8 target`` (N3 =
    2 N(3,1) + N22, and N22 stays below 6 N(3,1) in every phase the tests and runs meet; an insertion that does
    not fit is rejected and sets ``overflow``), with ``fix="n3"`` ``2 target``; at least ``36 T`` (twice the
    start). Without volume fixing there is no default: pass ``capacity``."""
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    target = concrete_max(params.target)
    if target is None:
        raise ValueError("the default capacity needs a concrete target (traced here); pass capacity")
    if target <= 0:
        raise ValueError(
            "without volume fixing (target=0) the volume is not bounded by the action: pass init(..., capacity=) "
            "(tetrahedron slots)"
        )
    cap = int(8 * target) if params.fix == "n31" else int(2 * target)
    return min(max(cap, 36 * int(n_slices)), MAX_TETRA_CAPACITY)


def _init(params: Metropolis3dParams, key: jax.Array, n_slices: int, capacity: int | None = None) -> Chain3d:
    check_key(key, "key")
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    if capacity is None:
        capacity = default_capacity_3d(params, n_slices)
    check_scalar(capacity, "capacity", integer=True, minimum=18 * int(n_slices))
    if int(capacity) > MAX_TETRA_CAPACITY:
        raise ValueError(f"capacity={int(capacity)} exceeds {MAX_TETRA_CAPACITY} tetrahedron slots; use less")
    target = concrete_max(params.target)
    if target and params.fix == "n3" and int(capacity) < target:
        raise ValueError(
            f"capacity={int(capacity)} is below the target N3 = {target:g}; use capacity >= {2 * target:g}"
        )
    if target and params.fix == "n31" and int(capacity) < 3 * target:
        raise ValueError(
            f"capacity={int(capacity)} is too few for the target N(3,1) = {target:g} (N3 >= 2 N(3,1) + N22); "
            f"use capacity >= {8 * target:g}"
        )
    return Chain3d(key=key, geometry=initial_state(n_slices, int(capacity)))


def _step(chain: Chain3d, params: Metropolis3dParams) -> Chain3d:
    """One sweep of ``params.attempts_per_sweep`` attempts with a fresh subkey (on ``params.engine``)."""
    from ivhl_jax.physics.cdt import d3_host, d3_jax

    key, sub = jax.random.split(chain.key)
    g = chain.geometry
    sweep: Any  # the engines' sweeps take the same arguments; the JAX engine's its key, the host's seed words
    if params.engine == "jax":
        sweep, rng = d3_jax.sweep, sub
    else:
        sweep, rng = d3_host.sweep, jax.random.bits(sub, (2,), jnp.uint32)
    plan = SweepPlan(
        params.attempts_per_sweep,
        g.tetra_capacity,
        g.n_slices,
        fix_n3=params.fix == "n3",
        reference=params.measure == "reference",
        until_target=params.stop_at_target,
        max_extra=_EXTRA * params.attempts_per_sweep,
    )
    buf = sweep(g.buf, rng, (params.k0, params.k3, params.eps, params.target), plan)
    return chain.replace(key=key, geometry=g.replace(buf=buf))


def metropolis_3d(
    k0: Any,
    k3: Any,
    *,
    target: Any = 0.0,
    eps: Any = REFERENCE_EPSILON,
    fix: str = "n31",
    attempts_per_sweep: int = REFERENCE_SWEEP,
    measure: str = "action",
    stop_at_target: bool = False,
    engine: str = "host",
) -> Stepper[Chain3d, Metropolis3dParams]:
    """Stepper of the 2+1D CDT chain of ``S = -k0 N0 + k3 N3 + eps (N_fix - target)^2`` (the module docstring; the
    reference code's conventions): ``step(chain)`` is one sweep of ``attempts_per_sweep`` attempts (default the
    reference's 10^6) with a fresh subkey split from ``chain.key``, on the ``engine`` (static): ``"host"`` (numba,
    through a JAX callback: jit, vmap and ``trajectory``/``chunked`` work; the chains of a vmapped batch run in
    parallel threads) or ``"jax"`` (pure XLA, :mod:`~ivhl_jax.physics.cdt.d3_jax`: the same chain for many chains
    under ``vmap`` on an accelerator; its manifold checks scan the buffer, so a sweep costs O(capacity) more per
    attempt than the host engine's).

    ``target``: 0 for no volume fixing, else the target ``N(3,1)`` (``fix="n31"``, the reference's default) or
    ``N3`` (``fix="n3"``); ``eps``: the coefficient of the quadratic term (the reference's 4e-5). ``measure``:
    ``"action"`` (detailed balance with respect to ``e^{-S}``) or ``"reference"`` (the reference's (2,6)/(6,2)
    acceptance: its stationary law, ``e^{-S}`` times a function of N(3,1); equal to ``"action"``'s at a fixed
    N(3,1)). ``stop_at_target``: the reference's continue-until-target rule before measuring (biased; see
    :class:`Metropolis3dParams`). Couplings may be arrays of one shape (a batch of parameter sets for ``jax.vmap``).

    ``init(key, n_slices, capacity=None)``: the minimal triangulation of ``n_slices`` slices (every slice a 5-vertex
    bipyramid, 18 tetrahedra per slab) in a buffer of ``capacity`` tetrahedron slots (default
    :func:`default_capacity_3d`). Measure with :func:`observe_3d`.
    """
    check_scalar(attempts_per_sweep, "attempts_per_sweep", integer=True, minimum=1)
    if fix not in FIXES:
        raise ValueError(f"fix must be one of {FIXES} (the count the volume term fixes), got {fix!r}")
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} (numba through a callback, or pure XLA), got {engine!r}")
    if not isinstance(stop_at_target, bool):
        raise TypeError(f"stop_at_target must be a bool, got {stop_at_target!r}")
    params = Metropolis3dParams(
        **check_couplings({"k0": k0, "k3": k3, "eps": eps, "target": target}, signed=("k0", "k3")),
        attempts_per_sweep=int(attempts_per_sweep),
        fix=fix,
        measure=measure,
        stop_at_target=stop_at_target,
        engine=engine,
    )
    target, eps = params.target, params.eps
    t_max, e_min = concrete_max(target), (None if not is_concrete(eps) else float(np.min(np.asarray(eps))))
    if t_max is not None and e_min is not None:
        t_arr = np.asarray(target, np.float64)
        if np.any(t_arr != np.round(t_arr)):
            raise ValueError(f"target must be a whole number of tetrahedra, got {target!r}")
        if t_max > 0 and e_min <= 0:
            raise ValueError("a target volume needs eps > 0 (the coefficient of the volume term; the reference: 4e-5)")
        if stop_at_target and float(np.min(t_arr)) <= 0:
            raise ValueError("stop_at_target needs a target volume > 0")
    return Stepper.create(_step, params, init_fn=_init, name="cdt.metropolis_3d")


def observe_3d(chain: Chain3d, params: Metropolis3dParams) -> dict[str, jax.Array]:
    """Per-measurement observables of a 2+1D chain (the ``observe`` of :func:`metropolis_3d`), int32:

    ``slice_volumes`` (T,): spatial triangles of each slice (= its (3,1) tetrahedra); ``n0``; ``n31``: N(3,1) +
    N(1,3) (twice the reference's ``tetras31``, which is ``sum(slice_volumes)``); ``n22``; ``n3``; ``at_target``
    (bool): ``N_fix == target`` (always True without volume fixing); ``overflow``, ``missed_target``; ``attempts``
    and ``accepts`` (5,): the last sweep's counts per move (:data:`~ivhl_jax.physics.cdt.d3_state.MOVE_NAMES_3D`:
    26, 62, 44, 23, 32)."""
    if not isinstance(chain, Chain3d):
        raise TypeError(f"chain must be a cdt.Chain3d (the state of cdt.metropolis_3d), got {type(chain).__name__}")
    if not isinstance(params, Metropolis3dParams):
        raise TypeError(f"params must be Metropolis3dParams (built by cdt.metropolis_3d); got {type(params).__name__}")
    g = chain.geometry
    n31_up = g.count("n31")
    n3 = g.count("n3")
    target = jnp.round(jnp.asarray(params.target, jnp.float32)).astype(jnp.int32)
    now = n3 if params.fix == "n3" else n31_up
    return {
        "slice_volumes": g.field("slices"),
        "n0": g.count("n0"),
        "n31": 2 * n31_up,
        "n22": g.count("n22"),
        "n3": n3,
        "at_target": (target <= 0) | (now == target),
        "overflow": g.count("overflow"),
        "missed_target": g.count("missed_target"),
        "attempts": g.field("attempts"),
        "accepts": g.field("accepts"),
    }
