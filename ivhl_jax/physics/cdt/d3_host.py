"""The 2+1D CDT host engine: numba kernels doing the Metropolis–Hastings moves on the packed buffer of
:mod:`~ivhl_jax.physics.cdt.d3_state`, called through ``jax.pure_callback`` (:func:`sweep`), so the stepper of
:mod:`~ivhl_jax.physics.cdt.d3_stepper` is an ordinary jit/vmap-able Stepper (a batch of chains runs in parallel
threads). Every kernel is a module-level function compiled with ``cache=True`` (numba's disk cache).

Action and proposal (the conventions of the reference code JorenB/3d-cdt, ``simulation.cpp``)
--------------------------------------------------------------------------------------------
``S = -k0 N0 + k3 N3 + eps (N_fix - target)^2`` with ``N_fix = N(3,1)`` (the number of (3,1) tetrahedra = the total
spatial area, the reference's ``volfixswitch 0``) or ``N_fix = N3`` (``volfixswitch 1``); no volume term when
``target <= 0``. One attempt picks a move family uniformly (the reference's frequencies ``v1 = v2 = v3 = 1``):

* **(2,6)/(6,2)**, each with probability 1/2. (2,6): a uniform (3,1) tetrahedron (probability ``1/n``, ``n =
  N(3,1)``); a new vertex is put in its base triangle (the (3,1) and the (1,3) below become three of each):
  ``dN0 = 1, dN3 = 4, dn = 2``. (6,2): a uniform live vertex (``1/N0``), removed if it has exactly 6 tetrahedra
  and 3 spatial triangles and each of its 3 spatial neighbours keeps at least 3 triangles (the reference's
  ``strictness >= 2``).
* **(4,4)**: a uniform (3,1) and one of its three side neighbours (1/3); if that is a (3,1) and the (1,3) below
  the two are glued, the spatial edge they share is flipped (unless the new edge exists: ``strictness 3``). Each
  flip is proposed by 2 ordered pairs, before and after: symmetric, accepted always.
* **(2,3)/(3,2)**, each 1/2, then up or down 1/2. (2,3) up: a uniform (3,1) and one of its side neighbours
  (1/3); if that is a (2,2), their shared triangle is replaced by the timelike edge between the two opposite
  vertices (unless that edge exists). Down: the same from the (1,3) below a uniform (3,1). (3,2) up: a uniform
  (3,1) and one of its base vertices ``v0`` (1/3); if the two side neighbours containing ``v0`` are (2,2) and
  share their fourth vertex (the timelike edge from ``v0`` to the apex then has exactly 3 tetrahedra), the edge
  is replaced by a triangle (unless that triangle exists). The (2,3) and its inverse are both proposed with
  probability ``1/(12 n) · 1/3`` (n unchanged).

Metropolis–Hastings ratios (accepted with ``min(1, R)``; ``dV`` the volume term's change)::

    R(2,6) = e^{k0 - 4 k3 - dV} · n / (N0 + 1)          R(6,2) = e^{-k0 + 4 k3 - dV} · N0 / (n - 2)
    R(4,4) = 1                                          R(2,3) = e^{-k3 - dV},  R(3,2) = e^{k3 - dV}

the ratio of the proposal probabilities (``q(6,2)/q(2,6) = (1/N0') / (1/n)`` with ``N0' = N0 + 1`` the vertices
after the insertion) times ``e^{-dS}``: detailed balance with respect to ``e^{-S}``.

``measure="reference"`` uses the reference's ratios ``n/(n+2)`` and ``n/(n-2)`` instead of ``n/(N0+1)`` and
``N0/(n-2)`` (with its uniform-vertex removal, as here). That chain satisfies detailed balance with respect to
``e^{-S} h``, ``h(N0') / h(N0) = N0' / (2 N0' - 4T)`` (on spherical slices ``n = 2 N0 - 4T``): the reference samples
``e^{-S}`` times ``~2^{-N0}``: the reference at ``k0`` samples the action's ensemble at ``k0 - ln 2`` (up to a
factor ``~N0^{2T}``).
Since ``N0 = n/2 + 2T``, ``h`` is a function of ``n`` alone: at a fixed ``N(3,1)`` both measures give the same
ensemble. The reference's removal also uses ``e^{-4 eps (target - n - 1)}`` where the inverse of its insertion
factor is ``e^{-4 eps (target - n + 1)}``; here the volume factor is always the exact ``e^{-dV}``.

Manifold conditions: every slice stays a simplicial 2-sphere (no double edges; the reference's ``strictness
3``) and the triangulation a simplicial 3-manifold: the (4,4)'s new edge, the (2,3)'s new edge and the (3,2)'s
new triangle must not exist already (checked completely: a walk of the new edge's endpoint's star in the slab,
or of the tetrahedra around the spatial edge of the new triangle). The reference's (3,2) looks at the first
tetrahedron of that fan only and so admits states with two triangles on the same three vertices (no simplicial
complex), which lowers its ⟨N22⟩/⟨N31⟩; with this check inserted it agrees with ours
(``python -m ivhl_jax.bench.peer_cdt3_fan``, the CDT guide).

Random numbers: SplitMix64 (:func:`ivhl_jax.physics.cdt.host_kernels.splitmix`) seeded per chain and sweep from
the chain's JAX key; indices are exactly uniform (Lemire, :func:`~ivhl_jax.physics.cdt.host_kernels.draw_index`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ivhl_jax.core.validation import check_choice
from ivhl_jax.physics.cdt.d3_state import COUNTS, ENGINES, TYPE_13, TYPE_22, TYPE_31, SweepPlan, layout
from ivhl_jax.physics.cdt.host_kernels import draw_index, splitmix

__all__ = ["sweep", "sweep_chain", "apply_move", "transition_counts", "field_offsets", "FIELDS"]

#: The buffer fields, in the order of their offsets in ``off`` (the views tuple ``S`` of the kernels).
FIELDS = (
    "tv",
    "tn",
    "ttype",
    "tperm",
    "tpos",
    "l31",
    "p31",
    "vtime",
    "vtet",
    "scnum",
    "cnum",
    "vperm",
    "vpos",
    "slices",
    "counts",
    "attempts",
    "accepts",
)
TV, TN, TT, TPERM, TPOS, L31, P31, VTIME, VTET, SC, CN, VPERM, VPOS, SLICES, CNT, ATT, ACC = range(17)
N0, N3, N31, N22, OVF, MISS = (COUNTS.index(k) for k in ("n0", "n3", "n31", "n22", "overflow", "missed_target"))
M26, M62, M44, M23, M32 = range(5)
MAXNEW = 6  # most tetrahedra a move creates (the (2,6))
MAXBND = 12  # most boundary faces of a move's cavity (the (6,2): 6 tetrahedra, 2 faces each)
KEY_MASK = (1 << 21) - 1  # face keys pack three vertex ids of 21 bits (d3_state.MAX_TETRA_CAPACITY keeps them so)


@njit(cache=True)
def scratch(c3):
    """Per-chain work arrays, allocated once per sweep (no allocation in the attempt loop): the walk's marks,
    stack and stamp (:func:`has_edge`), a move's new tetrahedra ``nv`` (MAXNEW, 4) and types, the removed slots,
    the cavity's boundary face keys and outside tetrahedra, the new slots, the new tetrahedra's face keys."""
    return (
        np.zeros(c3, np.int32),
        np.empty(c3, np.int32),
        np.zeros(1, np.int32),
        np.empty((MAXNEW, 4), np.int32),
        np.empty(MAXNEW, np.int32),
        np.empty(MAXNEW, np.int32),
        np.empty(MAXBND, np.int64),
        np.empty(MAXBND, np.int32),
        np.empty(MAXNEW, np.int32),
        np.empty(4 * MAXNEW, np.int64),
    )


def field_offsets(c3: int, t_n: int) -> np.ndarray:
    """The kernels' ``off``: the start of each field of :data:`FIELDS` in the buffer, then each field's size."""
    lay = layout(c3, t_n)
    return np.asarray([lay[f][0] for f in FIELDS] + [lay[f][1] for f in FIELDS], np.int64)


# ---- borrowed views: NumPy views without a reference count. A numba array carries a pointer to its owner's
# reference count, and every time the compiled code binds, passes or drops one (the moves take and unpack the
# tuple of 17 field views at every attempt) it increments or decrements that count with an atomic instruction:
# hundreds per attempt, more than half of the attempt's time. Views made by ``carray`` from a raw address have no
# owner, so those updates are skipped; their owner (the chain's buffer, the scratch arrays) is alive for the
# whole kernel call that uses them.


@intrinsic
def _void_pointer(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@njit(inline="always")
def borrowed(a):
    """A view of the C-contiguous array ``a`` without a reference count (valid while ``a`` is alive)."""
    return carray(_void_pointer(a.ctypes.data), a.shape, a.dtype)  # type: ignore[call-arg]


@njit(inline="always")
def _field(buf, off, k, i):
    return carray(_void_pointer(buf.ctypes.data + 4 * off[i]), off[k + i], np.int32)  # type: ignore[call-arg]


@njit(cache=True)
def views(buf, off):
    """The fields of one chain's buffer (``off``: :func:`field_offsets`) as borrowed views, in :data:`FIELDS`
    order; valid while ``buf`` is alive."""
    k = len(off) // 2
    return (
        _field(buf, off, k, 0),
        _field(buf, off, k, 1),
        _field(buf, off, k, 2),
        _field(buf, off, k, 3),
        _field(buf, off, k, 4),
        _field(buf, off, k, 5),
        _field(buf, off, k, 6),
        _field(buf, off, k, 7),
        _field(buf, off, k, 8),
        _field(buf, off, k, 9),
        _field(buf, off, k, 10),
        _field(buf, off, k, 11),
        _field(buf, off, k, 12),
        _field(buf, off, k, 13),
        _field(buf, off, k, 14),
        _field(buf, off, k, 15),
        _field(buf, off, k, 16),
    )


@njit(cache=True)
def borrowed_work(w):
    """Borrowed views of the :func:`scratch` arrays ``w`` (valid while ``w`` is alive)."""
    return (
        borrowed(w[0]),
        borrowed(w[1]),
        borrowed(w[2]),
        borrowed(w[3]),
        borrowed(w[4]),
        borrowed(w[5]),
        borrowed(w[6]),
        borrowed(w[7]),
        borrowed(w[8]),
        borrowed(w[9]),
    )


# ---- small geometric queries


@njit(inline="always")
def _position(rows, t, x):
    """Position of ``x`` in row ``t`` of a flat table of 4-entry rows (vertices or neighbours), -1 if absent."""
    for i in range(4):
        if rows[4 * t + i] == x:
            return i
    return -1


@njit(inline="always")
def vidx(S, t, v):
    """Position of vertex ``v`` in tetrahedron ``t``, -1 if absent."""
    return _position(S[TV], t, v)


@njit(inline="always")
def glued(S, a, b):
    """Whether tetrahedron ``b`` is a face neighbour of ``a``."""
    return _position(S[TN], a, b) >= 0


@njit(inline="always")
def uniform01(rng):
    x, z = splitmix(rng[0])
    rng[0] = x
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def has_edge(S, a, b, upper, work):
    """Whether vertices ``a`` and ``b`` share an edge, ``b`` on ``a``'s slice or on the next (``upper``) or
    previous slice: a walk of the tetrahedra that contain ``a`` in that slab (they are face-connected: the star
    of a vertex is a ball and its part in one slab a half-ball). ``work``: :func:`scratch`."""
    tv, tn, vtime, vtet = S[TV], S[TN], S[VTIME], S[VTET]
    mark, stack, stamp = work[0], work[1], work[2]
    stamp[0] += 1
    st = stamp[0]
    start = vtet[a]
    if not upper:
        start = tn[4 * start + 3]
    slab = vtime[tv[4 * start]]
    top = 1
    stack[0] = start
    mark[start] = st
    while top > 0:
        top -= 1
        x = stack[top]
        for i in range(4):
            if tv[4 * x + i] == b:
                return True
        for i in range(4):
            if tv[4 * x + i] == a:
                continue
            y = tn[4 * x + i]
            if mark[y] == st or vtime[tv[4 * y]] != slab:
                continue
            mark[y] = st
            stack[top] = y
            top += 1
    return False


@njit(inline="always")
def fan_step(S, e1, e2, prev, cur):
    """The next tetrahedron around the spatial edge ``(e1, e2)`` after the (2,2) ``cur``, entered from ``prev``:
    across the face of ``cur`` that holds the edge and is not shared with ``prev``."""
    tv, tn = S[TV], S[TN]
    nxt = -1
    for i in range(4):
        w = tv[4 * cur + i]
        if w != e1 and w != e2 and vidx(S, prev, w) >= 0:
            nxt = tn[4 * cur + i]
    return nxt


@njit(cache=True)
def spatial_edge(S, a, b):
    """Whether vertices ``a`` and ``b`` of one slice share a spatial edge: a walk once around ``a`` in its slice,
    over the (3,1) tetrahedra on the spatial triangles at ``a`` (``scnum[a]`` of them) and the (2,2) between
    consecutive ones (the fan of the slab above around the spatial edge they share). Cheaper than
    :func:`has_edge`'s walk of the whole half-star, which also visits every (1,3) with apex ``a``."""
    tv, tn, tt, vtet = S[TV], S[TN], S[TT], S[VTET]
    t0 = vtet[a]
    c = t0
    pa = vidx(S, c, a)
    x = tv[4 * c + (pa + 1) % 3]  # the edge (a, x) the walk arrived by; it leaves by the other edge at a
    for _ in range(len(tt)):
        z = tv[4 * c + (pa + 2) % 3] if tv[4 * c + (pa + 1) % 3] == x else tv[4 * c + (pa + 1) % 3]
        if z == b or x == b:
            return True
        # round the spatial edge (a, z) in the slab above: from the (3,1) c across its face (a, z, apex), through
        # the (2,2) around the edge, to the (3,1) on the next spatial triangle at a
        prev, cur = c, tn[4 * c + vidx(S, c, x)]
        while tt[cur] != TYPE_31:
            prev, cur = cur, fan_step(S, a, z, prev, cur)
        c, x = cur, z
        if c == t0:
            return False
        pa = vidx(S, c, a)
    return True  # not reached on a valid triangulation; refuse the move


