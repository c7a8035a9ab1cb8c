"""Observables of a CDT triangulation: coordination numbers, timelike degrees, slice-length profiles and
their correlator, graph distances and sphere volumes on the vertex and dual graphs.

The graph algorithms themselves work on plain arrays (:mod:`ivhl_jax.physics.cdt.graph`); this module
supplies them from a :class:`~ivhl_jax.physics.cdt.state.CDTState` (unbatched; ``jax.vmap`` for chains).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ivhl_jax.core.validation import check_array, check_key, check_scalar, is_concrete
from ivhl_jax.physics.cdt import graph as _graph
from ivhl_jax.physics.cdt.state import UP, CDTState, live_triangles, live_vertices

__all__ = [
    "coordination_numbers",
    "coordination_histogram",
    "timelike_degrees",
    "max_timelike_degree",
    "geometry_arrays",
    "measurements",
    "volume_correlator",
    "center_profiles",
    "vertex_distances",
    "sphere_volumes",
    "graph_edges",
]


def coordination_numbers(state: CDTState) -> jax.Array:
    """(C0,) number of triangles at each vertex (= its number of links); 0 for free slots."""
    tv, _, tri_alive, vert_alive = geometry_arrays(state)
    return _graph.vertex_coordination(tv, tri_alive, vert_alive)


def coordination_histogram(state: CDTState, max_coordination: int = 32) -> jax.Array:
    """(max_coordination + 1,) counts of vertices with coordination q (last bin: q >= max)."""
    check_scalar(max_coordination, "max_coordination", integer=True, minimum=1)
    max_coordination = int(max_coordination)
    q = jnp.minimum(coordination_numbers(state), max_coordination)
    q = jnp.where(live_vertices(state), q, max_coordination + 1)
    return jnp.zeros(max_coordination + 1, jnp.int32).at[q].add(1, mode="drop")


def timelike_degrees(state: CDTState) -> tuple[jax.Array, jax.Array]:
    """(future, past) timelike links of every vertex slot (C0,) each, for an unbatched state (vmap for
    chains); 0 for free slots.

    A vertex with ``k`` down triangles of the strip above having it as apex has ``k + 1`` future links
    (likewise past links from the up triangles below), so its coordination is ``2 + future + past``.
    """
    _check_type(state, "state")
    c0 = state.vertex_capacity
    alive_t, alive_v = live_triangles(state), live_vertices(state)
    up = state.ttype == UP
    apex = state.apex

    def count(mask):
        return jnp.zeros(c0, jnp.int32).at[jnp.where(mask, apex, c0)].add(1, mode="drop")

    future = jnp.where(alive_v, 1 + count(alive_t & ~up), 0)
    past = jnp.where(alive_v, 1 + count(alive_t & up), 0)
    return future, past


def max_timelike_degree(state: CDTState) -> jax.Array:
    """Largest number of future or past links of any vertex (the thermalisation criterion of 2d-cdt compares
    it with log2(2 N2): a grown, unthermalised triangulation has a few vertices with very many)."""
    future, past = timelike_degrees(state)
    return jnp.maximum(future.max(-1), past.max(-1))


def geometry_arrays(state: CDTState) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(tv, tnbr, tri_alive, vert_alive)`` of an unbatched state in the format of
    :mod:`ivhl_jax.physics.cdt.graph`: ``tnbr`` (C2, 3) holds the triangles across the left timelike,
    right timelike and spatial edge (``tl``, ``tr``, slot ``^ 1``)."""
    _check_type(state, "state")
    tnbr = jnp.stack([state.tl, state.tr, state.tc], axis=-1)
    return state.tv, tnbr, live_triangles(state), live_vertices(state)


def measurements(state: CDTState) -> dict[str, jax.Array]:
    """Cheap per-measurement observables: slice lengths l_t, N2, N0, coordination histogram, the largest
    timelike degree, flags and counters."""
    return {
        "lengths": state.lengths,
        "n2": state.n2,
        "n0": state.n0,
        "coordination": coordination_histogram(state),
        "max_timelike_degree": max_timelike_degree(state),
        "overflow": state.overflow,
        "missed_target": state.missed_target,
        "accepts": state.accepts,
        "attempts": state.attempts,
    }


