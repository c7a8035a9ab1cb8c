"""The stepper protocol and the one scanned time loop every physics family runs through.

A **stepper** (:class:`Stepper`) is what a family's builder returns, in the spirit of jax-md's
``init_fn, apply_fn`` pair and optax's ``GradientTransformation``: the builder closes over the physics
and the step size *once* (``condensate.strang(system, dt)``, ``cdt.metropolis(lam, ...)``, ...) and the
stepper carries

* ``params`` — a pytree of everything the step reads (arrays, step size, couplings); traced, so a
  parameter sweep or ``vmap`` over it never recompiles;
* ``step_fn(state, params) -> state`` — a *module-level* pure function (static, hashed by identity);
* ``run_fn(state, params, n) -> state`` or None — n steps at once by the same scheme (equal to n single steps
  to round-off, with work shared between neighbouring steps), which :func:`rollout` uses for each block
  between two observations (static);
* ``init_fn(params, *args, **kwargs) -> state`` — builds the initial state (static);
* ``max_steps`` — the most steps one run from ``init`` may take, or None for no bound (static): a stepper over a
  finite input (``gru.recurrence`` over T inputs) sets it, and :func:`trajectory` and :func:`chunked` refuse a
  longer run with a one-line ValueError instead of running past the input;
* ``check_fn(state, params) -> None`` or None — the family's check of a start state handed to :func:`trajectory`
  or :func:`chunked` without ``init`` (static; e.g. the condensates refuse a field sharded over a mesh their
  system has no layout for): run on the concrete state in Python, before the compiled loop.

Families build their steppers with :meth:`Stepper.create`, which checks the functions once; the pytree node
itself only holds them (unflattening, which ``jit``, ``vmap`` and ``tree.map`` do on every call, checks
nothing).

``stepper.step(state)`` is the bound, pure one-step map; randomness lives in the state (a typed PRNG
key field), never in a side argument. What to record is an ``observe(state, params) -> pytree``
function, again module-level so that it hashes stably.

:func:`trajectory` drives every family: ``steps`` applications of the step inside ``lax.scan``,
``observe`` every ``save_every`` steps, optional rematerialisation for ``grad`` through long runs. It
is jitted at the API boundary with the stepper as a pytree argument, so a second call with the same
step function, shapes, dtypes and static settings compiles nothing (the diffrax ``diffeqsolve``
discipline). :func:`chunked` turns a stepper into the ``advance`` function of
:func:`ivhl_jax.run.runner.run_chunked` (progress, checkpoints, exact resume).

:func:`rollout` is the unjitted core (the jax-cfd ``trajectory`` idea) for code already inside a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, cast

import flax.struct
import jax
import numpy as np

from ivhl_jax.core.validation import check_scalar

__all__ = ["Stepper", "trajectory", "chunked", "rollout", "converge", "identity_observe", "Step", "Observe"]

S = TypeVar("S")
P = TypeVar("P")
Step = Callable[[Any, Any], Any]
Observe = Callable[[Any, Any], Any]


def identity_observe(state: Any, params: Any) -> Any:
    """Record the whole state (the default observable)."""
    del params
    return state


class Stepper(flax.struct.PyTreeNode, Generic[S, P]):
    """A pure one-step map with its parameters bound: ``stepper.step(state) -> state``.

    Build one with :meth:`create` (which checks its arguments); the fields are data only.

    Attributes:
      step_fn: ``step_fn(state, params) -> state``, a module-level function (static).
      params: pytree the step reads (traced; vmap/grad over it work and never recompile).
      init_fn: ``init_fn(params, *args, **kwargs) -> state`` (static), or None when the family's
        state is supplied by the user.
      run_fn: ``run_fn(state, params, n) -> state``, ``n`` steps at once by the same scheme (static), or None:
        the driver then scans ``step_fn``.
      name: a short label for progress lines and errors (static).
      max_steps: the most steps one run may take (a stepper over an input of that many items), or None (static):
        :func:`trajectory` and :func:`chunked` refuse more.
      check_fn: ``check_fn(state, params) -> None``, raising on a start state the family refuses (static), or
        None; :func:`trajectory` and :func:`chunked` call it on a concrete state before the compiled loop.
    """

    step_fn: Callable[[S, P], S] = flax.struct.field(pytree_node=False)
    params: P
    init_fn: Callable[..., S] | None = flax.struct.field(pytree_node=False, default=None)
    run_fn: Callable[[S, P, int], S] | None = flax.struct.field(pytree_node=False, default=None)
    name: str = flax.struct.field(pytree_node=False, default="stepper")
    max_steps: int | None = flax.struct.field(pytree_node=False, default=None)
    check_fn: Callable[[S, P], None] | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def create(
        cls,
        step_fn: Callable[[S, P], S],
        params: P,
        *,
        init_fn: Callable[..., S] | None = None,
        run_fn: Callable[[S, P, int], S] | None = None,
        name: str = "stepper",
        max_steps: int | None = None,
        check_fn: Callable[[S, P], None] | None = None,
    ) -> Stepper[S, P]:
        """The checked constructor: a non-function would otherwise surface only at the first step, deep
        inside a trace."""
        if not callable(step_fn):
            raise TypeError(f"step_fn must be a function step_fn(state, params) -> state, got {step_fn!r}")
        for label, fn, form in (
            ("init_fn", init_fn, "init_fn(params, ...)"),
            ("run_fn", run_fn, "run_fn(state, params, n)"),
            ("check_fn", check_fn, "check_fn(state, params)"),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be a function {form} or None, got {fn!r}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, got {name!r}")
        if max_steps is not None:
            check_scalar(max_steps, "max_steps", integer=True, nonnegative=True)
            max_steps = int(max_steps)
        return cls(step_fn, params, init_fn, run_fn, name, max_steps, check_fn)  # every field, in declaration order

    def step(self, state: S) -> S:
        """Advance ``state`` by one step."""
        return self.step_fn(state, self.params)

    def init(self, *args: Any, **kwargs: Any) -> S:
        """Build an initial state (arguments are family-specific; see the builder's docstring)."""
        if self.init_fn is None:
            raise TypeError(f"{self.name}: this stepper has no init_fn; build the initial state yourself")
        return self.init_fn(self.params, *args, **kwargs)


#: the most steps one scan runs (``lax.scan`` counts its iterations in int32); longer runs go in chunks
#: (:func:`chunked` and :func:`ivhl_jax.run.runner.run_chunked`)
MAX_SCAN_STEPS = 2**31 - 1


def _check_schedule(steps: Any, save_every: Any, unroll: Any, steps_name: str = "steps") -> tuple[int, int, int]:
    """Validated ``(steps, save_every, unroll)`` as ints; ``steps`` must be a multiple of ``save_every``. Each is a
    count known when tracing: a boolean or a traced value is refused, and ``steps`` must fit ``lax.scan``'s int32
    step counter."""
    for value, name in ((steps, steps_name), (save_every, "save_every"), (unroll, "unroll")):
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be an integer count, got the boolean {value!r}")
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"{name} must be a Python int known when tracing (the loop's length is static), got a traced value: "
                f"pass it as a static argument (jax.jit(..., static_argnames='{name}')) or call outside jit"
            )
    check_scalar(steps, steps_name, integer=True, nonnegative=True)
    if int(steps) > MAX_SCAN_STEPS:
        raise ValueError(
            f"{steps_name} ({int(steps)}) is more than one scan runs (2**31 - 1 steps, an int32 counter): run it in "
            "chunks (chunked with ivhl_jax.run.runner.run_chunked)"
        )
    check_scalar(save_every, "save_every", integer=True, minimum=1)
    check_scalar(unroll, "unroll", integer=True, minimum=1)
    if int(steps) % int(save_every):
        raise ValueError(f"{steps_name} ({steps}) must be a multiple of save_every ({save_every})")
    return int(steps), int(save_every), int(unroll)


