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

Data structure (fixed capacity, the jax-md neighbour-list pattern)
-----------------------------------------------------------------
Per triangle slot: ``ttype`` (0 up, 1 down), ``ttime`` (strip index), ``tl``/``tr`` (left/right
neighbour in the strip, sharing a timelike link), ``tc`` (centre neighbour across the base) and
``tv = (vl, vr, vc)`` (base-left, base-right, apex; "right" is the positive spatial orientation).
Per vertex slot: ``vtime`` (slice) and ``vtu`` (the up triangle whose base starts at the vertex,
i.e. ``tv[vtu[v], 0] == v``). Live triangles/vertices are kept in "bags": ``tperm[:n2]`` lists the
live triangle ids and ``tperm[n2:]`` the free ones (``tpos`` is the inverse permutation), likewise
``vperm``/``vpos``/``n0``; a uniform live element is one gather, insertion pops a free id, removal
is a swap with the last live id. An insertion that does not fit sets ``overflow`` and is rejected;
rerun with a larger capacity when ``overflow`` is set.

Moves (each attempt: flip with probability 1/2, insertion 1/4, removal 1/4)
---------------------------------------------------------------------------
* (2,2) flip: pick a live triangle uniformly and its right neighbour; if their types differ, swap
  them in the strip (the shared timelike link rotates). Symmetric proposal, no change of action:
  always accepted.
* (2,4) insertion: pick a live triangle uniformly; its base link (an up triangle and the down
  triangle below share each spatial link, so every one of the ``N0`` spatial links is chosen with
  probability ``1/N0``) is split by a new vertex of coordination 4.
* (4,2) removal: pick a live vertex uniformly (``1/N0``); if it has one future and one past link
  and its slice has ``l_t > 3`` vertices, remove it (the exact inverse of an insertion).
Detailed balance with ``pi ∝ e^{-S}/|Aut|`` (orbit-stabiliser: (T, marked link) <-> (T', marked
order-4 vertex)) gives the acceptances

    A_add = min(1, e^{-dS} N0/(N0+1)),     A_del = min(1, e^{-dS} N0/(N0-1)),

checked against exact enumeration by the test-suite (chi-squared).

All moves are a handful of scatters whose indices are sent out of bounds (``mode="drop"``) when
the move is not taken, so an attempt costs O(1) even under ``vmap`` (no ``lax.cond`` -> select of
whole arrays).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.numerics.rollout import Stepper, rollout, trajectory

__all__ = ["LN2", "MOVE_NAMES", "CDTState", "CDTParams", "Chain", "metropolis", "observe_chain",
    "make_params", "initial_state", "replicate", "apply_flip",
    "apply_insertion", "apply_removal", "is_removable", "log_acceptance", "attempt", "sweep", "live_triangles",
    "live_vertices", "coordination_numbers", "coordination_histogram", "observe", "run", "run_chains",
    "volume_correlator", "center_profiles", "vertex_distances", "sphere_volumes", "mean_distance",
    "hausdorff_from_spheres", "hausdorff_from_scaling", "check_invariants", "assert_invariants", "strip_count",
    "log_length_weight", "transfer_matrix", "exact_mean_length", "exact_length_distribution", "slice_orders",
    "draw_triangulation"]

LN2 = math.log(2.0)
UP, DOWN = 0, 1
MOVE_NAMES = ("flip", "add", "delete")


class CDTState(flax.struct.PyTreeNode):
    """A 1+1D CDT triangulation in fixed-capacity arrays (see the module docstring).

    Shapes: ``C2 = 2 * C0`` triangle slots, ``C0`` vertex slots, ``T`` slices. All ints are int32.
    ``attempts``/``accepts`` count proposals/acceptances per move type (flip, add, delete).
    """

    ttype: jax.Array  # (C2,)
    ttime: jax.Array  # (C2,)
    tl: jax.Array  # (C2,)
    tr: jax.Array  # (C2,)
    tc: jax.Array  # (C2,)
    tv: jax.Array  # (C2, 3) vl, vr, vc
    vtime: jax.Array  # (C0,)
    vtu: jax.Array  # (C0,)
    tperm: jax.Array  # (C2,)
    tpos: jax.Array  # (C2,)
    vperm: jax.Array  # (C0,)
    vpos: jax.Array  # (C0,)
    n2: jax.Array  # ()
    n0: jax.Array  # ()
    lengths: jax.Array  # (T,)
    overflow: jax.Array  # () bool
    attempts: jax.Array  # (3,)
    accepts: jax.Array  # (3,)

    @property
    def n_slices(self) -> int:
        return self.lengths.shape[-1]

    @property
    def vertex_capacity(self) -> int:
        return self.vtime.shape[-1]