@njit(cache=True)
def fan_has(S, e1, e2, prev, cur, w_target, end_type):
    """Walk the tetrahedra around the spatial edge ``(e1, e2)`` in one slab from ``prev`` into ``cur`` (across a
    face containing the edge) until the tetrahedron of type ``end_type`` closing the fan; whether any contains
    vertex ``w_target`` (the triangle ``(e1, e2, w_target)`` then exists)."""
    tt = S[TT]
    for _ in range(len(tt)):
        if vidx(S, cur, w_target) >= 0:
            return True
        if tt[cur] == end_type:
            return False
        prev, cur = cur, fan_step(S, e1, e2, prev, cur)
    return True  # not reached on a valid triangulation; refuse the move


# ---- the one generic update: replace a cavity of tetrahedra by new ones


@njit(inline="always")
def bag_remove(perm, pos, n, x):
    """Move id ``x`` out of the first ``n`` entries of ``perm`` (swap with the last); returns the new count."""
    i = pos[x]
    last = perm[n - 1]
    perm[i] = last
    pos[last] = i
    perm[n - 1] = x
    pos[x] = n - 1
    return n - 1


@njit(inline="always")
def face_key(a, b, c):
    """The sorted vertex triple of a face packed in one int64 (21 bits a vertex id, :data:`KEY_MASK`)."""
    if a > b:
        a, b = b, a
    if b > c:
        b, c = c, b
    if a > b:
        a, b = b, a
    return (np.int64(a) << 42) | (np.int64(b) << 21) | np.int64(c)


