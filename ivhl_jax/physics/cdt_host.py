"""Opt-in compiled CPU kernel for the CDT Metropolis moves (``cdt.make_params(..., engine="host")``).

XLA:CPU runs one CDT attempt as a few hundred tiny operations (a while-loop body of gathers and one
scatter): ~5-10 µs per attempt however the state is laid out. The moves are branchy pointer updates,
which a compiled scalar loop does in tens of nanoseconds. This module applies *the same moves to the
same packed buffer* as :func:`ivhl_jax.physics.cdt.attempt` (same decoding of the two random words, the
same float32 acceptance arithmetic), compiled with numba and called through ``jax.pure_callback``, so
jit, vmap (chains run in parallel threads), checkpoints and the observables are unchanged.

Random numbers: the kernel draws the two 32-bit words of each attempt from a SplitMix64 stream (Steele,
Lea & Flood 2014) seeded per chain and sweep from the chain's JAX key, because generating them with JAX
(threefry) costs ~48 ns per attempt on this CPU, more than the move. Given the same words,
:func:`attempts` and the JAX engine produce bit-identical states (tested).

Requires ``numba`` (``pip install 'ivhl_jax[cpu-kernels]'``); numba caches the compiled kernel on disk.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["available", "require", "sweep", "attempts"]

_OFFSETS = ("tl", "tr", "apex", "vright", "vtime", "vperm", "vpos", "lengths", "n0", "overflow", "attempts",
            "accepts", "missed_target")


def available() -> bool:
    """Whether numba can be imported (the host engine can run)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Raise a clear ImportError when numba is missing."""
    if not available():
        raise ImportError("engine='host' needs numba: pip install 'ivhl_jax[cpu-kernels]' (or pip install numba), "
                          "or use engine='jax'")


@functools.cache
def _kernels() -> tuple[Any, Any]:
    import numba

    f32 = np.float32

    @numba.njit(inline="always")
    def log_ratio(kind_add, n0, lam, eps, target):
        # the float32 arithmetic of cdt.log_acceptance / cdt._delta_action, operation for operation
        dn2 = f32(2.0) if kind_add else f32(-2.0)
        dev = f32(2 * n0) - target
        ds = lam * dn2 + eps * dn2 * (f32(2.0) * dev + dn2)
        n0f = f32(n0)
        other = n0f + f32(1.0) if kind_add else n0f - f32(1.0)
        return -ds + np.log(n0f / other)

    # ---- the three geometric updates, shared by both proposal schemes (the caller has checked the move)

    @numba.njit(inline="always")
    def do_flip(buf, off, t1, t2, fl, fr):
        """fl t1 t2 fr -> fl t2 t1 fr; t1's new apex is t2's base-right vertex, t2's is t1's base-left one."""
        o_tl, o_tr, o_ap, o_vr = off[0], off[1], off[2], off[3]
        new_apex_t1 = buf[o_vr + t2 // 2]
        buf[o_tr + fl] = t2
        buf[o_tl + t2] = fl
        buf[o_tr + t2] = t1
        buf[o_tl + t1] = t2
        buf[o_tr + t1] = fr
        buf[o_tl + fr] = t1
        buf[o_ap + t1] = new_apex_t1
        buf[o_ap + t2] = t1 // 2

    @numba.njit(inline="always")
    def do_insert(buf, off, w, n0):
        """Split the link from w to its right neighbour by vertex vperm[n0] (slots 2av, 2av+1); returns av."""
        o_tl, o_tr, o_ap, o_vr, o_vt, o_vperm, o_len, o_n0 = off[0], off[1], off[2], off[3], off[4], off[5], \
            off[7], off[8]
        up = 2 * w
        dn = up + 1
        t = buf[o_vt + w]
        av = buf[o_vperm + n0]
        au = 2 * av
        ad = au + 1
        ax = buf[o_tr + up]
        ay = buf[o_tr + dn]
        buf[o_tr + up] = au
        buf[o_tl + au] = up
        buf[o_tr + au] = ax
        buf[o_tl + ax] = au
        buf[o_tr + dn] = ad
        buf[o_tl + ad] = dn
        buf[o_tr + ad] = ay
        buf[o_tl + ay] = ad
        buf[o_ap + au] = buf[o_ap + up]
        buf[o_ap + ad] = buf[o_ap + dn]
        buf[o_vr + av] = buf[o_vr + w]
        buf[o_vr + w] = av
        buf[o_vt + av] = t
        buf[o_len + t] += 1
        buf[o_n0] = n0 + 1
        return av

    @numba.njit(inline="always")
    def do_remove(buf, off, w, n0):
        """Remove the order-4 vertex w (its slots 2w, 2w+1 leave the strips; swap-remove from the live bag)."""
        o_tl, o_tr, o_vr, o_vt, o_vperm, o_vpos, o_len, o_n0 = off[0], off[1], off[3], off[4], off[5], off[6], \
            off[7], off[8]
        up = 2 * w
        dn = up + 1
        t = buf[o_vt + w]
        lu = buf[o_tl + up]
        ld = buf[o_tl + dn]
        ax = buf[o_tr + up]
        ay = buf[o_tr + dn]
        buf[o_tr + lu] = ax
        buf[o_tl + ax] = lu
        buf[o_tr + ld] = ay
        buf[o_tl + ay] = ld
        buf[o_vr + lu // 2] = buf[o_vr + w]
        buf[o_len + t] -= 1
        pos_w = buf[o_vpos + w]
        last = buf[o_vperm + n0 - 1]
        buf[o_vperm + pos_w] = last
        buf[o_vperm + n0 - 1] = w
        buf[o_vpos + last] = pos_w
        buf[o_vpos + w] = n0 - 1
        buf[o_n0] = n0 - 1

    @numba.njit(inline="always")
    def one(buf, w0, w1, lam, eps, target, off, c0):
        o_tl, o_tr, o_ap, o_vr, o_vt, o_vperm, o_vpos, o_len, o_n0, o_ovf, o_att, o_acc, _ = off
        n0 = buf[o_n0]
        move = w1 & 3
        coin = (w1 >> 2) & 1
        u = f32(w1 >> 8) * f32(2.0**-24)
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

    @numba.njit(parallel=True, cache=True)
    def run_words(bufs, words, lam, eps, target, off, c0):
        for c in numba.prange(bufs.shape[0]):
            for i in range(words.shape[1]):
                one(bufs[c], np.int64(words[c, i, 0]), np.int64(words[c, i, 1]), lam[c], eps[c], target[c], off, c0)

    @numba.njit(inline="always")
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

    @numba.njit(inline="always")
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

    @numba.njit(inline="always")
    def order4(buf, o_tl, v):
        return (buf[o_tl + 2 * v] & 1) == 0 and (buf[o_tl + 2 * v + 1] & 1) == 1

    @numba.njit(inline="always")
    def update_q(buf, o_tl, qperm, qpos, counts, v):
        bag_set(qperm, qpos, counts, 1, v, order4(buf, o_tl, v))

    @numba.njit(inline="always")
    def flippable(buf, o_tr, t):
        return ((t ^ buf[o_tr + t]) & 1) == 1

    @numba.njit(cache=True)
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

    @numba.njit(inline="always")
    def pick(word, n):
        return (word * n) >> 32  # exact floor(word n / 2^32) in int64 (word < 2^32, n < 2^31)

    @numba.njit(inline="always")
    def one_lists(buf, w0, w1, lam, eps, target, off, c0, fperm, fpos, qperm, qpos, counts):
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
            t1 = fperm[pick(w0, nf)]
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
            w = buf[o_vperm + pick(w0, n0)]
            up = 2 * w
            dn = up + 1
            av = do_insert(buf, off, w, n0)
            au = 2 * av
            ad = au + 1
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
        w = qperm[pick(w0, n4)]
        t = buf[o_vt + w]
        if buf[o_len + t] <= 3:
            return
        if u * (n0 - 1.0) >= np.exp(-ds) * n4:
            return
        up = 2 * w
        dn = up + 1
        lu = buf[o_tl + up]
        ld = buf[o_tl + dn]
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

    @numba.njit(parallel=True, cache=True)
    def run_stream(bufs, seeds, n, target_n0, max_extra, lam, eps, target, off, c0, lists):
        mask = np.uint64(0xFFFFFFFF)
        o_n0, o_miss = off[8], off[12]
        for c in numba.prange(bufs.shape[0]):
            buf = bufs[c]
            x = (np.uint64(seeds[c, 0]) << np.uint64(32)) | np.uint64(seeds[c, 1])
            if lists:
                fperm, fpos, qperm, qpos, counts = build_lists(buf, off, c0)
            for _ in range(n):
                x, z = splitmix(x)
                if lists:
                    one_lists(buf, np.int64(z & mask), np.int64(z >> np.uint64(32)), lam[c], eps[c], target[c], off,
                              c0, fperm, fpos, qperm, qpos, counts)
                else:
                    one(buf, np.int64(z & mask), np.int64(z >> np.uint64(32)), lam[c], eps[c], target[c], off, c0)
            if target_n0[c] >= 0:
                extra = 0
                while buf[o_n0] != target_n0[c] and extra < max_extra:
                    x, z = splitmix(x)
                    if lists:
                        one_lists(buf, np.int64(z & mask), np.int64(z >> np.uint64(32)), lam[c], eps[c], target[c],
                                  off, c0, fperm, fpos, qperm, qpos, counts)
                    else:
                        one(buf, np.int64(z & mask), np.int64(z >> np.uint64(32)), lam[c], eps[c], target[c], off, c0)
                    extra += 1
                if buf[o_n0] != target_n0[c]:
                    buf[o_miss] += 1

    return run_words, run_stream


def _offsets(lay: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    return tuple(int(lay[name][0]) for name in _OFFSETS)


def _params_arrays(params: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    return tuple(jnp.asarray(x, jnp.float32) for x in (params.lam, params.eps, params.target))  # type: ignore[return-value]


def _host_call(kernel_index: int, extra: tuple, buf: np.ndarray, rand: np.ndarray, lam, eps, target, off, c0,
               target_n0=None, tail: tuple = ()):
    shape = buf.shape
    bufs = np.array(buf, np.int32).reshape(-1, shape[-1])
    nb = bufs.shape[0]
    rand = np.ascontiguousarray(rand).reshape((nb,) + rand.shape[-(2 if kernel_index == 0 else 1):])

    def per_chain(x, dtype):
        return np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype), shape[:-1]).reshape(nb))

    lam, eps, target = (per_chain(x, np.float32) for x in (lam, eps, target))
    if target_n0 is not None:
        extra = (extra[0], per_chain(target_n0, np.int32), extra[1])
    kernel = _kernels()[kernel_index]
    kernel(bufs, rand, *extra, lam, eps, target, off, c0, *tail)
    return bufs.reshape(shape)


def sweep(buf: jax.Array, seed: jax.Array, params: Any, n: int, lay: dict[str, tuple[int, int]], c0: int,
          target_n0: jax.Array, max_extra: int = 0) -> jax.Array:
    """``n`` attempts on the packed buffer ``buf`` (..., size) with words from SplitMix64 seeded by ``seed``
    (..., 2) uint32, then (when ``target_n0 >= 0``) up to ``max_extra`` more until n0 == target_n0 (a miss
    increments ``missed_target``). ``params.proposal``: ``"uniform"`` (the moves of the JAX engine) or
    ``"lists"`` (2d-cdt's proposals from the lists of flippable triangles and order-4 vertices). Works under
    jit and vmap (the callback sees the whole batch and runs the chains in parallel threads)."""
    off = _offsets(lay)
    lam, eps, target = _params_arrays(params)
    lists = params.proposal == "lists"

    def cb(b, s, tn, la, ep, ta):
        return _host_call(1, (int(n), int(max_extra)), b, s, la, ep, ta, off, int(c0), target_n0=tn, tail=(lists,))

    return jax.pure_callback(cb, jax.ShapeDtypeStruct(buf.shape, jnp.int32), buf, seed,
                             jnp.asarray(target_n0, jnp.int32), lam, eps, target, vmap_method="broadcast_all")


def attempts(buf: jax.Array, words: jax.Array, params: Any, lay: dict[str, tuple[int, int]], c0: int) -> jax.Array:
    """The attempts given by explicit words (..., n, 2) uint32, as :func:`ivhl_jax.physics.cdt.attempt` takes
    them: the cross-check of the two engines."""
    off = _offsets(lay)
    lam, eps, target = _params_arrays(params)

    def cb(b, w, la, ep, ta):
        return _host_call(0, (), b, w, la, ep, ta, off, int(c0))

    return jax.pure_callback(cb, jax.ShapeDtypeStruct(buf.shape, jnp.int32), buf, words, lam, eps, target,
                             vmap_method="broadcast_all")
