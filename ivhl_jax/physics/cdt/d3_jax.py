"""The 2+1D CDT JAX engine (``engine="jax"`` of :func:`~ivhl_jax.physics.cdt.metropolis_3d`): the host engine's
Markov chain in pure XLA on the same packed buffer (:mod:`~ivhl_jax.physics.cdt.d3_state`), so it jits, ``vmap``s
over chains and runs on any device; :mod:`~ivhl_jax.physics.cdt.d3_checks`, ``observe_3d`` and the host engine
read its states.

One attempt is the host engine's (:mod:`~ivhl_jax.physics.cdt.d3_host`, where the proposal and the
Metropolis–Hastings ratios are derived): a move family uniformly ((2,6)/(6,2), (4,4), (2,3)/(3,2)), a uniform
(3,1) tetrahedron (a uniform live vertex for the (6,2)), a face or base vertex (1/3), the time orientation (1/2),
the same manifold conditions and the same ratios for both measures and both volume-fixing choices; a sweep is the
same number of attempts, with ``stop_at_target``'s continuation. The random numbers are four uint32 words per
attempt from the chain's JAX key (``jax.random.bits`` in blocks of :data:`BLOCK` attempts): the index draws are
``floor(word n / 2^32)`` (exact in 32-bit limbs; the probabilities of two indices differ by at most ``n / 2^32``
relative), the acceptance uniform has 24 bits and the ratio is computed in float32.

How an attempt runs in XLA: every value is gathered from the buffer first, the five moves' proposals are one
``lax.switch`` (under ``vmap`` a select of all five), and the accepted move is ONE scatter of (index, value)
pairs into the buffer (rejected: every index dropped), so XLA updates the loop's buffer in place. The move that
replaces a cavity of ``nr`` tetrahedra by ``nn`` new ones (:func:`_replace_writes`) glues the new faces to each
other or to the cavity's outside by comparing their sorted vertex triples; the swap-remove bags are updated as a
batch (the removed entries' holes below the new prefix length are filled by the live entries above it), which
leaves other (equally valid) slot orders than the host's sequential swaps. The manifold conditions (the (4,4)'s
and (2,3)'s new edge, the (3,2)'s new triangle must not exist) scan the live tetrahedra for one containing those
vertices: O(capacity) work per attempt that needs it, where the host engine walks the vertex's star. Overflow
(a move that does not fit the capacity) is rejected and sets ``overflow``, as on the host.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.physics.cdt.d3_state import (
    COUNTS,
    MOVE_NAMES_3D,
    TYPE_13,
    TYPE_22,
    TYPE_31,
    SweepPlan,
    layout,
    vertex_capacity,
)

__all__ = ["sweep", "attempt", "apply_words", "proposal_words", "BLOCK"]

#: Attempts whose random words one ``jax.random.bits`` call draws (16 bytes per attempt and chain).
BLOCK = 1024
_N0, _N3, _N31, _N22, _OVF, _MISS = (COUNTS.index(k) for k in ("n0", "n3", "n31", "n22", "overflow", "missed_target"))
_M26, _M62, _M44, _M23, _M32 = range(5)
_MAXNEW = 6  # most tetrahedra a move creates (the (2,6)) or removes (the (6,2))
_I32 = jnp.int32


class _Couplings(NamedTuple):
    k0: jax.Array
    k3: jax.Array
    eps: jax.Array
    target: jax.Array


class _Proposal(NamedTuple):
    """One move proposed on the pre-attempt buffer: whether its conditions hold (``ok``), whether it overflows the
    capacity (``ovf``, counted only where the host counts it), its log ratio and whether a Metropolis test applies,
    the vertices ``check`` (3,) that no live tetrahedron may contain together (-1: unused; all -1: no check), and
    the cavity: ``rem`` (6,) of which ``nr`` removed, ``nv`` (6, 4) and ``ntype`` (6,) of which ``nn`` new; ``vnew``
    the vertex slot a (2,6) makes live (-1 none), ``vdel`` the vertex a (6,2) removes (-1 none)."""

    ok: jax.Array
    ovf: jax.Array
    log_r: jax.Array
    metro: jax.Array
    check: jax.Array
    rem: jax.Array
    nr: jax.Array
    nv: jax.Array
    ntype: jax.Array
    nn: jax.Array
    vnew: jax.Array
    vdel: jax.Array


def _mulhi(word: jax.Array, n: jax.Array) -> jax.Array:
    """``floor(word n / 2^32)`` for uint32 ``word`` and 0 <= n < 2^31, exactly, in 32-bit arithmetic (16-bit limbs):
    a uniform index in [0, n)."""
    n = n.astype(jnp.uint32)
    m16 = jnp.uint32(0xFFFF)
    wh, wl, nh, nl = word >> 16, word & m16, n >> 16, n & m16
    a, b, c = wh * nl, wl * nh, wl * nl
    low = ((a & m16) + (b & m16) + (c >> 16)) >> 16
    return (wh * nh + (a >> 16) + (b >> 16) + low).astype(_I32)


def _sort3(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    """The sorted vertex triple of a face, stacked on the last axis (..., 3)."""
    lo = jnp.minimum(jnp.minimum(a, b), c)
    hi = jnp.maximum(jnp.maximum(a, b), c)
    return jnp.stack([lo, a + b + c - lo - hi, hi], -1)


class _Buf:
    """Gathers from one chain's flat buffer by field name (indices clipped by XLA: garbage, never out of bounds, for
    a proposal that is not done) and the flat indices of the fields."""

    def __init__(self, buf: jax.Array, c3: int, t_n: int):
        self.buf = buf
        self.lay = layout(c3, t_n)
        self.c3, self.c0 = c3, vertex_capacity(c3, t_n)

    def at(self, name: str, i: Any) -> jax.Array:
        return self.lay[name][0] + jnp.asarray(i, _I32)

    def g(self, name: str, i: Any) -> jax.Array:
        return self.buf[self.at(name, i)]

    def tv(self, t: Any, i: Any) -> jax.Array:
        return self.g("tv", 4 * t + i)

    def tn(self, t: Any, i: Any) -> jax.Array:
        return self.g("tn", 4 * t + i)

    def tt(self, t: Any) -> jax.Array:
        return self.g("ttype", t)

    def cnt(self, k: int) -> jax.Array:
        return self.g("counts", k)

    def other(self, t: Any, excl: tuple[Any, ...], rows: int = 4) -> jax.Array:
        """The vertex among the first ``rows`` of tetrahedron ``t`` that is none of ``excl`` (the last one)."""
        vs = self.g("tv", 4 * jnp.asarray(t)[..., None] + jnp.arange(rows))
        off = jnp.all(jnp.stack([vs != e for e in excl]), 0)
        return jnp.max(jnp.where(off, vs, -1), -1)

    def position(self, t: Any, v: Any, field: str = "tv") -> jax.Array:
        """Position of ``v`` in row ``t`` of ``tv`` or ``tn`` (-1 if absent)."""
        row = self.g(field, 4 * jnp.asarray(t)[..., None] + jnp.arange(4))
        return jnp.max(jnp.where(row == jnp.asarray(v)[..., None], jnp.arange(4), -1), -1)


def _volume_delta(b: _Buf, dn: int, dn3: int, cp: _Couplings, fix_n3: bool) -> jax.Array:
    """The volume term's change ``eps d (2 (N_fix - target) + d)`` (0 without volume fixing)."""
    now, d = (b.cnt(_N3), dn3) if fix_n3 else (b.cnt(_N31), dn)
    dev = now.astype(jnp.float32) - cp.target
    return jnp.where(cp.target > 0, cp.eps * d * (2.0 * dev + d), 0.0)


