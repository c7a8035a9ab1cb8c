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
            fl = buf[o_tl + t1]
            fr = buf[o_tr + t2]
            new_apex_t1 = buf[o_vr + t2 // 2]
            buf[o_tr + fl] = t2
            buf[o_tl + t2] = fl
            buf[o_tr + t2] = t1
            buf[o_tl + t1] = t2
            buf[o_tr + t1] = fr
            buf[o_tl + fr] = t1
            buf[o_ap + t1] = new_apex_t1
            buf[o_ap + t2] = t1 // 2
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
            buf[o_acc + 1] += 1
            return
        lu = buf[o_tl + up]
        ld = buf[o_tl + dn]
        if (lu & 1) != 0 or (ld & 1) != 1 or buf[o_len + t] <= 3:
            return
        if not log_u < log_ratio(False, n0, lam, eps, target):
            return
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

    @numba.njit(parallel=True, cache=True)
    def run_stream(bufs, seeds, n, target_n0, max_extra, lam, eps, target, off, c0):
        mask = np.uint64(0xFFFFFFFF)
        o_n0, o_miss = off[8], off[12]
        for c in numba.prange(bufs.shape[0]):
            buf = bufs[c]
            x = (np.uint64(seeds[c, 0]) << np.uint64(32)) | np.uint64(seeds[c, 1])
            for _ in range(n):
                x, z = splitmix(x)
                one(buf, np.int64(z & mask), np.int64(z >> np.uint64(32)), lam[c], eps[c], target[c], off, c0)
            if target_n0[c] >= 0:
                extra = 0
                while buf[o_n0] != target_n0[c] and extra < max_extra:
                    x, z = splitmix(x)
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
               target_n0=None):
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
    kernel(bufs, rand, *extra, lam, eps, target, off, c0)
    return bufs.reshape(shape)


def sweep(buf: jax.Array, seed: jax.Array, params: Any, n: int, lay: dict[str, tuple[int, int]], c0: int,
          target_n0: jax.Array, max_extra: int = 0) -> jax.Array:
    """``n`` attempts on the packed buffer ``buf`` (..., size) with words from SplitMix64 seeded by ``seed``
    (..., 2) uint32, then (when ``target_n0 >= 0``) up to ``max_extra`` more until n0 == target_n0 (a miss
    increments ``missed_target``). Works under jit and vmap (the callback sees the whole batch and runs the
    chains in parallel threads)."""
    off = _offsets(lay)
    lam, eps, target = _params_arrays(params)

    def cb(b, s, tn, la, ep, ta):
        return _host_call(1, (int(n), int(max_extra)), b, s, la, ep, ta, off, int(c0), target_n0=tn)

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
