"""1+1-dimensional causal dynamical triangulations (CDT) on a torus: Metropolis Monte Carlo in JAX.

Model
-----
``T`` periodic time slices; slice ``t`` is a circle of ``l_t >= 3`` vertices. Strip ``t`` (between
slices ``t`` and ``t+1``) is a cyclic sequence of ``l_t`` *up* triangles (base on slice ``t``, apex on
``t+1``) and ``l_{t+1}`` *down* triangles (base on ``t+1``, apex on ``t``), glued along timelike links.
The action is ``S = lambda N2 + eps (N2 - V)^2`` with ``N2 = 2 N0 = 2 sum_t l_t`` triangles (the
curvature term is topological in 2D, Gauss-Bonnet). The ensemble is Ambjorn-Loll's: every cyclic
up/down word is allowed in every strip (a vertex may be linked twice to the same vertex of a
neighbouring slice when that slice is short), and an unlabelled triangulation carries the usual
symmetry factor ``1/|Aut(T)|``. The exact marginal of the slice lengths is then

    P(l_0..l_{T-1}) ∝ exp(-2 lambda sum l) prod_t S(l_t, l_{t+1}) / prod_t l_t,
    S(a, b) = (a+b-1)! / ((a-1)! (b-1)!)     (strips between two rooted circles),

see :func:`exact_length_distribution`; ``lambda_c = ln 2``.

Data structure (fixed capacity, one packed int32 buffer)
-------------------------------------------------------
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
read of it feeds the single scatter that updates it: an attempt is one round of gathers and one
scatter, O(1) work whatever the capacity (with 18 separate arrays XLA copied all of them every
attempt: 110k attempts/s at N2 = 512 falling to 5.7k at N2 = 32768).

Moves (each attempt: flip with probability 1/2, insertion 1/4, removal 1/4)
---------------------------------------------------------------------------
A uniform live vertex ``w`` (``1/N0``) and a coin pick a uniform live triangle (``1/N2``).

* (2,2) flip: the chosen triangle and its right neighbour, if their types differ, swap places in
  the strip (the shared timelike link rotates). Symmetric proposal, no change of action: always
  accepted.
* (2,4) insertion: the spatial link from ``w`` to its right neighbour (``1/N0``) is split by a new
  vertex of coordination 4.
* (4,2) removal: ``w`` itself (``1/N0``), if it has one future and one past link and its slice has
  ``l_t > 3`` vertices (the exact inverse of an insertion).

Detailed balance with ``pi ∝ e^{-S}/|Aut|`` (orbit-stabiliser: (T, marked link) <-> (T', marked
order-4 vertex)) gives the acceptances

    A_add = min(1, e^{-dS} N0/(N0+1)),     A_del = min(1, e^{-dS} N0/(N0-1)),

checked against exact enumeration (slice lengths, vertex coordinations and their joint law with N0)
by the test-suite. Two engines apply these moves to the same buffer: ``engine="jax"`` (XLA, any
device, vmapped chains) and ``engine="host"`` (:mod:`ivhl_jax.physics.cdt_host`, a compiled CPU loop;
bit-identical states given the same random words).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_array, check_key, check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper, rollout, trajectory
from ivhl_jax.physics import cdt_geometry
from ivhl_jax.physics.cdt_geometry import hausdorff_from_scaling, hausdorff_from_spheres, mean_distance

__all__ = ["LN2", "MOVE_NAMES", "CDTState", "CDTParams", "Chain", "metropolis", "observe_chain",
    "make_params", "initial_state", "replicate", "apply_flip",
    "apply_insertion", "apply_removal", "is_removable", "log_acceptance", "attempt", "sweep", "live_triangles",
    "live_vertices", "coordination_numbers", "timelike_degrees", "max_timelike_degree", "geometry_arrays",
    "buffer_layout", "ENGINES", "PROPOSALS", "MAX_VERTEX_CAPACITY", "coordination_histogram", "observe", "run",
    "run_chains",
    "volume_correlator", "center_profiles", "vertex_distances", "sphere_volumes", "mean_distance",
    "hausdorff_from_spheres", "hausdorff_from_scaling", "check_invariants", "assert_invariants", "strip_count",
    "log_length_weight", "transfer_matrix", "exact_mean_length", "exact_length_distribution", "slice_orders",
    "draw_triangulation"]

LN2 = math.log(2.0)
UP, DOWN = 0, 1
MOVE_NAMES = ("flip", "add", "delete")


_SCALARS = (("n0", 1), ("overflow", 1), ("missed_target", 1), ("attempts", 3), ("accepts", 3))
_SCALAR_FIELDS = ("n0", "overflow", "missed_target")
MAX_VERTEX_CAPACITY = 1 << 16  # the exact 32-bit multiply-high index draw needs N0 <= 2^16


def buffer_layout(vertex_capacity: int, n_slices: int) -> dict[str, tuple[int, int]]:
    """Offsets ``name -> (start, size)`` of the fields in :attr:`CDTState.buf` (``C2 = 2 C0``)."""
    check_scalar(vertex_capacity, "vertex_capacity", integer=True, minimum=1)
    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    c0, c2 = int(vertex_capacity), 2 * int(vertex_capacity)
    sizes = [("tl", c2), ("tr", c2), ("apex", c2), ("vright", c0), ("vtime", c0), ("vperm", c0), ("vpos", c0),
             ("lengths", int(n_slices)), *_SCALARS]
    out, start = {}, 0
    for name, size in sizes:
        out[name] = (start, size)
        start += size
    out["size"] = (start, 0)
    return out


class CDTState(flax.struct.PyTreeNode):
    """A 1+1D CDT triangulation packed into one int32 array ``buf`` (see the module docstring).

    ``buf`` has shape ``(..., size)`` (leading axes: independent chains); the fields below are views of
    it (:func:`buffer_layout`). Stored per triangle slot (``C2 = 2 C0``): ``tl``/``tr`` (left/right
    neighbour in the strip) and ``apex``; per vertex slot (``C0``): ``vright`` (right neighbour on its
    slice), ``vtime`` (slice), the live-vertex bag ``vperm``/``vpos``; per slice: ``lengths``; scalars
    ``n0``, ``overflow``, ``missed_target`` (sweeps that ended off the target volume, see
    :class:`CDTParams`), ``attempts[3]``/``accepts[3]`` (per move: flip, add, delete). Derived (not
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
        return self.buf[..., start:start + size]

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
                buf = buf.at[..., start:start + size].set(v)
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


class CDTParams(flax.struct.PyTreeNode):
    """Action and schedule: ``S = lam N2 + eps (N2 - target)^2``.

    ``attempts_per_sweep`` (static) is the number of move attempts in one :func:`sweep`; ``engine``
    (static) is ``"jax"`` (pure XLA, any device) or ``"host"`` (the compiled CPU kernel of
    :mod:`ivhl_jax.physics.cdt_host`, needs ``numba``). ``stop_at_target`` (static): with volume
    fixing the quadratic term only steers N2 towards ``target``; the fixed-volume ensemble is measured
    where N2 equals it, so each sweep continues (at most ``10 attempts_per_sweep`` more attempts) until
    N2 == target, the convention of the reference code 2d-cdt; a sweep that does not get there
    increments ``missed_target``. ``proposal`` (static): ``"uniform"`` (the moves of the module docstring,
    both engines) or ``"lists"`` (host engine only): proposals drawn from the lists of possible moves, as in
    2d-cdt, so that almost every attempt is accepted (a flip of a uniform flippable triangle, accepted with
    ``min(1, F/F')``, F the number of flippable triangles; an insertion on a uniform link, accepted with
    ``min(1, e^{-dS} N0/(N4+1))``; the removal of a uniform order-4 vertex, accepted with
    ``min(1, e^{-dS} N4/(N0-1))``, N4 the number of order-4 vertices; an insertion creates exactly one
    order-4 vertex, so N4(T') = N4 + 1 and these are the Metropolis-Hastings ratios of the move lists).
    """

    lam: jax.Array | float = LN2 + 0.1
    eps: jax.Array | float = 0.0
    target: jax.Array | float = 0.0
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=100)
    engine: str = flax.struct.field(pytree_node=False, default="jax")
    stop_at_target: bool = flax.struct.field(pytree_node=False, default=False)
    proposal: str = flax.struct.field(pytree_node=False, default="uniform")