def _rows(*rows: Any) -> jax.Array:
    """(6, 4) new-tetrahedron rows, padded with -1."""
    out = [jnp.stack([jnp.asarray(x, _I32) for x in r]) for r in rows]
    out += [jnp.full(4, -1, _I32)] * (_MAXNEW - len(rows))
    return jnp.stack(out)


def _vec(*xs: Any, fill: int = -1) -> jax.Array:
    return jnp.stack([jnp.asarray(x, _I32) for x in xs] + [jnp.asarray(fill, _I32)] * (_MAXNEW - len(xs)))


def _proposal(ok, ovf, log_r, metro, check, rem, nv, ntype, vnew=-1, vdel=-1) -> _Proposal:
    return _Proposal(
        ok=jnp.asarray(ok, bool),
        ovf=jnp.asarray(ovf, bool),
        log_r=jnp.asarray(log_r, jnp.float32),
        metro=jnp.asarray(metro, bool),
        check=jnp.stack([jnp.asarray(x, _I32) for x in check]),
        rem=_vec(*rem),
        nr=jnp.asarray(len(rem), _I32),
        nv=nv,
        ntype=_vec(*ntype, fill=0),
        nn=jnp.asarray(len(ntype), _I32),
        vnew=jnp.asarray(vnew, _I32),
        vdel=jnp.asarray(vdel, _I32),
    )


_NO_CHECK = (-1, -1, -1)


def _p26(b: _Buf, t, i, up, cp: _Couplings, fix_n3: bool, ref: bool) -> _Proposal:
    n0, n3 = b.cnt(_N0), b.cnt(_N3)
    n = b.cnt(_N31).astype(jnp.float32)
    ovf = (n3 + 6 > b.c3) | (n0 >= b.c0)
    geo = n / (n + 2.0) if ref else n / (n0 + 1).astype(jnp.float32)
    log_r = cp.k0 - 4.0 * cp.k3 - _volume_delta(b, 2, 4, cp, fix_n3) + jnp.log(geo)
    u = b.tn(t, 3)
    v0, v1, v2, vt = (b.tv(t, k) for k in range(4))
    vb = b.tv(u, 0)
    vn = b.g("vperm", jnp.minimum(n0, b.c0 - 1))
    pairs = ((v0, v1), (v1, v2), (v2, v0))
    nv = _rows(*((x, y, vn, vt) for x, y in pairs), *((vb, x, y, vn) for x, y in pairs))
    types = (TYPE_31,) * 3 + (TYPE_13,) * 3
    return _proposal(True, ovf, log_r, True, _NO_CHECK, (t, u), nv, types, vnew=vn)