def rollout(
    step: Step,
    state: Any,
    params: Any,
    steps: int,
    *,
    save_every: int = 1,
    observe: Observe | None = None,
    remat: bool = False,
    unroll: int = 1,
    run: Callable[[Any, Any, int], Any] | None = None,
) -> tuple[Any, Any]:
    """Advance ``state`` by ``steps`` applications of ``step(state, params)`` inside ``lax.scan``.

    Not jitted (use it inside traced code; from Python use :func:`trajectory`).

    Args:
      step: pure ``step(state, params) -> state``.
      state: initial state pytree.
      params: parameters passed to every step (a pytree; may be traced).
      steps: number of steps (Python int, multiple of ``save_every``).
      save_every: record ``observe(state, params)`` after every ``save_every`` steps.
      observe: function of (state, params) returning a pytree of observations; defaults to the
        state itself (the full trajectory).
      remat: checkpoint each block of ``save_every`` steps so reverse-mode memory is
        O(steps / save_every) states plus one block, not O(steps).
      unroll: ``lax.scan`` unroll factor for the inner loop.
      run: ``run(state, params, n)``, n steps at once by the same scheme (a stepper's ``run_fn``), used for
        each block between two observations; None (or an explicit ``unroll`` > 1) scans ``step``.

    Returns:
      (final_state, observations) where observations has a leading axis of length
      ``steps // save_every``.
    """
    steps, save_every, unroll = _check_schedule(steps, save_every, unroll)
    observe = identity_observe if observe is None else observe

    # A block between two observations is one ``run`` (the GP stepper merges the potential half-steps of
    # neighbouring steps); an explicit ``unroll`` asks for the plain scan.
    if run is not None and not callable(run):
        raise TypeError(f"run must be a function run(state, params, n) -> state or None, got {run!r}")
    run = run if unroll == 1 else None

    def block(carry, _):
        if run is not None:
            return (c := run(carry, params, save_every)), observe(c, params)

        def one(c, _):
            return step(c, params), None

        carry, _ = jax.lax.scan(one, carry, None, length=save_every, unroll=unroll)
        return carry, observe(carry, params)

    if remat:
        block = jax.checkpoint(block)
    return jax.lax.scan(block, state, None, length=steps // save_every)


def _no_observe(state: Any, params: Any) -> None:
    del state, params
    return None


def converge(
    stepper: Stepper, state: Any, measure: Callable[[Any, Any], Any], tol: Any, *, blocks: int, block: int
) -> tuple[Any, Any, Any, Any]:
    """Run ``stepper`` in blocks of ``block`` steps until ``measure(state, params)`` settles: stop when its relative
    change over a block, |m − m_old| / |m|, is at most ``tol``, or after ``blocks`` blocks.

    The loop of every imaginary-time ground-state search (``measure`` the energy). ``measure`` may return a tuple of
    arrays with ``tol`` a tuple of as many tolerances: each settles when its relative change in the 2-norm,
    ‖m − m_old‖ / ‖m‖, is at most its tolerance, and the loop stops when all have (e.g. the energy, quadratic in the
    error, and the state itself, linear in it). Not jitted (call it inside traced code); one ``lax.while_loop``, so
    the block count is decided on the device. A non-finite measure stops the loop (NaN > tol is False) and is
    returned for the caller to report.

    Returns:
      (state, measure, relative change of the last block (a tuple for a tuple measure), blocks run) — arrays.
    """
    _check_stepper(stepper)
    check_scalar(blocks, "blocks", integer=True, minimum=1)
    check_scalar(block, "block", integer=True, minimum=1)
    if not callable(measure):
        raise TypeError(f"measure must be a function measure(state, params) -> scalar, got {type(measure).__name__}")
    jnp = jax.numpy
    params = stepper.params
    m0 = measure(state, params)
    several = isinstance(m0, tuple)
    m0 = tuple(jnp.asarray(m) for m in m0) if several else (jnp.asarray(m0),)
    tols = tuple(tol) if several else (tol,)
    if len(tols) != len(m0):
        raise ValueError(f"tol must give one tolerance per measured quantity ({len(m0)}), got {len(tols)}")
    tols = tuple(jnp.asarray(t, jnp.real(m).dtype) for t, m in zip(tols, m0))

    def change(m, m_old):
        if m.ndim == 0:
            return jnp.abs(m - m_old) / jnp.maximum(jnp.abs(m), jnp.finfo(m.dtype).tiny)
        size = jnp.sqrt(jnp.sum(jnp.abs(m) ** 2))
        return jnp.sqrt(jnp.sum(jnp.abs(m - m_old) ** 2)) / jnp.maximum(size, jnp.finfo(size.dtype).tiny)

    def cond(c):
        unsettled = jnp.any(jnp.stack([d > t for d, t in zip(c[2], tols)]))
        return jnp.logical_and(c[3] < blocks, unsettled)

    def body(c):
        s, m_old, _, k = c
        s, _ = rollout(stepper.step_fn, s, params, block, save_every=block, observe=_no_observe, run=stepper.run_fn)
        m = measure(s, params)
        m = tuple(jnp.asarray(x, y.dtype) for x, y in zip(m if several else (m,), m_old))
        return s, m, tuple(change(x, y) for x, y in zip(m, m_old)), k + 1

    inf = tuple(jnp.asarray(jnp.inf, t.dtype) for t in tols)
    s, m, delta, k = jax.lax.while_loop(cond, body, (state, m0, inf, jnp.asarray(0, jnp.int32)))
    return (s, m, delta, k) if several else (s, m[0], delta[0], k)


def _trajectory_impl(
    stepper: Stepper, state: Any, steps: int, save_every: int, observe: Observe, remat: bool, unroll: int
) -> tuple[Any, Any]:
    return rollout(
        stepper.step_fn,
        state,
        stepper.params,
        steps,
        save_every=save_every,
        observe=observe,
        remat=remat,
        unroll=unroll,
        run=stepper.run_fn,
    )


_STATIC = ("steps", "save_every", "observe", "remat", "unroll")
_trajectory = jax.jit(_trajectory_impl, static_argnames=_STATIC)
# The same loop writing its final state into the input state's buffers (chunked(..., donate=True)): a long run
# then holds one copy of the field, not two, and the step reads and writes it in place.
_trajectory_donating = jax.jit(_trajectory_impl, static_argnames=_STATIC, donate_argnames=("state",))


def _check_stepper(stepper: Any) -> None:
    if not isinstance(stepper, Stepper):
        raise TypeError(
            f"stepper must be an ivhl_jax Stepper (from a family builder such as "
            f"condensate.strang(system, dt)); got {type(stepper).__name__}"
        )


def _check_start(stepper: Stepper, state: Any) -> None:
    """The family's own check of a concrete start state (``check_fn``); traced states (inside a user's jit) pass."""
    if stepper.check_fn is None:
        return
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(state)):
        return
    stepper.check_fn(state, stepper.params)


