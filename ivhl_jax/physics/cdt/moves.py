"""The CDT moves on the packed buffer, and the kernel of the pure-JAX engine (``engine="jax"``, :func:`attempts`;
a sweep of a chain is the step of :func:`~ivhl_jax.physics.cdt.metropolis`).

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
by the test-suite.

An attempt is one round of gathers from the buffer and ONE scatter into it: XLA:CPU updates a
while-loop buffer in place only when every read of it feeds the scatter that updates it; a second
loop-carried array, or a read after the write, makes it copy the whole buffer every attempt.

The vertex index is drawn exactly as ``floor(word N0 / 2^32)`` from a uint32 word in 32-bit arithmetic,
which addresses ``N0 <= 2^16`` (:data:`MAX_VERTEX_CAPACITY`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.physics.cdt.state import DOWN, UP, CDTState, buffer_layout

__all__ = [
    "MAX_VERTEX_CAPACITY",
    "attempt",
    "attempts",
    "sweep_length",
    "SweepRequest",
    "sweep_request",
    "apply_flip",
    "apply_insertion",
    "apply_removal",
    "is_removable",
    "log_acceptance",
]

#: Most vertex slots the JAX engine addresses: the exact 32-bit multiply-high index draw needs N0 <= 2^16.
MAX_VERTEX_CAPACITY = 1 << 16


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


def move_writes(buf, lay, bits, params, c0, stop_n0=None, active=None):
    """(index, value, enabled) triples of one attempt, every value gathered from ``buf`` before any write.

    With ``stop_n0`` the attempt is a no-op (not even counted) once n0 == stop_n0; with ``active`` (a bool)
    it is a no-op where ``active`` is False."""

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
    ins = _insertion_site(g, w, n0, c0)
    acc_add = is_add & (log_u < log_acceptance("add", n0, 2 * n0, params))
    do_add = acc_add & ins.fits
    # (4,2) removal of vertex w: its left neighbour a owns the up/down triangles left of it
    lu, ld = g("tl", ins.up), g("tl", ins.dn)
    removable = _removable(lu, ld, ins.len_t)
    do_del = is_del & removable & (log_u < log_acceptance("delete", n0, 2 * n0, params))
    pos_w, last = g("vpos", w), g("vperm", jnp.maximum(n0 - 1, 0))
    live = jnp.bool_(True) if stop_n0 is None else n0 != stop_n0
    if active is not None:
        live = live & active
    do_flip, do_add, do_del, acc_add = do_flip & live, do_add & live, do_del & live, acc_add & live
    accepted = do_flip | do_add | do_del
    return [
        *_flip_writes(g, at, t1, t2, fl, fr, do_flip),
        *_insertion_writes(g, at, ins, w, n0, do_add),
        *_removal_writes(at, ins, w, n0, lu, ld, pos_w, last, do_del),
        # bookkeeping
        (at("attempts", kind), g("attempts", kind) + 1, live),
        (at("accepts", kind), g("accepts", kind) + 1, accepted),
        (at("overflow", 0), jnp.int32(1), acc_add & ~ins.fits),
    ]


class _InsertionSite(NamedTuple):
    """The slots an insertion on the link from vertex w to its right neighbour ``bv`` reads and writes: w's up and
    down triangles ``up``/``dn``, the new vertex ``av`` (the first free slot) with its triangles ``au``/``ad``,
    the right neighbours ``ax``/``ay`` of up/dn, w's slice ``t`` of length ``len_t``, and whether av ``fits``."""

    up: jax.Array
    dn: jax.Array
    fits: jax.Array
    av: jax.Array
    au: jax.Array
    ad: jax.Array
    ax: jax.Array
    ay: jax.Array
    bv: jax.Array
    t: jax.Array
    len_t: jax.Array


def _insertion_site(g, w, n0, c0) -> _InsertionSite:
    up, dn = 2 * w, 2 * w + 1
    fits = n0 + 1 <= c0
    av = g("vperm", jnp.minimum(n0, c0 - 1))
    au, ad = 2 * av, 2 * av + 1
    ax, ay = g("tr", up), g("tr", dn)
    bv, t = g("vright", w), g("vtime", w)
    return _InsertionSite(up, dn, fits, av, au, ad, ax, ay, bv, t, g("lengths", t))