def _p62(b: _Buf, v, i, up, cp: _Couplings, fix_n3: bool, ref: bool) -> _Proposal:
    ok = (b.g("cnum", v) == 6) & (b.g("scnum", v) == 3)
    t01 = b.g("vtet", v)
    p = jnp.maximum(b.position(t01, v), 0)
    a, c_b = b.tv(t01, (p + 1) % 3), b.tv(t01, (p + 2) % 3)
    ta, tb = b.tn(t01, (p + 2) % 3), b.tn(t01, (p + 1) % 3)
    ok &= (b.tt(ta) == TYPE_31) & (b.tt(tb) == TYPE_31)
    c = b.other(ta, (v, a), rows=3)
    ok &= (b.g("scnum", a) >= 4) & (b.g("scnum", c_b) >= 4) & (b.g("scnum", c) >= 4)
    n = b.cnt(_N31).astype(jnp.float32)
    geo = n / (n - 2.0) if ref else b.cnt(_N0).astype(jnp.float32) / (n - 2.0)
    log_r = -cp.k0 + 4.0 * cp.k3 - _volume_delta(b, -2, -4, cp, fix_n3) + jnp.log(geo)
    u01 = b.tn(t01, 3)
    vt, vb = b.tv(t01, 3), b.tv(u01, 0)
    rem = (t01, ta, tb, u01, b.tn(ta, 3), b.tn(tb, 3))
    nv = _rows((a, c_b, c, vt), (vb, a, c_b, c))
    return _proposal(ok, False, log_r, True, _NO_CHECK, rem, nv, (TYPE_31, TYPE_13), vdel=v)


def _p44(b: _Buf, t, i, up, cp: _Couplings, fix_n3: bool, ref: bool) -> _Proposal:
    t2 = b.tn(t, i)
    u, u2 = b.tn(t, 3), b.tn(t2, 3)
    ok = (b.tt(t2) == TYPE_31) & (b.position(u, u2, "tn") >= 0)
    ovf = ok & (b.cnt(_N3) + 4 > b.c3)
    a, p, q = b.tv(t, i), b.tv(t, (i + 1) % 3), b.tv(t, (i + 2) % 3)
    bb = b.other(t2, (p, q), rows=3)
    vt, vb = b.tv(t, 3), b.tv(u, 0)
    nv = _rows((a, bb, p, vt), (a, bb, q, vt), (vb, a, bb, p), (vb, a, bb, q))
    types = (TYPE_31, TYPE_31, TYPE_13, TYPE_13)
    return _proposal(ok, ovf, 0.0, False, (a, bb, -1), (t, t2, u, u2), nv, types)


def _p23(b: _Buf, t, i, up, cp: _Couplings, fix_n3: bool, ref: bool) -> _Proposal:
    a = jnp.where(up, t, b.tn(t, 3))
    apex, tri0 = jnp.where(up, 3, 0), jnp.where(up, 0, 1)
    fi = tri0 + i
    x = b.tn(a, fi)
    ok = b.tt(x) == TYPE_22
    ovf = ok & (b.cnt(_N3) + 3 > b.c3)
    v0 = b.tv(a, fi)
    b1, b2 = b.tv(a, tri0 + (i + 1) % 3), b.tv(a, tri0 + (i + 2) % 3)
    v3 = b.tv(a, apex)
    v1 = b.other(x, (b1, b2, v3))
    log_r = -cp.k3 - _volume_delta(b, 0, 1, cp, fix_n3)
    a0, a1, a2, a3 = (b.tv(a, k) for k in range(4))
    first = jnp.where(up, jnp.stack([a0, a1, a2, v1]), jnp.stack([v1, a1, a2, a3]))
    r1 = jnp.where(up, jnp.stack([v0, b1, v1, v3]), jnp.stack([v1, v3, v0, b1]))
    r2 = jnp.where(up, jnp.stack([v0, b2, v1, v3]), jnp.stack([v1, v3, v0, b2]))
    nv = _rows(first, r1, r2)
    types = (jnp.where(up, TYPE_31, TYPE_13), TYPE_22, TYPE_22)
    return _proposal(ok, ovf, log_r, True, (v0, v1, -1), (a, x), nv, types)


def _p32(b: _Buf, t, j, up, cp: _Couplings, fix_n3: bool, ref: bool) -> _Proposal:
    a = jnp.where(up, t, b.tn(t, 3))
    apex, tri0 = jnp.where(up, 3, 0), jnp.where(up, 0, 1)
    k, m = tri0 + (j + 1) % 3, tri0 + (j + 2) % 3
    x, y = b.tn(a, k), b.tn(a, m)
    ok = (b.tt(x) == TYPE_22) & (b.tt(y) == TYPE_22)
    v0, v1 = b.tv(a, tri0 + j), b.tv(a, apex)
    vk, vm = b.tv(a, k), b.tv(a, m)
    v3 = b.other(x, (v0, vm, v1))
    ok &= b.position(y, v3) >= 0
    log_r = cp.k3 - _volume_delta(b, 0, -1, cp, fix_n3)
    a0, a1, a2, a3 = (b.tv(a, q) for q in range(4))
    first = jnp.where(up, jnp.stack([a0, a1, a2, v3]), jnp.stack([v3, a1, a2, a3]))
    second = jnp.where(up, jnp.stack([vk, vm, v1, v3]), jnp.stack([v1, v3, vk, vm]))
    types = (jnp.where(up, TYPE_31, TYPE_13), TYPE_22)
    return _proposal(ok, False, log_r, True, (vk, vm, v3), (a, x, y), _rows(first, second), types)


