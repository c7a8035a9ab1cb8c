"""The host engine (``engine="host"``): the CDT moves as a compiled CPU loop (numba) behind ``jax.pure_callback``.

XLA:CPU runs one CDT attempt as a few hundred tiny operations (a loop body of gathers and one scatter);
the moves are branchy pointer updates that a compiled scalar loop does in tens of nanoseconds. The kernels
(:mod:`ivhl_jax.physics.cdt.host_kernels`, compiled once and cached on disk) apply *the same moves to the
same packed buffer* as the JAX engine, so jit, vmap (the chains of a batch run in parallel threads),
checkpoints and the observables are unchanged.

Random numbers: the kernel draws the two 32-bit words of each attempt from a SplitMix64 stream (Steele,
Lea & Flood 2014) seeded per chain and sweep from the chain's JAX key (generating them with threefry costs
more than the move). Given the same words, :func:`attempts` and the JAX engine produce bit-identical states
(tested). Vertex and list indices are drawn exactly (see :mod:`~ivhl_jax.physics.cdt.host_kernels`), up to
:data:`MAX_VERTEX_CAPACITY` vertex slots.

Requires ``numba`` (``pip install 'ivhl_jax[cpu-kernels]'``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.physics.cdt.moves import EXTRA_ATTEMPTS, SweepRequest, sweep_length, sweep_request
from ivhl_jax.physics.cdt.state import BUFFER_MAX_CAPACITY, CDTState

__all__ = ["MAX_VERTEX_CAPACITY", "available", "require", "sweep", "sweep_state", "attempts"]

#: Most vertex slots the host engine addresses: the buffer's int32 limit (its index draw reaches 2^31).
MAX_VERTEX_CAPACITY = BUFFER_MAX_CAPACITY

_OFFSETS = (
    "tl",
    "tr",
    "apex",
    "vright",
    "vtime",
    "vperm",
    "vpos",
    "lengths",
    "n0",
    "overflow",
    "attempts",
    "accepts",
    "missed_target",
)


def available() -> bool:
    """Whether numba can be imported (the host engine can run)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Raise a clear ImportError when numba is missing."""
    if not available():
        raise ImportError(
            "engine='host' needs numba: pip install 'ivhl_jax[cpu-kernels]' (or pip install numba), or use engine='jax'"
        )


def _offsets(lay: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    return tuple(int(lay[name][0]) for name in _OFFSETS)


def _params_arrays(params: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    return tuple(jnp.asarray(x, jnp.float32) for x in (params.lam, params.eps, params.target))  # type: ignore[return-value]


def _per_chain(x: Any, dtype: Any, batch: tuple[int, ...], nb: int) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype), batch).reshape(nb))


def sweep(buf: jax.Array, request: SweepRequest, params: Any) -> jax.Array:
    """One sweep on the packed buffer ``buf`` (..., size) as ``request`` asks: ``request.n >= 1`` attempts (a fixed
    count) with words from SplitMix64 seeded by ``request.seed`` (..., 2) uint32, then (with a ``target_n0``) up to
    :data:`~ivhl_jax.physics.cdt.moves.EXTRA_ATTEMPTS` times as many more until n0 == target_n0 (a miss increments
    ``missed_target``).
    ``params.proposal``: ``"uniform"`` (the moves of the JAX engine) or ``"lists"`` (2d-cdt's proposals from
    the lists of flippable triangles and order-4 vertices). Works under jit and vmap (the callback sees the
    whole batch and runs the chains in parallel threads)."""
    n = sweep_length(request.n, params)
    off = _offsets(request.lay)
    c0 = request.c0
    target_n0, extra_factor = (-1, 0) if request.target_n0 is None else (request.target_n0, EXTRA_ATTEMPTS)
    lam, eps, target = _params_arrays(params)
    lists = params.proposal == "lists"

    def cb(b, s, tn, la, ep, ta):
        from ivhl_jax.physics.cdt import host_kernels as kernels  # numba dispatchers (untyped calls)

        shape = b.shape
        bufs = np.array(b, np.int32).reshape(-1, shape[-1])
        nb = bufs.shape[0]
        seeds = np.ascontiguousarray(s).reshape(nb, 2)
        kernels.run_stream(  # type: ignore[call-arg]
            bufs,
            seeds,
            int(n),
            _per_chain(tn, np.int32, shape[:-1], nb),
            int(extra_factor),
            *(_per_chain(x, np.float32, shape[:-1], nb) for x in (la, ep, ta)),
            off,
            int(c0),
            lists,
        )
        return bufs.reshape(shape)

    return jax.pure_callback(
        cb,
        jax.ShapeDtypeStruct(buf.shape, jnp.int32),
        buf,
        request.seed,
        jnp.asarray(target_n0, jnp.int32),
        lam,
        eps,
        target,
        vmap_method="broadcast_all",
    )


def sweep_state(key: jax.Array, state: CDTState, params: Any, n: int | None = None) -> CDTState:
    """One sweep of the stepper on the host engine (``params.engine == "host"``):
    :func:`~ivhl_jax.physics.cdt.moves.sweep_request` of ``state`` run by :func:`sweep`."""
    return state.replace(buf=sweep(state.buf, sweep_request(key, state, params, n), params))


def attempts(buf: jax.Array, words: jax.Array, params: Any, lay: dict[str, tuple[int, int]], c0: int) -> jax.Array:
    """The attempts given by explicit words (..., n, 2) uint32, as the JAX engine's
    :func:`ivhl_jax.physics.cdt.moves.attempt` takes them: the cross-check of the two engines."""
    off = _offsets(lay)
    lam, eps, target = _params_arrays(params)

    def cb(b, w, la, ep, ta):
        from ivhl_jax.physics.cdt import host_kernels as kernels  # numba dispatchers (untyped calls)

        shape = b.shape
        bufs = np.array(b, np.int32).reshape(-1, shape[-1])
        nb = bufs.shape[0]
        words = np.ascontiguousarray(w).reshape((nb,) + w.shape[-2:])
        kernels.run_words(  # type: ignore[call-arg]
            bufs, words, *(_per_chain(x, np.float32, shape[:-1], nb) for x in (la, ep, ta)), off, int(c0)
        )
        return bufs.reshape(shape)

    return jax.pure_callback(
        cb, jax.ShapeDtypeStruct(buf.shape, jnp.int32), buf, words, lam, eps, target, vmap_method="broadcast_all"
    )