def _check_max_steps(stepper: Stepper, steps: int, steps_name: str) -> None:
    """A stepper over a finite input (``max_steps`` set) runs at most that many steps."""
    if stepper.max_steps is not None and steps > stepper.max_steps:
        raise ValueError(
            f"{steps_name}={steps} but {stepper.name}'s input has {stepper.max_steps} steps (max_steps); "
            f"run at most {stepper.max_steps} steps"
        )


def _check_observe(observe: Any) -> Observe:
    if observe is None:
        return identity_observe
    if not callable(observe):
        raise TypeError(f"observe must be a function observe(state, params) -> pytree; got {type(observe).__name__}")
    if not isinstance(observe, Hashable):
        raise TypeError("observe must be hashable (a module-level function), so compiled loops can be reused")
    return cast(Observe, observe)


@jax.jit
def _finite_flags(leaves: list[Any]) -> jax.Array:
    """One flag per leaf: all of its values are finite (one device reduction for the whole state)."""
    return jax.numpy.stack([jax.numpy.all(jax.numpy.isfinite(x)) for x in leaves])


def _check_start_finite(state: Any) -> None:
    """ValueError naming the first inexact leaf of a concrete ``state`` that holds NaN or inf.

    A non-finite start would otherwise run to an all-NaN trajectory without a word. The check is one jitted
    reduction over every inexact leaf and one host sync of a boolean per leaf (no copy of the state to the
    host); under a trace (``trajectory`` called inside ``jit``, ``vmap`` or ``grad``) the values are not known
    and nothing is checked.
    """
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    if any(isinstance(x, jax.core.Tracer) for _, x in flat):
        return
    inexact = [
        (path, x) for path, x in flat if hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)
    ]
    if not inexact:
        return
    flags = _finite_flags([x for _, x in inexact])
    if isinstance(flags, jax.core.Tracer):  # inside a caller's jit/grad with closed-over concrete leaves
        return
    flags = jax.device_get(flags)
    for (path, _), ok in zip(inexact, flags, strict=True):
        if not ok:
            raise ValueError(
                f"state{jax.tree_util.keystr(path)} holds NaN or inf at the start of the trajectory; "
                "check the initial state (build it with the stepper's init, which validates it)"
            )


