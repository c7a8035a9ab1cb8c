"""Spectral dimension: the lazy-walk return probability against exact heat kernels (NumPy, float64) on rings,
square tori and the regular CDT triangulation (vertex and dual graph), d_s on lattices where it is known,
the jackknife errors, bad input, and the 2D CDT value."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ivhl_jax import cdt
from ivhl_jax.physics.cdt import graph as cdt_graph
from ivhl_jax.physics.cdt import spectral
from ivhl_jax.physics.cdt import state as cdt_state


def _ring_edges(n):
    i = np.arange(n)
    return np.concatenate([i, (i + 1) % n]), np.concatenate([(i + 1) % n, i])


def _torus_edges(lx, ly):
    idx = np.arange(lx * ly).reshape(lx, ly)
    src, dst = [], []
    for nb in (np.roll(idx, 1, 0), np.roll(idx, -1, 0), np.roll(idx, 1, 1), np.roll(idx, -1, 1)):
        src.append(idx.ravel())
        dst.append(nb.ravel())
    return np.concatenate(src), np.concatenate(dst)


def _exact_ring(n, sigmas, a=0.5):
    k = 2 * np.pi * np.arange(n) / n
    return np.array([np.mean((a + (1 - a) * np.cos(k)) ** s) for s in sigmas])


def _exact_torus(lx, ly, sigmas, a=0.5):
    kx, ky = 2 * np.pi * np.arange(lx) / lx, 2 * np.pi * np.arange(ly) / ly
    lam = (np.cos(kx)[:, None] + np.cos(ky)[None, :]) / 2
    return np.array([np.mean((a + (1 - a) * lam) ** s) for s in sigmas])


def _dense_walk_return(src, dst, n, origins, sigma_max, a=0.5):
    """Independent reference: the lazy transition matrix as a dense float64 array, powers by matmul."""
    m = np.zeros((n, n))
    np.add.at(m, (src, dst), 1.0)
    deg = m.sum(1, keepdims=True)
    w = a * np.eye(n) + (1 - a) * m / np.where(deg > 0, deg, 1)
    out = np.zeros((len(origins), sigma_max + 1))
    p = np.eye(n)[origins]
    for s in range(sigma_max + 1):
        out[:, s] = p[np.arange(len(origins)), origins]
        p = p @ w
    return out


def test_ring_and_square_torus_match_the_exact_heat_kernel():
    n = 61
    src, dst = _ring_edges(n)
    p = np.asarray(spectral.graph_return_probability(src, dst, np.ones(n, bool), np.array([0, 17]), 60))
    exact = _exact_ring(n, range(61))
    np.testing.assert_allclose(p, np.broadcast_to(exact, p.shape), rtol=2e-5, atol=1e-7)
    lx, ly = 12, 9
    src, dst = _torus_edges(lx, ly)
    p = np.asarray(spectral.graph_return_probability(src, dst, np.ones(lx * ly, bool), np.array([0, 50, 107]), 100))
    exact = _exact_torus(lx, ly, range(101))
    np.testing.assert_allclose(p, np.broadcast_to(exact, p.shape), rtol=2e-5, atol=1e-7)


def test_spectral_dimension_of_ring_is_one_and_of_torus_is_two():
    sig = np.unique(np.geomspace(1, 400, 24).astype(int))
    src, dst = _ring_edges(2001)
    p = np.asarray(spectral.graph_return_probability(src, dst, np.ones(2001, bool), np.array([0]), 400))
    res = spectral.spectral_dimension(p[:, sig], sig)
    win = (res.sigma > 20) & (res.sigma < 400)
    np.testing.assert_allclose(res.d_s[win], 1.0, atol=0.02)
    src, dst = _torus_edges(64, 64)
    p = np.asarray(spectral.graph_return_probability(src, dst, np.ones(64 * 64, bool), np.array([5]), 400))
    np.testing.assert_allclose(p[0], _exact_torus(64, 64, range(401)), rtol=1e-4)
    res = spectral.spectral_dimension(p[:, sig], sig)
    win = (res.sigma > 20) & (res.sigma < 400)
    np.testing.assert_allclose(res.d_s[win], 2.0, atol=0.02)
    # beyond the window the finite size shows: d_s falls once sigma ~ L^2 (P -> 1/N)
    big = np.asarray(spectral.graph_return_probability(src, dst, np.ones(64 * 64, bool), np.array([5]), 4000))
    late = spectral.spectral_dimension(big[:, [2000, 4000]], [2000, 4000]).d_s[0]
    assert late < 1.0


def _regular_cdt_graphs(state):
    """Independent NumPy construction of the vertex and dual graphs of a regular CDT torus from its triangles."""
    tv = np.asarray(state.tv)
    alive = np.asarray(cdt_state.live_triangles(state))
    tri = tv[alive]
    vsrc, vdst = [], []
    for i, j in ((0, 1), (1, 2), (2, 0)):
        vsrc += [tri[:, i], tri[:, j]]
        vdst += [tri[:, j], tri[:, i]]
    # dual: triangles sharing an edge (as vertex pairs)
    ids = np.nonzero(alive)[0]
    edges = {}
    for t, (a, b, c) in zip(ids, tri):
        for e in ((a, b), (b, c), (c, a)):
            edges.setdefault(tuple(sorted(e)), []).append(t)
    dsrc, ddst = [], []
    for ts in edges.values():
        assert len(ts) == 2
        dsrc += [ts[0], ts[1]]
        ddst += [ts[1], ts[0]]
    return (np.concatenate(vsrc), np.concatenate(vdst)), (np.array(dsrc), np.array(ddst))


def test_cdt_return_probability_matches_dense_reference_on_vertex_and_dual_graphs():
    # one sweep of 200 attempts from the regular torus (4 slices of 5, 40 slots), so the lattice is not regular
    st = cdt.metropolis(1.0, attempts_per_sweep=200)
    s = jax.jit(st.step)(st.init(jax.random.key(3), 4, 5, 40)).geometry
    (vs, vd), (ds, dd) = _regular_cdt_graphs(s)
    key = jax.random.key(0)
    for graph, (src, dst), n in (("vertex", (vs, vd), s.vertex_capacity), ("dual", (ds, dd), 2 * s.vertex_capacity)):
        p = np.asarray(spectral.return_probability(key, s, 15, 4, graph=graph))
        alive = np.asarray(cdt_state.live_vertices(s) if graph == "vertex" else cdt_state.live_triangles(s))
        origins = np.asarray(cdt_graph.random_live_nodes(key, alive, 4))
        ref = _dense_walk_return(src, dst, n, origins, 15)
        np.testing.assert_allclose(p, ref, rtol=2e-5, atol=1e-7, err_msg=graph)


def test_jackknife_errors_cover_the_truth():
    # samples P_i(σ) = c_i σ^{-1} (1 + noise): d_s = 2 on average; the jackknife error must be of the size
    # of the scatter of the estimate over repetitions
    rng = np.random.default_rng(0)
    sig = np.array([10.0, 20, 40, 80])
    est, errs = [], []
    for _ in range(200):
        c = rng.uniform(0.5, 2.0, (16, 1))
        p = c / sig * (1 + 0.05 * rng.standard_normal((16, 4)))
        r = spectral.spectral_dimension(p, sig)
        est.append(r.d_s)
        errs.append(r.error)
    est, errs = np.array(est), np.array(errs)
    np.testing.assert_allclose(est.mean(0), 2.0, atol=0.02)
    ratio = est.std(0) / errs.mean(0)
    assert np.all((ratio > 0.7) & (ratio < 1.4)), ratio


def test_mixing_time_scales_as_volume_on_tori():
    # sigma* ∝ N^{2/d}: on L x L tori it grows like L^2
    ts = []
    for ell in (8, 16, 32):
        src, dst = _torus_edges(ell, ell)
        p = np.asarray(spectral.graph_return_probability(src, dst, np.ones(ell * ell, bool), np.array([0]), ell * ell))
        ts.append(float(spectral.mixing_time(p[0], ell * ell)))
    slope = np.polyfit(np.log([8, 16, 32]), np.log(ts), 1)[0]
    assert abs(slope - 2.0) < 0.05, (ts, slope)


def test_bad_input():
    src, dst = _ring_edges(10)
    alive = np.ones(10, bool)
    with pytest.raises(ValueError, match="sigma_max"):
        spectral.graph_return_probability(src, dst, alive, np.array([0]), 11)
    with pytest.raises(ValueError, match="laziness"):
        spectral.graph_return_probability(src, dst, alive, np.array([0]), 5, laziness=1.0)
    with pytest.raises(ValueError, match="origins"):
        spectral.graph_return_probability(src, dst, alive, np.array([10]), 5)
    with pytest.raises(TypeError, match="sigma_max"):
        spectral.graph_return_probability(src, dst, alive, np.array([0]), 2.5)
    s = cdt_state.initial_state(3, 3)
    with pytest.raises(ValueError, match="graph"):
        spectral.return_probability(jax.random.key(0), s, 3, graph="edges")
    with pytest.raises(ValueError, match="sigma_max"):
        spectral.return_probability(jax.random.key(0), s, 10, graph="vertex")  # 9 vertices
    with pytest.raises(ValueError, match="sigmas"):
        spectral.spectral_dimension(np.ones((2, 3)), [1, 3, 2])
    with pytest.raises(ValueError, match="p must be > 0"):
        spectral.spectral_dimension(np.zeros((2, 3)), [1, 2, 3])


def test_jit_and_vmap_over_configurations():
    s = cdt_state.replicate(cdt_state.initial_state(4, 6), 3)
    keys = jax.random.split(jax.random.key(1), 3)
    fn = jax.jit(jax.vmap(lambda k, st: spectral.return_probability(k, st, 12, 2, graph="dual")))
    p = np.asarray(fn(keys, s))
    assert p.shape == (3, 2, 13)
    one = np.asarray(
        spectral.return_probability(keys[1], jax.tree_util.tree_map(lambda x: x[1], s), 12, 2, graph="dual")
    )
    np.testing.assert_allclose(p[1], one, rtol=1e-6)
    # regular triangulation: all origins equivalent, and the dual is the honeycomb lattice
    np.testing.assert_allclose(p[:, 0], p[:, 1], rtol=1e-5)