class CDTParams(flax.struct.PyTreeNode):
    """Action and schedule: ``S = lam N2 + eps (N2 - target)^2``.

    ``attempts_per_sweep`` (static) is the number of move attempts in one :func:`sweep`.
    """

    lam: jax.Array | float = LN2 + 0.1
    eps: jax.Array | float = 0.0
    target: jax.Array | float = 0.0
    attempts_per_sweep: int = flax.struct.field(pytree_node=False, default=100)


def make_params(lam: float, *, eps: float = 0.0, target: float = 0.0, attempts_per_sweep: int = 100) -> CDTParams:
    """Validated :class:`CDTParams`. Without volume fixing (``eps=0``) the chain needs ``lam > ln 2``."""
    check_scalar(lam, "lam")
    check_scalar(eps, "eps", nonnegative=True)
    check_scalar(target, "target", nonnegative=True)
    check_scalar(attempts_per_sweep, "attempts_per_sweep", integer=True, minimum=1)
    if eps == 0 and lam <= LN2:
        raise ValueError(f"lam={lam} <= ln 2 = {LN2:.6f} without volume fixing: the volume diverges; "
                         "use lam > ln 2 or set eps > 0 and a target volume")
    if eps > 0 and target <= 0:
        raise ValueError("volume fixing (eps > 0) needs target > 0 (the target number of triangles N2)")
    return CDTParams(lam=float(lam), eps=float(eps), target=float(target), attempts_per_sweep=int(attempts_per_sweep))


def initial_state(n_slices: int, length: int, capacity: int | None = None) -> CDTState:
    """A regular torus: ``n_slices`` slices of ``length`` vertices, strips ``U D U D ...``.

    Args:
      n_slices: T >= 2.
      length: initial slice length l >= 3.
      capacity: vertex slots C0 >= T * length (default 4 T l); triangle slots are 2 C0.
    """
    check_scalar(n_slices, "n_slices", integer=True, minimum=2)
    check_scalar(length, "length", integer=True, minimum=3)
    T, L = int(n_slices), int(length)
    n0 = T * L
    c0 = 4 * n0 if capacity is None else int(capacity)
    check_scalar(c0, "capacity", integer=True, minimum=n0)
    c2 = 2 * c0
    t = np.repeat(np.arange(T), L)
    i = np.tile(np.arange(L), T)

    def vid(tt, ii):
        return (tt % T) * L + (ii % L)

    def uid(tt, ii):
        return (tt % T) * 2 * L + 2 * (ii % L)

    ttype = np.zeros(c2, np.int32)
    ttime = np.zeros(c2, np.int32)
    tl = np.zeros(c2, np.int32)
    tr = np.zeros(c2, np.int32)
    tc = np.zeros(c2, np.int32)
    tv = np.zeros((c2, 3), np.int32)
    u, d = uid(t, i), uid(t, i) + 1
    # U_i: base (b_i, b_{i+1}), apex top_i ; D_i: base (top_i, top_{i+1}), apex b_{i+1}.
    ttype[u], ttype[d] = UP, DOWN
    ttime[u], ttime[d] = t, t
    tv[u] = np.stack([vid(t, i), vid(t, i + 1), vid(t + 1, i)], 1)
    tv[d] = np.stack([vid(t + 1, i), vid(t + 1, i + 1), vid(t, i + 1)], 1)
    tr[u], tl[d] = d, u
    tr[d], tl[uid(t, i + 1)] = uid(t, i + 1), d
    tc[u] = uid(t - 1, i) + 1
    tc[uid(t - 1, i) + 1] = u
    vtime = np.zeros(c0, np.int32)
    vtu = np.zeros(c0, np.int32)
    vtime[vid(t, i)] = t
    vtu[vid(t, i)] = u
    perm2 = np.arange(c2, dtype=np.int32)
    perm0 = np.arange(c0, dtype=np.int32)
    return CDTState(
        ttype=jnp.asarray(ttype), ttime=jnp.asarray(ttime), tl=jnp.asarray(tl), tr=jnp.asarray(tr),
        tc=jnp.asarray(tc), tv=jnp.asarray(tv), vtime=jnp.asarray(vtime), vtu=jnp.asarray(vtu),
        tperm=jnp.asarray(perm2), tpos=jnp.asarray(perm2), vperm=jnp.asarray(perm0), vpos=jnp.asarray(perm0),
        n2=jnp.int32(2 * n0), n0=jnp.int32(n0), lengths=jnp.full((T,), L, jnp.int32),
        overflow=jnp.bool_(False), attempts=jnp.zeros(3, jnp.int32), accepts=jnp.zeros(3, jnp.int32))


