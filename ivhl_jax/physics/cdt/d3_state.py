"""The 2+1D CDT state: one packed int32 buffer per chain (:class:`CDT3State`) and the minimal starting geometry.

Topology S² × S¹: ``T`` periodic time slices, each a triangulated 2-sphere; slab ``t`` (between slices ``t`` and
``t+1 mod T``) is filled with tetrahedra of three types, named by how many vertices lie on slice ``t`` and on
``t+1``: (3,1) (a spatial triangle of slice ``t`` and an apex on ``t+1``), (2,2) and (1,3) (an apex on ``t``
and a spatial triangle of ``t+1``). Every spatial triangle is the base of exactly one (3,1) (above it) and the
top of exactly one (1,3) (below it), so N(3,1) = N(1,3) = the total spatial area, and on spherical slices
``N0 = N(3,1)/2 + 2T`` (Euler: ``F = 2V - 4`` per slice).

Vertex order inside a tetrahedron (as the reference code JorenB/3d-cdt orders it): (3,1): ``v0 v1 v2`` on slice
``t``, ``v3`` on ``t+1``; (2,2): ``v0 v1`` on ``t``, ``v2 v3`` on ``t+1``; (1,3): ``v0`` on ``t``, ``v1 v2 v3`` on
``t+1``. Neighbour ``i`` is the tetrahedron glued across the face opposite vertex ``i`` (so neighbour 3 of a (3,1)
is the (1,3) below its base, neighbour 0 of a (1,3) the (3,1) above its top); ``v0`` always lies on the slab's
lower slice.

Buffer fields (:func:`layout`; ``C3`` tetrahedron slots, ``C0 = C3/4 + 2T + 8`` vertex slots, enough since
``N3 >= 2 N(3,1) = 4 N0 - 8T``): ``tv`` (C3, 4) vertices, ``tn`` (C3, 4) neighbours, ``ttype`` (C3,) (0 free,
1 (3,1), 2 (2,2), 3 (1,3)); the live-tetrahedron bag ``tperm``/``tpos`` (``tperm[:N3]`` the live slots, the rest
the free list; ``tpos`` its inverse); the (3,1) bag ``l31``/``p31`` (``l31[:N(3,1)]``, ``p31 = -1`` off the bag);
per vertex slot ``vtime``, ``vtet`` (a (3,1) with the vertex in its base), ``scnum`` (number of spatial triangles
at the vertex, its degree in its slice), ``cnum`` (number of tetrahedra containing it); the live-vertex bag
``vperm``/``vpos``; ``slices`` (T,) the spatial triangles of each slice; the counts ``n0, n3, n31, n22,
overflow, missed_target`` (here ``n31`` counts the (3,1) only, the reference's ``tetras31``); ``attempts`` and
``accepts`` of the last sweep per move (:data:`MOVE_NAMES_3D`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.cdt.state import packed_offsets

__all__ = [
    "MOVE_NAMES_3D",
    "TYPE_31",
    "TYPE_22",
    "TYPE_13",
    "CDT3State",
    "SweepPlan",
    "ENGINES",
    "layout",
    "initial_state",
    "vertex_capacity",
    "minimal_tetrahedra",
    "unpack",
    "pack",
    "MAX_TETRA_CAPACITY",
]

TYPE_31, TYPE_22, TYPE_13 = 1, 2, 3
#: The moves counted in ``attempts``/``accepts``: vertex insertion (2,6) and removal (6,2), the spatial flip
#: (4,4), and the (2,3)/(3,2) moves (both time orientations together).
MOVE_NAMES_3D = ("26", "62", "44", "23", "32")
COUNTS = ("n0", "n3", "n31", "n22", "overflow", "missed_target")
#: Most tetrahedron slots a buffer holds: its vertex ids stay below 2^21 (the host engine packs a face's three
#: ids in one int64). The reference code's pool holds 5 million tetrahedra.
MAX_TETRA_CAPACITY = 8_000_000
#: The starting slice: a triangular bipyramid (5 vertices, 6 triangles), as in the reference's generator
#: (``3dcdt_gen_init.py`` builds 5-vertex spheres); poles 0 and 1, equator 2, 3, 4.
_BIPYRAMID = ((0, 2, 3), (0, 3, 4), (0, 2, 4), (1, 2, 3), (1, 3, 4), (1, 2, 4))
_SLICE_VERTICES = 5


def vertex_capacity(tetra_capacity: int, n_slices: int) -> int:
    """Vertex slots that go with ``tetra_capacity`` tetrahedron slots: ``C3 // 4 + 2 T + 8`` (N0 <= N3/4 + 2T)."""
    return int(tetra_capacity) // 4 + 2 * int(n_slices) + 8


