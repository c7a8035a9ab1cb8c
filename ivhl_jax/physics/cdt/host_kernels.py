"""The numba kernels of the CDT host engine (imported only when ``engine="host"`` runs).

Every kernel is a module-level function compiled with ``cache=True``, so the compiled code is written to
numba's disk cache once and loaded by every later process (a kernel built inside a factory is a closure
that numba cannot find again in its cache).

The uniform-proposal attempt (:func:`one`) is the JAX engine's attempt operation for operation (same
decoding of the two random words, the same float32 acceptance arithmetic), so the two engines give
bit-identical states given the same words. Indices are drawn exactly: ``floor(w0 N / 2^32)`` from the
attempt's 32-bit word while the buffer has at most 2^16 vertex slots (what the JAX engine addresses), and by
Lemire's multiply-and-reject method on 64-bit words beyond (an exactly uniform draw for any count).
"""

import numpy as np
from numba import njit, prange

WIDE = 1 << 16  # above this many vertex slots, indices are drawn from 64-bit words (see the module docstring)

f32 = np.float32
MASK32 = np.uint64(0xFFFFFFFF)


@njit(inline="always")
def log_ratio(kind_add, n0, lam, eps, target):
    # the float32 arithmetic of cdt.log_acceptance / cdt._delta_action, operation for operation
    dn2 = f32(2.0) if kind_add else f32(-2.0)
    dev = f32(2 * n0) - target
    ds = lam * dn2 + eps * dn2 * (f32(2.0) * dev + dn2)
    n0f = f32(n0)
    other = n0f + f32(1.0) if kind_add else n0f - f32(1.0)
    return -ds + np.log(n0f / other)


# ---- the three geometric updates, shared by both proposal schemes (the caller has checked the move)


@njit(inline="always")
def link(buf, off, left, right):
    """Make triangle slot ``right`` the strip neighbour to the right of slot ``left`` (tr[left], tl[right])."""
    buf[off[1] + left] = right
    buf[off[0] + right] = left