def replicate(state: CDTState, n_chains: int) -> CDTState:
    """Stack ``n_chains`` copies of ``state`` along a new leading axis (for ``vmap``)."""
    check_scalar(n_chains, "n_chains", integer=True, minimum=1)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n_chains,) + x.shape), state)


# ----------------------------------------------------------------------------------------------
# moves: every write goes through _set, whose index is pushed out of bounds (dropped) when off.

def _scatter(arr, pairs, fill=None):
    """arr.at[idx].set(val) for a fixed list of (idx, val, on); entries with on=False are dropped."""
    idx = jnp.stack([jnp.where(on, i, arr.shape[0]) for i, _, on in pairs])
    val = jnp.stack([jnp.asarray(v, arr.dtype) for _, v, _ in pairs])
    return arr.at[idx].set(val, mode="drop")


def _bag_remove(perm, pos, n, x, on):
    """Swap-remove id ``x`` from the live prefix ``perm[:n]`` (no-op when ``on`` is False)."""
    i = pos[x]
    last = perm[n - 1]
    # if x is the last live id, both writes of each pair agree, so duplicate indices are harmless
    perm = _scatter(perm, [(i, last, on), (n - 1, x, on)])
    pos = _scatter(pos, [(last, i, on), (x, n - 1, on)])
    return perm, pos, jnp.where(on, n - 1, n)


def _removal_geometry(s: CDTState, v):
    """(u, u2, d, d2, removable) for removing vertex v: u2 = vtu[v] right of v, u left of it, d/d2 below."""
    u2 = s.vtu[v]
    u = s.tl[u2]
    d2 = s.tc[u2]
    d = s.tl[d2]
    removable = (s.ttype[u] == UP) & (s.ttype[d] == DOWN) & (s.lengths[s.vtime[v]] > 3)
    return u, u2, d, d2, removable


def _apply_moves(s: CDTState, t1, up, v, do_flip, do_add, do_del) -> CDTState:
    """Apply at most one of: flip of (t1, tr[t1]); insertion on the base of up triangle ``up``; removal of
    vertex ``v``. All reads come from ``s`` and the writes of the three moves are merged into one scatter
    per array (moves are exclusive), which keeps an attempt O(1) and the compiled program small."""
    # (2,2) flip: t1, t2 swap places; the left one's new apex is t2's base-right vertex, the right one's
    # new apex is t1's base-left vertex (the same rule for UD -> DU and DU -> UD).
    t2 = s.tr[t1]
    fl, fr = s.tl[t1], s.tr[t2]
    # (2,4) insertion on the link shared by up triangle u and down triangle d = tc[u]
    d = s.tc[up]
    ax, ay = s.tr[up], s.tr[d]
    ab, ac, ad = s.tv[up, 1], s.tv[up, 2], s.tv[d, 2]
    au2, ad2 = s.tperm[s.n2], s.tperm[s.n2 + 1]
    av = s.vperm[s.n0]
    at = s.ttime[up]
    # (4,2) removal of vertex v
    ru, ru2, rd, rd2, _ = _removal_geometry(s, v)
    rx, ry = s.tr[ru2], s.tr[rd2]
    rb = s.tv[ru2, 1]
    rt = s.vtime[v]
    f, a, r = do_flip, do_add, do_del
    tr = _scatter(s.tr, [(fl, t2, f), (t2, t1, f), (t1, fr, f),
                         (up, au2, a), (au2, ax, a), (d, ad2, a), (ad2, ay, a),
                         (ru, rx, r), (rd, ry, r)])
    tl = _scatter(s.tl, [(t2, fl, f), (t1, t2, f), (fr, t1, f),
                         (au2, up, a), (ax, au2, a), (ad2, d, a), (ay, ad2, a),
                         (rx, ru, r), (ry, rd, r)])
    tc = _scatter(s.tc, [(au2, ad2, a), (ad2, au2, a)])
    tvf = _scatter(s.tv.reshape(-1), [
        (3 * t1 + 2, s.tv[t2, 1], f), (3 * t2 + 2, s.tv[t1, 0], f),
        (3 * up + 1, av, a), (3 * d + 1, av, a),
        (3 * au2, av, a), (3 * au2 + 1, ab, a), (3 * au2 + 2, ac, a),
        (3 * ad2, av, a), (3 * ad2 + 1, ab, a), (3 * ad2 + 2, ad, a),
        (3 * ru + 1, rb, r), (3 * rd + 1, rb, r)])
    ttype = _scatter(s.ttype, [(au2, UP, a), (ad2, DOWN, a)])
    ttime = _scatter(s.ttime, [(au2, at, a), (ad2, s.ttime[d], a)])
    vtime = _scatter(s.vtime, [(av, at, a)])
    vtu = _scatter(s.vtu, [(av, au2, a)])
    lengths = _scatter(s.lengths, [(at, s.lengths[at] + 1, a), (rt, s.lengths[rt] - 1, r)])
    tperm, tpos, n2 = _bag_remove(s.tperm, s.tpos, s.n2, ru2, r)
    tperm, tpos, n2 = _bag_remove(tperm, tpos, n2, rd2, r)
    vperm, vpos, n0 = _bag_remove(s.vperm, s.vpos, s.n0, v, r)
    inc = a.astype(jnp.int32)
    return s.replace(tr=tr, tl=tl, tc=tc, tv=tvf.reshape(s.tv.shape), ttype=ttype, ttime=ttime, vtime=vtime,
                     vtu=vtu, lengths=lengths, tperm=tperm, tpos=tpos, vperm=vperm, vpos=vpos,
                     n2=n2 + 2 * inc, n0=n0 + inc)