def layout(tetra_capacity: int, n_slices: int) -> dict[str, tuple[int, int]]:
    """Offsets ``name -> (start, size)`` of the fields in :attr:`CDT3State.buf`; ``"size"`` holds the total."""
    check_scalar(tetra_capacity, "tetra_capacity", integer=True, minimum=1)
    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    c3, t = int(tetra_capacity), int(n_slices)
    c0 = vertex_capacity(c3, t)
    sizes = [
        ("tv", 4 * c3),
        ("tn", 4 * c3),
        ("ttype", c3),
        ("tperm", c3),
        ("tpos", c3),
        ("l31", c3),
        ("p31", c3),
        ("vtime", c0),
        ("vtet", c0),
        ("scnum", c0),
        ("cnum", c0),
        ("vperm", c0),
        ("vpos", c0),
        ("slices", t),
        ("counts", len(COUNTS)),
        ("attempts", len(MOVE_NAMES_3D)),
        ("accepts", len(MOVE_NAMES_3D)),
    ]
    return packed_offsets(sizes)


class CDT3State(flax.struct.PyTreeNode):
    """A 2+1D CDT triangulation packed into one int32 array ``buf`` (..., size) (the module docstring lists the
    fields); ``tetra_capacity`` and ``n_slices`` (static) fix the layout."""

    buf: jax.Array
    tetra_capacity: int = flax.struct.field(pytree_node=False, default=0)
    n_slices: int = flax.struct.field(pytree_node=False, default=0)

    def field(self, name: str) -> jax.Array:
        """One field of the buffer (..., size), e.g. ``"slices"`` (..., T); ``tv``/``tn`` come back (..., C3, 4)."""
        start, size = layout(self.tetra_capacity, self.n_slices)[name]
        x = self.buf[..., start : start + size]
        return x.reshape(x.shape[:-1] + (-1, 4)) if name in ("tv", "tn") else x

    def count(self, name: str) -> jax.Array:
        """One of the counts ``n0, n3, n31`` (the (3,1) only), ``n22``, ``overflow``, ``missed_target``."""
        return self.field("counts")[..., COUNTS.index(name)]


#: The engines of one 2+1D chain: ``"host"`` (numba, through a callback under jit) and ``"jax"`` (pure XLA).
ENGINES = ("host", "jax")


class SweepPlan(NamedTuple):
    """The static plan of one sweep, as both engines' ``sweep(buf, rng, couplings, plan)`` run it
    (:func:`~ivhl_jax.physics.cdt.metropolis_3d` makes it from its parameters and the geometry): ``attempts``
    attempts on a buffer of ``tetra_capacity`` slots and ``n_slices`` slices; the volume term on ``N3``
    (``fix_n3``) or ``N(3,1)``; the reference code's (2,6)/(6,2) ratios (``reference``); then (``until_target``)
    up to ``max_extra`` more attempts until ``N_fix == target`` (a miss increments ``missed_target``)."""

    attempts: int
    tetra_capacity: int
    n_slices: int
    fix_n3: bool = False
    reference: bool = False
    until_target: bool = False
    max_extra: int = 0


