"""Full invariant check of a 2+1D CDT buffer (NumPy; used by the tests, O(N3) with Python loops: small volumes).

:func:`check` raises ``AssertionError`` naming the first broken invariant:

* the bags: ``tperm``/``tpos`` and ``vperm``/``vpos`` are inverse permutations whose first ``n3``/``n0`` entries
  are exactly the live slots; the (3,1) bag holds exactly the live (3,1);
* every live tetrahedron has live, distinct vertices whose times fit its type (with periodic time), and four
  live neighbours, reciprocal (``tn[tn[a, i], j] == a`` for the face they share), sharing exactly the face
  opposite vertex ``i``; no two tetrahedra have the same vertex set, and every triangle lies in exactly two
  tetrahedra; the (1,3) below each (3,1) has its base as top triangle;
* every slice (the bases of its (3,1)) is a triangulated 2-sphere: connected, every edge in exactly two
  triangles, the link of every vertex one cycle, V - E + F = 2; every vertex of the slice is in it;
* the link of every vertex in the 3D triangulation is a connected closed surface with Euler characteristic 2
  (a 2-sphere: the triangulation is a 3-manifold);
* the counts ``n0, n3, n31, n22``, ``slices``, ``scnum``, ``cnum`` and ``vtet`` equal their recount.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ivhl_jax.physics.cdt.d3_state import COUNTS, TYPE_13, TYPE_22, TYPE_31, unpack

__all__ = ["check", "live_tetrahedra", "canonical"]

_SPLIT = {TYPE_31: 3, TYPE_22: 2, TYPE_13: 1}  # vertices on the slab's lower slice


def live_tetrahedra(buf: Any, tetra_capacity: int, n_slices: int) -> tuple[np.ndarray, np.ndarray]:
    """The live slots and their vertices (N3, 4) of one chain's buffer."""
    f = unpack(buf, tetra_capacity, n_slices)
    n3 = int(f["counts"][COUNTS.index("n3")])
    slots = np.sort(f["tperm"][:n3])
    return slots, f["tv"][slots]


def canonical(buf: Any, tetra_capacity: int, n_slices: int) -> tuple[Any, ...]:
    """A label-free summary of the triangulation for equality tests: the sorted vertex sets of the tetrahedra with
    their types, the sorted glued pairs of vertex sets, and the vertex times (slots relabel, this does not)."""
    f = unpack(buf, tetra_capacity, n_slices)
    slots, tv = live_tetrahedra(buf, tetra_capacity, n_slices)
    key = {int(s): tuple(sorted(int(x) for x in v)) for s, v in zip(slots, tv, strict=True)}
    tets = sorted((key[int(s)], int(f["ttype"][s])) for s in slots)
    glue = sorted(tuple(sorted((key[int(s)], key[int(f["tn"][s, i])]))) for s in slots for i in range(4))
    n0 = int(f["counts"][COUNTS.index("n0")])
    verts = sorted((int(v), int(f["vtime"][v])) for v in f["vperm"][:n0])
    return tuple(tets), tuple(glue), tuple(verts)


def _surface(triangles: list[tuple[int, ...]], what: str) -> tuple[int, int, int]:
    """Check a closed connected surface (every edge in two triangles, every vertex link one cycle); V, E, F."""
    edges: dict[tuple[int, int], int] = defaultdict(int)
    around: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for tri in triangles:
        a, b, c = tri
        for x, y, z in ((a, b, c), (b, c, a), (c, a, b)):
            edges[tuple(sorted((x, y)))] += 1  # type: ignore[index]
            around[z].append((x, y))
    bad = [e for e, k in edges.items() if k != 2]
    assert not bad, f"{what}: edge {bad[0]} lies in {edges[bad[0]]} triangles, not 2"
    for v, links in around.items():
        nbr: dict[int, list[int]] = defaultdict(list)
        for x, y in links:
            nbr[x].append(y)
            nbr[y].append(x)
        assert all(len(n) == 2 for n in nbr.values()), f"{what}: the link of vertex {v} is not a cycle"
        start = links[0][0]
        prev, cur, steps = -1, start, 0
        while True:
            nxt = nbr[cur][0] if nbr[cur][0] != prev else nbr[cur][1]
            prev, cur, steps = cur, nxt, steps + 1
            if cur == start:
                break
        assert steps == len(nbr), f"{what}: the link of vertex {v} is not one cycle"
    verts = sorted(around)
    parent = {v: v for v in verts}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for a, b in edges:
        parent[root(a)] = root(b)
    assert len({root(v) for v in verts}) == 1, f"{what}: not connected"
    return len(verts), len(edges), len(triangles)