@njit(cache=True)
def replace(S, nr, nn, work):
    """Remove tetrahedra ``rem[:nr]`` and glue in ``nn`` new ones (vertices ``nv[:nn]`` (nn, 4) in the type's
    order, types ``ntype``; ``rem``, ``nv``, ``ntype`` are the :func:`scratch` arrays ``work[5]``, ``work[3]``,
    ``work[4]``); the new tetrahedra's faces are glued to each other or to the cavity's outside neighbours by
    matching their packed vertex triples (:func:`face_key`). Keeps every count, bag and per-vertex datum (a new
    vertex is made live by the caller first). The caller has checked the capacity (``n3 + nn <= C3``)."""
    tv, tn, tt, tperm, tpos, l31, p31 = S[TV], S[TN], S[TT], S[TPERM], S[TPOS], S[L31], S[P31]
    vtime, vtet, sc, cn, slices, cnt = S[VTIME], S[VTET], S[SC], S[CN], S[SLICES], S[CNT]
    nv, ntype, rem, bkey, bout, slots, nkey = work[3], work[4], work[5], work[6], work[7], work[8], work[9]
    # the cavity's boundary: faces of removed tetrahedra whose neighbour stays
    nb = 0
    for k in range(nr):
        r = rem[k]
        for i in range(4):
            x = tn[4 * r + i]
            inside = False
            for m in range(nr):
                if rem[m] == x:
                    inside = True
            if inside:
                continue
            bkey[nb] = face_key(tv[4 * r + (i + 1) % 4], tv[4 * r + (i + 2) % 4], tv[4 * r + (i + 3) % 4])
            bout[nb] = x
            nb += 1
    # new slots first (the removed slots stay taken while the outside is relinked)
    n3 = cnt[N3]
    for a in range(nn):
        s = tperm[n3]
        n3 += 1
        slots[a] = s
        tt[s] = ntype[a]
        for i in range(4):
            tv[4 * s + i] = nv[a, i]
            cn[nv[a, i]] += 1
            nkey[4 * a + i] = face_key(nv[a, (i + 1) % 4], nv[a, (i + 2) % 4], nv[a, (i + 3) % 4])
        if ntype[a] == TYPE_31:
            l31[cnt[N31]] = s
            p31[s] = cnt[N31]
            cnt[N31] += 1
            slices[vtime[nv[a, 0]]] += 1
            for i in range(3):
                sc[nv[a, i]] += 1
                vtet[nv[a, i]] = s
        elif ntype[a] == TYPE_22:
            cnt[N22] += 1
    for f in range(4 * nn):
        s = slots[f // 4]
        key = nkey[f]
        found = -1
        for g in range(4 * nn):  # another new tetrahedron with this face
            if nkey[g] == key and g // 4 != f // 4:
                found = slots[g // 4]
                break
        if found < 0:
            for m in range(nb):  # the outside tetrahedron across it: relink its face (opposite its vertex off it)
                if bkey[m] == key:
                    found = bout[m]
                    f0, f1, f2 = key >> 42, (key >> 21) & KEY_MASK, key & KEY_MASK
                    for q in range(4):
                        w = tv[4 * found + q]
                        if w != f0 and w != f1 and w != f2:
                            tn[4 * found + q] = s
                    break
        tn[4 * s + f % 4] = found
    for k in range(nr):
        r = rem[k]
        for i in range(4):
            cn[tv[4 * r + i]] -= 1
        if tt[r] == TYPE_31:
            slices[vtime[tv[4 * r]]] -= 1
            for i in range(3):
                sc[tv[4 * r + i]] -= 1
            cnt[N31] = bag_remove(l31, p31, cnt[N31], r)
            p31[r] = -1
        elif tt[r] == TYPE_22:
            cnt[N22] -= 1
        tt[r] = 0
        n3 = bag_remove(tperm, tpos, n3, r)
    cnt[N3] = n3


# ---- the moves (each returns whether it was done; checks first, then the Metropolis test). The attempt and the
# moves are inlined into the sweep loop: a call passes the 17 field views of S, and their bookkeeping costs as much
# as a rejected attempt (inlined: twice the attempts per second); the rarer, larger helpers stay calls.


@njit(inline="always")
def volume_delta(cnt, dn, dn3, eps, target, fix_n3):
    if target <= 0.0:
        return 0.0
    if fix_n3:
        dev, d = np.float64(cnt[N3]) - target, np.float64(dn3)
    else:
        dev, d = np.float64(cnt[N31]) - target, np.float64(dn)
    return eps * d * (2.0 * dev + d)


@njit(inline="always")
def metropolis(log_r, rng):
    if log_r >= 0.0:
        return True
    return uniform01(rng) < np.exp(log_r)


@njit(inline="always")
def move26(S, t, cp, rng, work, force):
    k0, k3, eps, target, fix_n3, ref, t_n = cp
    tv, tn, cnt, vperm, vtime, sc, cn = S[TV], S[TN], S[CNT], S[VPERM], S[VTIME], S[SC], S[CN]
    if cnt[N3] + 6 > len(S[TT]) or cnt[N0] >= len(vperm):
        cnt[OVF] = 1
        return False
    n = np.float64(cnt[N31])
    geo = n / (n + 2.0) if ref else n / np.float64(cnt[N0] + 1)
    log_r = k0 - 4.0 * k3 - volume_delta(cnt, 2, 4, eps, target, fix_n3) + np.log(geo)
    if not force and not metropolis(log_r, rng):
        return False
    u = tn[4 * t + 3]
    v0, v1, v2, vt = tv[4 * t], tv[4 * t + 1], tv[4 * t + 2], tv[4 * t + 3]
    vb = tv[4 * u]
    vn = vperm[cnt[N0]]
    cnt[N0] += 1
    vtime[vn] = vtime[v0]
    sc[vn] = 0
    cn[vn] = 0
    nv, ntype, rem = work[3], work[4], work[5]
    rows = ((v0, v1), (v1, v2), (v2, v0))
    for k in range(3):
        a, b = rows[k]
        nv[k, 0], nv[k, 1], nv[k, 2], nv[k, 3] = a, b, vn, vt
        ntype[k] = TYPE_31
        nv[3 + k, 0], nv[3 + k, 1], nv[3 + k, 2], nv[3 + k, 3] = vb, a, b, vn
        ntype[3 + k] = TYPE_13
    rem[0], rem[1] = t, u
    replace(S, 2, 6, work)
    return True


@njit(inline="always")
def move62(S, v, cp, rng, work, force):
    k0, k3, eps, target, fix_n3, ref, t_n = cp
    tv, tn, tt, cnt, vtet, sc, cn, vperm, vpos = S[TV], S[TN], S[TT], S[CNT], S[VTET], S[SC], S[CN], S[VPERM], S[VPOS]
    if cn[v] != 6 or sc[v] != 3:
        return False
    t01 = vtet[v]
    p = vidx(S, t01, v)
    a = tv[4 * t01 + (p + 1) % 3]
    b = tv[4 * t01 + (p + 2) % 3]
    ta = tn[4 * t01 + (p + 2) % 3]  # across the face (v, a, apex)
    tb = tn[4 * t01 + (p + 1) % 3]  # across (v, b, apex)
    if tt[ta] != TYPE_31 or tt[tb] != TYPE_31:
        return False
    c = -1
    for i in range(3):
        w = tv[4 * ta + i]
        if w != v and w != a:
            c = w
    if sc[a] < 4 or sc[b] < 4 or sc[c] < 4:
        return False
    n = np.float64(cnt[N31])
    geo = n / (n - 2.0) if ref else np.float64(cnt[N0]) / (n - 2.0)
    log_r = -k0 + 4.0 * k3 - volume_delta(cnt, -2, -4, eps, target, fix_n3) + np.log(geo)
    if not force and not metropolis(log_r, rng):
        return False
    vt = tv[4 * t01 + 3]
    vb = tv[4 * tn[4 * t01 + 3]]
    nv, ntype, rem = work[3], work[4], work[5]
    rem[0], rem[1], rem[2] = t01, ta, tb
    rem[3], rem[4], rem[5] = tn[4 * t01 + 3], tn[4 * ta + 3], tn[4 * tb + 3]
    nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = a, b, c, vt
    nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = vb, a, b, c
    ntype[0], ntype[1] = TYPE_31, TYPE_13
    replace(S, 6, 2, work)
    cnt[N0] = bag_remove(vperm, vpos, cnt[N0], v)
    return True


@njit(inline="always")
def move44(S, t, i, cp, rng, work):
    tv, tn, tt, cnt = S[TV], S[TN], S[TT], S[CNT]
    t2 = tn[4 * t + i]
    if tt[t2] != TYPE_31:
        return False
    u, u2 = tn[4 * t + 3], tn[4 * t2 + 3]
    if not glued(S, u, u2):
        return False
    if cnt[N3] + 4 > len(tt):
        cnt[OVF] = 1
        return False
    a = tv[4 * t + i]
    p, q = tv[4 * t + (i + 1) % 3], tv[4 * t + (i + 2) % 3]
    b = -1
    for k in range(3):
        w = tv[4 * t2 + k]
        if w != p and w != q:
            b = w
    # the new spatial edge (a, b) must not exist (a vertex p or q of degree 3 would lose a triangle: its link is
    # then the triangle (a, b, other), so a and b are already joined; the degree test is the cheap half)
    if S[SC][p] == 3 or S[SC][q] == 3 or spatial_edge(S, a, b):
        return False
    vt, vb = tv[4 * t + 3], tv[4 * u]
    nv, ntype, rem = work[3], work[4], work[5]
    nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = a, b, p, vt
    nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = a, b, q, vt
    nv[2, 0], nv[2, 1], nv[2, 2], nv[2, 3] = vb, a, b, p
    nv[3, 0], nv[3, 1], nv[3, 2], nv[3, 3] = vb, a, b, q
    ntype[0], ntype[1], ntype[2], ntype[3] = TYPE_31, TYPE_31, TYPE_13, TYPE_13
    rem[0], rem[1], rem[2], rem[3] = t, t2, u, u2
    replace(S, 4, 4, work)
    return True


@njit(inline="always")
def move23(S, t, i, up, cp, rng, work, force):
    """(2,3) from the (3,1) ``t`` (``up``) or the (1,3) below it, across its side face ``i`` (0..2)."""
    k0, k3, eps, target, fix_n3, ref, t_n = cp
    tv, tn, tt, cnt = S[TV], S[TN], S[TT], S[CNT]
    if up:
        a, apex, tri0 = t, 3, 0
    else:
        a, apex, tri0 = tn[4 * t + 3], 0, 1
    fi = tri0 + i
    x = tn[4 * a + fi]
    if tt[x] != TYPE_22:
        return False
    if cnt[N3] + 3 > len(tt):
        cnt[OVF] = 1
        return False
    v0 = tv[4 * a + fi]
    b1, b2 = tv[4 * a + tri0 + (i + 1) % 3], tv[4 * a + tri0 + (i + 2) % 3]
    v3 = tv[4 * a + apex]
    v1 = -1
    for k in range(4):
        w = tv[4 * x + k]
        if w != b1 and w != b2 and w != v3:
            v1 = w
    log_r = -k3 - volume_delta(cnt, 0, 1, eps, target, fix_n3)
    if not force and not metropolis(log_r, rng):
        return False
    if has_edge(S, v0, v1, up, work):
        return False
    nv, ntype, rem = work[3], work[4], work[5]
    if up:
        nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = tv[4 * a], tv[4 * a + 1], tv[4 * a + 2], v1
        nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = v0, b1, v1, v3
        nv[2, 0], nv[2, 1], nv[2, 2], nv[2, 3] = v0, b2, v1, v3
        ntype[0] = TYPE_31
    else:
        nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = v1, tv[4 * a + 1], tv[4 * a + 2], tv[4 * a + 3]
        nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = v1, v3, v0, b1
        nv[2, 0], nv[2, 1], nv[2, 2], nv[2, 3] = v1, v3, v0, b2
        ntype[0] = TYPE_13
    ntype[1], ntype[2] = TYPE_22, TYPE_22
    rem[0], rem[1] = a, x
    replace(S, 2, 3, work)
    return True


@njit(inline="always")
def move32(S, t, j, up, cp, rng, work, force):
    """(3,2) on the timelike edge from base vertex ``j`` (0..2) of the (3,1) ``t`` (``up``) or of the top of the
    (1,3) below it to the apex."""
    k0, k3, eps, target, fix_n3, ref, t_n = cp
    tv, tn, tt, cnt = S[TV], S[TN], S[TT], S[CNT]
    if up:
        a, apex, tri0, end = t, 3, 0, TYPE_31
    else:
        a, apex, tri0, end = tn[4 * t + 3], 0, 1, TYPE_13
    k, m = tri0 + (j + 1) % 3, tri0 + (j + 2) % 3
    x, y = tn[4 * a + k], tn[4 * a + m]
    if tt[x] != TYPE_22 or tt[y] != TYPE_22:
        return False
    v0, v1 = tv[4 * a + tri0 + j], tv[4 * a + apex]
    vk, vm = tv[4 * a + k], tv[4 * a + m]
    v3 = -1
    for q in range(4):
        w = tv[4 * x + q]
        if w != v0 and w != vm and w != v1:
            v3 = w
    if vidx(S, y, v3) < 0:
        return False
    log_r = k3 - volume_delta(cnt, 0, -1, eps, target, fix_n3)
    if not force and not metropolis(log_r, rng):
        return False
    if fan_has(S, vk, vm, a, tn[4 * a + tri0 + j], v3, end):
        return False
    nv, ntype, rem = work[3], work[4], work[5]
    if up:
        nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = tv[4 * a], tv[4 * a + 1], tv[4 * a + 2], v3
        nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = vk, vm, v1, v3
        ntype[0] = TYPE_31
    else:
        nv[0, 0], nv[0, 1], nv[0, 2], nv[0, 3] = v3, tv[4 * a + 1], tv[4 * a + 2], tv[4 * a + 3]
        nv[1, 0], nv[1, 1], nv[1, 2], nv[1, 3] = v1, v3, vk, vm
        ntype[0] = TYPE_13
    ntype[1] = TYPE_22
    rem[0], rem[1], rem[2] = a, x, y
    replace(S, 3, 2, work)
    return True


@njit(inline="always")
def attempt(S, cp, rng, work):
    """One attempt (the module docstring's proposal); counts it in ``attempts``/``accepts``."""
    cnt, l31, vperm, att, acc = S[CNT], S[L31], S[VPERM], S[ATT], S[ACC]
    r = draw_index(rng, 12)
    family, sub = r // 4, r % 4
    if family == 0:
        if sub & 1 == 0:
            kind = M26
            ok = move26(S, l31[draw_index(rng, cnt[N31])], cp, rng, work, False)
        else:
            kind = M62
            ok = move62(S, vperm[draw_index(rng, cnt[N0])], cp, rng, work, False)
    elif family == 1:
        kind = M44
        t = l31[draw_index(rng, cnt[N31])]
        ok = move44(S, t, draw_index(rng, 3), cp, rng, work)
    else:
        t = l31[draw_index(rng, cnt[N31])]
        i = draw_index(rng, 3)
        up = (sub >> 1) == 0
        if sub & 1 == 0:
            kind = M23
            ok = move23(S, t, i, up, cp, rng, work, False)
        else:
            kind = M32
            ok = move32(S, t, i, up, cp, rng, work, False)
    att[kind] += 1
    if ok:
        acc[kind] += 1


@njit(cache=True)
def sweep_chain(buf, off, n, k0, k3, eps, target, fix_n3, ref, t_n, until_target, max_extra, seed):
    """``n`` attempts on one chain's buffer, then (``until_target``) up to ``max_extra`` more until the volume
    ``N_fix`` equals ``target`` (a miss increments ``missed_target``)."""
    S = views(buf, off)
    cnt = S[CNT]
    S[ATT][:] = 0
    S[ACC][:] = 0
    c3 = len(S[TT])
    owner = scratch(c3)
    work = borrowed_work(owner)
    rng_owner = np.empty(1, np.uint64)
    rng = borrowed(rng_owner)
    rng[0] = seed
    cp = (k0, k3, eps, target, fix_n3, ref, t_n)
    for _ in range(n):
        attempt(S, cp, rng, work)
    if until_target:
        tgt = np.int64(target)
        for _ in range(max_extra):
            now = cnt[N3] if fix_n3 else cnt[N31]
            if now == tgt:
                break
            attempt(S, cp, rng, work)
        now = cnt[N3] if fix_n3 else cnt[N31]
        if now != tgt:
            cnt[MISS] += 1
    owner[2][0] = rng_owner[0] > 0  # the borrowed views' owners stay alive until here


@njit(cache=True, parallel=True)
def sweep_batch(bufs, off, n, k0, k3, eps, target, fix_n3, ref, t_n, until_target, max_extra, seeds):
    for c in prange(bufs.shape[0]):
        sweep_chain(
            bufs[c], off, n, k0[c], k3[c], eps[c], target[c], fix_n3, ref, t_n, until_target, max_extra, seeds[c]
        )


@njit(cache=True)
def apply_move_kernel(buf, off, kind, a, i, up, k0, k3, eps, target, fix_n3, ref, t_n, force, seed):
    S = views(buf, off)
    c3 = len(S[TT])
    work = scratch(c3)
    rng = np.empty(1, np.uint64)
    rng[0] = seed
    cp = (k0, k3, eps, target, fix_n3, ref, t_n)
    if kind == M26:
        return move26(S, a, cp, rng, work, force)
    if kind == M62:
        return move62(S, a, cp, rng, work, force)
    if kind == M44:
        return move44(S, a, i, cp, rng, work)
    if kind == M23:
        return move23(S, a, i, up, cp, rng, work, force)
    return move32(S, a, i, up, cp, rng, work, force)


@njit(cache=True)
def outcome_kernel(buf, targets, skip_lo, skip_hi, off, trials, k0, k3, eps, target, fix_n3, ref, t_n, seed):
    counts = np.zeros(targets.shape[0] + 1, np.int64)
    work_buf = buf.copy()
    c3 = off[len(off) // 2 + TT]
    work = scratch(c3)
    rng = np.empty(1, np.uint64)
    rng[0] = seed
    cp = (k0, k3, eps, target, fix_n3, ref, t_n)
    for _ in range(trials):
        work_buf[:] = buf
        S = views(work_buf, off)
        attempt(S, cp, rng, work)
        hit = targets.shape[0]
        for k in range(targets.shape[0]):
            same = True
            for x in range(len(buf)):
                if (x < skip_lo or x >= skip_hi) and work_buf[x] != targets[k, x]:
                    same = False
                    break
            if same:
                hit = k
                break
        counts[hit] += 1
    return counts


def _kernel_couplings(couplings: Any, fix_n3: bool, reference: bool, n_slices: int) -> tuple[Any, ...]:
    """The kernels' coupling arguments ``k0, k3, eps, target, fix_n3, ref, t_n``."""
    k0, k3, eps, target = (float(x) for x in couplings)
    return k0, k3, eps, target, bool(fix_n3), bool(reference), int(n_slices)


def transition_counts(
    buf: np.ndarray,
    targets: np.ndarray,
    tetra_capacity: int,
    n_slices: int,
    trials: int,
    *,
    couplings: tuple[float, float, float, float],
    fix_n3: bool = False,
    reference: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """How often one attempt from the state ``buf`` lands exactly on each of the states ``targets`` (k, size)
    (buffers made by :func:`apply_move` from ``buf``, so slot for slot what the attempt makes; the move counters
    are ignored), over ``trials`` attempts each from ``buf``: counts (k + 1,), the last entry every other outcome
    (rejections included). The direct check of detailed balance: ``P(A->B) / P(B->A) = pi(B) / pi(A)``."""
    lay = layout(tetra_capacity, n_slices)
    skip_lo = lay["attempts"][0]
    skip_hi = lay["accepts"][0] + lay["accepts"][1]
    return np.asarray(
        outcome_kernel(  # type: ignore[call-arg]
            np.ascontiguousarray(buf, np.int32),
            np.ascontiguousarray(np.atleast_2d(targets), np.int32),
            skip_lo,
            skip_hi,
            field_offsets(tetra_capacity, n_slices),
            int(trials),
            *_kernel_couplings(couplings, fix_n3, reference, n_slices),
            np.uint64(seed),
        )
    )


def apply_move(
    buf: np.ndarray,
    tetra_capacity: int,
    n_slices: int,
    move: str,
    a: int,
    i: int = 0,
    up: bool = True,
    *,
    couplings: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    fix_n3: bool = False,
    reference: bool = False,
    force: bool = True,
    seed: int = 0,
    engine: str = "host",
) -> bool:
    """Apply one move to a NumPy buffer in place (tests and exact enumeration): ``move`` one of
    :data:`~ivhl_jax.physics.cdt.d3_state.MOVE_NAMES_3D`; ``a`` the (3,1) slot (the vertex slot for ``"62"``),
    ``i`` the face or base vertex (0..2), ``up`` the time orientation of the (2,3)/(3,2). ``force=True`` skips the
    Metropolis test (the manifold conditions always apply); returns whether the move was done.

    ``engine`` as in :func:`~ivhl_jax.physics.cdt.metropolis_3d`: ``"host"`` (this module's kernel) or ``"jax"``
    (one :func:`~ivhl_jax.physics.cdt.d3_jax.attempt` with the move's
    :func:`~ivhl_jax.physics.cdt.d3_jax.proposal_words`, whose acceptance uniform 0 passes the Metropolis test
    for any finite ratio: ``force=True`` only), so a test runs both engines through one door."""
    from ivhl_jax.physics.cdt.d3_state import MOVE_NAMES_3D

    check_choice(engine, "engine", ENGINES)
    check_choice(move, "move", MOVE_NAMES_3D)
    if buf.dtype != np.int32 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("buf must be one chain's buffer: a contiguous 1-D int32 NumPy array")
    if engine == "jax":
        if not force:
            raise ValueError("force=False (a Metropolis test on a seeded uniform) needs engine='host'")
        from ivhl_jax.physics.cdt import d3_jax

        words = d3_jax.proposal_words(buf, tetra_capacity, n_slices, move, a, i, up)
        return d3_jax.apply_words(
            buf, words, tetra_capacity, n_slices, couplings=couplings, fix_n3=fix_n3, reference=reference
        )
    return bool(
        apply_move_kernel(  # type: ignore[call-arg]
            buf,
            field_offsets(tetra_capacity, n_slices),
            MOVE_NAMES_3D.index(move),
            int(a),
            int(i),
            bool(up),
            *_kernel_couplings(couplings, fix_n3, reference, n_slices),
            bool(force),
            np.uint64(seed),
        )
    )


def sweep(buf: jax.Array, seed: jax.Array, couplings: tuple[Any, Any, Any, Any], plan: SweepPlan) -> jax.Array:
    """One sweep of ``plan`` (:func:`sweep_chain`) on the buffer ``buf`` (..., size) with SplitMix64 seeded by
    ``seed`` (..., 2) uint32; ``couplings`` ``(k0, k3, eps, target)`` scalars or arrays broadcasting to the batch.
    Works under jit and vmap (the callback sees the whole batch and runs its chains in parallel threads)."""
    off = field_offsets(plan.tetra_capacity, plan.n_slices)

    def cb(b, s, k0, k3, eps, target):
        shape = b.shape
        bufs = np.array(b, np.int32).reshape(-1, shape[-1])
        nb = bufs.shape[0]
        s = np.asarray(s, np.uint64).reshape(nb, 2)
        seeds = np.ascontiguousarray((s[:, 0] << np.uint64(32)) | s[:, 1])
        per = [
            np.ascontiguousarray(np.broadcast_to(np.asarray(x, np.float64), shape[:-1]).reshape(nb))
            for x in (k0, k3, eps, target)
        ]
        sweep_batch(  # type: ignore[call-arg]
            bufs,
            off,
            int(plan.attempts),
            *per,
            bool(plan.fix_n3),
            bool(plan.reference),
            int(plan.n_slices),
            bool(plan.until_target),
            int(plan.max_extra),
            seeds,
        )
        return bufs.reshape(shape)

    args = [jnp.asarray(x, jnp.float32) for x in couplings]
    return jax.pure_callback(
        cb, jax.ShapeDtypeStruct(buf.shape, jnp.int32), buf, seed, *args, vmap_method="broadcast_all"
    )