def minimal_tetrahedra(n_slices: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The starting triangulation, NumPy: ``(tv, types, vtime)``: every slice the bipyramid, every slab the prisms
    over its 6 triangles, each cut into a (3,1), a (2,2) and a (1,3) by the diagonals that run from the lower-numbered
    vertex of slice ``t`` to the higher-numbered one of ``t+1`` (one rule for every prism, so neighbouring prisms cut
    their shared side the same way): 5T vertices, 18T tetrahedra."""
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    t_n = int(n_slices)
    tv, types = [], []
    for s in range(t_n):
        lo, hi = s * _SLICE_VERTICES, ((s + 1) % t_n) * _SLICE_VERTICES
        for a, b, c in _BIPYRAMID:
            tv.append((lo + a, lo + b, lo + c, hi + c))
            tv.append((lo + a, lo + b, hi + b, hi + c))
            tv.append((lo + a, hi + a, hi + b, hi + c))
            types += [TYPE_31, TYPE_22, TYPE_13]
    vtime = np.repeat(np.arange(t_n), _SLICE_VERTICES)
    return np.asarray(tv, np.int64), np.asarray(types, np.int64), vtime


def _neighbours(tv: np.ndarray) -> np.ndarray:
    """Face-to-face gluing of tetrahedra ``tv`` (N, 4): ``tn[a, i]`` shares the face opposite ``tv[a, i]``."""
    faces: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for a, vs in enumerate(tv.tolist()):
        for i in range(4):
            key = tuple(sorted(vs[:i] + vs[i + 1 :]))
            faces.setdefault(key, []).append((a, i))
    tn = np.full(tv.shape, -1, np.int64)
    for key, owners in faces.items():
        if len(owners) != 2:
            raise ValueError(f"face {key} is shared by {len(owners)} tetrahedra, not 2")
        (a, i), (b, j) = owners
        tn[a, i], tn[b, j] = b, a
    return tn


def pack(tv: np.ndarray, types: np.ndarray, vtime: np.ndarray, n_slices: int, tetra_capacity: int) -> np.ndarray:
    """The buffer (int32) of the triangulation with live tetrahedra ``tv`` (N3, 4) of ``types`` and vertices
    ``vtime`` (N0,) (vertex ids 0..N0-1), in slots 0..N3-1; the gluing, bags and counts are derived."""
    t_n, c3 = int(n_slices), int(tetra_capacity)
    tv = np.asarray(tv, np.int64)
    types = np.asarray(types, np.int64)
    vtime = np.asarray(vtime, np.int64)
    n3, n0 = tv.shape[0], vtime.shape[0]
    c0 = vertex_capacity(c3, t_n)
    if n3 > c3 or n0 > c0:
        raise ValueError(
            f"capacity={c3} tetrahedron slots is too few for {n3} tetrahedra and {n0} vertices; "
            f"use capacity >= {max(n3, 4 * n0)}"
        )
    lay = layout(c3, t_n)
    buf = np.zeros(lay["size"][0], np.int64)

    def put(name: str, values: Any, at: int = 0) -> None:
        start, _ = lay[name]
        v = np.asarray(values).reshape(-1)
        buf[start + at : start + at + v.size] = v

    tn = _neighbours(tv)
    put("tv", tv)
    put("tn", tn)
    put("ttype", types)
    put("tperm", np.arange(c3))
    put("tpos", np.arange(c3))
    is31 = np.flatnonzero(types == TYPE_31)
    put("l31", np.concatenate([is31, np.zeros(c3 - is31.size, np.int64)]))
    p31 = np.full(c3, -1, np.int64)
    p31[is31] = np.arange(is31.size)
    put("p31", p31)
    put("vtime", vtime)
    vtet = np.full(c0, -1, np.int64)
    scnum = np.zeros(c0, np.int64)
    cnum = np.zeros(c0, np.int64)
    np.add.at(cnum, tv.reshape(-1), 1)
    base = tv[is31, :3]
    np.add.at(scnum, base.reshape(-1), 1)
    vtet[base.reshape(-1)] = np.repeat(is31, 3)
    put("vtet", vtet)
    put("scnum", scnum)
    put("cnum", cnum)
    put("vperm", np.arange(c0))
    put("vpos", np.arange(c0))
    slices = np.bincount(vtime[tv[is31, 0]], minlength=t_n)
    put("slices", slices)
    counts = dict(n0=n0, n3=n3, n31=is31.size, n22=int(np.sum(types == TYPE_22)), overflow=0, missed_target=0)
    put("counts", [counts[k] for k in COUNTS])
    return buf.astype(np.int32)


def initial_state(n_slices: int, tetra_capacity: int) -> CDT3State:
    """The minimal starting triangulation (:func:`minimal_tetrahedra`) in a buffer of ``tetra_capacity`` slots."""
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(tetra_capacity, "tetra_capacity", integer=True, minimum=18 * int(n_slices))
    if int(tetra_capacity) > MAX_TETRA_CAPACITY:
        raise ValueError(f"tetra_capacity={tetra_capacity} exceeds {MAX_TETRA_CAPACITY} slots (int32 indices)")
    tv, types, vtime = minimal_tetrahedra(n_slices)
    buf = pack(tv, types, vtime, n_slices, tetra_capacity)
    return CDT3State(buf=jnp.asarray(buf), tetra_capacity=int(tetra_capacity), n_slices=int(n_slices))


def unpack(buf: Any, tetra_capacity: int, n_slices: int) -> dict[str, np.ndarray]:
    """Every field of one chain's buffer as NumPy arrays (``tv``/``tn`` shaped (C3, 4))."""
    b = np.asarray(buf)
    if b.ndim != 1:
        raise ValueError(f"unpack takes one chain's buffer (size,), got shape {b.shape}")
    lay = layout(tetra_capacity, n_slices)
    if b.size != lay["size"][0]:
        raise ValueError(
            f"buffer of {b.size} entries does not match tetra_capacity={tetra_capacity}, n_slices={n_slices}"
        )
    out = {name: b[s : s + n] for name, (s, n) in lay.items() if name != "size"}
    out["tv"] = out["tv"].reshape(-1, 4)
    out["tn"] = out["tn"].reshape(-1, 4)
    return out
