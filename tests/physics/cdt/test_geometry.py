"""Graph observables of triangulations (ivhl_jax.physics.cdt.graph) against an independent reference.

Triangulations are built here in NumPy (a regular triangulated torus, random 1+1D CDT tori), embedded
in larger fixed-capacity arrays with garbage in the free slots, and every observable is compared with
all-pairs shortest paths from ``scipy.sparse.csgraph.shortest_path``: integers exactly, averages to 1e-6.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import sparse
from scipy.sparse import csgraph

from ivhl_jax.numerics.statistics import chi2_histogram_test
from ivhl_jax.physics.cdt import graph as geo

# ----------------------------------------------------------------------------------------------------
# reference triangulations


def cdt_torus(lengths, words):
    """A 1+1D CDT torus: slice t has lengths[t] vertices; strip t (slices t, t+1) follows words[t], a cyclic
    sequence of 'U' (base on t) / 'D' (base on t+1) with lengths[t] U's and lengths[t+1] D's.

    Returns tv (N2, 3) and tnbr (N2, 3) (neighbour across edges: left timelike, right timelike, base),
    built combinatorially from the strip structure (not by matching vertex pairs, so double links are fine).
    """
    n_t = len(lengths)
    off = np.concatenate([[0], np.cumsum(lengths)])
    tv, left, right = [], [], []
    up_at, down_at = {}, {}  # (slice, base index) -> triangle id
    for t in range(n_t):
        a, b = lengths[t], lengths[(t + 1) % n_t]
        word = words[t]
        assert word.count("U") == a and word.count("D") == b
        i = j = 0
        first = len(tv)
        oa, ob = off[t], off[(t + 1) % n_t]
        for k, w in enumerate(word):
            tid = first + k
            if w == "U":
                tv.append((oa + i % a, oa + (i + 1) % a, ob + j % b))
                up_at[(t, i % a)] = tid
                i += 1
            else:
                tv.append((ob + j % b, ob + (j + 1) % b, oa + i % a))
                down_at[((t + 1) % n_t, j % b)] = tid
                j += 1
            m = len(word)
            left.append(first + (k - 1) % m)
            right.append(first + (k + 1) % m)
    n2 = len(tv)
    base_tri = np.zeros(n2, np.int64)
    for (s, i), tid in up_at.items():
        other = down_at[(s, i)]
        base_tri[tid], base_tri[other] = other, tid
    tnbr = np.stack([left, right, base_tri], 1)
    return np.asarray(tv, np.int64), tnbr.astype(np.int64)


def regular_torus(n_t, length):
    return cdt_torus([length] * n_t, ["UD" * length] * n_t)


def random_cdt(rng, n_t, l_min=3, l_max=7):
    lengths = rng.integers(l_min, l_max + 1, n_t)
    words = []
    for t in range(n_t):
        w = np.array(["U"] * lengths[t] + ["D"] * lengths[(t + 1) % n_t])
        rng.shuffle(w)
        words.append("".join(w))
    return cdt_torus(list(lengths), words)


def embed(rng, tv, tnbr, c0, c2):
    """Scatter a triangulation into capacity (C0, C2) with random slot ids and garbage in free slots."""
    n0, n2 = int(tv.max()) + 1, tv.shape[0]
    pv, pt = rng.permutation(c0)[:n0], rng.permutation(c2)[:n2]
    tv_e = rng.integers(0, c0, (c2, 3))  # garbage that would add links if free slots were not masked
    tn_e = rng.integers(0, c2, (c2, 3))
    tv_e[pt], tn_e[pt] = pv[tv], pt[tnbr]
    tri_alive = np.zeros(c2, bool)
    tri_alive[pt] = True
    vert_alive = np.zeros(c0, bool)
    vert_alive[pv] = True
    return dict(tv=tv_e.astype(np.int32), tnbr=tn_e.astype(np.int32), tri_alive=tri_alive, vert_alive=vert_alive)


def ref_vertex_dist(g):
    tv = g["tv"][g["tri_alive"]]
    c0 = g["vert_alive"].shape[0]
    e = np.concatenate([tv[:, [0, 1]], tv[:, [1, 2]], tv[:, [2, 0]]])
    adj = sparse.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(c0, c0)).tocsr()
    return csgraph.shortest_path(adj, directed=False, unweighted=True)


def ref_dual_dist(g):
    c2 = g["tri_alive"].shape[0]
    live = np.flatnonzero(g["tri_alive"])
    src = np.repeat(live, 3)
    dst = g["tnbr"][live].reshape(-1)
    adj = sparse.coo_matrix((np.ones(len(src)), (src, dst)), shape=(c2, c2)).tocsr()
    return csgraph.shortest_path(adj, directed=False, unweighted=True)


def clip(ref, r_max):
    return np.where(np.isfinite(ref) & (ref <= r_max), ref, r_max + 1).astype(np.int64)


def ref_sphere_distance(dist, x, y, delta, max_sphere=None):
    sx, sy = np.flatnonzero(dist[x] == delta), np.flatnonzero(dist[y] == delta)
    over = max_sphere is not None and (len(sx) > max_sphere or len(sy) > max_sphere)
    if max_sphere is not None:
        sx, sy = sx[:max_sphere], sy[:max_sphere]
    total = int(dist[np.ix_(sx, sy)].sum())
    return total, len(sx), len(sy), total / (len(sx) * len(sy)), over


@pytest.fixture(scope="module")
def graphs():
    rng = np.random.default_rng(1234)
    out = []
    for _ in range(3):  # three random CDT tori in the same capacities: a batch for vmap
        tv, tn = random_cdt(rng, 6)
        out.append(embed(rng, tv, tn, 48, 96))
    return out


def vgraph(g):
    src, dst = geo.vertex_adjacency_edges(g["tv"], g["tri_alive"])
    return src, dst, g["vert_alive"]


def dgraph(g):
    src, dst = geo.dual_adjacency_edges(g["tnbr"], g["tri_alive"])
    return src, dst, g["tri_alive"]


GRAPH_KINDS = [("vertex", vgraph, ref_vertex_dist), ("dual", dgraph, ref_dual_dist)]


# ----------------------------------------------------------------------------------------------------
# the reference itself


def test_reference_triangulations_are_closed_tori():
    for tv, tn in [regular_torus(4, 5), random_cdt(np.random.default_rng(0), 5)]:
        n2, n0 = len(tv), tv.max() + 1
        assert n2 == 2 * n0
        # tnbr is an involution without fixed points, and neighbours share exactly an edge (2 vertices)
        for t in range(n2):
            for k in range(3):
                u = tn[t, k]
                assert u != t and t in tn[u]
                assert len(set(tv[t]) & set(tv[u])) >= 2


# ----------------------------------------------------------------------------------------------------
# distances and spheres


@pytest.mark.parametrize("kind,graph,ref", GRAPH_KINDS)
def test_distances_match_scipy(graphs, kind, graph, ref):
    g = graphs[0]
    src, dst, alive = graph(g)
    dist = ref(g)
    live = np.flatnonzero(alive)
    for r_max in (3, 40):
        for o in live[:: max(1, len(live) // 5)]:
            d = np.asarray(geo.graph_distances(src, dst, alive.shape[0], int(o), r_max))
            assert d.dtype == np.int32
            np.testing.assert_array_equal(d, clip(dist[o], r_max))


def test_distances_on_random_graphs_match_scipy():
    rng = np.random.default_rng(7)
    for n, density in [(30, 0.05), (60, 0.03), (40, 0.2)]:
        adj = sparse.random(n, n, density=density, random_state=rng, format="coo")
        src, dst = np.concatenate([adj.row, adj.col]), np.concatenate([adj.col, adj.row])
        # dead edges (out of bounds) must be ignored
        src = np.concatenate([src, [geo.OUT_OF_BOUNDS, 3]]).astype(np.int32)
        dst = np.concatenate([dst, [0, geo.OUT_OF_BOUNDS]]).astype(np.int32)
        ref = csgraph.shortest_path(adj.tocsr(), directed=False, unweighted=True)
        counts = np.asarray(geo.sphere_counts(src, dst, n, np.arange(n), 12))
        for o in range(n):
            d = np.asarray(geo.graph_distances(src, dst, n, o, 12))
            np.testing.assert_array_equal(d, clip(ref[o], 12))
            np.testing.assert_array_equal(counts[o], np.bincount(clip(ref[o], 12), minlength=14)[:13])


@pytest.mark.parametrize("kind,graph,ref", GRAPH_KINDS)
def test_sphere_counts_and_volumes_match_scipy(graphs, kind, graph, ref):
    g = graphs[1]
    src, dst, alive = graph(g)
    dist = ref(g)
    n, r_max = alive.shape[0], 30
    live = np.flatnonzero(alive)
    counts = np.asarray(geo.sphere_counts(src, dst, n, live, r_max))
    want = np.stack([np.bincount(clip(dist[o], r_max), minlength=r_max + 2)[: r_max + 1] for o in live])
    np.testing.assert_array_equal(counts, want)
    assert np.all(counts.sum(1) == len(live))  # r_max beyond the diameter: every live node is counted once
    key = jax.random.key(3)
    origins = np.asarray(geo.random_live_nodes(key, alive, 16))
    assert np.all(alive[origins])
    vols = np.asarray(geo.sphere_volumes(key, src, dst, alive, r_max, 16))
    np.testing.assert_allclose(vols, want[np.searchsorted(live, origins)].mean(0), rtol=1e-6)


# ----------------------------------------------------------------------------------------------------
# coordination


def test_coordination_matches_reference(graphs):
    for g in graphs:
        q = np.asarray(geo.vertex_coordination(g["tv"], g["tri_alive"], g["vert_alive"]))
        ref = np.zeros(g["vert_alive"].shape[0], np.int64)
        np.add.at(ref, g["tv"][g["tri_alive"]].reshape(-1), 1)
        np.testing.assert_array_equal(q, np.where(g["vert_alive"], ref, 0))
        n0, n2 = g["vert_alive"].sum(), g["tri_alive"].sum()
        assert q.sum() == 3 * n2 == 6 * n0  # Euler: a torus has average coordination exactly 6
        for q_max in (8, 30):
            p = np.asarray(geo.coordination_distribution(g["tv"], g["tri_alive"], g["vert_alive"], q_max))
            hist = np.bincount(np.minimum(ref[g["vert_alive"]], q_max), minlength=q_max + 1)
            np.testing.assert_array_equal(np.rint(p * n0).astype(int), hist)
            np.testing.assert_allclose(p, hist / n0, rtol=1e-6)


def test_flat_triangular_lattice_has_coordination_six():
    tv, tn = regular_torus(32, 32)
    g = embed(np.random.default_rng(2), tv, tn, 1100, 2100)
    p = np.asarray(geo.coordination_distribution(g["tv"], g["tri_alive"], g["vert_alive"], 12))
    np.testing.assert_array_equal(p, np.eye(13)[6])
    # the flat lattice: spheres of the triangular lattice have 6r vertices, of the hexagonal dual 3r
    src, dst, alive = vgraph(g)
    vols = np.asarray(geo.sphere_volumes(jax.random.key(0), src, dst, alive, 8, 4))
    np.testing.assert_array_equal(vols, np.r_[1, 6 * np.arange(1, 9)])
    src, dst, alive = dgraph(g)
    vols = np.asarray(geo.sphere_volumes(jax.random.key(0), src, dst, alive, 8, 4))
    np.testing.assert_array_equal(vols, np.r_[1, 3 * np.arange(1, 9)])


# ----------------------------------------------------------------------------------------------------
# quantum Ricci curvature


@pytest.mark.parametrize("kind,graph,ref", GRAPH_KINDS)
def test_average_sphere_distance_matches_scipy(graphs, kind, graph, ref):
    g = graphs[2]
    src, dst, alive = graph(g)
    dist = ref(g)
    n = alive.shape[0]
    rng = np.random.default_rng(5)
    live = np.flatnonzero(alive)
    checked = 0
    for delta in (1, 2, 3):
        for x in rng.choice(live, 4, replace=False):
            for y in np.flatnonzero(dist[x] == delta)[:2]:
                for max_sphere in (64, 5):
                    # one r_max for every δ: one compilation per max_sphere
                    res = geo.average_sphere_distance(src, dst, n, int(x), int(y), delta, 9, max_sphere)
                    total, nx, ny, dbar, over = ref_sphere_distance(dist, x, y, delta, max_sphere)
                    assert (int(res.total), int(res.n_x), int(res.n_y), bool(res.overflow)) == (total, nx, ny, over)
                    np.testing.assert_allclose(float(res.dbar), dbar, rtol=1e-6)
                    checked += 1
    assert checked > 20


def test_average_sphere_distance_unreached_is_nan(graphs):
    g = graphs[0]
    src, dst, alive = vgraph(g)
    dist = ref_vertex_dist(g)
    x = int(np.flatnonzero(alive)[0])
    y = int(np.flatnonzero(dist[x] == 2)[0])
    sx, sy = np.flatnonzero(dist[x] == 2), np.flatnonzero(dist[y] == 2)
    assert dist[np.ix_(sx, sy)].max() > 2  # some sphere points are farther apart than r_max = 2 below
    # delta traced under jit: no eager r_max check, and pairs farther than r_max make the result NaN
    f = jax.jit(lambda d: geo.average_sphere_distance(src, dst, alive.shape[0], x, y, d, 2, 64))
    assert np.isnan(float(f(2).dbar))
    ok = jax.jit(lambda d: geo.average_sphere_distance(src, dst, alive.shape[0], x, y, d, 6, 64))(2)
    np.testing.assert_allclose(float(ok.dbar), ref_sphere_distance(dist, x, y, 2)[3], rtol=1e-6)


def test_sample_pairs_law_is_uniform_x_then_uniform_on_sphere():
    rng = np.random.default_rng(11)
    tv, tn = random_cdt(rng, 4, 3, 4)
    g = embed(rng, tv, tn, 20, 36)
    src, dst, alive = vgraph(g)
    dist = ref_vertex_dist(g)
    delta, n_samples = 2, 20000
    x, y, valid = (np.asarray(a) for a in geo.sample_pairs(jax.random.key(9), src, dst, alive, delta, n_samples))
    live = np.flatnonzero(alive)
    assert np.all(valid == np.array([np.any(dist[xi] == delta) for xi in x]))
    assert np.all(dist[x[valid], y[valid]] == delta)
    # χ² test of the joint law P(x, y) = 1/(N |S_δ(x)|) over all pairs at distance δ
    cells = [(a, b) for a in live for b in np.flatnonzero(dist[a] == delta)]
    probs = np.array([1.0 / (len(live) * np.sum(dist[a] == delta)) for a, _ in cells])
    index = {c: i for i, c in enumerate(cells)}
    counts = np.bincount([index[(a, b)] for a, b in zip(x[valid], y[valid])], minlength=len(cells))
    res = chi2_histogram_test(counts, probs)
    assert res.p_value > 1e-4, res


@pytest.mark.parametrize("kind,graph,ref", GRAPH_KINDS)
def test_ricci_profile_matches_reference(graphs, kind, graph, ref):
    g = graphs[0]
    src, dst, alive = graph(g)
    dist = ref(g)
    deltas = (1, 2)
    prof = geo.ricci_curvature_profile(jax.random.key(4), src, dst, alive, deltas, 12, max_sphere=32)
    assert prof.samples.shape == (2, 12)
    np.testing.assert_array_equal(np.asarray(prof.deltas), deltas)
    for i, delta in enumerate(deltas):
        x, y, s = np.asarray(prof.x[i]), np.asarray(prof.y[i]), np.asarray(prof.samples[i])
        assert np.all(dist[x, y] == delta)  # every x has a non-empty δ-sphere on these tori
        want = np.array([ref_sphere_distance(dist, a, b, delta)[3] / delta for a, b in zip(x, y)])
        np.testing.assert_allclose(s, want, rtol=1e-6)
        assert int(prof.n_valid[i]) == 12 and int(prof.n_overflow[i]) == 0
        np.testing.assert_allclose(float(prof.mean[i]), want.mean(), rtol=1e-6)
        np.testing.assert_allclose(float(prof.stderr[i]), want.std(ddof=1) / np.sqrt(12), rtol=1e-4)


def test_ricci_profile_counts_overflow(graphs):
    src, dst, alive = vgraph(graphs[0])
    prof = geo.ricci_curvature_profile(jax.random.key(4), src, dst, alive, [3], 6, max_sphere=2)
    assert int(prof.n_overflow[0]) == 6 and int(prof.n_valid[0]) == 0
    assert np.all(np.isnan(np.asarray(prof.samples))) and np.isnan(float(prof.mean[0]))


def test_flat_lattice_sphere_distance():
    # on the triangular lattice the δ = 1 spheres of two neighbours are hexagons: d̄ computed by hand
    tv, tn = regular_torus(12, 12)
    g = embed(np.random.default_rng(0), tv, tn, 150, 300)
    src, dst, alive = vgraph(g)
    dist = ref_vertex_dist(g)
    prof = geo.ricci_curvature_profile(jax.random.key(1), src, dst, alive, (1, 2, 3), 8, max_sphere=32)
    for i, delta in enumerate((1, 2, 3)):
        # all pairs on the flat torus at distance δ that are related by a lattice symmetry give the same d̄;
        # check against the reference for each sampled pair and that the values are δ-spheres of size 6δ
        x, y = np.asarray(prof.x[i]), np.asarray(prof.y[i])
        want = [ref_sphere_distance(dist, a, b, delta)[3] / delta for a, b in zip(x, y)]
        np.testing.assert_allclose(np.asarray(prof.samples[i]), want, rtol=1e-6)
        assert all(np.sum(dist[a] == delta) == 6 * delta for a in x)
    # two adjacent vertices: their 1-spheres (hexagons) are at mean distance 5/3 — by hand, in axial
    # coordinates where d = max(|a|, |b|, |a + b|): 36 pairs whose distances sum to 60
    x = int(np.flatnonzero(alive)[0])
    y = int(np.flatnonzero(dist[x] == 1)[0])
    res = geo.average_sphere_distance(src, dst, alive.shape[0], x, y, 1, 3, 8)
    assert (int(res.total), int(res.n_x), int(res.n_y)) == (60, 6, 6)
    np.testing.assert_allclose(float(res.dbar), 5 / 3, rtol=1e-6)


# ----------------------------------------------------------------------------------------------------
# jit and vmap


def test_jit_and_vmap_over_a_batch_of_triangulations(graphs):
    batch = {k: np.stack([g[k] for g in graphs]) for k in graphs[0]}
    c0 = batch["vert_alive"].shape[1]

    @functools.partial(jax.jit, static_argnums=())
    def observe(tv, tnbr, tri_alive, vert_alive, key):
        src, dst = geo.vertex_adjacency_edges(tv, tri_alive)
        dsrc, ddst = geo.dual_adjacency_edges(tnbr, tri_alive)
        origin = geo.random_live_nodes(key, vert_alive, 1)[0]
        return dict(
            dist=geo.graph_distances(src, dst, c0, origin, 10),
            counts=geo.sphere_counts(src, dst, c0, origin[None], 10),
            vol=geo.sphere_volumes(key, dsrc, ddst, tri_alive, 6, 4),
            coord=geo.coordination_distribution(tv, tri_alive, vert_alive, 10),
            asd=geo.average_sphere_distance(src, dst, c0, origin, origin, 2, 6, 32).dbar,
            prof=geo.ricci_curvature_profile(key, src, dst, vert_alive, (1,), 3, max_sphere=16).mean,
        )

    keys = jax.random.split(jax.random.key(0), len(graphs))
    out = jax.vmap(observe)(batch["tv"], batch["tnbr"], batch["tri_alive"], batch["vert_alive"], keys)
    for i, g in enumerate(graphs):
        one = observe(g["tv"], g["tnbr"], g["tri_alive"], g["vert_alive"], keys[i])
        for k in one:
            np.testing.assert_allclose(np.asarray(out[k][i]), np.asarray(one[k]), rtol=1e-6, err_msg=k)
        # and the unjitted, unbatched public calls agree with the reference
        origin = int(geo.random_live_nodes(keys[i], g["vert_alive"], 1)[0])
        np.testing.assert_array_equal(np.asarray(out["dist"][i]), clip(ref_vertex_dist(g)[origin], 10))


# ----------------------------------------------------------------------------------------------------
# bad inputs


def test_bad_inputs_name_the_argument(graphs):
    g = graphs[0]
    tv, tn, ta, va = g["tv"], g["tnbr"], g["tri_alive"], g["vert_alive"]
    src, dst = geo.vertex_adjacency_edges(tv, ta)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="tv must have shape"):
        geo.vertex_adjacency_edges(tv[:, :2], ta)
    with pytest.raises(ValueError, match="tri_alive must have shape"):
        geo.vertex_adjacency_edges(tv, ta[:-1])
    with pytest.raises(ValueError, match="tnbr must have shape"):
        geo.dual_adjacency_edges(tn.reshape(-1), ta)
    with pytest.raises(ValueError, match="tri_alive must have shape"):
        geo.coordination_distribution(tv, ta[:5], va, 10)
    with pytest.raises(ValueError, match="dst must have the shape of src"):
        geo.graph_distances(src, dst[:-1], 48, 0, 5)
    with pytest.raises(ValueError, match="r_max must be >= 1"):
        geo.graph_distances(src, dst, 48, 0, 0)
    with pytest.raises(ValueError, match="r_max must be >= 1"):
        geo.sphere_volumes(key, src, dst, va, 0)
    with pytest.raises(ValueError, match="r_max must be >= 1"):
        geo.sphere_counts(src, dst, 48, jnp.arange(3), -2)
    with pytest.raises(ValueError, match="delta must be >= 1"):
        geo.average_sphere_distance(src, dst, 48, 0, 1, 0, 6, 8)
    with pytest.raises(ValueError, match="r_max must be >= 3\\*delta"):
        geo.average_sphere_distance(src, dst, 48, 0, 1, 3, 6, 8)
    with pytest.raises(ValueError, match="delta must be >= 1"):
        geo.sample_pairs(key, src, dst, va, 0, 4)
    with pytest.raises(ValueError, match="deltas must be >= 1"):
        geo.ricci_curvature_profile(key, src, dst, va, (1, 0), 4)
    with pytest.raises(ValueError, match="deltas must be a non-empty"):
        geo.ricci_curvature_profile(key, src, dst, va, (), 4)
    with pytest.raises(ValueError, match="q_max must be >= 1"):
        geo.coordination_distribution(tv, ta, va, 0)
    with pytest.raises(ValueError, match="max_sphere must be >= 1"):
        geo.average_sphere_distance(src, dst, 48, 0, 1, 1, 6, 0)
    with pytest.raises(ValueError, match="vert_alive must be 1-dimensional"):
        geo.vertex_coordination(tv, ta, va[None])
    with pytest.raises(TypeError, match="tv must have a integer dtype"):
        geo.vertex_adjacency_edges(tv.astype(float), ta)
    with pytest.raises(TypeError, match="key must be a PRNG key"):
        geo.sphere_volumes(0, src, dst, va, 4)