def volume_correlator(lengths: Any) -> jax.Array:
    """Connected spatial-volume correlator ``C(dt) = <l_t l_{t+dt}> - <l>^2``, averaged over t.

    ``lengths``: (..., n_meas, T) profiles; the average runs over measurements (and leading axes).
    Returns (T,) indexed by dt.
    """
    x = _check_lengths(lengths).astype(jnp.float32)
    x = x.reshape(-1, x.shape[-1])
    mean = x.mean()
    corr = jnp.stack([(x * jnp.roll(x, -k, axis=-1)).mean() for k in range(x.shape[-1])])
    return corr - mean**2


def center_profiles(lengths: Any) -> jax.Array:
    """Shift each profile (..., T) so that its largest slice is at index T // 2 (for averaging blobs)."""
    x = _check_lengths(lengths)
    T = x.shape[-1]
    shift = T // 2 - jnp.argmax(x, axis=-1)
    idx = (jnp.arange(T) - shift[..., None]) % T
    return jnp.take_along_axis(x, idx, axis=-1)


# ----------------------------------------------------------------------------------------------
# distances and the Hausdorff dimension


def vertex_distances(state: CDTState, origin: jax.Array, r_max: int) -> jax.Array:
    """Graph distance (in links) from ``origin`` to every vertex slot of an unbatched state
    (:func:`ivhl_jax.physics.cdt.graph.graph_distances` on the vertex graph); unreached and free slots
    get ``r_max + 1``. Cost O(r_max * C2)."""
    check_state(state, "state")
    check_scalar(r_max, "r_max", integer=True, nonnegative=True)
    check_scalar(
        origin,
        "origin",
        integer=True,
        nonnegative=True,
        maximum=state.vertex_capacity - 1 if is_concrete(origin) else None,
    )
    tv, _, tri_alive, vert_alive = geometry_arrays(state)
    src, dst = _graph.vertex_adjacency_edges(tv, tri_alive)
    d = _graph.graph_distances(src, dst, state.vertex_capacity, origin, r_max)
    return jnp.where(vert_alive, d, r_max + 1)


def sphere_volumes(
    key: jax.Array, state: CDTState, r_max: int, n_origins: int = 8, *, graph: str = "vertex"
) -> jax.Array:
    """Mean sphere volume |S_r| (r = 0..r_max) from ``n_origins`` uniform live origins, on the vertex graph
    (vertices, distances in links) or the dual graph (triangles, distances in dual links), via
    :func:`ivhl_jax.physics.cdt.graph.sphere_volumes`. Returns (r_max + 1,) float32; ``sum_r`` equals
    N0 (vertex) or N2 (dual) when ``r_max`` exceeds the diameter."""
    check_key(key, "key")
    check_state(state, "state")
    src, dst, alive = graph_edges(state, graph)
    return _graph.sphere_volumes(key, src, dst, alive, r_max, n_origins).astype(jnp.float32)


def graph_edges(state: CDTState, graph: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(src, dst, alive)`` of the vertex graph (vertices joined by links) or the dual graph (triangles joined
    by shared edges) of one chain: directed edges in both directions and the live-node mask."""
    tv, tnbr, tri_alive, vert_alive = geometry_arrays(state)
    if graph == "vertex":
        return (*_graph.vertex_adjacency_edges(tv, tri_alive), vert_alive)
    if graph == "dual":
        return (*_graph.dual_adjacency_edges(tnbr, tri_alive), tri_alive)
    raise ValueError(f"graph must be 'vertex' or 'dual', got {graph!r}")


def _check_lengths(lengths: Any) -> jax.Array:
    """Slice-length profiles (..., T): a real array with T >= 1 and (when concrete) finite entries."""
    x = check_array(lengths, "lengths", kind="numeric", finite=True)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"lengths must have a last (time) axis of length >= 1, got shape {tuple(x.shape)}")
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"lengths must be real, got {x.dtype}")
    return x


def _check_type(state: Any, name: str) -> None:
    """``state`` must be a 1+1D CDTState: anything else (a 2+1D ``CDT3State`` included) is refused in one line,
    before an attribute lookup fails inside."""
    if not isinstance(state, CDTState):
        raise TypeError(
            f"{name} must be a CDTState (the geometry of a chain: chain.geometry), got {type(state).__name__}"
        )


def check_state(state: Any, name: str) -> None:
    """``state`` must be one chain's CDTState (``chain.geometry``; vmap over a batch of chains)."""
    _check_type(state, name)
    if jnp.ndim(state.n0) != 0:
        raise ValueError(
            f"{name} must be a single chain (n0 a scalar), got a batch with n0 of shape "
            f"{jnp.shape(state.n0)}; use jax.vmap over the chains"
        )