ENGINES = ("jax", "host")
PROPOSALS = ("uniform", "lists")


def make_params(lam: float, *, eps: float = 0.0, target: float = 0.0, attempts_per_sweep: int = 100,
                engine: str = "jax", stop_at_target: bool | None = None, proposal: str | None = None) -> CDTParams:
    """Validated :class:`CDTParams`. Without volume fixing (``eps=0``) the chain needs ``lam > ln 2``.

    ``stop_at_target`` defaults to ``eps > 0`` (then ``target`` must be an even number of triangles);
    ``proposal`` to ``"lists"`` for the host engine and ``"uniform"`` for the JAX engine.
    """
    check_scalar(lam, "lam")
    check_scalar(eps, "eps", nonnegative=True)
    check_scalar(target, "target", nonnegative=True)
    check_scalar(attempts_per_sweep, "attempts_per_sweep", integer=True, minimum=1)
    if eps == 0 and lam <= LN2:
        raise ValueError(f"lam={lam} <= ln 2 = {LN2:.6f} without volume fixing: the volume diverges; "
                         "use lam > ln 2 or set eps > 0 and a target volume")
    if eps > 0 and target <= 0:
        raise ValueError("volume fixing (eps > 0) needs target > 0 (the target number of triangles N2)")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "host":
        from ivhl_jax.physics import cdt_host

        cdt_host.require()
    if proposal is None:
        proposal = "lists" if engine == "host" else "uniform"
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
    if proposal == "lists" and engine != "host":
        raise ValueError("proposal='lists' needs engine='host' (the JAX engine keeps no move lists); "
                         "use proposal='uniform'")
    stop = bool(eps > 0) if stop_at_target is None else bool(stop_at_target)
    if stop and (target <= 0 or target % 2):
        raise ValueError(f"stop_at_target needs an even target number of triangles N2 = 2 N0, got target={target}")
    return CDTParams(lam=float(lam), eps=float(eps), target=float(target), attempts_per_sweep=int(attempts_per_sweep),
                     engine=engine, stop_at_target=stop, proposal=proposal)


def initial_state(n_slices: int, length: int, capacity: int | None = None) -> CDTState:
    """A regular torus: ``n_slices`` slices of ``length`` vertices, strips ``U D U D ...``.

    Args:
      n_slices: T >= 3 (with two slices both strips join the same pair of circles).
      length: initial slice length l >= 3.
      capacity: vertex slots C0 >= T * length (default 4 T l, at most 2^16); triangle slots are 2 C0.
    """
    check_scalar(n_slices, "n_slices", integer=True, minimum=3)
    check_scalar(length, "length", integer=True, minimum=3)
    T, L = int(n_slices), int(length)
    n0 = T * L
    if capacity is not None:
        check_scalar(capacity, "capacity", integer=True, minimum=n0)
    c0 = min(4 * n0, MAX_VERTEX_CAPACITY) if capacity is None else int(capacity)
    if c0 > MAX_VERTEX_CAPACITY:
        raise ValueError(f"capacity={c0} vertex slots exceeds the maximum {MAX_VERTEX_CAPACITY} (N2 <= 2^17 "
                         "triangles); split the volume or use fewer slots")
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
    _check_state(state, "state", batched=False)
    check_scalar(n_chains, "n_chains", integer=True, minimum=1)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n_chains,) + x.shape), state)