def check(buf: Any, tetra_capacity: int, n_slices: int, *, manifold: bool = True) -> None:
    """Check every invariant of one chain's buffer (the module docstring); ``manifold=False`` skips the vertex
    links of the 3D triangulation (the slowest part). A broken invariant raises ``AssertionError`` naming it."""
    c3, t_n = int(tetra_capacity), int(n_slices)
    f = unpack(buf, c3, t_n)
    counts = {k: int(v) for k, v in zip(COUNTS, f["counts"], strict=True)}
    live, vlive = _check_slot_lists(f, counts, c3)
    _check_tetrahedra(f, live, vlive, t_n)
    _check_gluing(f, live)
    _check_slices(f, live, vlive, t_n)
    _check_counts(f, counts, live, vlive)
    if manifold:
        _check_vertex_links(f, live, vlive)


def _check_slot_lists(f: dict[str, np.ndarray], counts: dict[str, int], c3: int) -> tuple[np.ndarray, np.ndarray]:
    """The live/free permutations of tetrahedron and vertex slots; the sorted live slots of each."""
    n3, n0 = counts["n3"], counts["n0"]
    tperm, tpos, vperm, vpos = f["tperm"], f["tpos"], f["vperm"], f["vpos"]
    c0 = vperm.size
    assert sorted(tperm.tolist()) == list(range(c3)), "tperm is not a permutation of the tetrahedron slots"
    assert np.array_equal(tpos[tperm], np.arange(c3)), "tpos is not the inverse of tperm"
    assert sorted(vperm.tolist()) == list(range(c0)), "vperm is not a permutation of the vertex slots"
    assert np.array_equal(vpos[vperm], np.arange(c0)), "vpos is not the inverse of vperm"
    assert np.all(f["ttype"][tperm[n3:]] == 0), "a free tetrahedron slot has a type"
    return np.sort(tperm[:n3]), np.sort(vperm[:n0])


def _live_mask(size: int, live: np.ndarray) -> np.ndarray:
    mask = np.zeros(size, bool)
    mask[live] = True
    return mask


def _check_tetrahedra(f: dict[str, np.ndarray], live: np.ndarray, vlive: np.ndarray, t_n: int) -> None:
    """Each live tetrahedron: a valid type, four distinct live vertices on the times its type says, and no two
    with the same vertex set."""
    ttype, tv, vtime = f["ttype"], f["tv"], f["vtime"]
    c0 = vtime.size
    is_live_v = _live_mask(c0, vlive)
    assert np.all(np.isin(ttype[live], (TYPE_31, TYPE_22, TYPE_13))), "a live tetrahedron has no valid type"
    keys: dict[int, tuple[int, ...]] = {}
    for a in live.tolist():
        vs = tv[a].tolist()
        assert len(set(vs)) == 4, f"tetrahedron {a} has repeated vertices {vs}"
        assert all(0 <= v < c0 and is_live_v[v] for v in vs), f"tetrahedron {a} has a dead vertex: {vs}"
        k = _SPLIT[int(ttype[a])]
        lo = int(vtime[vs[0]])
        times = [int(vtime[v]) for v in vs]
        assert all(x == lo for x in times[:k]) and all(x == (lo + 1) % t_n for x in times[k:]), (
            f"tetrahedron {a} of type {int(ttype[a])} has vertex times {times}"
        )
        keys[a] = tuple(sorted(vs))
    assert len(set(keys.values())) == len(keys), "two tetrahedra have the same vertex set"


def _check_gluing(f: dict[str, np.ndarray], live: np.ndarray) -> None:
    """Face-to-face gluing: reciprocal neighbours sharing the face opposite the vertex, every triangle in exactly
    two tetrahedra, each (3,1) above the (1,3) that shares its spatial base."""
    ttype, tv, tn = f["ttype"], f["tv"], f["tn"]
    c3 = ttype.size
    is_live_t = _live_mask(c3, live)
    faces: dict[tuple[int, ...], int] = defaultdict(int)
    for a in live.tolist():
        vs = tv[a].tolist()
        for i in range(4):
            b = int(tn[a, i])
            assert 0 <= b < c3 and is_live_t[b], f"neighbour {i} of tetrahedron {a} is not live ({b})"
            face = set(vs) - {vs[i]}
            assert face <= set(tv[b].tolist()), f"tetrahedron {a} and its neighbour {i} ({b}) do not share face {face}"
            j = [x for x in range(4) if int(tv[b, x]) not in face]
            assert len(j) == 1 and int(tn[b, j[0]]) == a, f"the gluing of {a} and {b} is not reciprocal"
            faces[tuple(sorted(face))] += 1
        if ttype[a] == TYPE_31:
            below = int(tn[a, 3])
            assert ttype[below] == TYPE_13 and set(tv[below, 1:].tolist()) == set(vs[:3]), (
                f"the tetrahedron below the (3,1) {a} is not a (1,3) with its base on top"
            )
    bad = [fc for fc, k in faces.items() if k != 2]
    assert not bad, f"triangle {bad[0]} lies in {faces[bad[0]]} tetrahedra, not 2"


