"""Spectral dimension of a triangulation: the return probability of a lazy random walk (heat kernel).

Definition
----------
On a graph with directed edge list ``(src, dst)`` (an undirected link appears once in each direction;
a link listed ``m`` times has weight ``m``), the lazy random walk stays put with probability ``a``
(``laziness``, default 1/2) and otherwise moves along a uniformly chosen outgoing edge:

    p_{σ+1}(v) = a p_σ(v) + (1 − a) Σ_{u→v} p_σ(u) / deg(u),      p_0 = δ_x,

``σ = 0, 1, ...`` the diffusion time in steps, ``deg(u)`` the number of outgoing edges of ``u``. The
return probability is ``P_x(σ) = p_σ(x)``: computed here *exactly* for each origin ``x`` by propagating
the whole distribution (no sampled walkers, no sampling noise for a given origin), vmapped over origins
("walkers"). The laziness removes the parity oscillation of bipartite graphs (the hexagonal dual of a
regular triangulation, square lattices); for ``a = 1/2`` the walk is ``(1 + W)/2``, a discrete heat
kernel ``P(σ) ≈ e^{σ(W − 1)/2}``. The spectral dimension is

    d_s(σ) = −2 d ln P(σ) / d ln σ,

with ``P`` averaged over origins and configurations (:func:`spectral_dimension`: slopes between
neighbouring points of a grid of σ, errors by jackknife over independent samples). On a flat d-torus of
``N`` nodes ``P(σ) ∝ σ^{−d/2}`` for ``1 ≪ σ ≪ N^{2/d}`` (so ``d_s → d``) and ``P → 1/N`` beyond. On a
2D CDT universe the plateau opens where the discreteness has faded (later on the trivalent dual graph,
whose distances are about twice as long, than on the vertex graph) and closes at ``σ`` of order ``N/5``,
where the walk feels the finite volume; :func:`mixing_time` (``P(σ*) = 2/N``, ``σ* ∝ N^{2/d_s}``) turns that
end into a finite-size-scaling estimate of ``d_s``.

:func:`graph_return_probability` takes a graph as in :mod:`ivhl_jax.physics.cdt.graph` (dead edges point
out of bounds); :func:`return_probability` builds the vertex or dual graph of a CDT state. Units: ``σ`` in
walk steps, ``P`` a probability.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_array, check_key, check_scalar, is_concrete
from ivhl_jax.physics.cdt import graph as _graph
from ivhl_jax.physics.cdt.graph import static_int
from ivhl_jax.physics.cdt.observables import check_state, graph_edges

__all__ = ["SpectralDimension", "graph_return_probability", "return_probability", "spectral_dimension", "mixing_time"]


class SpectralDimension(NamedTuple):
    """Result of :func:`spectral_dimension`: ``sigma`` (S,) the diffusion times where ``d_s`` is read
    (geometric midpoints of neighbouring grid points), ``d_s`` (S,), ``error`` (S,) jackknife standard error
    over the independent samples (NaN with one sample), ``p`` (G,) the mean return probability on the grid
    ``grid`` (G,)."""

    sigma: np.ndarray
    d_s: np.ndarray
    error: np.ndarray
    p: np.ndarray
    grid: np.ndarray


def _check_graph(src: Any, dst: Any, alive: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    src = check_array(src, "src", ndim=1, kind="integer").astype(jnp.int32)
    dst = check_array(dst, "dst", ndim=1, kind="integer").astype(jnp.int32)
    if dst.shape != src.shape:
        raise ValueError(f"dst must have the shape of src {tuple(src.shape)}, got {tuple(dst.shape)}")
    alive = check_array(alive, "alive", ndim=1, kind="bool")
    return src, dst, alive


def _check_sigma_max(sigma_max: Any, alive: jax.Array) -> int:
    sigma_max = static_int(sigma_max, "sigma_max", 1)
    if is_concrete(alive):
        n = int(np.count_nonzero(np.asarray(alive)))
        if n == 0:
            raise ValueError("alive marks no live node: there is no graph to walk on")
        if sigma_max > n:
            raise ValueError(
                f"sigma_max={sigma_max} exceeds the number of live nodes N={n}: beyond σ ~ N the walk "
                "has spread over the whole universe (P -> 1/N, d_s -> 0); use sigma_max <= N "
                f"(d_s is read at σ well below N, e.g. sigma_max ~ 4 sqrt(N) = {4 * math.isqrt(n)})"
            )
    return sigma_max


def _propagate(src, dst, n_nodes, origins, sigma_max, laziness):
    """(K, sigma_max + 1) return probabilities of the lazy walk from each origin (see module docstring)."""
    dtype = jnp.result_type(float)
    ones = jnp.ones(src.shape, dtype)
    deg = jnp.zeros(n_nodes, dtype).at[src].add(ones, mode="drop")
    inv_deg = jnp.where(deg > 0, 1.0 / jnp.where(deg > 0, deg, 1.0), 0.0)
    stay = jnp.asarray(laziness, dtype)

    def one(x):
        p0 = jnp.zeros(n_nodes, dtype).at[x].set(1.0)

        def step(p, _):
            flow = (p * inv_deg).at[src].get(mode="fill", fill_value=0.0)
            moved = jnp.zeros(n_nodes, dtype).at[dst].add(flow, mode="drop")
            p = stay * p + (1.0 - stay) * moved
            return p, p[x]

        _, ret = jax.lax.scan(step, p0, None, length=sigma_max)
        return jnp.concatenate([jnp.ones(1, dtype), ret])

    return jax.vmap(one)(origins)


_propagate_jit = jax.jit(_propagate, static_argnums=(2, 4))


def graph_return_probability(
    src: Any, dst: Any, alive: Any, origins: Any, sigma_max: int, *, laziness: float = 0.5
) -> jax.Array:
    """Exact return probabilities ``P_x(σ)``, ``σ = 0..sigma_max``, of the lazy walk from each origin.

    Args:
      src: (E,) int tails of the directed edges (both directions of every link; indices ``>= len(alive)`` are
        dead).
      dst: (E,) int heads of the same edges.
      alive: (N,) bool live nodes (sets the node count and bounds ``sigma_max``).
      origins: (K,) int live node ids (vmapped: one exact diffusion per origin).
      sigma_max: static number of steps, ``1 <= sigma_max <= number of live nodes``.
      laziness: probability ``a`` in [0, 1) of staying put per step.
    Returns (K, sigma_max + 1) float (``P_x(0) = 1``). Cost O(sigma_max · E) per origin.
    """
    src, dst, alive = _check_graph(src, dst, alive)
    sigma_max = _check_sigma_max(sigma_max, alive)
    check_scalar(laziness, "laziness", minimum=0.0, maximum=0.999)
    origins = check_array(origins, "origins", ndim=1, kind="integer")
    n = alive.shape[0]
    if is_concrete(origins) and is_concrete(alive) and origins.size:
        o = np.asarray(origins)
        if o.min() < 0 or o.max() >= n or not np.all(np.asarray(alive)[o]):
            raise ValueError(f"origins must be live node ids in [0, {n}), got {o.tolist()[:8]}...")
    return _propagate_jit(src, dst, n, origins.astype(jnp.int32), sigma_max, float(laziness))


def return_probability(
    key: Any, state: Any, sigma_max: int, n_origins: int = 8, *, graph: str = "vertex", laziness: float = 0.5
) -> jax.Array:
    """Return probabilities on an unbatched CDT state: (n_origins, sigma_max + 1), origins uniform among the
    live vertices (``graph="vertex"``, steps along links) or live triangles (``graph="dual"``, steps across
    edges: the trivalent dual graph). Each origin is diffused exactly (see :func:`graph_return_probability`)."""
    check_key(key, "key")
    check_state(state, "state")
    n_origins = static_int(n_origins, "n_origins", 1)
    src, dst, alive = graph_edges(state, graph)
    origins = _graph.random_live_nodes(key, alive, n_origins)
    return graph_return_probability(src, dst, alive, origins, sigma_max, laziness=laziness)


def _ds_from_mean(p_mean: np.ndarray, grid: np.ndarray) -> np.ndarray:
    lp, ls = np.log(p_mean), np.log(grid)
    return -2.0 * np.diff(lp, axis=-1) / np.diff(ls)


def spectral_dimension(p: Any, sigmas: Any = None) -> SpectralDimension:
    """``d_s(σ) = −2 d ln P / d ln σ`` from return probabilities, with jackknife errors.

    Args:
      p: (n_samples, G) return probabilities on a grid of diffusion times; each row an independent
        sample (e.g. one configuration, averaged over its origins). A (G,) array is one sample.
      sigmas: (G,) increasing positive diffusion times of the columns; default ``1..G`` when ``p`` has
        ``G`` columns starting at σ = 1, or pass the full (sigma_max + 1)-column output of
        :func:`graph_return_probability` with ``sigmas=None`` and column σ = 0 is dropped.
    The derivative is the slope between neighbouring grid points (read at their geometric mean); use a
    geometric grid (e.g. ``np.unique(np.geomspace(...).astype(int))``) for even resolution in ``ln σ``.
    Errors: delete-one jackknife over the samples (the slope is a nonlinear function of the mean ``P``).
    """
    arr = np.asarray(check_array(p, "p", kind="numeric", finite=True), np.float64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError(f"p must be (n_samples, G) with G >= 2 diffusion times, got shape {arr.shape}")
    if sigmas is None:
        grid = np.arange(arr.shape[1], dtype=np.float64)
        arr, grid = arr[:, 1:], grid[1:]
        if arr.shape[1] < 2:
            raise ValueError("p needs at least 2 diffusion times beyond sigma = 0")
    else:
        grid = np.asarray(check_array(sigmas, "sigmas", ndim=1, kind="numeric", finite=True), np.float64)
        if grid.shape[0] != arr.shape[1]:
            raise ValueError(f"sigmas must have one entry per column of p ({arr.shape[1]}), got {grid.shape[0]}")
        if np.any(grid <= 0) or np.any(np.diff(grid) <= 0):
            raise ValueError("sigmas must be positive and strictly increasing")
    if np.any(arr <= 0):
        raise ValueError("p must be > 0 (return probabilities of a connected graph)")
    n = arr.shape[0]
    mean = arr.mean(0)
    ds = _ds_from_mean(mean, grid)
    if n > 1:
        jack = np.stack([_ds_from_mean((mean * n - arr[i]) / (n - 1), grid) for i in range(n)])
        err = np.sqrt((n - 1) / n * ((jack - jack.mean(0)) ** 2).sum(0))
    else:
        err = np.full_like(ds, np.nan)
    return SpectralDimension(np.sqrt(grid[1:] * grid[:-1]), ds, err, mean, grid)


def mixing_time(p: Any, n_nodes: Any, factor: float = 2.0) -> np.ndarray:
    """First diffusion time ``σ*`` at which ``P(σ) <= factor / N`` (the walk has spread over the universe),
    per row of ``p`` (..., sigma_max + 1), linearly interpolated in ``ln P``; NaN when not reached.

    For ``N`` nodes in ``d_s`` dimensions ``σ* ∝ N^{2/d_s}`` at fixed shape: the finite-size-scaling
    observable of the spectral dimension (as the mean distance is of the Hausdorff dimension).
    """
    arr = np.asarray(check_array(p, "p", kind="numeric", finite=True), np.float64)
    check_scalar(factor, "factor", minimum=1.0 + 1e-9)
    nn = np.broadcast_to(np.asarray(n_nodes, np.float64), arr.shape[:-1])
    if np.any(nn < 1):
        raise ValueError("n_nodes must be >= 1")
    flat, nflat = arr.reshape(-1, arr.shape[-1]), nn.reshape(-1)
    out = np.full(flat.shape[0], np.nan)
    for i, (row, n) in enumerate(zip(flat, nflat)):
        level = math.log(factor / n)
        lp = np.log(np.maximum(row, 1e-300))
        hit = np.nonzero(lp <= level)[0]
        if hit.size and hit[0] > 0:
            j = hit[0]
            out[i] = (j - 1) + (lp[j - 1] - level) / (lp[j - 1] - lp[j])
    return out.reshape(arr.shape[:-1])