_PROPOSALS = (_p26, _p62, _p44, _p23, _p32)


def _exists(b: _Buf, check: jax.Array) -> jax.Array:
    """Whether a live tetrahedron contains every vertex of ``check`` (3,) that is not -1 (an edge or a triangle of
    the triangulation): a scan of every slot."""
    tv = b.buf[b.lay["tv"][0] : b.lay["tv"][0] + 4 * b.c3].reshape(b.c3, 4)
    live = b.buf[b.lay["ttype"][0] : b.lay["ttype"][0] + b.c3] > 0
    has = jnp.all((tv[:, :, None] == check).any(1) | (check < 0), -1)
    return jnp.any(live & has)


def _first_of_equal(idx: jax.Array, en: jax.Array) -> jax.Array:
    """For entries ``idx`` (K,) enabled by ``en``: whether each is the first enabled entry with its value."""
    same = (idx[:, None] == idx[None, :]) & en[:, None] & en[None, :]
    earlier = jnp.tril(same, -1).any(1)
    return en & ~earlier


def _accumulate(b: _Buf, name: str, idx: jax.Array, delta: jax.Array, en: jax.Array, zero: jax.Array):
    """Writes adding ``delta`` (K,) to ``name[idx]`` (duplicates summed into one write per index; ``zero`` (K,):
    entries whose old value counts as 0, a vertex slot just made live)."""
    same = (idx[:, None] == idx[None, :]) & en[:, None] & en[None, :]
    total = jnp.sum(jnp.where(same, delta[None, :], 0), 1)
    old = jnp.where(zero, 0, b.g(name, idx))
    return b.at(name, idx), old + total, _first_of_equal(idx, en)


def _last_of_equal(idx: jax.Array, en: jax.Array) -> jax.Array:
    same = (idx[:, None] == idx[None, :]) & en[:, None] & en[None, :]
    later = jnp.triu(same, 1).any(1)
    return en & ~later


def _bag_removal(length: jax.Array, rem: jax.Array, rem_pos: jax.Array, ren: jax.Array, tail: jax.Array):
    """Remove the entries ``rem`` (6,) (enabled ``ren``, at positions ``rem_pos``) from the prefix of ``length``
    entries of a swap-remove bag whose entries at positions ``length - nr .. length - 1`` are ``tail`` (6,) (only
    the first ``nr`` used): the removed entries below the new length leave holes that the tail's kept entries
    fill, in order. Returns (new length, for each removed entry: its hole's partner entry and that entry's old
    position, and whether it has one)."""
    nr = jnp.sum(ren.astype(_I32))
    new_len = length - nr
    k = jnp.arange(_MAXNEW)
    tail_pos = new_len + k
    tail_on = k < nr
    kept = tail_on & ~jnp.any((tail[:, None] == rem[None, :]) & ren[None, :], 1)
    hole = ren & (rem_pos < new_len)
    rank_kept = jnp.cumsum(kept.astype(_I32)) - 1
    rank_hole = jnp.cumsum(hole.astype(_I32)) - 1
    pair = (rank_hole[:, None] == rank_kept[None, :]) & hole[:, None] & kept[None, :]  # (removed, tail)
    mover = jnp.sum(jnp.where(pair, tail[None, :], 0), 1)
    mover_pos = jnp.sum(jnp.where(pair, tail_pos[None, :], 0), 1)
    return new_len, mover, mover_pos, hole


def _replace_writes(b: _Buf, pr: _Proposal, vtime_new: jax.Array) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """(flat index, value, enabled) of the move ``pr`` (every value gathered before any write): the cavity
    ``rem[:nr]`` replaced by ``nv[:nn]``, the gluing, the bags, the counts and the per-vertex data (the module
    docstring). ``vtime_new``: the time of the (2,6)'s new vertex. The writes are listed in a fixed order:
    gluing, bags, per-vertex data, counts and the vertex bag."""
    kr = kn = jnp.arange(_MAXNEW)  # removed and new entries share the padded length
    ren, nen = kr < pr.nr, kn < pr.nn
    rem = jnp.where(ren, pr.rem, 0)
    nv = jnp.where(nen[:, None], pr.nv, 0)
    rv = b.g("tv", 4 * rem[:, None] + jnp.arange(4))  # (6, 4) the removed tetrahedra's vertices
    rtype = jnp.where(ren, b.tt(rem), 0)
    slots = b.g("tperm", jnp.minimum(b.cnt(_N3) + kn, b.c3 - 1))  # the new tetrahedra's slots
    is31, r31 = nen & (pr.ntype == TYPE_31), ren & (rtype == TYPE_31)  # the new and the removed (3,1)
    out = _gluing_writes(b, pr, rem, ren, rv, nv, nen, slots)
    bags, new3, d31 = _bag_writes(b, pr, rem, ren, is31, r31, slots)
    out += bags
    out += _vertex_writes(b, pr, vtime_new, rv, ren, r31, nv, nen, is31, slots)
    out += _count_writes(b, pr, vtime_new, ren, rtype, nen, new3, d31)
    return out