def apply_flip(state: CDTState, t1) -> CDTState:
    """Unconditionally flip triangle ``t1`` with its right neighbour (they must differ in type)."""
    z, yes, no = jnp.int32(0), jnp.bool_(True), jnp.bool_(False)
    return _apply_moves(state, jnp.int32(t1), z, z, yes, no, no)


def apply_insertion(state: CDTState, up) -> CDTState:
    """Unconditionally insert a vertex on the base link of up triangle ``up`` (capacity must allow)."""
    z, yes, no = jnp.int32(0), jnp.bool_(True), jnp.bool_(False)
    return _apply_moves(state, z, jnp.int32(up), z, no, yes, no)


def apply_removal(state: CDTState, v) -> CDTState:
    """Unconditionally remove vertex ``v`` (it must be removable: coordination 4, slice length > 3)."""
    z, yes, no = jnp.int32(0), jnp.bool_(True), jnp.bool_(False)
    return _apply_moves(state, z, z, jnp.int32(v), no, no, yes)


def is_removable(state: CDTState, v) -> jax.Array:
    """Whether vertex ``v`` has one future and one past link and its slice has more than 3 vertices."""
    return _removal_geometry(state, v)[-1]


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


def attempt(state: CDTState, u: jax.Array, params: CDTParams) -> CDTState:
    """One Metropolis attempt driven by three uniforms ``u = (move, choice, accept)`` in [0, 1)."""
    s = state
    move = jnp.minimum((u[0] * 4.0).astype(jnp.int32), 3)
    is_flip, is_add, is_del = move <= 1, move == 2, move == 3
    kind = jnp.where(is_flip, 0, jnp.where(is_add, 1, 2))
    # a uniform live triangle (flip, add) or vertex (delete)
    tri = s.tperm[jnp.minimum((u[1] * s.n2).astype(jnp.int32), s.n2 - 1)]
    vert = s.vperm[jnp.minimum((u[1] * s.n0).astype(jnp.int32), s.n0 - 1)]
    log_u = jnp.log(jnp.maximum(u[2], 1e-38))
    # flip
    do_flip = is_flip & (s.ttype[tri] != s.ttype[s.tr[tri]])
    # insertion on the base link of the chosen triangle (its up triangle)
    up = jnp.where(s.ttype[tri] == UP, tri, s.tc[tri])
    fits = (s.n2 + 2 <= s.ttype.shape[0]) & (s.n0 + 1 <= s.vtime.shape[0])
    acc_add = is_add & (log_u < log_acceptance("add", s.n0, s.n2, params))
    do_add = acc_add & fits
    # removal of the chosen vertex
    *_, removable = _removal_geometry(s, vert)
    do_del = is_del & removable & (log_u < log_acceptance("delete", s.n0, s.n2, params))
    s = _apply_moves(s, tri, up, vert, do_flip, do_add, do_del)
    accepted = do_flip | do_add | do_del
    return s.replace(
        overflow=s.overflow | (acc_add & ~fits),
        attempts=s.attempts.at[kind].add(1),
        accepts=s.accepts.at[kind].add(accepted.astype(jnp.int32)),
    )


def sweep(key: jax.Array, state: CDTState, params: CDTParams) -> CDTState:
    """``params.attempts_per_sweep`` Metropolis attempts (a ``lax.fori_loop``); pure."""
    n = params.attempts_per_sweep
    us = jax.random.uniform(key, (n, 3), dtype=jnp.float32)
    return jax.lax.fori_loop(0, n, lambda i, s: attempt(s, us[i], params), state)