def trajectory(
    stepper: Stepper,
    state: Any,
    steps: int,
    *,
    save_every: int = 1,
    observe: Observe | None = None,
    remat: bool = False,
    unroll: int = 1,
) -> tuple[Any, Any]:
    """Run ``steps`` steps of ``stepper`` from ``state``; record ``observe(state, params)`` every ``save_every``.

    Compiled once per (step function, observe, state/param shapes and dtypes, ``steps``, ``save_every``,
    ``remat``, ``unroll``): calling it again with new *values* (a new state, a new ``dt`` or coupling in
    ``stepper.params``) reuses the compiled loop. Pass ``observe`` as a module-level function; a fresh
    ``lambda`` per call is a new static argument and recompiles. Works under ``jit``, ``vmap`` (over
    states or params) and ``grad``.

    A stepper with ``max_steps`` (one over a finite input) runs at most that many steps: more is a ValueError.

    A concrete start ``state`` must be finite: a NaN or inf in an inexact leaf is a ValueError naming the leaf
    (one reduction on the device; skipped when ``state`` is traced).

    Returns:
      (final_state, observations); observations have a leading axis of ``steps // save_every``.
    """
    _check_stepper(stepper)
    observe = _check_observe(observe)
    steps, save_every, unroll = _check_schedule(steps, save_every, unroll)
    _check_max_steps(stepper, steps, "steps")
    _check_start_finite(state)
    _check_start(stepper, state)
    return _trajectory(stepper, state, steps, save_every, observe, bool(remat), unroll)