# ----------------------------------------------------------------------------------------------
# moves: one round of gathers from the packed buffer, then ONE scatter into it. XLA:CPU updates a
# while-loop buffer in place only when every read of it feeds the scatter that updates it; a second
# loop-carried array, or a read after the write, makes it copy the whole buffer every attempt
# (measured: 16k attempts/s at N2 = 8192 with 18 separate arrays, O(capacity) per attempt).


def _mulhi(word, n):
    """floor(word * n / 2^32) for uint32 ``word`` and 1 <= n <= 2^16, exactly, in 32-bit arithmetic."""
    n = n.astype(jnp.uint32)
    hi, lo = word >> 16, word & jnp.uint32(0xFFFF)
    return ((hi * n + ((lo * n) >> 16)) >> 16).astype(jnp.int32)


def _decode(bits):
    """Two uint32 words -> (move 0..3, coin 0/1, acceptance uniform in [0, 1) with 24 bits, index word)."""
    w1 = bits[1]
    move = (w1 & jnp.uint32(3)).astype(jnp.int32)
    coin = ((w1 >> 2) & jnp.uint32(1)).astype(jnp.int32)
    u = (w1 >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
    return move, coin, u, bits[0]


def _move_writes(buf, lay, bits, params, c0, stop_n0=None):
    """(index, value, enabled) triples of one attempt, every value gathered from ``buf`` before any write.

    With ``stop_n0`` the attempt is a no-op (not even counted) once n0 == stop_n0."""
    def g(name, i):
        return buf[lay[name][0] + i]

    def at(name, i):
        return lay[name][0] + i

    n0 = buf[lay["n0"][0]]
    move, coin, u, word = _decode(bits)
    is_flip, is_add, is_del = move <= 1, move == 2, move == 3
    kind = jnp.where(is_flip, 0, jnp.where(is_add, 1, 2))
    w = g("vperm", _mulhi(word, n0))  # a uniform live vertex; with the coin, a uniform live triangle
    log_u = jnp.log(jnp.maximum(u, jnp.float32(2.0**-25)))
    # (2,2) flip of t1 with its right neighbour t2 (they must differ in type = slot parity)
    t1 = 2 * w + coin
    t2 = g("tr", t1)
    fl, fr = g("tl", t1), g("tr", t2)
    do_flip = is_flip & (((t1 ^ t2) & 1) == 1)
    # (2,4) insertion on the link from w to its right neighbour bv; the new vertex av owns slots 2av, 2av+1
    up, dn = 2 * w, 2 * w + 1
    fits = n0 + 1 <= c0
    av = g("vperm", jnp.minimum(n0, c0 - 1))
    au, ad = 2 * av, 2 * av + 1
    ax, ay = g("tr", up), g("tr", dn)
    bv, t = g("vright", w), g("vtime", w)
    len_t = g("lengths", t)
    acc_add = is_add & (log_u < log_acceptance("add", n0, 2 * n0, params))
    do_add = acc_add & fits
    # (4,2) removal of vertex w: its left neighbour a owns the up/down triangles left of it
    lu, ld = g("tl", up), g("tl", dn)
    a = lu // 2
    removable = _removable(lu, ld, len_t)
    do_del = is_del & removable & (log_u < log_acceptance("delete", n0, 2 * n0, params))
    pos_w, last = g("vpos", w), g("vperm", jnp.maximum(n0 - 1, 0))
    live = jnp.bool_(True) if stop_n0 is None else n0 != stop_n0
    do_flip, do_add, do_del, acc_add = do_flip & live, do_add & live, do_del & live, acc_add & live
    accepted = do_flip | do_add | do_del
    f, ad_, r = do_flip, do_add, do_del
    writes = [
        # flip: fl t1 t2 fr -> fl t2 t1 fr; t1's new apex is t2's base-right vertex, t2's is t1's base-left
        (at("tr", fl), t2, f), (at("tl", t2), fl, f), (at("tr", t2), t1, f), (at("tl", t1), t2, f),
        (at("tr", t1), fr, f), (at("tl", fr), t1, f),
        (at("apex", t1), g("vright", t2 // 2), f), (at("apex", t2), t1 // 2, f),
        # insertion: up au ax and dn ad ay in the two strips; au/ad keep the apexes of up/dn
        (at("tr", up), au, ad_), (at("tl", au), up, ad_), (at("tr", au), ax, ad_), (at("tl", ax), au, ad_),
        (at("tr", dn), ad, ad_), (at("tl", ad), dn, ad_), (at("tr", ad), ay, ad_), (at("tl", ay), ad, ad_),
        (at("apex", au), g("apex", up), ad_), (at("apex", ad), g("apex", dn), ad_),
        (at("vright", w), av, ad_), (at("vright", av), bv, ad_), (at("vtime", av), t, ad_),
        (at("lengths", t), len_t + 1, ad_), (at("n0", 0), n0 + 1, ad_),
        # removal: the triangles right of w (2w, 2w+1) leave; swap-remove w from the live bag
        (at("tr", lu), ax, r), (at("tl", ax), lu, r), (at("tr", ld), ay, r), (at("tl", ay), ld, r),
        (at("vright", a), bv, r), (at("lengths", t), len_t - 1, r), (at("n0", 0), n0 - 1, r),
        (at("vperm", pos_w), last, r), (at("vperm", n0 - 1), w, r), (at("vpos", last), pos_w, r),
        (at("vpos", w), n0 - 1, r),
        # bookkeeping
        (at("attempts", kind), g("attempts", kind) + 1, live),
        (at("accepts", kind), g("accepts", kind) + 1, accepted),
        (at("overflow", 0), jnp.int32(1), acc_add & ~fits),
    ]
    return writes


def _apply(buf, writes):
    size = buf.shape[0]
    idx = jnp.stack([jnp.where(on, i, size) for i, _, on in writes])
    val = jnp.stack([jnp.asarray(v, jnp.int32) for _, v, _ in writes])
    return buf.at[idx].set(val, mode="drop")


def _attempt_buf(buf, bits, params, lay, c0, stop_n0=None):
    return _apply(buf, _move_writes(buf, lay, bits, params, c0, stop_n0))


def attempt(state: CDTState, bits: jax.Array, params: CDTParams) -> CDTState:
    """One Metropolis attempt driven by two uint32 words ``bits``: ``bits[1] & 3`` picks the move (0, 1 flip;
    2 add; 3 delete), bit 2 a coin, bits 8..31 the acceptance uniform; ``bits[0]`` the vertex (exact
    ``floor(bits[0] N0 / 2^32)``-th live vertex)."""
    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    return state.replace(buf=_attempt_buf(state.buf, jnp.asarray(bits, jnp.uint32), params, lay,
                                          state.vertex_capacity))


def _forced(state: CDTState, vertex, move: int, coin: int = 0) -> CDTState:
    """Apply one move unconditionally: the attempt with acceptance uniform 0 on the vertex at bag position
    of ``vertex`` (only for tests and docs; the caller guarantees the move is possible)."""
    pos = int(np.asarray(state.vpos)[int(vertex)])
    n0 = int(state.n0)
    word = -(-(pos << 32) // n0)  # smallest word with floor(word n0 / 2^32) == pos
    bits = jnp.asarray([word, move | (coin << 2)], jnp.uint32)
    big = CDTParams(lam=-1e3 if move == 2 else 1e3, eps=0.0, target=0.0)
    return attempt(state, bits, big)


def apply_flip(state: CDTState, t1) -> CDTState:
    """Flip triangle slot ``t1`` with its right neighbour (they must differ in type)."""
    return _forced(state, int(t1) // 2, 0, int(t1) % 2)


def apply_insertion(state: CDTState, up) -> CDTState:
    """Insert a vertex on the base link of up triangle slot ``up`` (capacity must allow)."""
    return _forced(state, int(up) // 2, 2)


def apply_removal(state: CDTState, v) -> CDTState:
    """Remove vertex ``v`` (it must be removable: coordination 4, slice length > 3)."""
    return _forced(state, int(v), 3)


def _removable(lu, ld, slice_length):
    """The (4,2) removal condition of a vertex ``v``, from ``lu = tl[2v]``, ``ld = tl[2v+1]`` (the left
    neighbours of the up and down triangle on the link from ``v`` to its right) and the length of its slice:
    ``v`` has one future and one past link exactly when those neighbours are an up and a down triangle, and
    the slice keeps at least 3 vertices. The one home of the test: :func:`is_removable` and the move kernel
    (:func:`_move_writes`) both call it (the host kernel, numba, spells it out in
    :mod:`ivhl_jax.physics.cdt_host`; the bit-identity test ties the two)."""
    return ((lu & 1) == UP) & ((ld & 1) == DOWN) & (slice_length > 3)


def is_removable(state: CDTState, v) -> jax.Array:
    """Whether vertex ``v`` has one future and one past link and its slice has more than 3 vertices."""
    return _removable(state.tl[2 * v], state.tl[2 * v + 1], state.lengths[state.vtime[v]])


def _delta_action(n2, dn2, params: CDTParams):
    # (N + d - V)^2 - (N - V)^2 = d (2 (N - V) + d), written so float32 stays exact for large N
    dev = n2.astype(jnp.float32) - params.target
    return params.lam * dn2 + params.eps * dn2 * (2.0 * dev + dn2)


def log_acceptance(kind: str, n0, n2, params: CDTParams):
    """log of the Metropolis ratio (before ``min(1, .)``) of an insertion ("add") or removal ("delete").

    ``add``: ``-dS + log(N0/(N0+1))``; ``delete``: ``-dS + log(N0/(N0-1))``; ``N0``, ``N2`` of the
    current state. Proposal probabilities: a link ``1/N0`` (add), a vertex ``1/N0`` (delete).
    """
    n0f = jnp.asarray(n0, jnp.float32)
    if kind == "add":
        return -_delta_action(jnp.asarray(n2), 2.0, params) + jnp.log(n0f / (n0f + 1.0))
    if kind == "delete":
        return -_delta_action(jnp.asarray(n2), -2.0, params) + jnp.log(n0f / (n0f - 1.0))
    raise ValueError(f"kind must be 'add' or 'delete', got {kind!r}")


_EXTRA = 10  # with stop_at_target, a sweep makes at most _EXTRA * attempts_per_sweep more attempts
_BLOCK = 4096  # attempts per block of random words: bounds the memory of many vmapped chains


def _attempts(buf, bits, params, lay, c0):
    return jax.lax.fori_loop(0, bits.shape[0], lambda i, b: _attempt_buf(b, bits[i], params, lay, c0), buf)


def sweep(key: jax.Array, state: CDTState, params: CDTParams) -> CDTState:
    """``params.attempts_per_sweep`` Metropolis attempts (then, with ``stop_at_target``, more until
    N2 == target); pure, O(1) work per attempt.

    ``engine="jax"``: ``lax.fori_loop`` over :func:`attempt`, random words from ``key`` in blocks of
    4096 attempts. ``engine="host"``: the compiled CPU kernel (:mod:`ivhl_jax.physics.cdt_host`, via
    ``jax.pure_callback``; vmapped chains run in parallel threads) applies the same moves to the same
    buffer, drawing its words from a SplitMix64 stream seeded from ``key``.
    """
    n = params.attempts_per_sweep
    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    c0 = state.vertex_capacity
    target_n0 = jnp.asarray(params.target, jnp.float32).astype(jnp.int32) // 2 if params.stop_at_target else None
    if params.engine == "host":
        from ivhl_jax.physics import cdt_host

        seed = jax.random.bits(key, (2,), jnp.uint32)
        extra = _EXTRA * n if params.stop_at_target else 0
        tn0 = target_n0 if target_n0 is not None else jnp.int32(-1)
        return state.replace(buf=cdt_host.sweep(state.buf, seed, params, n, lay, c0, tn0, extra))
    full, rest = divmod(n, _BLOCK)
    buf = state.buf
    if full:
        def block(b, buf):
            bits = jax.random.bits(jax.random.fold_in(key, b), (_BLOCK, 2), jnp.uint32)
            return _attempts(buf, bits, params, lay, c0)

        buf = jax.lax.fori_loop(0, full, block, buf)
    if rest:
        buf = _attempts(buf, jax.random.bits(jax.random.fold_in(key, full), (rest, 2), jnp.uint32), params, lay, c0)
    if target_n0 is not None:
        buf = _until_target(buf, jax.random.fold_in(key, full + 1), target_n0, _EXTRA * n, params, lay, c0)
    return state.replace(buf=buf)


def _until_target(buf, key, target_n0, max_extra, params, lay, c0):
    """Attempts until n0 == target_n0, at most ``max_extra`` (rounded up to whole blocks); a miss increments
    ``missed_target``. A while loop over blocks of 256 attempts, each a no-op once the target is reached:
    under vmap a while loop selects between old and new carry of every chain each iteration (O(capacity)),
    so the iterations must be few; the gating keeps the stop exact (``_move_writes(stop_n0=...)``)."""
    o_n0, o_miss = lay["n0"][0], lay["missed_target"][0]
    block = 256

    def cond(c):
        b, i = c
        return (b[o_n0] != target_n0) & (i < max_extra)

    def body(c):
        b, i = c
        bits = jax.random.bits(jax.random.fold_in(key, i), (block, 2), jnp.uint32)
        b = jax.lax.fori_loop(0, block, lambda j, b: _attempt_buf(b, bits[j], params, lay, c0, target_n0), b)
        return b, i + block

    buf, _ = jax.lax.while_loop(cond, body, (buf, jnp.int32(0)))
    return buf.at[o_miss].add((buf[o_n0] != target_n0).astype(jnp.int32))


# ----------------------------------------------------------------------------------------------
# observables


def live_triangles(state: CDTState) -> jax.Array:
    """(..., C2) bool mask of live triangle slots (the two slots of every live vertex)."""
    return jnp.repeat(live_vertices(state), 2, axis=-1)


def live_vertices(state: CDTState) -> jax.Array:
    """(..., C0) bool mask of live vertex slots."""
    return state.vpos < state.n0[..., None]


def coordination_numbers(state: CDTState) -> jax.Array:
    """(C0,) number of triangles at each vertex (= its number of links); 0 for free slots."""
    tv, _, tri_alive, vert_alive = geometry_arrays(state)
    return cdt_geometry.vertex_coordination(tv, tri_alive, vert_alive)


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
    :mod:`ivhl_jax.physics.cdt_geometry`: ``tnbr`` (C2, 3) holds the triangles across the left timelike,
    right timelike and spatial edge (``tl``, ``tr``, slot ``^ 1``)."""
    tnbr = jnp.stack([state.tl, state.tr, state.tc], axis=-1)
    return state.tv, tnbr, live_triangles(state), live_vertices(state)


def observe(state: CDTState, params: Any = None) -> dict[str, jax.Array]:
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


def run(key: jax.Array, state: CDTState, params: CDTParams, steps: int, save_every: int = 1):
    """``steps`` sweeps in ``lax.scan``; observables every ``save_every`` sweeps (the vocabulary of
    :func:`ivhl_jax.numerics.rollout.trajectory`: one step of :func:`metropolis` is one sweep).

    Returns ``(final_state, obs)`` with ``obs`` a dict of arrays with leading axis
    ``steps // save_every`` (see :func:`observe`). Deterministic given ``key``.
    """
    check_key(key, "key")
    _check_params(params)
    _check_state(state, "state", batched=False, params=params)
    check_scalar(steps, "steps", integer=True, nonnegative=True)

    final, obs = trajectory(metropolis(params), Chain(key=key, geometry=state), steps, save_every=save_every,
                            observe=observe_chain)
    return final.geometry, obs


def run_chains(key: jax.Array, states: CDTState, params: CDTParams, steps: int, save_every: int = 1):
    """:func:`run` on a batch of independent chains (leading axis of ``states``, e.g. from
    :func:`replicate`), keys split per chain."""
    check_key(key, "key")
    _check_params(params)
    _check_state(states, "states", batched=True, params=params)
    check_scalar(steps, "steps", integer=True, nonnegative=True)
    check_scalar(save_every, "save_every", integer=True, minimum=1)
    return _run_chains(key, states, params, int(steps), int(save_every))


def _check_params(params: Any) -> None:
    if not isinstance(params, CDTParams):
        raise TypeError(f"params must be CDTParams (from cdt.make_params); got {type(params).__name__}")


def _check_lengths(lengths: Any) -> jax.Array:
    """Slice-length profiles (..., T): a real array with T >= 1 and (when concrete) finite entries."""
    x = check_array(lengths, "lengths", kind="numeric", finite=True)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"lengths must have a last (time) axis of length >= 1, got shape {tuple(x.shape)}")
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"lengths must be real, got {x.dtype}")
    return x


def _check_state(state: Any, name: str, *, batched: bool, params: CDTParams | None = None) -> None:
    """``state`` must be a CDTState, with a leading chain axis iff ``batched``, and room for the target volume."""
    if not isinstance(state, CDTState):
        raise TypeError(f"{name} must be a CDTState (from cdt.initial_state), got {type(state).__name__}")
    if params is not None and params.stop_at_target and is_concrete(params.target):
        need = int(float(params.target)) // 2 + 1
        if state.vertex_capacity < need:
            raise ValueError(f"{name} has {state.vertex_capacity} vertex slots, too few for the target N2 = "
                             f"{float(params.target):g} (N0 = N2/2 = {need - 1}); build it with "
                             f"cdt.initial_state(..., capacity >= {2 * need})")
    ndim = jnp.ndim(state.n0)
    if batched and ndim != 1:
        raise ValueError(f"{name} must be a batch of chains with a leading chain axis (n0 of shape (n_chains,)), "
                         f"got n0 of shape {jnp.shape(state.n0)}; build it with "
                         f"cdt.replicate(cdt.initial_state(...), n_chains), or use cdt.run for a single chain")
    if not batched and ndim != 0:
        raise ValueError(f"{name} must be a single chain (n0 a scalar), got a batch with n0 of shape "
                         f"{jnp.shape(state.n0)}; use cdt.run_chains for replicated states")


@functools.partial(jax.jit, static_argnames=("steps", "save_every"))
def _run_chains(key: jax.Array, states: CDTState, params: CDTParams, steps: int, save_every: int):
    keys = jax.random.split(key, states.n0.shape[0])

    def one(k, s):
        final, obs = rollout(_sweep_step, Chain(key=k, geometry=s), params, steps, save_every=save_every,
                             observe=observe_chain)
        return final.geometry, obs

    return jax.vmap(one)(keys, states)


# ----------------------------------------------------------------------------------------------
# the stepper protocol (ivhl_jax.numerics.rollout): one step = one sweep, the PRNG key lives in the state


class Chain(flax.struct.PyTreeNode):
    """State of one Markov chain for :func:`metropolis`: its PRNG key and its triangulation."""

    key: jax.Array
    geometry: CDTState


def _sweep_step(chain: Chain, params: CDTParams) -> Chain:
    key, sub = jax.random.split(chain.key)
    return Chain(key=key, geometry=sweep(sub, chain.geometry, params))


def _init_chain(params: CDTParams, key: jax.Array, n_slices: int, length: int, capacity: int | None = None) -> Chain:
    del params
    return Chain(key=key, geometry=initial_state(n_slices, length, capacity))


def observe_chain(chain: Chain, params: CDTParams) -> dict[str, jax.Array]:
    """:func:`observe` of a :class:`Chain` (the ``observe`` to pass to ``trajectory``)."""
    return observe(chain.geometry, params)


def metropolis(params: CDTParams) -> Stepper[Chain, CDTParams]:
    """Stepper for the Metropolis chain: ``step(chain)`` is one :func:`sweep` of
    ``params.attempts_per_sweep`` attempts with a fresh subkey split from ``chain.key``.

    ``init(key, n_slices, length, capacity=None)`` builds a :class:`Chain` on the regular torus of
    :func:`initial_state`. ``trajectory(metropolis(p), chain, sweeps, save_every=m, observe=observe_chain)``
    equals :func:`run` bit for bit and compiles once per shapes (``lam``, ``eps``, ``target`` are traced).
    """
    _check_params(params)
    return Stepper(step_fn=_sweep_step, params=params, init_fn=_init_chain, name="cdt.metropolis")


def volume_correlator(lengths: jax.Array) -> jax.Array:
    """Connected spatial-volume correlator ``C(dt) = <l_t l_{t+dt}> - <l>^2``, averaged over t.

    ``lengths``: (..., n_meas, T) profiles; the average runs over measurements (and leading axes).
    Returns (T,) indexed by dt.
    """
    x = _check_lengths(lengths).astype(jnp.float32)
    x = x.reshape(-1, x.shape[-1])
    mean = x.mean()
    corr = jnp.stack([(x * jnp.roll(x, -k, axis=-1)).mean() for k in range(x.shape[-1])])
    return corr - mean**2


def center_profiles(lengths: jax.Array) -> jax.Array:
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
    (:func:`ivhl_jax.physics.cdt_geometry.graph_distances` on the vertex graph); unreached and free slots
    get ``r_max + 1``. Cost O(r_max * C2)."""
    _check_state(state, "state", batched=False)
    check_scalar(r_max, "r_max", integer=True, nonnegative=True)
    check_scalar(origin, "origin", integer=True, nonnegative=True,
                 maximum=state.vertex_capacity - 1 if is_concrete(origin) else None)
    tv, _, tri_alive, vert_alive = geometry_arrays(state)
    src, dst = cdt_geometry.vertex_adjacency_edges(tv, tri_alive)
    d = cdt_geometry.graph_distances(src, dst, state.vertex_capacity, origin, r_max)
    return jnp.where(vert_alive, d, r_max + 1)


def sphere_volumes(key: jax.Array, state: CDTState, r_max: int, n_origins: int = 8, *,
                   graph: str = "vertex") -> jax.Array:
    """Mean sphere volume |S_r| (r = 0..r_max) from ``n_origins`` uniform live origins, on the vertex graph
    (vertices, distances in links) or the dual graph (triangles, distances in dual links), via
    :func:`ivhl_jax.physics.cdt_geometry.sphere_volumes`. Returns (r_max + 1,) float32; ``sum_r`` equals
    N0 (vertex) or N2 (dual) when ``r_max`` exceeds the diameter."""
    check_key(key, "key")
    _check_state(state, "state", batched=False)
    tv, tnbr, tri_alive, vert_alive = geometry_arrays(state)
    if graph == "vertex":
        src, dst = cdt_geometry.vertex_adjacency_edges(tv, tri_alive)
        alive = vert_alive
    elif graph == "dual":
        src, dst = cdt_geometry.dual_adjacency_edges(tnbr, tri_alive)
        alive = tri_alive
    else:
        raise ValueError(f"graph must be 'vertex' or 'dual', got {graph!r}")
    return cdt_geometry.sphere_volumes(key, src, dst, alive, r_max, n_origins).astype(jnp.float32)


# ----------------------------------------------------------------------------------------------
# invariants


def check_invariants(state: CDTState) -> dict[str, jax.Array]:
    """Structural checks of one (unbatched) state, jit/vmap-able; name -> bool scalar, all True when valid.

    * ``bags``: vperm/vpos are inverse permutations; 0 <= n0 <= C0.
    * ``neighbours``: tl/tr of live triangles are live, ``tr[tl[t]] = tl[tr[t]] = t``, same strip.
    * ``gluing``: a triangle and its right neighbour share their timelike link (same bottom and top
      vertex); base and apex vertices are live and on the right slices.
    * ``slices``: following ``vright`` closes every slice into one circle of exactly ``lengths[t] >= 3``
      vertices; every strip closes (under ``tr``) into one cycle of ``l_t + l_{t+1}`` triangles.
    * ``euler``: N0 = sum l_t (so N2 = 2 N0 and chi = N0 - 3 N2 / 2 + N2 = 0 on the torus).
    """
    s = state
    c2, c0, T = 2 * s.vertex_capacity, s.vertex_capacity, s.n_slices
    ids2, ids0 = jnp.arange(c2), jnp.arange(c0)
    at, av = live_triangles(s), live_vertices(s)
    n0 = s.n0
    ok = {}
    ok["bags"] = jnp.all(s.vpos[jnp.clip(s.vperm, 0, c0 - 1)] == ids0) & (n0 >= 0) & (n0 <= c0)

    def live_all(cond):
        return jnp.all(jnp.where(at, cond, True))

    tl, tr = jnp.clip(s.tl, 0, c2 - 1), jnp.clip(s.tr, 0, c2 - 1)
    ttime = s.ttime
    up = s.ttype == UP
    ok["neighbours"] = (live_all(at[tl] & at[tr]) & live_all((s.tr[tl] == ids2) & (s.tl[tr] == ids2))
                        & live_all((ttime[tl] == ttime) & (ttime[tr] == ttime)))
    vl, vr, vc = (jnp.clip(s.tv[:, k], 0, c0 - 1) for k in range(3))
    bot_l, top_l = jnp.where(up, vl, vc), jnp.where(up, vc, vl)
    bot_r, top_r = jnp.where(up, vr, vc), jnp.where(up, vc, vr)
    base_t = jnp.where(up, ttime, (ttime + 1) % T)
    apex_t = jnp.where(up, (ttime + 1) % T, ttime)
    ok["gluing"] = (
        live_all((bot_r == bot_l[tr]) & (top_r == top_l[tr]))
        & live_all(av[vl] & av[vr] & av[vc] & (s.tv >= 0).all(1) & (s.tv < c0).all(1))
        & live_all((s.vtime[vl] == base_t) & (s.vtime[vr] == base_t) & (s.vtime[vc] == apex_t))
    )
    right = jnp.where(av, jnp.clip(s.vright, 0, c0 - 1), ids0)
    nxt = jnp.where(at, tr, ids2)

    # cycle length of v under `right` (and of t under `tr`): first k >= 1 with f^k(x) = x (capped)
    def cycles(f, ids, n):
        def body(k, carry):
            cur, cyc = carry
            cur = f[cur]
            return cur, jnp.where((cyc == 0) & (cur == ids), k, cyc)

        return jax.lax.fori_loop(1, n + 1, body, (ids, jnp.zeros(n, jnp.int32)))[1]

    vt = jnp.clip(s.vtime, 0, T - 1)
    counts = jnp.zeros(T, jnp.int32).at[jnp.where(av, vt, T)].add(1, mode="drop")
    strip_len = s.lengths + jnp.roll(s.lengths, -1)
    tt = jnp.clip(ttime, 0, T - 1)
    ok["slices"] = (jnp.all(jnp.where(av, s.vtime[right] == s.vtime, True))
                    & jnp.all(jnp.where(av, cycles(right, ids0, c0) == s.lengths[vt], True))
                    & live_all(cycles(nxt, ids2, c2) == strip_len[tt])
                    & jnp.all(counts == s.lengths) & jnp.all(s.lengths >= 3))
    ok["euler"] = n0 == s.lengths.sum()
    return ok


_check_jit = jax.jit(check_invariants)
_check_vmap_jit = jax.jit(jax.vmap(check_invariants))


def assert_invariants(state: CDTState) -> None:
    """Raise ``AssertionError`` naming every failed structural check (works on batched states too)."""
    res = (_check_jit if state.n0.ndim == 0 else _check_vmap_jit)(state)
    bad = [k for k, v in res.items() if not bool(np.all(np.asarray(v)))]
    if bad:
        raise AssertionError(f"CDT invariants violated: {bad}")
    if bool(np.any(np.asarray(state.overflow))):
        raise AssertionError("CDT capacity overflow: an insertion was rejected for lack of slots; raise capacity")


# ----------------------------------------------------------------------------------------------
# exact results (NumPy, float64): the transfer matrix


def strip_count(a: int, b: int) -> int:
    """Number of strips between two rooted, oriented circles of a and b vertices: (a+b-1)!/((a-1)!(b-1)!)."""
    check_scalar(a, "a", integer=True, minimum=1)
    check_scalar(b, "b", integer=True, minimum=1)
    return math.comb(int(a) + int(b) - 1, int(a) - 1) * int(b)


def log_length_weight(lengths, lam: float) -> float:
    """log of the exact unnormalised probability of a slice-length vector (see module docstring)."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size < 1 or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"lengths must be a non-empty 1-D sequence of slice lengths, got {lengths!r}")
    if not (np.all(np.isfinite(arr)) and np.all(arr >= 1) and np.all(arr == np.round(arr))):
        raise ValueError(f"lengths must be integers >= 1, got {lengths!r}")
    check_scalar(lam, "lam")
    ls = [int(v) for v in arr]
    T = len(ls)
    val = -2.0 * lam * sum(ls) - sum(math.log(v) for v in ls)
    return val + sum(math.log(strip_count(ls[t], ls[(t + 1) % T])) for t in range(T))


def transfer_matrix(lam: float, l_max: int) -> np.ndarray:
    """Symmetric transfer matrix M[a, b] = e^{-lam(a+b)} S(a, b) / sqrt(a b) for 3 <= a, b <= l_max.

    Index k corresponds to l = k + 3. Z(T) = Tr M^T (up to the truncation at l_max).
    """
    from scipy.special import gammaln

    check_scalar(lam, "lam")
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    ls = np.arange(3, int(l_max) + 1, dtype=float)
    a, b = ls[:, None], ls[None, :]
    logm = -lam * (a + b) + gammaln(a + b) - gammaln(a) - gammaln(b) - 0.5 * np.log(a * b)
    return np.exp(logm)


def exact_mean_length(lam: float, n_slices: int | None, l_max: int | None = None) -> float:
    """Exact <l_t> on a torus of ``n_slices`` slices from the transfer matrix (lam > ln 2).

    ``n_slices=None``: the T -> infinity limit, ``<psi_0| l |psi_0>`` of the top eigenvector.

    ``l_max`` (truncation) defaults to 40/sqrt(lam - ln 2) + 60, far in the exponential tail
    ``~ exp(-2 sqrt(lam - ln 2) l)``.
    """
    check_scalar(lam, "lam")
    if lam <= LN2:
        raise ValueError(f"lam={lam} must exceed ln 2 = {LN2:.6f}")
    if n_slices is not None:
        check_scalar(n_slices, "n_slices", integer=True, minimum=1)
        n_slices = int(n_slices)
    if l_max is None:
        l_max = int(40.0 / math.sqrt(lam - LN2)) + 60
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    l_max = int(l_max)
    m = transfer_matrix(lam, l_max)
    ls = np.arange(3, l_max + 1, dtype=float)
    if n_slices is None:
        from scipy.sparse.linalg import eigsh

        _, v0 = eigsh(m, k=1, which="LA")
        return float((v0[:, 0] ** 2 * ls).sum() / (v0[:, 0] ** 2).sum())
    w, vec = np.linalg.eigh(m)
    # <l> = Tr(L M^T) / Tr(M^T) in the eigenbasis, powers scaled by the top eigenvalue
    p = (w / w[-1]) ** n_slices
    return float(np.sum(p * ((vec**2) * ls[:, None]).sum(0)) / np.sum(p))


def exact_length_distribution(lam: float, n_slices: int, l_max: int) -> dict[tuple[int, ...], float]:
    """Exact P(l_0, ..., l_{T-1}) for all vectors with 3 <= l_t <= l_max, normalised over that box."""
    import itertools

    check_scalar(lam, "lam")
    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    n_slices, l_max = int(n_slices), int(l_max)
    if (l_max - 2) ** n_slices > 10**7:
        raise ValueError(f"n_slices={n_slices} and l_max={l_max} give {(l_max - 2) ** n_slices:.3g} length vectors "
                         "to enumerate (more than 1e7); use exact_mean_length for large systems")
    vecs = list(itertools.product(range(3, l_max + 1), repeat=n_slices))
    logw = np.array([log_length_weight(v, lam) for v in vecs])
    p = np.exp(logw - logw.max())
    p /= p.sum()
    return dict(zip(vecs, p.tolist()))


# ----------------------------------------------------------------------------------------------
# host-side helpers for drawing


def slice_orders(state: CDTState) -> list[list[int]]:
    """For an unbatched state: per slice, its vertex ids in spatial order (starting anywhere)."""
    s = jax.device_get(state)
    alive = np.asarray(s.vpos) < int(s.n0)
    vright, vtime = np.asarray(s.vright), np.asarray(s.vtime)
    out: list[list[int]] = []
    for t in range(s.n_slices):
        vs = np.nonzero(alive & (vtime == t))[0]
        order = [int(vs[0])]
        for _ in range(int(s.lengths[t]) - 1):
            order.append(int(vright[order[-1]]))
        out.append(order)
    return out


def draw_triangulation(state: CDTState, ax=None, *, color="k", lw=0.6):
    """Draw an unbatched triangulation: slice t at height t, vertices spread evenly on [0, 1).

    Spatial links and timelike links that wrap around the circle are omitted. Returns the axes.
    """
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    s = jax.device_get(state)
    orders = slice_orders(state)
    xpos, ypos = {}, {}
    for t, order in enumerate(orders):
        for k, v in enumerate(order):
            xpos[v], ypos[v] = (k + 0.5) / len(order), t
    alive = np.asarray(live_triangles(s))
    tv = np.asarray(s.tv)
    T = len(orders)
    for tri in np.nonzero(alive)[0]:
        a, b, c = (int(x) for x in tv[tri])
        for p, q in ((a, b), (a, c), (b, c)):
            if abs(xpos[p] - xpos[q]) > 0.5 or abs(ypos[p] - ypos[q]) > 1:
                continue
            ax.plot([xpos[p], xpos[q]], [ypos[p], ypos[q]], color=color, lw=lw)
    ax.set_xlabel("spatial position (fraction of slice)")
    ax.set_ylabel("time slice t")
    ax.set_ylim(-0.5, T - 0.5)
    return ax