# ----------------------------------------------------------------------------------------------
# observables


def live_triangles(state: CDTState) -> jax.Array:
    """(C2,) bool mask of live triangle slots."""
    return state.tpos < state.n2


def live_vertices(state: CDTState) -> jax.Array:
    """(C0,) bool mask of live vertex slots."""
    return state.vpos < state.n0


def coordination_numbers(state: CDTState) -> jax.Array:
    """(C0,) number of triangles at each vertex (= its number of links); 0 for free slots."""
    c0 = state.vtime.shape[0]
    alive = live_triangles(state)
    idx = jnp.where(alive[:, None], state.tv, c0).reshape(-1)
    return jnp.zeros(c0, jnp.int32).at[idx].add(1, mode="drop")


def coordination_histogram(state: CDTState, max_coordination: int = 32) -> jax.Array:
    """(max_coordination + 1,) counts of vertices with coordination q (last bin: q >= max)."""
    q = jnp.minimum(coordination_numbers(state), max_coordination)
    q = jnp.where(live_vertices(state), q, max_coordination + 1)
    return jnp.zeros(max_coordination + 1, jnp.int32).at[q].add(1, mode="drop")


def observe(state: CDTState, params: Any = None) -> dict[str, jax.Array]:
    """Cheap per-measurement observables: slice lengths l_t, N2, N0, coordination histogram, flags."""
    return {
        "lengths": state.lengths,
        "n2": state.n2,
        "n0": state.n0,
        "coordination": coordination_histogram(state),
        "overflow": state.overflow,
        "accepts": state.accepts,
        "attempts": state.attempts,
    }


def run(key: jax.Array, state: CDTState, params: CDTParams, sweeps: int, measure_every: int = 1):
    """``sweeps`` sweeps in ``lax.scan``; observables every ``measure_every`` sweeps.

    Returns ``(final_state, obs)`` with ``obs`` a dict of arrays with leading axis
    ``sweeps // measure_every`` (see :func:`observe`). Deterministic given ``key``.
    """
    _check_key(key, "key")
    _check_state(state, "state", batched=False)
    check_scalar(sweeps, "sweeps", integer=True, nonnegative=True)

    final, obs = trajectory(metropolis(params), Chain(key=key, geometry=state), sweeps, save_every=measure_every,
                            observe=observe_chain)
    return final.geometry, obs


def run_chains(key: jax.Array, states: CDTState, params: CDTParams, sweeps: int, measure_every: int = 1):
    """:func:`run` on a batch of independent chains (leading axis of ``states``, e.g. from
    :func:`replicate`), keys split per chain."""
    _check_key(key, "key")
    _check_state(states, "states", batched=True)
    check_scalar(sweeps, "sweeps", integer=True, nonnegative=True)
    check_scalar(measure_every, "measure_every", integer=True, minimum=1)
    return _run_chains(key, states, params, int(sweeps), int(measure_every))


def _check_key(key: Any, name: str) -> None:
    """Accept one typed key (``jax.random.key(seed)``) or one legacy ``jax.random.PRNGKey(seed)`` (uint32 (2,))."""
    fix = f"pass {name}=jax.random.key(seed) (or jax.random.PRNGKey(seed))"
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if jnp.shape(key) != ():
            raise ValueError(f"{name} must be a single PRNG key, got a batch of shape {jnp.shape(key)}; {fix}")
        return
    if dtype is not None and jnp.dtype(dtype) == jnp.uint32 and jnp.shape(key) == (2,):
        return
    what = f"{type(key).__name__}" + (f" of dtype {dtype} and shape {jnp.shape(key)}" if dtype is not None else "")
    raise TypeError(f"{name} must be a PRNG key, got {what}; {fix}")


def _check_state(state: Any, name: str, *, batched: bool) -> None:
    """``state`` must be a CDTState, with a leading chain axis iff ``batched``."""
    if not isinstance(state, CDTState):
        raise TypeError(f"{name} must be a CDTState (from cdt.initial_state), got {type(state).__name__}")
    ndim = jnp.ndim(state.n0)
    if batched and ndim != 1:
        raise ValueError(f"{name} must be a batch of chains with a leading chain axis (n0 of shape (n_chains,)), "
                         f"got n0 of shape {jnp.shape(state.n0)}; build it with "
                         f"cdt.replicate(cdt.initial_state(...), n_chains), or use cdt.run for a single chain")
    if not batched and ndim != 0:
        raise ValueError(f"{name} must be a single chain (n0 a scalar), got a batch with n0 of shape "
                         f"{jnp.shape(state.n0)}; use cdt.run_chains for replicated states")