def chunked(
    stepper: Stepper,
    steps_per_chunk: int,
    *,
    save_every: int | None = None,
    observe: Observe | None = None,
    donate: bool = False,
) -> Callable[[Any], tuple[Any, Any]]:
    """``advance(state) -> (state, observations)`` running ``steps_per_chunk`` steps, for
    :func:`ivhl_jax.run.runner.run_chunked`. Observations are recorded every ``save_every`` steps
    (default: once per chunk).

    ``donate=True`` hands the input state's buffers to the chunk, which writes the new state into them (the
    field stays in place: one copy in memory instead of two); the state passed in is then deleted, so pass
    each state once (as :func:`~ivhl_jax.run.runner.run_chunked` does). A stepper with ``max_steps`` refuses a
    chunk longer than that."""
    _check_stepper(stepper)
    observe = _check_observe(observe)
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    steps_per_chunk, save_every, _ = _check_schedule(
        steps_per_chunk, steps_per_chunk if save_every is None else save_every, 1, steps_name="steps_per_chunk"
    )
    _check_max_steps(stepper, steps_per_chunk, "steps_per_chunk")

    run = _trajectory_donating if donate else _trajectory

    def advance(state: Any) -> tuple[Any, Any]:
        _check_start(stepper, state)
        return run(stepper, state, steps_per_chunk, save_every, observe, False, 1)

    advance.steps_per_chunk = steps_per_chunk  # type: ignore[attr-defined]  # run_chunked checks its own against it
    return advance
