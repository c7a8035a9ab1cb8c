"""The CDT state: one packed int32 buffer per chain (:class:`CDTState`) and the regular starting torus.

Data structure (fixed capacity)
-------------------------------
Every triangle's base link is never changed by a flip, so triangle slots are tied to vertex slots:
slot ``2v`` is the up triangle whose base runs from vertex ``v`` to its right neighbour, slot ``2v+1``
the down triangle glued to it across that base. Type (slot parity), the base (``v``, ``vright[v]``)
and the triangle across the base (slot ``^ 1``) are then implicit; stored are ``tl``/``tr`` (left/right
neighbour in the strip) and ``apex`` per triangle slot, ``vright``/``vtime`` per vertex slot, the
live-vertex "bag" ``vperm``/``vpos`` (``vperm[:n0]`` live ids, ``vpos`` its inverse: a uniform live
vertex is one gather, an insertion takes ``vperm[n0]``, a removal swaps with the last live id), the
slice lengths, ``n0`` and per-move counters: :func:`buffer_layout`. An insertion that does not fit
sets ``overflow`` and is rejected; rerun with a larger capacity when it is set.

All fields live in ONE array because XLA:CPU updates a loop-carried array in place only when every
read of it feeds the single scatter that updates it: an attempt is then one round of gathers and one
scatter, O(1) work whatever the capacity (with one array per field XLA copies every field on every
attempt, O(capacity) work).
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar

__all__ = [
    "LN2",
    "MOVE_NAMES",
    "CDTState",
    "buffer_layout",
    "packed_offsets",
    "initial_state",
    "replicate",
    "live_triangles",
    "live_vertices",
    "BUFFER_MAX_CAPACITY",
]

LN2 = math.log(2.0)
UP, DOWN = 0, 1
MOVE_NAMES = ("flip", "add", "delete")

_SCALARS = (("n0", 1), ("overflow", 1), ("missed_target", 1), ("attempts", 3), ("accepts", 3))
_SCALAR_FIELDS = ("n0", "overflow", "missed_target")
#: Most vertex slots a buffer can hold: its ~10 C0 entries and every slot id must stay int32 indices.
BUFFER_MAX_CAPACITY = 1 << 27


def packed_offsets(sizes: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """Offsets ``name -> (start, size)`` of consecutive fields of the given sizes in one packed buffer, in order;
    ``"size"`` holds ``(total, 0)``. The 1+1D and 2+1D buffers are both laid out by it."""
    out, start = {}, 0
    for name, size in sizes:
        check_scalar(size, "sizes", integer=True, minimum=0)
        out[name] = (start, int(size))
        start += int(size)
    out["size"] = (start, 0)
    return out


def buffer_layout(vertex_capacity: int, n_slices: int) -> dict[str, tuple[int, int]]:
    """Offsets ``name -> (start, size)`` of the fields in :attr:`CDTState.buf` (``C2 = 2 C0``)."""
    check_scalar(vertex_capacity, "vertex_capacity", integer=True, minimum=1)
    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    c0, c2 = int(vertex_capacity), 2 * int(vertex_capacity)
    sizes = [
        ("tl", c2),
        ("tr", c2),
        ("apex", c2),
        ("vright", c0),
        ("vtime", c0),
        ("vperm", c0),
        ("vpos", c0),
        ("lengths", int(n_slices)),
        *_SCALARS,
    ]
    return packed_offsets(sizes)


class CDTState(flax.struct.PyTreeNode):
    """A 1+1D CDT triangulation packed into one int32 array ``buf`` (see the module docstring).

    ``buf`` has shape ``(..., size)`` (leading axes: independent chains); the fields below are views of
    it (:func:`buffer_layout`). Stored per triangle slot (``C2 = 2 C0``): ``tl``/``tr`` (left/right
    neighbour in the strip) and ``apex``; per vertex slot (``C0``): ``vright`` (right neighbour on its
    slice), ``vtime`` (slice), the live-vertex bag ``vperm``/``vpos``; per slice: ``lengths``; scalars
    ``n0``, ``overflow``, ``missed_target`` (sweeps that ended off the target volume, see
    :class:`MetropolisParams`), ``attempts[3]``/``accepts[3]`` (per move: flip, add, delete). Derived (not
    stored): ``ttype`` (slot parity), ``tc`` (slot ``^ 1``), ``ttime``, ``tv``, ``n2 = 2 n0``.
    """

    buf: jax.Array
    n_slices: int = flax.struct.field(pytree_node=False)
    vertex_capacity: int = flax.struct.field(pytree_node=False)

    def field(self, name: str) -> jax.Array:
        """The view of field ``name`` (shape ``(..., size)``; scalars without the last axis)."""
        start, size = buffer_layout(self.vertex_capacity, self.n_slices)[name]
        if name in _SCALAR_FIELDS:
            return self.buf[..., start]
        return self.buf[..., start : start + size]

    def with_fields(self, **values: Any) -> CDTState:
        """A copy with the named fields replaced (e.g. to corrupt a state in a test, or to pack one)."""
        lay = buffer_layout(self.vertex_capacity, self.n_slices)
        buf = self.buf
        for name, value in values.items():
            start, size = lay[name]
            v = jnp.asarray(value, jnp.int32)
            if name in _SCALAR_FIELDS:
                buf = buf.at[..., start].set(v)
            else:
                buf = buf.at[..., start : start + size].set(v)
        return self.replace(buf=buf)

    tl = property(lambda self: self.field("tl"))
    tr = property(lambda self: self.field("tr"))
    apex = property(lambda self: self.field("apex"))
    vright = property(lambda self: self.field("vright"))
    vtime = property(lambda self: self.field("vtime"))
    vperm = property(lambda self: self.field("vperm"))
    vpos = property(lambda self: self.field("vpos"))
    lengths = property(lambda self: self.field("lengths"))
    n0 = property(lambda self: self.field("n0"))
    missed_target = property(lambda self: self.field("missed_target"))
    attempts = property(lambda self: self.field("attempts"))
    accepts = property(lambda self: self.field("accepts"))

    @property
    def overflow(self) -> jax.Array:
        return self.field("overflow") != 0

    @property
    def n2(self) -> jax.Array:
        return 2 * self.n0

    @property
    def ttype(self) -> jax.Array:
        """(..., C2) 0 for up, 1 for down triangle slots (slot parity)."""
        return jnp.broadcast_to(jnp.arange(2 * self.vertex_capacity, dtype=jnp.int32) & 1, self.tl.shape)

    @property
    def tc(self) -> jax.Array:
        """(..., C2) the triangle across the base (slots 2v and 2v+1 share the link from v to its right)."""
        return jnp.broadcast_to(jnp.arange(2 * self.vertex_capacity, dtype=jnp.int32) ^ 1, self.tl.shape)

    @property
    def ttime(self) -> jax.Array:
        """(..., C2) strip index: t for an up triangle with base on slice t, t-1 for a down one."""
        vt = jnp.repeat(self.vtime, 2, axis=-1)
        return jnp.where(self.ttype == UP, vt, (vt - 1) % self.n_slices)

    @property
    def tv(self) -> jax.Array:
        """(..., C2, 3) vertices (base-left, base-right, apex) of every triangle slot."""
        base_l = jnp.broadcast_to(jnp.arange(2 * self.vertex_capacity, dtype=jnp.int32) // 2, self.tl.shape)
        return jnp.stack([base_l, jnp.repeat(self.vright, 2, axis=-1), self.apex], axis=-1)


def initial_state(n_slices: int, length: int, capacity: int | None = None) -> CDTState:
    """A regular torus: ``n_slices`` slices of ``length`` vertices, strips ``U D U D ...``.

    Args:
      n_slices: T >= 3 (with two slices both strips join the same pair of circles).
      length: initial slice length l >= 3.
      capacity: vertex slots C0 >= T * length (default 4 T l, at most :data:`BUFFER_MAX_CAPACITY`); triangle
        slots are 2 C0. An engine may address fewer (:func:`ivhl_jax.physics.cdt.metropolis` checks).
    """
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    T, L = int(n_slices), int(length)
    n0 = T * L
    if capacity is not None:
        check_scalar(capacity, "capacity", integer=True, minimum=n0)
    c0 = min(4 * n0, BUFFER_MAX_CAPACITY) if capacity is None else int(capacity)
    if c0 > BUFFER_MAX_CAPACITY:
        raise ValueError(
            f"capacity={c0} vertex slots exceeds the buffer's maximum {BUFFER_MAX_CAPACITY} (2^27: its "
            "slot ids and offsets are int32); use fewer slots"
        )
    lay = buffer_layout(c0, T)
    buf = np.zeros(lay["size"][0], np.int32)

    def put(name, idx, val):
        buf[lay[name][0] + np.asarray(idx)] = val

    t = np.repeat(np.arange(T), L)
    i = np.tile(np.arange(L), T)

    def vid(tt, ii):
        return (tt % T) * L + (ii % L)

    # U_i = slot 2 b_i: base (b_i, b_{i+1}), apex top_i; D_i = slot 2 top_i + 1: base (top_i, top_{i+1}),
    # apex b_{i+1}; strip order U_0 D_0 U_1 D_1 ...
    b = vid(t, i)
    top = vid(t + 1, i)
    u, d, u_next = 2 * b, 2 * top + 1, 2 * vid(t, i + 1)
    put("tr", u, d)
    put("tl", d, u)
    put("tr", d, u_next)
    put("tl", u_next, d)
    put("apex", u, top)
    put("apex", d, vid(t, i + 1))
    put("vright", b, vid(t, i + 1))
    put("vtime", b, t)
    put("vperm", np.arange(c0), np.arange(c0))
    put("vpos", np.arange(c0), np.arange(c0))
    put("lengths", np.arange(T), L)
    put("n0", 0, n0)
    return CDTState(buf=jnp.asarray(buf), n_slices=T, vertex_capacity=c0)


def replicate(state: CDTState, n_chains: int) -> CDTState:
    """Stack ``n_chains`` copies of ``state`` along a new leading axis (for ``vmap``)."""
    if not isinstance(state, CDTState) or jnp.ndim(state.n0) != 0:
        raise TypeError(f"state must be a single-chain CDTState, got {type(state).__name__}")
    check_scalar(n_chains, "n_chains", integer=True, minimum=1)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n_chains,) + x.shape), state)


def live_triangles(state: CDTState) -> jax.Array:
    """(..., C2) bool mask of live triangle slots (the two slots of every live vertex)."""
    return jnp.repeat(live_vertices(state), 2, axis=-1)


def live_vertices(state: CDTState) -> jax.Array:
    """(..., C0) bool mask of live vertex slots."""
    return state.vpos < state.n0[..., None]
