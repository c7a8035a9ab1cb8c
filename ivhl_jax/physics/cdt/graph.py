"""Graph observables of a 2D triangulation stored in fixed-capacity arrays: distances, sphere volumes,
coordination numbers and the quantum Ricci curvature.

Input format (plain arrays, independent of any Monte Carlo engine)
-----------------------------------------------------------------
* ``tv`` (C2, 3) int — the three vertex ids of every triangle slot;
* ``tnbr`` (C2, 3) int — the triangle across each of the three edges of every slot (the dual graph);
* ``tri_alive`` (C2,) bool, ``vert_alive`` (C0,) bool — which slots hold a live triangle / vertex.

Free slots may hold anything: every observable masks them. Two graphs are built from it, both as
directed edge lists ``(src, dst)`` of fixed length with dead edges pointed out of bounds
(:data:`OUT_OF_BOUNDS`), so that all shapes are static and everything jits and vmaps over a batch of
triangulations of equal capacity:

* the vertex graph (:func:`vertex_adjacency_edges`): vertices joined by the links (edges) of live
  triangles — distances in links;
* the dual graph (:func:`dual_adjacency_edges`): triangles joined across shared edges — distances in
  dual links (the dual of a 2D triangulation is trivalent).

Distances (:func:`graph_distances`) are computed by ``r_max`` rounds of a Bellman–Ford/BFS relaxation,
``d[dst] ← min(d[dst], d[src] + 1)`` as one scatter-min over all edges: O(r_max · E) work, no
data-dependent control flow, exact for every node within ``r_max`` links (unreached: ``r_max + 1``).

Observables
-----------
* :func:`sphere_counts` / :func:`sphere_volumes` — ``|S_r(x)| = #{v : d(x, v) = r}``, ``r = 0..r_max``,
  averaged over random live origins; its growth gives the Hausdorff dimension ``|S_r| ~ r^{d_H − 1}``.
* :func:`vertex_coordination` / :func:`coordination_distribution` — the number of triangles at each
  vertex (= its number of links in a simplicial manifold) and its normalised histogram; 6 everywhere
  on a flat triangular lattice.
* :func:`average_sphere_distance` / :func:`ricci_curvature_profile` — the quantum Ricci curvature of
  N. Klitgaard and R. Loll, Phys. Rev. D 97, 046008 and 106017 (2018), arXiv:1712.08847, 1802.10524:
  for two points at distance ``δ``, the average distance between their ``δ``-spheres

      d̄(S_δ(x), S_δ(y)) = 1/(|S_δ(x)| |S_δ(y)|) Σ_{x'∈S_δ(x)} Σ_{y'∈S_δ(y)} d(x', y'),

  and ``d̄/δ = c_q (1 − K_q(δ))`` defines the curvature ``K_q`` (``c_q ≈ 1.5746`` for the flat continuum
  in 2D; it is larger on positively curved spaces).

This module does not import the Monte Carlo engine: a CDT state supplies ``tv``, ``tnbr``,
``tri_alive`` and ``vert_alive`` through its own accessors.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_array, check_key, check_scalar, is_concrete

__all__ = [
    "OUT_OF_BOUNDS",
    "SphereDistance",
    "CurvatureProfile",
    "vertex_adjacency_edges",
    "dual_adjacency_edges",
    "graph_distances",
    "random_live_nodes",
    "sphere_counts",
    "sphere_volumes",
    "vertex_coordination",
    "coordination_distribution",
    "average_sphere_distance",
    "sample_pairs",
    "ricci_curvature_profile",
    "mean_distance",
    "hausdorff_from_spheres",
    "hausdorff_from_scaling",
]

# Index of a dead edge end. Scatters use mode="drop" and gathers mode="fill", so any index >= n_nodes
# would do; 2^30 is far beyond any capacity and leaves room for index arithmetic without int32 overflow.
OUT_OF_BOUNDS = 1 << 30


class SphereDistance(NamedTuple):
    """Result of :func:`average_sphere_distance` (scalars; leading axes under vmap).

    ``dbar`` average sphere distance ``d̄`` (links, float; NaN when a sphere is empty or a pair was not
    reached within ``r_max``), ``total`` the integer sum ``Σ d(x', y')`` over the gathered pairs, ``n_x``,
    ``n_y`` the numbers of gathered sphere points, ``overflow`` True when a sphere had more than
    ``max_sphere`` points (then only the first ``max_sphere`` by node id were used: ``dbar`` is biased).
    """

    dbar: jax.Array
    total: jax.Array
    n_x: jax.Array
    n_y: jax.Array
    overflow: jax.Array


class CurvatureProfile(NamedTuple):
    """Result of :func:`ricci_curvature_profile` for ``D`` distances and ``S`` samples each.

    ``deltas`` (D,) int32; ``mean`` (D,) average of ``d̄/δ`` over the usable samples, ``stderr`` (D,) its
    standard error (the pairs are independent draws on a fixed triangulation); ``samples`` (D, S) the
    per-pair ``d̄/δ`` (NaN where unusable: empty sphere, sphere overflow, unreached pair); ``x``, ``y``
    (D, S) the sampled pairs; ``n_valid`` (D,) usable samples; ``n_overflow`` (D,) samples dropped for
    sphere overflow (raise ``max_sphere`` until it is 0, else large spheres are under-represented).
    """

    deltas: jax.Array
    mean: jax.Array
    stderr: jax.Array
    samples: jax.Array
    x: jax.Array
    y: jax.Array
    n_valid: jax.Array
    n_overflow: jax.Array


# ----------------------------------------------------------------------------------------------------
# validation (eager, on shapes and on concrete values; tracers pass through)


def static_int(v: Any, name: str, minimum: int) -> int:
    """A Python/NumPy integer >= minimum used as a static size (r_max, n_origins, ...)."""
    if isinstance(v, jax.core.Tracer):
        raise TypeError(f"{name} must be a static Python int (it sets array shapes or loop lengths), got a tracer")
    check_scalar(v, name, integer=True, minimum=minimum)
    return int(v)


def _check_tv(tv: Any, tri_alive: Any, name: str = "tv") -> tuple[jax.Array, jax.Array]:
    tv = check_array(tv, name, shape=(None, 3), kind="integer")
    tri_alive = check_array(tri_alive, "tri_alive", kind="bool")
    if tri_alive.shape != (tv.shape[0],):
        raise ValueError(
            f"tri_alive must have shape ({tv.shape[0]},) to match {name} {tuple(tv.shape)}, "
            f"got {tuple(tri_alive.shape)}"
        )
    return tv.astype(jnp.int32), tri_alive


def _check_edges(src: Any, dst: Any) -> tuple[jax.Array, jax.Array]:
    src = check_array(src, "src", ndim=1, kind="integer")
    dst = check_array(dst, "dst", ndim=1, kind="integer")
    if dst.shape != src.shape:
        raise ValueError(f"dst must have the shape of src {tuple(src.shape)}, got {tuple(dst.shape)}")
    return src.astype(jnp.int32), dst.astype(jnp.int32)


def _check_alive(alive: Any, name: str = "alive", *, some_live: bool = False) -> jax.Array:
    alive = check_array(alive, name, ndim=1, kind="bool")
    if some_live and is_concrete(alive) and not bool(np.any(np.asarray(alive))):
        raise ValueError(f"{name} marks no live node: there is nothing to draw from")
    return alive


def _check_node(v: Any, name: str, n_nodes: int | None = None) -> Any:
    check_scalar(
        v, name, integer=True, nonnegative=True, maximum=None if n_nodes is None or not is_concrete(v) else n_nodes - 1
    )
    return jnp.asarray(v, jnp.int32)


# ----------------------------------------------------------------------------------------------------
# graphs


def vertex_adjacency_edges(tv: Any, tri_alive: Any) -> tuple[jax.Array, jax.Array]:
    """Directed links of the vertex graph: ``(src, dst)``, each (6 C2,) int32.

    Every live triangle ``(a, b, c)`` contributes its three edges in both directions (a link shared by
    two triangles appears twice; harmless for distances). Edges of dead triangle slots have both ends
    set to :data:`OUT_OF_BOUNDS`. ``tv`` (C2, 3) int, ``tri_alive`` (C2,) bool.
    """
    tv, tri_alive = _check_tv(tv, tri_alive)
    a, b, c = tv[:, 0], tv[:, 1], tv[:, 2]
    src = jnp.concatenate([a, b, c, b, c, a])
    dst = jnp.concatenate([b, c, a, a, b, c])
    live = jnp.tile(tri_alive, 6)
    return jnp.where(live, src, OUT_OF_BOUNDS), jnp.where(live, dst, OUT_OF_BOUNDS)


def dual_adjacency_edges(tnbr: Any, tri_alive: Any) -> tuple[jax.Array, jax.Array]:
    """Directed links of the dual graph: ``(src, dst)``, each (3 C2,) int32; ``src`` is slot ``i // 3``.

    A live triangle ``t`` links to ``tnbr[t, k]`` for ``k = 0, 1, 2`` (the reverse direction comes from
    the neighbour's own row). An edge is kept only when both triangles are live, so a stale neighbour
    id in a live row cannot connect to a free slot. ``tnbr`` (C2, 3) int, ``tri_alive`` (C2,) bool.
    """
    tnbr, tri_alive = _check_tv(tnbr, tri_alive, "tnbr")
    c2 = tnbr.shape[0]
    src = jnp.repeat(jnp.arange(c2, dtype=jnp.int32), 3)
    dst = tnbr.reshape(-1)
    in_range = (dst >= 0) & (dst < c2)
    live = jnp.repeat(tri_alive, 3) & in_range & tri_alive.at[dst].get(mode="fill", fill_value=False)
    return jnp.where(live, src, OUT_OF_BOUNDS), jnp.where(live, dst, OUT_OF_BOUNDS)


def _relax(src: jax.Array, dst: jax.Array, d0: jax.Array, n_steps: Any, inf: int) -> jax.Array:
    """``n_steps`` rounds of ``d[dst] = min(d[dst], d[src] + 1)`` over all edges at once.

    After round ``k`` every node within ``k`` links of a seed (``d0 = 0``) holds its exact distance
    (BFS layer by layer); the others keep ``d0``'s ``inf`` because the scatter-min includes the old
    value (an unreached source proposes ``inf + 1``, which never wins). Dead edges point out of
    bounds: their gather reads the fill value and their scatter is dropped. ``n_steps`` may be traced
    (a while loop), so one compilation serves every sphere radius.
    """

    def body(_, d):
        return d.at[dst].min(d.at[src].get(mode="fill", fill_value=inf) + 1, mode="drop")

    return jax.lax.fori_loop(0, n_steps, body, d0)


def _distances(src: jax.Array, dst: jax.Array, n_nodes: int, origin: Any, r_max: int, n_steps: Any = None) -> jax.Array:
    """Distances from ``origin``, unreached ``r_max + 1``; ``n_steps`` (default ``r_max``) rounds."""
    d0 = jnp.full(n_nodes, r_max + 1, jnp.int32).at[origin].set(0, mode="drop")
    return _relax(src, dst, d0, r_max if n_steps is None else n_steps, r_max + 1)


def graph_distances(src: Any, dst: Any, n_nodes: int, origin: Any, r_max: int) -> jax.Array:
    """Graph distance (links) from ``origin`` to every node: (n_nodes,) int32.

    ``src``, ``dst`` (E,) int directed edges (indices ``>= n_nodes`` are dead and ignored), ``origin``
    a node id (may be traced), ``r_max >= 1`` (static) the number of relaxation rounds. Exact for every
    node within ``r_max`` links of ``origin``; all others (unreached, dead, other components) get
    ``r_max + 1``. Cost O(r_max · E).
    """
    src, dst = _check_edges(src, dst)
    n_nodes = static_int(n_nodes, "n_nodes", 1)
    r_max = static_int(r_max, "r_max", 1)
    origin = _check_node(origin, "origin", n_nodes)
    return _distances_jit(src, dst, n_nodes, origin, r_max)


_distances_jit = jax.jit(_distances, static_argnums=(2, 4, 5))


def random_live_nodes(key: Any, alive: Any, n: int) -> jax.Array:
    """``n`` nodes drawn uniformly and independently from the live ones: (n,) int32.

    ``alive`` (N,) bool. Sampling is ``categorical`` over ``log(alive)`` (exactly uniform on live nodes,
    never a dead one while at least one is live).
    """
    check_key(key)
    alive = _check_alive(alive, some_live=True)
    n = static_int(n, "n", 1)
    return _random_live(key, alive, n)


def _random_live(key: jax.Array, alive: jax.Array, n: int) -> jax.Array:
    logits = jnp.where(alive, 0.0, -jnp.inf)
    return jax.random.categorical(key, logits, shape=(n,)).astype(jnp.int32)


def _counts(src, dst, n_nodes, origins, r_max):
    def one(o):
        d = _distances(src, dst, n_nodes, o, r_max)
        # bin r_max + 1 collects the unreached nodes and is cut off
        return jnp.zeros(r_max + 2, jnp.int32).at[d].add(1)[: r_max + 1]

    return jax.vmap(one)(origins)


@functools.partial(jax.jit, static_argnums=(2, 4))
def _counts_jit(src, dst, n_nodes, origins, r_max):
    return _counts(src, dst, n_nodes, origins, r_max)


def sphere_counts(src: Any, dst: Any, n_nodes: int, origins: Any, r_max: int) -> jax.Array:
    """Sphere sizes ``|S_r(o)| = #{v : d(o, v) = r}`` for ``r = 0..r_max``: (K, r_max + 1) int32.

    ``origins`` (K,) int node ids; the graph as in :func:`graph_distances`. ``Σ_r |S_r(o)|`` is the size
    of ``o``'s component once ``r_max`` reaches its eccentricity.
    """
    src, dst = _check_edges(src, dst)
    n_nodes = static_int(n_nodes, "n_nodes", 1)
    r_max = static_int(r_max, "r_max", 1)
    origins = check_array(origins, "origins", ndim=1, kind="integer")
    if is_concrete(origins) and origins.size and not (0 <= int(np.min(origins)) and int(np.max(origins)) < n_nodes):
        raise ValueError(
            f"origins must be node ids in [0, n_nodes={n_nodes}), got values in "
            f"[{int(np.min(origins))}, {int(np.max(origins))}]"
        )
    origins = origins.astype(jnp.int32)
    return _counts_jit(src, dst, n_nodes, origins, r_max)


@functools.partial(jax.jit, static_argnums=(4, 5))
def _volumes_jit(key, src, dst, alive, r_max, n_origins):
    origins = _random_live(key, alive, n_origins)
    counts = _counts(src, dst, alive.shape[0], origins, r_max)
    return counts.astype(jnp.result_type(float)).mean(0)


def sphere_volumes(key: Any, src: Any, dst: Any, alive: Any, r_max: int, n_origins: int = 8) -> jax.Array:
    """Mean sphere volume ``<|S_r|>`` (nodes) for ``r = 0..r_max`` over ``n_origins`` random live origins.

    ``alive`` (N,) bool marks the live nodes (N = number of node slots: ``vert_alive`` with the edges of
    :func:`vertex_adjacency_edges`, ``tri_alive`` with those of :func:`dual_adjacency_edges`); origins
    are drawn by :func:`random_live_nodes` from ``key`` (so ``sphere_counts(..., random_live_nodes(key,
    alive, n_origins), r_max).mean(0)`` is the same number). Returns (r_max + 1,) float.
    """
    check_key(key)
    src, dst = _check_edges(src, dst)
    alive = _check_alive(alive, some_live=True)
    r_max = static_int(r_max, "r_max", 1)
    n_origins = static_int(n_origins, "n_origins", 1)
    return _volumes_jit(key, src, dst, alive, r_max, n_origins)


# ----------------------------------------------------------------------------------------------------
# coordination


def vertex_coordination(tv: Any, tri_alive: Any, vert_alive: Any) -> jax.Array:
    """Coordination number of every vertex slot: (C0,) int32, 0 for dead slots.

    ``q(v)`` = number of live triangles having ``v`` as a corner (= its number of links on a closed
    simplicial surface; ``Σ_v q(v) = 3 N2``). ``tv`` (C2, 3), ``tri_alive`` (C2,), ``vert_alive`` (C0,).
    """
    tv, tri_alive = _check_tv(tv, tri_alive)
    vert_alive = _check_alive(vert_alive, "vert_alive")
    return _coordination(tv, tri_alive, vert_alive)


def _coordination(tv, tri_alive, vert_alive):
    c0 = vert_alive.shape[0]
    idx = jnp.where(tri_alive[:, None], tv, OUT_OF_BOUNDS).reshape(-1)
    q = jnp.zeros(c0, jnp.int32).at[idx].add(1, mode="drop")
    return jnp.where(vert_alive, q, 0)


def coordination_distribution(tv: Any, tri_alive: Any, vert_alive: Any, q_max: int) -> jax.Array:
    """Normalised histogram ``P(q)``, ``q = 0..q_max``, of the coordination of live vertices: (q_max + 1,).

    ``P(q) = #{live v : q(v) = q} / N0`` (:func:`vertex_coordination`), with the last bin collecting
    ``q >= q_max``; sums to 1 (all zeros when no vertex is live). Float dtype.
    """
    tv, tri_alive = _check_tv(tv, tri_alive)
    vert_alive = _check_alive(vert_alive, "vert_alive")
    q_max = static_int(q_max, "q_max", 1)
    return _coord_hist_jit(tv, tri_alive, vert_alive, q_max)


@functools.partial(jax.jit, static_argnums=(3,))
def _coord_hist_jit(tv, tri_alive, vert_alive, q_max):
    q = jnp.minimum(_coordination(tv, tri_alive, vert_alive), q_max)
    q = jnp.where(vert_alive, q, q_max + 1)  # dead slots go to a dropped bin
    hist = jnp.zeros(q_max + 1, jnp.result_type(float)).at[q].add(1.0, mode="drop")
    return hist / jnp.maximum(vert_alive.sum(), 1)


# ----------------------------------------------------------------------------------------------------
# quantum Ricci curvature


def _gather_sphere(d: jax.Array, delta, max_sphere: int):
    """Nodes with ``d == delta`` into a (max_sphere,) buffer (first by id, padding OUT_OF_BOUNDS)."""
    mask = d == delta
    count = mask.sum(dtype=jnp.int32)
    (idx,) = jnp.nonzero(mask, size=max_sphere, fill_value=OUT_OF_BOUNDS)
    return idx.astype(jnp.int32), jnp.minimum(count, max_sphere), count > max_sphere


def _sphere_distance(src, dst, n_nodes, x, y, delta, r_max, max_sphere, pair_steps=None):
    # the spheres need only δ rounds; the pair distances r_max (or 3δ when d(x, y) = δ is known)
    dx = _distances(src, dst, n_nodes, x, r_max, jnp.minimum(delta, r_max))
    dy = _distances(src, dst, n_nodes, y, r_max, jnp.minimum(delta, r_max))
    xs, n_x, over_x = _gather_sphere(dx, delta, max_sphere)
    ys, n_y, over_y = _gather_sphere(dy, delta, max_sphere)
    inf = r_max + 1

    # one BFS per point of S_δ(x), all at once as a (max_sphere, n_nodes) table (padding rows start
    # nowhere and stay at inf), read at the points of S_δ(y): each relaxation round is one wide scatter
    def from_xp(o):
        return _distances(src, dst, n_nodes, o, r_max, pair_steps).at[ys].get(mode="fill", fill_value=inf)

    dist = jax.vmap(from_xp)(xs)
    pair = (jnp.arange(max_sphere) < n_x)[:, None] & (jnp.arange(max_sphere) < n_y)[None, :]
    total = jnp.where(pair, dist, 0).sum(dtype=jnp.int32)
    unreached = jnp.any(pair & (dist >= inf))
    fdt = jnp.result_type(float)
    dbar = total.astype(fdt) / (n_x * n_y).astype(fdt)
    dbar = jnp.where((n_x > 0) & (n_y > 0) & ~unreached, dbar, jnp.nan)
    return SphereDistance(dbar, total, n_x, n_y, over_x | over_y)


_sphere_distance_jit = jax.jit(_sphere_distance, static_argnums=(2, 6, 7))


def average_sphere_distance(
    src: Any, dst: Any, n_nodes: int, x: Any, y: Any, delta: Any, r_max: int, max_sphere: int
) -> SphereDistance:
    """Average distance ``d̄(S_δ(x), S_δ(y))`` between the ``δ``-spheres of ``x`` and ``y`` (Klitgaard–Loll).

    ``d̄ = 1/(|S_δ(x)| |S_δ(y)|) Σ_{x'∈S_δ(x)} Σ_{y'∈S_δ(y)} d(x', y')`` in links, with
    ``S_δ(x) = {v : d(x, v) = δ}``. Meant for ``d(x, y) = δ`` (then every ``d(x', y') <= 3δ``), but defined
    for any pair. The graph is ``(src, dst)`` on ``n_nodes`` nodes as in :func:`graph_distances`; ``x``,
    ``y``, ``delta`` (>= 1) may be traced; ``r_max`` (static) is the BFS depth and must cover all
    ``d(x', y')`` — ``r_max >= 3δ`` is required when ``delta`` is concrete, and a pair left unreached
    makes ``dbar`` NaN. Each sphere is gathered into a buffer of ``max_sphere`` (static) points; a larger
    sphere sets ``overflow`` and is truncated. Cost O(max_sphere · r_max · E); memory
    O(max_sphere · n_nodes) int32. Returns :class:`SphereDistance`.
    """
    src, dst = _check_edges(src, dst)
    n_nodes = static_int(n_nodes, "n_nodes", 1)
    r_max = static_int(r_max, "r_max", 1)
    max_sphere = static_int(max_sphere, "max_sphere", 1)
    x, y = _check_node(x, "x", n_nodes), _check_node(y, "y", n_nodes)
    check_scalar(delta, "delta", integer=True, minimum=1)
    if is_concrete(delta) and r_max < 3 * int(delta):
        raise ValueError(
            f"r_max must be >= 3*delta = {3 * int(delta)} (sphere points can be 3 delta apart), got {r_max}"
        )
    return _sphere_distance_jit(src, dst, n_nodes, x, y, jnp.asarray(delta, jnp.int32), r_max, max_sphere)


def _pairs(key, src, dst, alive, delta, n_samples, r_max):
    """Pairs at distance ``delta`` (may be traced, ``<= r_max``); ``r_max`` static sets the unreached value."""
    kx, ky = jax.random.split(key)
    x = _random_live(kx, alive, n_samples)

    def pick(k, xi):
        d = jnp.where(alive, _distances(src, dst, alive.shape[0], xi, r_max, delta), r_max + 1)
        on = d == delta
        y = jax.random.categorical(k, jnp.where(on, 0.0, -jnp.inf)).astype(jnp.int32)
        return y, jnp.any(on)

    y, valid = jax.vmap(pick)(jax.random.split(ky, n_samples), x)
    return x, jnp.where(valid, y, x), valid


_pairs_jit = jax.jit(_pairs, static_argnums=(4, 5, 6))


def sample_pairs(
    key: Any, src: Any, dst: Any, alive: Any, delta: int, n_samples: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``n_samples`` random pairs at distance ``delta``: ``x`` uniform over live nodes, ``y`` uniform on
    ``S_δ(x)`` — the joint law is ``P(x, y) = 1/(N |S_δ(x)|)``.

    Returns ``(x, y, valid)``, each (n_samples,); ``valid`` is False (and ``y = x``) where ``S_δ(x)`` is
    empty. ``delta >= 1`` static; the graph as in :func:`sphere_volumes`.
    """
    check_key(key)
    src, dst = _check_edges(src, dst)
    alive = _check_alive(alive)
    delta = static_int(delta, "delta", 1)
    n_samples = static_int(n_samples, "n_samples", 1)
    return _pairs_jit(key, src, dst, alive, delta, n_samples, delta)


@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _profile_jit(key, src, dst, alive, deltas, n_samples, max_sphere, r_max):
    n_nodes = alive.shape[0]

    # δ is traced (loop lengths are dynamic): one compilation for the whole profile
    def per_delta(args):
        k, delta = args
        x, y, valid = _pairs(k, src, dst, alive, delta, n_samples, r_max)
        res = jax.lax.map(
            lambda xy: _sphere_distance(src, dst, n_nodes, xy[0], xy[1], delta, r_max, max_sphere, 3 * delta), (x, y)
        )
        ok = valid & ~res.overflow & jnp.isfinite(res.dbar)
        return x, y, jnp.where(ok, res.dbar / delta, jnp.nan), ok, valid & res.overflow

    keys = jax.random.split(key, deltas.shape[0])
    x, y, samples, ok, over = jax.lax.map(per_delta, (keys, deltas))
    n_valid = ok.sum(-1, dtype=jnp.int32)
    nv = jnp.maximum(n_valid, 1).astype(samples.dtype)
    mean = jnp.where(ok, samples, 0.0).sum(-1) / nv
    var = jnp.where(ok, (samples - mean[:, None]) ** 2, 0.0).sum(-1) / jnp.maximum(nv - 1, 1)
    mean = jnp.where(n_valid > 0, mean, jnp.nan)
    stderr = jnp.where(n_valid > 1, jnp.sqrt(var / nv), jnp.nan)
    return CurvatureProfile(deltas, mean, stderr, samples, x, y, n_valid, over.sum(-1, dtype=jnp.int32))


def ricci_curvature_profile(
    key: Any, src: Any, dst: Any, alive: Any, deltas: Any, n_samples: int, *, max_sphere: int = 64
) -> CurvatureProfile:
    """Average normalised sphere distance ``<d̄/δ>`` for each ``δ`` in ``deltas`` (Klitgaard–Loll).

    For every ``δ``: ``n_samples`` pairs from :func:`sample_pairs` (``x`` uniform, ``y`` uniform on
    ``S_δ(x)``), ``d̄(S_δ(x), S_δ(y))`` by :func:`average_sphere_distance` with ``r_max = 3δ``, averaged as
    ``d̄/δ``. ``<d̄/δ> = c_q (1 − K_q(δ))`` gives the quantum Ricci curvature ``K_q``. Use the vertex graph
    (:func:`vertex_adjacency_edges`, ``alive = vert_alive``) or the dual graph
    (:func:`dual_adjacency_edges`, ``alive = tri_alive``). ``deltas``: a sequence of ints >= 1 (static),
    ``n_samples``, ``max_sphere`` static ints. Samples whose sphere overflows ``max_sphere`` are excluded
    and counted. Cost O(D · n_samples · max_sphere · 3δ · E). Returns :class:`CurvatureProfile`.
    """
    check_key(key)
    src, dst = _check_edges(src, dst)
    alive = _check_alive(alive)
    if isinstance(deltas, jax.core.Tracer):
        raise TypeError("deltas must be a static sequence of ints, got a tracer")
    seq = list(deltas) if hasattr(deltas, "__iter__") else [deltas]
    if not seq:
        raise ValueError("deltas must be a non-empty sequence of integers >= 1, got an empty one")
    dl = []
    for d in seq:
        check_scalar(d, "deltas", integer=True, minimum=1)
        dl.append(int(d))
    n_samples = static_int(n_samples, "n_samples", 1)
    max_sphere = static_int(max_sphere, "max_sphere", 1)
    return _profile_jit(key, src, dst, alive, jnp.asarray(dl, jnp.int32), n_samples, max_sphere, 3 * max(dl))


# ----------------------------------------------------------------------------------------------------
# dimensions from sphere volumes (host-side fits)


def _host_series(v: Any, name: str, *, minimum: float, positive: bool = False) -> np.ndarray:
    """A finite real 1-D series as float64 NumPy (for the host-side fits), each entry >= ``minimum`` (> when
    ``positive``)."""
    checked = check_array(v, name, ndim=1, kind="numeric", finite=True)
    if jnp.issubdtype(checked.dtype, jnp.complexfloating):
        raise TypeError(f"{name} must be real, got {checked.dtype}")
    arr = np.asarray(v, np.float64)  # full precision (check_array's copy may be float32)
    if np.any(arr <= minimum if positive else arr < minimum):
        raise ValueError(f"{name} must be {'>' if positive else '>='} {minimum:g}, got a minimum of {arr.min():g}")
    return arr


def mean_distance(spheres: jax.Array) -> jax.Array:
    """Average distance ``<r> = sum r S(r) / sum S(r)`` of sphere volumes S (..., R)."""
    s = check_array(spheres, "spheres", kind="numeric", finite=True)
    if s.ndim < 1 or s.shape[-1] < 1 or jnp.issubdtype(s.dtype, jnp.complexfloating):
        raise ValueError(f"spheres must be real sphere volumes (..., R) with R >= 1, got {s.dtype}{tuple(s.shape)}")
    if is_concrete(s):
        host = np.asarray(s, np.float64)
        if np.any(host < 0) or np.any(host.sum(-1) <= 0):
            raise ValueError("spheres must be >= 0 with a positive sum over r (sphere volumes)")
    s = s.astype(jnp.float32)
    r = jnp.arange(s.shape[-1], dtype=jnp.float32)
    return (s * r).sum(-1) / s.sum(-1)


def hausdorff_from_spheres(spheres, r_min: int = 1, r_max: int | None = None) -> tuple[float, float]:
    """Local Hausdorff dimension from sphere volumes, ``S(r) ∝ r^(d_H - 1)`` fitted on [r_min, r_max].

    A crude single-volume estimate (lattice effects at small r, finite size near the peak of S);
    prefer :func:`hausdorff_from_scaling`. ``r_max`` defaults to 2/3 of the radius where S(r) peaks.
    Returns (d_H, std error of the fit); NaN when fewer than 3 radii are usable.
    """
    s = _host_series(spheres, "spheres", minimum=0.0)
    check_scalar(r_min, "r_min", integer=True, minimum=1, maximum=s.size - 1)
    r_min = int(r_min)
    if r_max is not None:
        check_scalar(r_max, "r_max", integer=True, minimum=r_min + 2)
        r_max = int(r_max)
    if r_max is None:
        r_max = max(r_min + 2, 2 * int(np.argmax(s)) // 3)
    r = np.arange(r_min, min(r_max, s.size - 1) + 1)
    r = r[s[r] > 0]
    if r.size < 3:
        return float("nan"), float("nan")
    coef, cov = np.polyfit(np.log(r), np.log(s[r]), 1, cov=True)
    return float(coef[0] + 1.0), float(math.sqrt(max(cov[0, 0], 0.0)))


def hausdorff_from_scaling(volumes, mean_distances, *, offset: bool = True) -> tuple[float, float]:
    """Finite-size scaling ``<r> = a + b N^(1/d_H)`` over several volumes; returns (d_H, std error).

    ``offset=True`` fits the lattice-artefact shift ``a`` too (needs >= 4 volumes); ``offset=False``
    is the plain log-log fit ``<r> ∝ N^(1/d_H)``.
    """
    x = _host_series(volumes, "volumes", minimum=0.0, positive=True)
    y = _host_series(mean_distances, "mean_distances", minimum=0.0, positive=True)
    if y.shape != x.shape:
        raise ValueError(f"mean_distances must have the shape of volumes {x.shape}, got {y.shape}")
    if x.size < 2:
        raise ValueError(f"volumes must hold at least 2 system sizes, got {x.size}")
    if not offset:
        coef, cov = np.polyfit(np.log(x), np.log(y), 1, cov=True)
        slope, err = coef[0], math.sqrt(max(cov[0, 0], 0.0))
        return float(1.0 / slope), float(err / slope**2)
    if x.size < 4:
        raise ValueError(f"the offset fit needs at least 4 volumes, got {x.size}")
    from scipy.optimize import curve_fit

    (a, b, p), cov = curve_fit(lambda n, a, b, p: a + b * n**p, x, y, p0=(0.0, y[-1] / math.sqrt(x[-1]), 0.5))
    return float(1.0 / p), float(math.sqrt(max(cov[2, 2], 0.0)) / p**2)