def _check_slices(f: dict[str, np.ndarray], live: np.ndarray, vlive: np.ndarray, t_n: int) -> None:
    """Every slice a connected triangulated 2-sphere (the (3,1) bases on it) holding all its live vertices, and the
    stored per-slice triangle counts equal to the recount."""
    ttype, tv, vtime = f["ttype"], f["tv"], f["vtime"]
    base_of: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for a in live.tolist():
        if ttype[a] == TYPE_31:
            base_of[int(vtime[tv[a, 0]])].append(tuple(int(x) for x in tv[a, :3]))
    slices = np.zeros(t_n, np.int64)
    for s in range(t_n):
        tris = base_of.get(s, [])
        assert tris, f"slice {s} has no triangles"
        v, e, fc = _surface(tris, f"slice {s}")
        assert v - e + fc == 2, f"slice {s}: V - E + F = {v - e + fc}, not 2"
        on_slice = int(np.sum(vtime[vlive] == s))
        assert v == on_slice, f"slice {s}: {on_slice} live vertices but {v} in its triangles"
        slices[s] = fc
    assert np.array_equal(slices, f["slices"]), f"slices {f['slices'].tolist()} != recount {slices.tolist()}"


def _check_counts(f: dict[str, np.ndarray], counts: dict[str, int], live: np.ndarray, vlive: np.ndarray) -> None:
    """N0, N3, N(3,1), N22 against a recount; the (3,1) bag and its inverse; the per-vertex coordinations and each
    vertex's (3,1)."""
    ttype, tv = f["ttype"], f["tv"]
    c3, c0 = ttype.size, f["vtime"].size
    recount = dict(
        n0=vlive.size,
        n3=live.size,
        n31=int(np.sum(ttype[live] == TYPE_31)),
        n22=int(np.sum(ttype[live] == TYPE_22)),
    )
    for name, value in recount.items():
        assert counts[name] == value, f"count {name} = {counts[name]} but the recount is {value}"
    l31 = f["l31"][: counts["n31"]]
    assert set(l31.tolist()) == set(live[ttype[live] == TYPE_31].tolist()), "the (3,1) bag is not the live (3,1)"
    assert np.array_equal(f["p31"][l31], np.arange(l31.size)), "p31 is not the inverse of the (3,1) bag"
    cnum = np.zeros(c0, np.int64)
    scnum = np.zeros(c0, np.int64)
    np.add.at(cnum, tv[live].reshape(-1), 1)
    is31 = live[ttype[live] == TYPE_31]
    np.add.at(scnum, tv[is31, :3].reshape(-1), 1)
    assert np.array_equal(cnum[vlive], f["cnum"][vlive]), "cnum differs from its recount"
    assert np.array_equal(scnum[vlive], f["scnum"][vlive]), "scnum differs from its recount"
    is_live_t = _live_mask(c3, live)
    for v in vlive.tolist():
        t = int(f["vtet"][v])
        assert 0 <= t < c3 and is_live_t[t] and ttype[t] == TYPE_31 and v in tv[t, :3], (
            f"vtet of vertex {v} is not a live (3,1) with the vertex in its base"
        )


def _check_vertex_links(f: dict[str, np.ndarray], live: np.ndarray, vlive: np.ndarray) -> None:
    """The link of every vertex of the 3D triangulation is a 2-sphere (a 3-manifold)."""
    tv = f["tv"]
    link: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for a in live.tolist():
        vs = [int(x) for x in tv[a]]
        for i, v in enumerate(vs):
            link[v].append(tuple(vs[:i] + vs[i + 1 :]))
    for v in vlive.tolist():
        nv, ne, nf = _surface(link[v], f"link of vertex {v}")
        assert nv - ne + nf == 2, f"the link of vertex {v} has Euler characteristic {nv - ne + nf}, not 2"