def _flip_writes(g, at, t1, t2, fl, fr, f):
    """flip: fl t1 t2 fr -> fl t2 t1 fr; t1's new apex is t2's base-right vertex, t2's is t1's base-left."""
    return [
        (at("tr", fl), t2, f),
        (at("tl", t2), fl, f),
        (at("tr", t2), t1, f),
        (at("tl", t1), t2, f),
        (at("tr", t1), fr, f),
        (at("tl", fr), t1, f),
        (at("apex", t1), g("vright", t2 // 2), f),
        (at("apex", t2), t1 // 2, f),
    ]


def _insertion_writes(g, at, s: _InsertionSite, w, n0, on):
    """insertion: up au ax and dn ad ay in the two strips; au/ad keep the apexes of up/dn."""
    return [
        (at("tr", s.up), s.au, on),
        (at("tl", s.au), s.up, on),
        (at("tr", s.au), s.ax, on),
        (at("tl", s.ax), s.au, on),
        (at("tr", s.dn), s.ad, on),
        (at("tl", s.ad), s.dn, on),
        (at("tr", s.ad), s.ay, on),
        (at("tl", s.ay), s.ad, on),
        (at("apex", s.au), g("apex", s.up), on),
        (at("apex", s.ad), g("apex", s.dn), on),
        (at("vright", w), s.av, on),
        (at("vright", s.av), s.bv, on),
        (at("vtime", s.av), s.t, on),
        (at("lengths", s.t), s.len_t + 1, on),
        (at("n0", 0), n0 + 1, on),
    ]


def _removal_writes(at, s: _InsertionSite, w, n0, lu, ld, pos_w, last, r):
    """removal: the triangles right of w (2w, 2w+1) leave, relinking w's left neighbours ``lu``/``ld`` (of the
    vertex a = lu // 2) to their right ones; swap-remove w from the live bag (its position ``pos_w``, the bag's
    ``last`` vertex)."""
    return [
        (at("tr", lu), s.ax, r),
        (at("tl", s.ax), lu, r),
        (at("tr", ld), s.ay, r),
        (at("tl", s.ay), ld, r),
        (at("vright", lu // 2), s.bv, r),
        (at("lengths", s.t), s.len_t - 1, r),
        (at("n0", 0), n0 - 1, r),
        (at("vperm", pos_w), last, r),
        (at("vperm", n0 - 1), w, r),
        (at("vpos", last), pos_w, r),
        (at("vpos", w), n0 - 1, r),
    ]


def _apply(buf, writes):
    size = buf.shape[0]
    idx = jnp.stack([jnp.where(on, i, size) for i, _, on in writes])
    val = jnp.stack([jnp.asarray(v, jnp.int32) for _, v, _ in writes])
    return buf.at[idx].set(val, mode="drop")


def _attempt_buf(buf, bits, params, lay, c0, stop_n0=None, active=None):
    return _apply(buf, move_writes(buf, lay, bits, params, c0, stop_n0, active))


def attempt(state: CDTState, bits: jax.Array, params: Any) -> CDTState:
    """One Metropolis attempt driven by two uint32 words ``bits``: ``bits[1] & 3`` picks the move (0, 1 flip;
    2 add; 3 delete), bit 2 a coin, bits 8..31 the acceptance uniform; ``bits[0]`` the vertex (exact
    ``floor(bits[0] N0 / 2^32)``-th live vertex)."""
    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    return state.replace(buf=_attempt_buf(state.buf, jnp.asarray(bits, jnp.uint32), params, lay, state.vertex_capacity))


class _Couplings(NamedTuple):
    """The couplings a move reads (``lam``, ``eps``, ``target``), for moves forced outside a chain."""

    lam: float
    eps: float
    target: float


def _forced(state: CDTState, vertex, move: int, coin: int = 0) -> CDTState:
    """Apply one move unconditionally: the attempt with acceptance uniform 0 on the vertex at bag position
    of ``vertex`` (only for tests and docs; the caller guarantees the move is possible)."""
    pos = int(np.asarray(state.vpos)[int(vertex)])
    n0 = int(state.n0)
    word = -(-(pos << 32) // n0)  # smallest word with floor(word n0 / 2^32) == pos
    bits = jnp.asarray([word, move | (coin << 2)], jnp.uint32)
    big = _Couplings(lam=-1e3 if move == 2 else 1e3, eps=0.0, target=0.0)
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
    (:func:`move_writes`) both call it (the host kernel, numba, spells it out in
    :mod:`ivhl_jax.physics.cdt.host_kernels`; the bit-identity test ties the two)."""
    return ((lu & 1) == UP) & ((ld & 1) == DOWN) & (slice_length > 3)


def is_removable(state: CDTState, v) -> jax.Array:
    """Whether vertex ``v`` has one future and one past link and its slice has more than 3 vertices."""
    return _removable(state.tl[2 * v], state.tl[2 * v + 1], state.lengths[state.vtime[v]])


def _delta_action(n2, dn2, params: Any):
    # (N + d - V)^2 - (N - V)^2 = d (2 (N - V) + d), written so float32 stays exact for large N
    dev = n2.astype(jnp.float32) - params.target
    return params.lam * dn2 + params.eps * dn2 * (2.0 * dev + dn2)


def log_acceptance(kind: str, n0, n2, params: Any):
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


# with stop_at_first_hit, a sweep makes at most EXTRA_ATTEMPTS * (attempts of the sweep) more attempts
EXTRA_ATTEMPTS = 10


def attempts(
    buf: jax.Array, bits: jax.Array, params: Any, lay: dict[str, tuple[int, int]], c0: int, stop_n0: Any = None
) -> jax.Array:
    """The JAX engine's kernel: one Metropolis attempt per row of ``bits [n, 2]`` (uint32 words, as in
    :func:`attempt`) on the packed buffer ``buf`` of layout ``lay`` (:func:`~ivhl_jax.physics.cdt.state.buffer_layout`)
    and vertex capacity ``c0``; with ``stop_n0`` every attempt is a no-op once N0 equals it. Returns the buffer.
    (The host and Pallas engines' ``attempts`` run the same words to the same bits.)"""
    return jax.lax.fori_loop(0, bits.shape[0], lambda i, b: _attempt_buf(b, bits[i], params, lay, c0, stop_n0), buf)


class SweepRequest(NamedTuple):
    """One sweep asked of an engine that draws its own random words (``engine="host"`` or ``"pallas"``).

    Attributes:
      seed: (..., 2) uint32, the seed of each chain's words.
      n: the attempts (a fixed count, :func:`sweep_length`; None: ``params.attempts_per_sweep``).
      lay: the buffer's layout (:func:`~ivhl_jax.physics.cdt.state.buffer_layout`).
      c0: the buffer's vertex slots (``CDTState.vertex_capacity``).
      target_n0: None; or, after the ``n`` attempts, attempts until n0 == target_n0 (the biased first-hit rule,
        a bounded number; a miss increments ``missed_target``).
    """

    seed: Any
    n: int | None
    lay: dict[str, tuple[int, int]]
    c0: int
    target_n0: Any = None


def sweep_request(key: jax.Array, state: CDTState, params: Any, n: int | None = None) -> SweepRequest:
    """The sweep of ``state`` an engine runs for the stepper: two seed words drawn from ``key``, ``n`` attempts
    (None: ``params.attempts_per_sweep``) on the state's buffer, and with ``params.stop_at_first_hit`` the target
    n0 = target N2 / 2."""
    lay = buffer_layout(state.vertex_capacity, state.n_slices)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    target_n0 = jnp.asarray(params.target, jnp.float32).astype(jnp.int32) // 2 if params.stop_at_first_hit else None
    return SweepRequest(seed, n, lay, state.vertex_capacity, target_n0)


def sweep_length(n: Any, params: Any) -> int:
    """The attempts of one sweep: ``n``, or ``params.attempts_per_sweep`` when ``n`` is None; a positive integer
    fixed before the sweep runs (never read from the state)."""
    n = params.attempts_per_sweep if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
        raise ValueError(
            f"a sweep is a fixed number of attempts >= 1, got {n!r}; pass n or set "
            "attempts_per_sweep (cdt.metropolis(...).init fixes it for a chain)"
        )
    return int(n)