def _gluing_writes(
    b: _Buf,
    pr: _Proposal,
    rem: jax.Array,
    ren: jax.Array,
    rv: jax.Array,
    nv: jax.Array,
    nen: jax.Array,
    slots: jax.Array,
) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """The new tetrahedra's types and vertices, and the gluing: each new face to the new tetrahedron or to the
    outside tetrahedron across the cavity's boundary with the same vertices, and that outside tetrahedron's
    face back to the new one."""
    kn = jnp.arange(_MAXNEW)
    out: list[tuple[jax.Array, jax.Array, jax.Array]] = []
    # the cavity's boundary faces (removed tetrahedron, face i) whose neighbour stays, and their sorted triples
    rn = b.g("tn", 4 * rem[:, None] + jnp.arange(4))
    inside = jnp.any((rn[:, :, None] == rem[None, None, :]) & ren[None, None, :], -1)
    bnd = (ren[:, None] & ~inside).reshape(-1)  # (24,)
    bout = rn.reshape(-1)
    opp = [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]  # the face opposite vertex i
    bkey = jnp.stack([_sort3(rv[:, f[0]], rv[:, f[1]], rv[:, f[2]]) for f in opp], 1).reshape(-1, 3)
    bq = b.position(bout, jnp.repeat(rem, 4), "tn")  # the outside tetrahedron's face index towards the cavity

    # new slots, types, vertices
    out.append((b.at("ttype", slots), pr.ntype, nen))
    out.append((b.at("tv", 4 * slots[:, None] + jnp.arange(4)).reshape(-1), nv.reshape(-1), jnp.repeat(nen, 4)))
    nkey = jnp.stack([_sort3(nv[:, f[0]], nv[:, f[1]], nv[:, f[2]]) for f in opp], 1).reshape(-1, 3)
    fen = jnp.repeat(nen, 4)
    owner = jnp.repeat(kn, 4)
    eq_new = jnp.all(nkey[:, None] == nkey[None, :], -1) & fen[:, None] & fen[None, :]
    eq_new &= owner[:, None] != owner[None, :]
    eq_bnd = jnp.all(nkey[:, None] == bkey[None, :], -1) & fen[:, None] & bnd[None, :]  # (new face, boundary)
    in_new = jnp.any(eq_new, 1)
    glue_new = jnp.sum(jnp.where(eq_new, slots[owner][None, :], 0), 1)
    glue_out = jnp.sum(jnp.where(eq_bnd, bout[None, :], 0), 1)
    out.append((b.at("tn", 4 * slots[owner] + jnp.arange(24) % 4), jnp.where(in_new, glue_new, glue_out), fen))
    relink_to = jnp.sum(jnp.where(eq_bnd, slots[owner][:, None], 0), 0)  # (boundary,) the new slot across it
    out.append((b.at("tn", 4 * bout + bq), relink_to, bnd & jnp.any(eq_bnd, 0)))
    return out