@njit(inline="always")
def do_flip(buf, off, t1, t2, fl, fr):
    """fl t1 t2 fr -> fl t2 t1 fr; t1's new apex is t2's base-right vertex, t2's is t1's base-left one."""
    o_ap, o_vr = off[2], off[3]
    new_apex_t1 = buf[o_vr + t2 // 2]
    link(buf, off, fl, t2)
    link(buf, off, t2, t1)
    link(buf, off, t1, fr)
    buf[o_ap + t1] = new_apex_t1
    buf[o_ap + t2] = t1 // 2


@njit(inline="always")
def do_insert(buf, off, w, n0):
    """Split the link from w to its right neighbour by vertex vperm[n0] (slots 2av, 2av+1); returns av."""
    o_tr, o_ap, o_vr, o_vt, o_vperm, o_len, o_n0 = off[1], off[2], off[3], off[4], off[5], off[7], off[8]
    up = 2 * w
    dn = up + 1
    t = buf[o_vt + w]
    av = buf[o_vperm + n0]
    au = 2 * av
    ad = au + 1
    ax = buf[o_tr + up]
    ay = buf[o_tr + dn]
    link(buf, off, up, au)
    link(buf, off, au, ax)
    link(buf, off, dn, ad)
    link(buf, off, ad, ay)
    buf[o_ap + au] = buf[o_ap + up]
    buf[o_ap + ad] = buf[o_ap + dn]
    buf[o_vr + av] = buf[o_vr + w]
    buf[o_vr + w] = av
    buf[o_vt + av] = t
    buf[o_len + t] += 1
    buf[o_n0] = n0 + 1
    return av


@njit(inline="always")
def do_remove(buf, off, w, n0):
    """Remove the order-4 vertex w (its slots 2w, 2w+1 leave the strips; swap-remove from the live bag)."""
    o_tl, o_tr, _, o_vr, o_vt, o_vperm, o_vpos, o_len, o_n0, _, _, _, _ = off
    up = 2 * w
    dn = up + 1
    t = buf[o_vt + w]
    lu = buf[o_tl + up]
    ld = buf[o_tl + dn]
    ax = buf[o_tr + up]
    ay = buf[o_tr + dn]
    link(buf, off, lu, ax)
    link(buf, off, ld, ay)
    buf[o_vr + lu // 2] = buf[o_vr + w]
    buf[o_len + t] -= 1
    pos_w = buf[o_vpos + w]
    last = buf[o_vperm + n0 - 1]
    buf[o_vperm + pos_w] = last
    buf[o_vperm + n0 - 1] = w
    buf[o_vpos + last] = pos_w
    buf[o_vpos + w] = n0 - 1
    buf[o_n0] = n0 - 1


@njit(inline="always")
def mulhi64(a, b):
    """floor(a b / 2^64) for uint64 ``a`` and ``b < 2^31``, in 32-bit limbs (no 128-bit product needed)."""
    return ((a >> np.uint64(32)) * b + (((a & MASK32) * b) >> np.uint64(32))) >> np.uint64(32)


@njit(inline="always")
def draw_index(rng, n):
    """An exactly uniform integer in [0, n) (Lemire's multiply-and-reject, ACM TOMS 2019) from SplitMix64
    words; ``rng`` is the one-element uint64 state, advanced in place. Rejection has probability < n / 2^64."""
    nn = np.uint64(n)
    x, z = splitmix(rng[0])
    lo = z * nn  # the low 64 bits of the 128-bit product (uint64 arithmetic wraps)
    if lo < nn:
        t = (np.uint64(0) - nn) % nn  # 2^64 mod n
        while lo < t:
            x, z = splitmix(x)
            lo = z * nn
    rng[0] = x
    return np.int64(mulhi64(z, nn))


@njit(inline="always")
def one(buf, w0, w1, lam, eps, target, off, c0, rng, wide):
    o_tl, o_tr, o_ap, o_vr, o_vt, o_vperm, o_vpos, o_len, o_n0, o_ovf, o_att, o_acc, _ = off
    n0 = buf[o_n0]
    move = w1 & 3
    coin = (w1 >> 2) & 1
    u = f32(w1 >> 8) * f32(2.0**-24)
    if wide:
        pos = draw_index(rng, n0)
    else:
        # exact floor(w0 * n0 / 2^32) in the 16-bit limbs the JAX engine uses
        hi, lo = w0 >> 16, w0 & 0xFFFF
        pos = (hi * n0 + ((lo * n0) >> 16)) >> 16
    w = buf[o_vperm + pos]
    kind = 0 if move <= 1 else (1 if move == 2 else 2)
    buf[o_att + kind] += 1
    if kind == 0:
        t1 = 2 * w + coin
        t2 = buf[o_tr + t1]
        if ((t1 ^ t2) & 1) == 0:
            return
        do_flip(buf, off, t1, t2, buf[o_tl + t1], buf[o_tr + t2])
        buf[o_acc] += 1
        return
    log_u = np.log(max(u, f32(2.0**-25)))
    up = 2 * w
    dn = up + 1
    t = buf[o_vt + w]
    if kind == 1:
        if not log_u < log_ratio(True, n0, lam, eps, target):
            return
        if n0 + 1 > c0:
            buf[o_ovf] = 1
            return
        do_insert(buf, off, w, n0)
        buf[o_acc + 1] += 1
        return
    lu = buf[o_tl + up]
    ld = buf[o_tl + dn]
    if (lu & 1) != 0 or (ld & 1) != 1 or buf[o_len + t] <= 3:
        return
    if not log_u < log_ratio(False, n0, lam, eps, target):
        return
    do_remove(buf, off, w, n0)
    buf[o_acc + 2] += 1


@njit(parallel=True, cache=True)
def run_words(bufs, words, lam, eps, target, off, c0):
    """The attempts given by explicit words (chains, n, 2): the cross-check with the JAX engine."""
    for c in prange(bufs.shape[0]):
        rng = np.zeros(1, np.uint64)
        for i in range(words.shape[1]):
            one(
                bufs[c],
                np.int64(words[c, i, 0]),
                np.int64(words[c, i, 1]),
                lam[c],
                eps[c],
                target[c],
                off,
                c0,
                rng,
                False,
            )


@njit(inline="always")
def splitmix(x):
    # SplitMix64: one 64-bit output = the two 32-bit words of an attempt
    x += np.uint64(0x9E3779B97F4A7C15)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x, z ^ (z >> np.uint64(31))


# ---- move lists (2d-cdt's proposals): the flippable triangles (right neighbour of the other type) and the
# order-4 vertices, kept in swap-remove bags rebuilt from the buffer at the start of every call (O(N) per
# call, so the buffer layout and the checkpoints do not change).


@njit(inline="always")
def bag_set(perm, pos, counts, k, x, on):
    # insert x into / remove x from bag k (prefix perm[:counts[k]]), idempotent
    i = pos[x]
    n = counts[k]
    inside = i < n
    if on and not inside:
        y = perm[n]
        perm[i], perm[n] = y, x
        pos[y], pos[x] = i, n
        counts[k] = n + 1
    elif not on and inside:
        y = perm[n - 1]
        perm[i], perm[n - 1] = y, x
        pos[y], pos[x] = i, n - 1
        counts[k] = n - 1


@njit(inline="always")
def order4(buf, o_tl, v):
    return (buf[o_tl + 2 * v] & 1) == 0 and (buf[o_tl + 2 * v + 1] & 1) == 1


@njit(inline="always")
def update_q(buf, o_tl, qperm, qpos, counts, v):
    bag_set(qperm, qpos, counts, 1, v, order4(buf, o_tl, v))


@njit(inline="always")
def flippable(buf, o_tr, t):
    return ((t ^ buf[o_tr + t]) & 1) == 1


@njit(cache=True)
def build_lists(buf, off, c0):
    o_tl, o_tr, o_vperm, o_n0 = off[0], off[1], off[5], off[8]
    fperm = np.arange(2 * c0).astype(np.int32)
    fpos = fperm.copy()
    qperm = np.arange(c0).astype(np.int32)
    qpos = qperm.copy()
    counts = np.zeros(2, np.int64)  # [F, N4]
    for i in range(buf[o_n0]):
        v = buf[o_vperm + i]
        bag_set(fperm, fpos, counts, 0, 2 * v, flippable(buf, o_tr, 2 * v))
        bag_set(fperm, fpos, counts, 0, 2 * v + 1, flippable(buf, o_tr, 2 * v + 1))
        if order4(buf, o_tl, v):
            bag_set(qperm, qpos, counts, 1, v, True)
    return fperm, fpos, qperm, qpos, counts


@njit(inline="always")
def pick(word, n, rng, wide):
    if wide:
        return draw_index(rng, n)
    return (word * n) >> 32  # exact floor(word n / 2^32) in int64 (word < 2^32, n < 2^31)


@njit(inline="always")
def one_lists(buf, w0, w1, lam, eps, target, off, c0, fperm, fpos, qperm, qpos, counts, rng, wide):
    """One attempt with 2d-cdt's proposals; acceptances (float64):
    flip t1 (1/F): min(1, F/F'); add on the right link of a uniform vertex (1/N0): min(1, e^{-dS} N0/(N4+1));
    delete a uniform order-4 vertex (1/N4): min(1, e^{-dS} N4/(N0-1)). N4(T') = N4(T) + 1 exactly after an
    insertion (the apexes that gain a link had >= 2 links on that side already)."""
    o_tl, o_tr, o_ap, o_vr, o_vt, o_vperm, o_vpos, o_len, o_n0, o_ovf, o_att, o_acc, _ = off
    n0 = buf[o_n0]
    move = w1 & 3
    u = (w1 >> 8) * 2.0**-24
    kind = 0 if move <= 1 else (1 if move == 2 else 2)
    buf[o_att + kind] += 1
    if kind == 0:
        nf = counts[0]
        t1 = fperm[pick(w0, nf, rng, wide)]
        t2 = buf[o_tr + t1]
        fl = buf[o_tl + t1]
        fr = buf[o_tr + t2]
        # after the flip the order is fl t2 t1 fr; t2 -> t1 stays flippable
        new_fl = ((fl ^ t2) & 1) == 1
        new_t1 = ((t1 ^ fr) & 1) == 1
        nf_new = nf - 1 - flippable(buf, o_tr, fl) + new_fl + new_t1 + 1 - flippable(buf, o_tr, t2)
        if nf_new > nf and u * nf_new >= nf:
            return
        new_apex_t1 = buf[o_vr + t2 // 2]
        old_apex_t1, old_apex_t2 = buf[o_ap + t1], buf[o_ap + t2]
        do_flip(buf, off, t1, t2, fl, fr)
        bag_set(fperm, fpos, counts, 0, fl, new_fl)
        bag_set(fperm, fpos, counts, 0, t2, True)
        bag_set(fperm, fpos, counts, 0, t1, new_t1)
        # the lost link joined the old apexes, the new one joins t1's base-left vertex and new_apex_t1
        update_q(buf, o_tl, qperm, qpos, counts, old_apex_t1)
        update_q(buf, o_tl, qperm, qpos, counts, old_apex_t2)
        update_q(buf, o_tl, qperm, qpos, counts, t1 // 2)
        update_q(buf, o_tl, qperm, qpos, counts, new_apex_t1)
        buf[o_acc] += 1
        return
    dn2 = 2.0 if kind == 1 else -2.0
    ds = lam * dn2 + eps * dn2 * (2.0 * (2.0 * n0 - target) + dn2)
    n4 = counts[1]
    if kind == 1:
        if u * (n4 + 1.0) >= np.exp(-ds) * n0:
            return
        if n0 + 1 > c0:
            buf[o_ovf] = 1
            return
        w = buf[o_vperm + pick(w0, n0, rng, wide)]
        up, dn = 2 * w, 2 * w + 1
        av = do_insert(buf, off, w, n0)
        au, ad = 2 * av, 2 * av + 1
        buf[o_acc + 1] += 1
        bag_set(fperm, fpos, counts, 0, au, flippable(buf, o_tr, au))
        bag_set(fperm, fpos, counts, 0, ad, flippable(buf, o_tr, ad))
        bag_set(fperm, fpos, counts, 0, up, False)
        bag_set(fperm, fpos, counts, 0, dn, False)
        update_q(buf, o_tl, qperm, qpos, counts, av)
        update_q(buf, o_tl, qperm, qpos, counts, buf[o_ap + up])
        update_q(buf, o_tl, qperm, qpos, counts, buf[o_ap + dn])
        return
    if n4 == 0:
        return
    w = qperm[pick(w0, n4, rng, wide)]
    t = buf[o_vt + w]
    if buf[o_len + t] <= 3:
        return
    if u * (n0 - 1.0) >= np.exp(-ds) * n4:
        return
    up, dn = 2 * w, 2 * w + 1
    lu, ld = buf[o_tl + up], buf[o_tl + dn]
    c_up, c_dn = buf[o_ap + up], buf[o_ap + dn]
    bag_set(fperm, fpos, counts, 0, up, False)
    bag_set(fperm, fpos, counts, 0, dn, False)
    bag_set(qperm, qpos, counts, 1, w, False)
    do_remove(buf, off, w, n0)
    buf[o_acc + 2] += 1
    bag_set(fperm, fpos, counts, 0, lu, flippable(buf, o_tr, lu))
    bag_set(fperm, fpos, counts, 0, ld, flippable(buf, o_tr, ld))
    update_q(buf, o_tl, qperm, qpos, counts, c_up)
    update_q(buf, o_tl, qperm, qpos, counts, c_dn)


@njit(parallel=True, cache=True)
def run_stream(bufs, seeds, n, target_n0, extra_factor, lam, eps, target, off, c0, lists):
    """One sweep of every chain (a row of ``bufs``): ``n`` attempts (a fixed count, the same for every chain),
    words from SplitMix64 seeded by ``seeds[c]``; then, where ``target_n0[c] >= 0``, up to ``extra_factor`` times
    as many more until n0 == target_n0 (a miss increments ``missed_target``)."""
    o_n0, o_miss = off[8], off[12]
    wide = c0 > WIDE
    for c in prange(bufs.shape[0]):
        buf = bufs[c]
        rng = np.zeros(1, np.uint64)
        rng[0] = (np.uint64(seeds[c, 0]) << np.uint64(32)) | np.uint64(seeds[c, 1])
        if lists:
            fperm, fpos, qperm, qpos, counts = build_lists(buf, off, c0)
        else:
            fperm, fpos = np.zeros(0, np.int32), np.zeros(0, np.int32)
            qperm, qpos = np.zeros(0, np.int32), np.zeros(0, np.int32)
            counts = np.zeros(2, np.int64)
        n_c = np.int64(n)
        for _ in range(n_c):
            attempt_stream(buf, rng, lam[c], eps[c], target[c], off, c0, lists, wide, fperm, fpos, qperm, qpos, counts)
        if target_n0[c] >= 0:
            extra = 0
            max_extra = extra_factor * n_c
            while buf[o_n0] != target_n0[c] and extra < max_extra:
                attempt_stream(
                    buf, rng, lam[c], eps[c], target[c], off, c0, lists, wide, fperm, fpos, qperm, qpos, counts
                )
                extra += 1
            if buf[o_n0] != target_n0[c]:
                buf[o_miss] += 1


@njit(inline="always")
def attempt_stream(buf, rng, lam, eps, target, off, c0, lists, wide, fperm, fpos, qperm, qpos, counts):
    x, z = splitmix(rng[0])
    rng[0] = x
    w0, w1 = np.int64(z & MASK32), np.int64(z >> np.uint64(32))
    if lists:
        one_lists(buf, w0, w1, lam, eps, target, off, c0, fperm, fpos, qperm, qpos, counts, rng, wide)
    else:
        one(buf, w0, w1, lam, eps, target, off, c0, rng, wide)