@functools.partial(jax.jit, static_argnames=("sweeps", "measure_every"))
def _run_chains(key: jax.Array, states: CDTState, params: CDTParams, sweeps: int, measure_every: int):
    keys = jax.random.split(key, states.n0.shape[0])

    def one(k, s):
        final, obs = rollout(_sweep_step, Chain(key=k, geometry=s), params, sweeps, save_every=measure_every,
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
    if not isinstance(params, CDTParams):
        raise TypeError(f"params must be CDTParams (from cdt.make_params); got {type(params).__name__}")
    return Stepper(step_fn=_sweep_step, params=params, init_fn=_init_chain, name="cdt.metropolis")


def volume_correlator(lengths: jax.Array) -> jax.Array:
    """Connected spatial-volume correlator ``C(dt) = <l_t l_{t+dt}> - <l>^2``, averaged over t.

    ``lengths``: (..., n_meas, T) profiles; the average runs over measurements (and leading axes).
    Returns (T,) indexed by dt.
    """
    x = jnp.asarray(lengths, jnp.float32)
    x = x.reshape(-1, x.shape[-1])
    mean = x.mean()
    corr = jnp.stack([(x * jnp.roll(x, -k, axis=-1)).mean() for k in range(x.shape[-1])])
    return corr - mean**2


def center_profiles(lengths: jax.Array) -> jax.Array:
    """Shift each profile (..., T) so that its largest slice is at index T // 2 (for averaging blobs)."""
    x = jnp.asarray(lengths)
    T = x.shape[-1]
    shift = T // 2 - jnp.argmax(x, axis=-1)
    idx = (jnp.arange(T) - shift[..., None]) % T
    return jnp.take_along_axis(x, idx, axis=-1)


# ----------------------------------------------------------------------------------------------
# distances and the Hausdorff dimension


def vertex_distances(state: CDTState, origin: jax.Array, r_max: int) -> jax.Array:
    """Graph distance (in links) from ``origin`` to every vertex slot, by ``r_max`` BFS relaxations.

    Unreached and free slots get ``r_max + 1``. Cost O(r_max * C2).
    """
    c0 = state.vtime.shape[0]
    alive = live_triangles(state)
    tv = state.tv
    src = jnp.concatenate([tv[:, 0], tv[:, 1], tv[:, 2], tv[:, 1], tv[:, 2], tv[:, 0]])
    dst = jnp.concatenate([tv[:, 1], tv[:, 2], tv[:, 0], tv[:, 0], tv[:, 1], tv[:, 2]])
    dst = jnp.where(jnp.tile(alive, 6), dst, c0)
    inf = r_max + 1
    d0 = jnp.full(c0, inf, jnp.int32).at[origin].set(0)

    def relax(_, d):
        return jnp.minimum(d, d.at[dst].min(d[src] + 1, mode="drop"))

    d = jax.lax.fori_loop(0, r_max, relax, d0)
    return jnp.where(live_vertices(state), d, inf)


def sphere_volumes(key: jax.Array, state: CDTState, r_max: int, n_origins: int = 8) -> jax.Array:
    """Mean number of vertices at distance r (r = 0..r_max) from ``n_origins`` uniform live vertices.

    Returns (r_max + 1,) float32; ``sum_r`` equals N0 when ``r_max`` exceeds the diameter.
    """
    u = jax.random.uniform(key, (n_origins,))
    origins = state.vperm[jnp.minimum((u * state.n0).astype(jnp.int32), state.n0 - 1)]

    def one(o):
        d = vertex_distances(state, o, r_max)
        return jnp.zeros(r_max + 2, jnp.float32).at[d].add(1.0)[: r_max + 1]

    return jax.vmap(one)(origins).mean(0)


def mean_distance(spheres: jax.Array) -> jax.Array:
    """Average distance ``<r> = sum r S(r) / sum S(r)`` of sphere volumes S (..., R)."""
    s = jnp.asarray(spheres, jnp.float32)
    r = jnp.arange(s.shape[-1], dtype=jnp.float32)
    return (s * r).sum(-1) / s.sum(-1)


def hausdorff_from_spheres(spheres, r_min: int = 1, r_max: int | None = None) -> tuple[float, float]:
    """Local Hausdorff dimension from sphere volumes, ``S(r) ∝ r^(d_H - 1)`` fitted on [r_min, r_max].

    A crude single-volume estimate (lattice effects at small r, finite size near the peak of S);
    prefer :func:`hausdorff_from_scaling`. ``r_max`` defaults to 2/3 of the radius where S(r) peaks.
    Returns (d_H, std error of the fit); NaN when fewer than 3 radii are usable.
    """
    s = np.asarray(spheres, float)
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
    x = np.asarray(volumes, float)
    y = np.asarray(mean_distances, float)
    if not offset:
        coef, cov = np.polyfit(np.log(x), np.log(y), 1, cov=True)
        slope, err = coef[0], math.sqrt(max(cov[0, 0], 0.0))
        return float(1.0 / slope), float(err / slope**2)
    if x.size < 4:
        raise ValueError(f"the offset fit needs at least 4 volumes, got {x.size}")
    from scipy.optimize import curve_fit

    (a, b, p), cov = curve_fit(lambda n, a, b, p: a + b * n**p, x, y, p0=(0.0, y[-1] / math.sqrt(x[-1]), 0.5))
    return float(1.0 / p), float(math.sqrt(max(cov[2, 2], 0.0)) / p**2)


# ----------------------------------------------------------------------------------------------
# invariants


def check_invariants(state: CDTState) -> dict[str, jax.Array]:
    """Structural checks (jit/vmap-able); returns name -> bool scalar, all True for a valid state.

    * ``bags``: tperm/tpos and vperm/vpos are inverse permutations; counts in range.
    * ``neighbours``: tl/tr/tc of live triangles are live; ``tr[tl[t]] = tl[tr[t]] = tc[tc[t]] = t``;
      tc has the opposite type; times consistent (tc of an up triangle in strip t lies in t-1).
    * ``gluing``: the timelike edge shared with tr has the same (bottom, top) vertices; tc shares the
      base (vl, vr); every vertex of a triangle is live and on the right slice.
    * ``slices``: ``vtu[v]`` is an up triangle starting at v; following spatial links ``v -> vr`` closes
      every slice into one circle of exactly ``lengths[t]`` >= 3 vertices.
    * ``euler``: N2 = 2 N0 = 2 sum l_t and every live vertex is used, so with E = 3 N2 / 2 (each edge
      in two triangles), chi = N0 - E + N2 = 0; equal numbers of up and down triangles.
    """
    s = state
    c2, c0 = s.ttype.shape[0], s.vtime.shape[0]
    T = s.lengths.shape[0]
    ids2, ids0 = jnp.arange(c2), jnp.arange(c0)
    at, av = live_triangles(s), live_vertices(s)
    ok = {}
    ok["bags"] = (jnp.all(s.tpos[s.tperm] == ids2) & jnp.all(s.vpos[s.vperm] == ids0)
                  & (s.n2 >= 0) & (s.n2 <= c2) & (s.n0 >= 0) & (s.n0 <= c0))

    def live_all(cond):
        return jnp.all(jnp.where(at, cond, True))

    tl, tr, tc = jnp.clip(s.tl, 0, c2 - 1), jnp.clip(s.tr, 0, c2 - 1), jnp.clip(s.tc, 0, c2 - 1)
    up = s.ttype == UP
    ok["neighbours"] = (
        live_all(at[tl] & at[tr] & at[tc])
        & live_all((s.tr[tl] == ids2) & (s.tl[tr] == ids2) & (s.tc[tc] == ids2) & (tc != ids2))
        & live_all(s.ttype[tc] != s.ttype)
        & live_all((s.ttime[tl] == s.ttime) & (s.ttime[tr] == s.ttime))
        & live_all(jnp.where(up, s.ttime[tc] == (s.ttime - 1) % T, s.ttime[tc] == (s.ttime + 1) % T))
        & live_all((s.ttype == UP) | (s.ttype == DOWN))
    )
    vl, vr, vc = (jnp.clip(s.tv[:, k], 0, c0 - 1) for k in range(3))
    bot_l, top_l = jnp.where(up, vl, vc), jnp.where(up, vc, vl)
    bot_r, top_r = jnp.where(up, vr, vc), jnp.where(up, vc, vr)
    base_t = jnp.where(up, s.ttime, (s.ttime + 1) % T)
    apex_t = jnp.where(up, (s.ttime + 1) % T, s.ttime)
    ok["gluing"] = (
        live_all((bot_r == bot_l[tr]) & (top_r == top_l[tr]))
        & live_all((vl == vl[tc]) & (vr == vr[tc]))
        & live_all(av[vl] & av[vr] & av[vc] & (s.tv >= 0).all(1) & (s.tv < c0).all(1))
        & live_all((s.vtime[vl] == base_t) & (s.vtime[vr] == base_t) & (s.vtime[vc] == apex_t))
    )
    vtu = jnp.clip(s.vtu, 0, c2 - 1)
    right = jnp.where(av, vr[vtu], ids0)
    vtu_ok = jnp.all(jnp.where(av, at[vtu] & (s.ttype[vtu] == UP) & (vl[vtu] == ids0), True))
    # cycle length of v under `right`: first k >= 1 with right^k(v) = v (capped at c0 + 1)
    def body(k, carry):
        cur, cyc = carry
        cur = right[cur]
        cyc = jnp.where((cyc == 0) & (cur == ids0), k, cyc)
        return cur, cyc

    _, cyc = jax.lax.fori_loop(1, c0 + 1, body, (ids0, jnp.zeros(c0, jnp.int32)))
    same_slice = jnp.all(jnp.where(av, s.vtime[right] == s.vtime, True))
    vt = jnp.clip(s.vtime, 0, T - 1)
    counts = jnp.zeros(T, jnp.int32).at[jnp.where(av, vt, T)].add(1, mode="drop")
    ok["slices"] = (vtu_ok & same_slice & jnp.all(jnp.where(av, cyc == s.lengths[vt], True))
                    & jnp.all(counts == s.lengths) & jnp.all(s.lengths >= 3))
    used = jnp.zeros(c0, bool).at[jnp.where(at[:, None], s.tv, c0).reshape(-1)].set(True, mode="drop")
    n_up = jnp.sum(at & up)
    ok["euler"] = ((s.n2 == 2 * s.n0) & (s.n0 == s.lengths.sum()) & jnp.all(used == av)
                   & (2 * n_up == s.n2) & (s.n0 - 3 * s.n2 // 2 + s.n2 == 0) & (s.n2 % 2 == 0))
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
    return math.comb(a + b - 1, a - 1) * b


def log_length_weight(lengths, lam: float) -> float:
    """log of the exact unnormalised probability of a slice-length vector (see module docstring)."""
    ls = [int(v) for v in lengths]
    T = len(ls)
    val = -2.0 * lam * sum(ls) - sum(math.log(v) for v in ls)
    return val + sum(math.log(strip_count(ls[t], ls[(t + 1) % T])) for t in range(T))


def transfer_matrix(lam: float, l_max: int) -> np.ndarray:
    """Symmetric transfer matrix M[a, b] = e^{-lam(a+b)} S(a, b) / sqrt(a b) for 3 <= a, b <= l_max.

    Index k corresponds to l = k + 3. Z(T) = Tr M^T (up to the truncation at l_max).
    """
    from scipy.special import gammaln

    ls = np.arange(3, l_max + 1, dtype=float)
    a, b = ls[:, None], ls[None, :]
    logm = -lam * (a + b) + gammaln(a + b) - gammaln(a) - gammaln(b) - 0.5 * np.log(a * b)
    return np.exp(logm)


def exact_mean_length(lam: float, n_slices: int | None, l_max: int | None = None) -> float:
    """Exact <l_t> on a torus of ``n_slices`` slices from the transfer matrix (lam > ln 2).

    ``n_slices=None``: the T -> infinity limit, ``<psi_0| l |psi_0>`` of the top eigenvector.

    ``l_max`` (truncation) defaults to 40/sqrt(lam - ln 2) + 60, far in the exponential tail
    ``~ exp(-2 sqrt(lam - ln 2) l)``.
    """
    if lam <= LN2:
        raise ValueError(f"lam={lam} must exceed ln 2 = {LN2:.6f}")
    if l_max is None:
        l_max = int(40.0 / math.sqrt(lam - LN2)) + 60
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
    out: list[list[int]] = []
    for t in range(s.lengths.shape[0]):
        vs = np.nonzero(alive & (np.asarray(s.vtime) == t))[0]
        order = [int(vs[0])]
        for _ in range(int(s.lengths[t]) - 1):
            order.append(int(s.tv[s.vtu[order[-1]], 1]))
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
    alive = np.asarray(s.tpos) < int(s.n2)
    T = len(orders)
    for tri in np.nonzero(alive)[0]:
        a, b, c = (int(x) for x in s.tv[tri])
        for p, q in ((a, b), (a, c), (b, c)):
            if abs(xpos[p] - xpos[q]) > 0.5 or abs(ypos[p] - ypos[q]) > 1:
                continue
            ax.plot([xpos[p], xpos[q]], [ypos[p], ypos[q]], color=color, lw=lw)
    ax.set_xlabel("spatial position (fraction of slice)")
    ax.set_ylabel("time slice t")
    ax.set_ylim(-0.5, T - 0.5)
    return ax