def _bag_writes(
    b: _Buf,
    pr: _Proposal,
    rem: jax.Array,
    ren: jax.Array,
    is31: jax.Array,
    r31: jax.Array,
    slots: jax.Array,
) -> tuple[list[tuple[jax.Array, jax.Array, jax.Array]], jax.Array, jax.Array]:
    """The removed slots freed and taken out of the live-tetrahedron bag, and the (3,1) bag updated. Returns
    the writes, the new N3 and the change of N31."""
    kr = jnp.arange(_MAXNEW)
    n3, n31 = b.cnt(_N3), b.cnt(_N31)
    out: list[tuple[jax.Array, jax.Array, jax.Array]] = []
    # removed slots: free, and out of the live-tetrahedron bag
    out.append((b.at("ttype", rem), jnp.zeros(_MAXNEW, _I32), ren))
    len3 = n3 + pr.nn
    tail3 = b.g("tperm", jnp.clip(len3 - pr.nr + kr, 0, b.c3 - 1))
    rpos = b.g("tpos", rem)
    new3, mover, mover_pos, hole = _bag_removal(len3, rem, rpos, ren, tail3)
    out.append((b.at("tperm", rpos), mover, hole))
    out.append((b.at("tpos", mover), rpos, hole))
    out.append((b.at("tperm", mover_pos), rem, hole))
    out.append((b.at("tpos", rem), mover_pos, hole))

    # the (3,1) bag: the new (3,1) appended, then the removed (3,1) taken out (p31 -1)
    rank31 = jnp.cumsum(is31.astype(_I32)) - 1
    new31 = jnp.sum(is31.astype(_I32))
    nrem31 = jnp.sum(r31.astype(_I32))
    len31 = n31 + new31
    tpos31 = len31 - nrem31 + kr
    # entries of the tail: old ones from the buffer, appended ones from the new slots
    appended = tpos31 >= n31
    by_rank = jnp.sum(jnp.where((rank31[None, :] == (tpos31 - n31)[:, None]) & is31[None, :], slots[None, :], 0), 1)
    tail31 = jnp.where(appended, by_rank, b.g("l31", jnp.clip(tpos31, 0, b.c3 - 1)))
    # the tail is only the first nrem31 entries: mask the rest so they are never taken as movers
    tail31 = jnp.where(kr < nrem31, tail31, -2)
    rp31 = b.g("p31", rem)
    _, mv31, mvpos31, hole31 = _bag_removal(len31, jnp.where(r31, rem, -3), rp31, r31, tail31)
    # final position of each new (3,1): appended at n31 + rank, or moved into a hole
    apos = n31 + rank31
    moved = (mv31[None, :] == slots[:, None]) & hole31[None, :]  # (new, removed)
    fpos = jnp.where(moved.any(1), jnp.sum(jnp.where(moved, rp31[None, :], 0), 1), apos)
    out.append((b.at("l31", fpos), slots, is31))
    out.append((b.at("p31", slots), fpos, is31))
    old_mover = hole31 & (mvpos31 < n31)
    out.append((b.at("l31", rp31), mv31, old_mover))
    out.append((b.at("p31", mv31), rp31, old_mover))
    out.append((b.at("p31", rem), jnp.full(_MAXNEW, -1, _I32), r31))
    return out, new3, new31 - nrem31


def _vertex_writes(
    b: _Buf,
    pr: _Proposal,
    vtime_new: jax.Array,
    rv: jax.Array,
    ren: jax.Array,
    r31: jax.Array,
    nv: jax.Array,
    nen: jax.Array,
    is31: jax.Array,
    slots: jax.Array,
) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """Per-vertex counts: cnum (every vertex of every new/removed tetrahedron), scnum and the slices ((3,1)
    bases), and each new (3,1)'s base vertices' representative tetrahedron."""
    fen = jnp.repeat(nen, 4)
    out: list[tuple[jax.Array, jax.Array, jax.Array]] = []

    def zero_of(v: jax.Array) -> jax.Array:  # the (2,6)'s new vertex: its slot's old counts are stale
        return (pr.vnew >= 0) & (v == pr.vnew)

    cv = jnp.concatenate([nv.reshape(-1), rv.reshape(-1)])
    cd = jnp.concatenate([jnp.ones(24, _I32), -jnp.ones(24, _I32)])
    ce = jnp.concatenate([fen, jnp.repeat(ren, 4)])
    out.append(_accumulate(b, "cnum", cv, cd, ce, zero_of(cv)))
    sv = jnp.concatenate([nv[:, :3].reshape(-1), rv[:, :3].reshape(-1)])
    sd = jnp.concatenate([jnp.ones(18, _I32), -jnp.ones(18, _I32)])
    se = jnp.concatenate([jnp.repeat(is31, 3), jnp.repeat(r31, 3)])
    out.append(_accumulate(b, "scnum", sv, sd, se, zero_of(sv)))
    base0 = jnp.concatenate([nv[:, 0], rv[:, 0]])
    times = jnp.where(zero_of(base0), vtime_new, b.g("vtime", base0))
    sl_d = jnp.concatenate([jnp.ones(6, _I32), -jnp.ones(6, _I32)])
    out.append(_accumulate(b, "slices", times, sl_d, jnp.concatenate([is31, r31]), jnp.zeros(12, bool)))
    vt_v = nv[:, :3].reshape(-1)
    vt_en = jnp.repeat(is31, 3)
    out.append((b.at("vtet", vt_v), jnp.repeat(slots, 3), _last_of_equal(vt_v, vt_en)))
    return out


def _count_writes(
    b: _Buf,
    pr: _Proposal,
    vtime_new: jax.Array,
    ren: jax.Array,
    rtype: jax.Array,
    nen: jax.Array,
    new3: jax.Array,
    d31: jax.Array,
) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """The counts (N0, N3, N31, N22; ``new3`` the new N3, ``d31`` the change of N31) and the vertex bag: a (2,6)
    takes slot vperm[n0] (already in place) and sets its vertex's time, a (6,2) swap-removes its vertex."""
    n0 = b.cnt(_N0)
    n22d = jnp.sum((nen & (pr.ntype == TYPE_22)).astype(_I32)) - jnp.sum((ren & (rtype == TYPE_22)).astype(_I32))
    dn0 = (pr.vnew >= 0).astype(_I32) - (pr.vdel >= 0).astype(_I32)
    cidx = jnp.asarray([_N0, _N3, _N31, _N22])
    cval = jnp.stack([n0 + dn0, new3, b.cnt(_N31) + d31, b.cnt(_N22) + n22d])
    out = [(b.at("counts", cidx), cval, jnp.ones(4, bool))]
    out.append((b.at("vtime", pr.vnew)[None], vtime_new[None], (pr.vnew >= 0)[None]))
    vd = jnp.maximum(pr.vdel, 0)
    i_d, last = b.g("vpos", vd), b.g("vperm", jnp.maximum(n0 - 1, 0))
    on = jnp.broadcast_to(pr.vdel >= 0, (4,))
    idx = jnp.stack([b.at("vperm", i_d), b.at("vpos", last), b.at("vperm", n0 - 1), b.at("vpos", vd)])
    out.append((idx, jnp.stack([last, i_d, vd, n0 - 1]), on))
    return out


def attempt(
    buf: jax.Array,
    bits: jax.Array,
    couplings: tuple[Any, Any, Any, Any],
    tetra_capacity: int,
    n_slices: int,
    *,
    fix_n3: bool,
    reference: bool,
    active: Any = True,
) -> jax.Array:
    """One attempt on one chain's buffer (size,) from the uint32 words ``bits`` (4,): returns the new buffer
    (counted in ``attempts``/``accepts``; a no-op, uncounted, where ``active`` is False). ``couplings``: ``(k0,
    k3, eps, target)`` float32 scalars."""
    b = _Buf(buf, int(tetra_capacity), int(n_slices))
    cp = _Couplings(*(jnp.asarray(x, jnp.float32) for x in couplings))
    r = _mulhi(bits[0], jnp.asarray(12))
    family, sub = r // 4, r % 4
    kind = jnp.where(family == 0, jnp.where(sub & 1 == 0, _M26, _M62), jnp.where(family == 1, _M44, 0))
    kind = jnp.where(family == 2, jnp.where(sub & 1 == 0, _M23, _M32), kind)
    up = (sub >> 1) == 0
    pick_vertex = kind == _M62
    n_pick = jnp.where(pick_vertex, b.cnt(_N0), b.cnt(_N31))
    pos = _mulhi(bits[1], n_pick)
    a = jnp.where(pick_vertex, b.g("vperm", pos), b.g("l31", pos))
    i = _mulhi(bits[2], jnp.asarray(3))
    u = (bits[3] >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
    branches = [lambda t, j, o, f=f: f(b, t, j, o, cp, fix_n3, reference) for f in _PROPOSALS]
    pr: _Proposal = jax.lax.switch(kind, branches, a, i, up)
    active = jnp.asarray(active, bool)
    passes = active & pr.ok & ~pr.ovf & (~pr.metro | (u < jnp.exp(pr.log_r)))
    needs = passes & jnp.any(pr.check >= 0)
    # under vmap the cond runs both branches (a select): the scan then runs every attempt
    exists = jax.lax.cond(needs, lambda: _exists(b, pr.check), lambda: jnp.bool_(False))
    do = passes & ~(needs & exists)
    vtime_new = b.g("vtime", b.tv(jnp.maximum(pr.rem[0], 0), 0))  # a (2,6)'s new vertex: its (3,1)'s base time
    writes = _replace_writes(b, pr, vtime_new)
    idx = jnp.concatenate([w[0].reshape(-1) for w in writes])
    val = jnp.concatenate([jnp.asarray(w[1], _I32).reshape(-1) for w in writes])
    en = jnp.concatenate([jnp.broadcast_to(w[2], w[0].shape).reshape(-1) for w in writes]) & do
    book = jnp.stack([b.at("attempts", kind), b.at("accepts", kind), b.at("counts", _OVF)])
    idx = jnp.concatenate([idx, book])
    val = jnp.concatenate([val, jnp.stack([b.g("attempts", kind) + 1, b.g("accepts", kind) + 1, jnp.int32(1)])])
    en = jnp.concatenate([en, jnp.stack([active, do, active & pr.ovf])])
    size = buf.shape[0]
    return buf.at[jnp.where(en, idx, size)].set(val, mode="drop")


def sweep(buf: jax.Array, key: jax.Array, couplings: tuple[Any, Any, Any, Any], plan: SweepPlan) -> jax.Array:
    """One sweep of ``plan`` on one chain's buffer (size,): ``attempts``/``accepts`` zeroed, ``plan.attempts``
    attempts with words from ``key``, then (``plan.until_target``) up to ``plan.max_extra`` more until
    ``N_fix == target`` (a miss increments ``missed_target``), as :func:`~ivhl_jax.physics.cdt.d3_host.sweep_chain`
    does. ``couplings``: ``(k0, k3, eps, target)`` scalars. jit/vmap-able."""
    if any(jnp.ndim(x) for x in couplings):
        raise ValueError(
            "the jax engine takes one chain's scalar couplings: map a batch of couplings with jax.vmap over the "
            "stepper together with the chains (vmap(trajectory)(stepper, chains))"
        )
    n, tetra_capacity, n_slices = plan.attempts, plan.tetra_capacity, plan.n_slices
    lay = layout(tetra_capacity, n_slices)
    k0, k3, eps, target = (jnp.asarray(x, jnp.float32) for x in couplings)
    cp = (k0, k3, eps, target)
    zero = jnp.concatenate([jnp.arange(lay[f][0], lay[f][0] + lay[f][1]) for f in ("attempts", "accepts")])
    buf = buf.at[zero].set(0)
    kw = dict(fix_n3=plan.fix_n3, reference=plan.reference)
    size = min(int(n), BLOCK)
    k_main, k_extra = jax.random.split(key)

    def run_block(blk, buf):
        # one body for every block (the last one shorter): one copy of the attempt in the compiled loop
        bits = jax.random.bits(jax.random.fold_in(k_main, blk), (size, 4), jnp.uint32)
        count = jnp.minimum(size, int(n) - blk * size)
        return jax.lax.fori_loop(0, count, lambda j, x: attempt(x, bits[j], cp, tetra_capacity, n_slices, **kw), buf)

    buf = jax.lax.fori_loop(0, -(-int(n) // size), run_block, buf)
    if plan.until_target:
        target = jnp.round(cp[3]).astype(_I32)
        c_fix = lay["counts"][0] + (_N3 if plan.fix_n3 else _N31)

        def more(state):
            j, x = state
            return (j < plan.max_extra) & (x[c_fix] != target)

        def one(state):
            j, x = state
            bits = jax.random.bits(jax.random.fold_in(k_extra, j), (4,), jnp.uint32)
            return j + 1, attempt(x, bits, cp, tetra_capacity, n_slices, **kw)

        _, buf = jax.lax.while_loop(more, one, (jnp.int32(0), buf))
        miss = lay["counts"][0] + _MISS
        buf = buf.at[miss].add((buf[c_fix] != target).astype(_I32))
    return buf


def _word(pos: int, n: int) -> int:
    """The smallest uint32 word whose index draw ``floor(word n / 2^32)`` is ``pos`` (0 <= pos < n)."""
    return -(-(int(pos) << 32) // int(n))


#: (family and sub-move draw r in [0, 12)) of each move and time orientation, as :func:`attempt` decodes it.
_CODE = {("26", True): 0, ("62", True): 1, ("44", True): 4, ("23", True): 8, ("32", True): 9}
_CODE |= {("23", False): 10, ("32", False): 11}


def proposal_words(buf: Any, tetra_capacity: int, n_slices: int, move: str, a: int, i: int = 0, up: bool = True):
    """The four uint32 words that make :func:`attempt` on ``buf`` propose ``move`` on the (3,1) slot ``a`` (the
    vertex slot for ``"62"``), face or base vertex ``i``, orientation ``up``, with acceptance uniform 0 (accepted
    whenever the move is valid: the ratio is positive). NumPy (4,) uint32."""
    from ivhl_jax.physics.cdt.d3_state import unpack

    if move not in MOVE_NAMES_3D:
        raise ValueError(f"move must be one of {MOVE_NAMES_3D}, got {move!r}")
    f = unpack(buf, tetra_capacity, n_slices)
    cnt = f["counts"]
    if move == "62":
        n, pos = int(cnt[_N0]), int(f["vpos"][a])
    else:
        n, pos = int(cnt[_N31]), int(f["p31"][a])
    if not 0 <= pos < n:
        raise ValueError(f"slot {a} is not a live {'vertex' if move == '62' else '(3,1) tetrahedron'}")
    code = _CODE[(move, bool(up) or move in ("26", "62", "44"))]
    return np.asarray([_word(code, 12), _word(pos, n), _word(int(i), 3), 0], np.uint32)


@functools.partial(jax.jit, static_argnames=("tetra_capacity", "n_slices", "fix_n3", "reference"))
def _attempt_jit(buf, bits, couplings, tetra_capacity, n_slices, fix_n3, reference):
    return attempt(buf, bits, couplings, tetra_capacity, n_slices, fix_n3=fix_n3, reference=reference)


def apply_words(
    buf: np.ndarray,
    words: Any,
    tetra_capacity: int,
    n_slices: int,
    *,
    couplings: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    fix_n3: bool = False,
    reference: bool = False,
) -> bool:
    """One :func:`attempt` with the four uint32 ``words`` (4,) (a move's :func:`proposal_words`, or any draw), in
    place on the NumPy buffer ``buf``; returns whether a move was done (an ``accepts`` counter moved: an attempt
    does at most one move). The door with the host engine's signature is
    :func:`~ivhl_jax.physics.cdt.d3_host.apply_move` with ``engine="jax"``."""
    if buf.dtype != np.int32 or buf.ndim != 1:
        raise ValueError("buf must be one chain's buffer: a 1-D int32 NumPy array")
    words = np.asarray(words)
    if words.shape != (4,) or words.dtype != np.uint32:
        raise ValueError(f"words must be four uint32 words (4,), got {words.dtype} {words.shape}")
    cp = tuple(np.float32(x) for x in couplings)
    out = np.asarray(_attempt_jit(buf, words, cp, int(tetra_capacity), int(n_slices), bool(fix_n3), bool(reference)))
    lo, n = layout(tetra_capacity, n_slices)["accepts"]
    done = bool(np.any(out[lo : lo + n] != buf[lo : lo + n]))
    buf[:] = out
    return done
