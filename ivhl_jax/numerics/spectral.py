"""Fourier multipliers ``ψ ↦ F⁻¹[(1 + m(k)) · F ψ]`` with a choice of FFT backend.

Every split-step kinetic propagator in this library (GP including its rotating-frame ADI factors,
the GFT condensate) is such a multiplier over some axes; the GFT uses the XLA backend only. The
factor is passed as ``m = f − 1`` (see :func:`ivhl_jax.numerics.splitstep.phase_factor_m1`): ``ψ̂ + ψ̂·m`` keeps the small
phases of the occupied modes to full float32 precision, which is what makes the scheme conserve the
norm to round-off.

Backends:

* ``"xla"`` (default) — ``jnp.fft``: portable (CPU, GPU, TPU), shardable, every transform rule.
* ``"ducc"`` — the same transforms computed on the host by the DUCC library (``ducc0``, two threads)
  through one ``jax.pure_callback`` per multiplier (forward FFT, multiply, inverse FFT in place).
  Opt-in, and allowed only where the backend table says so (``ivhl_jax.core.backend.defaults().host_fft``:
  the CPU row). Why it exists: XLA:CPU's built-in multi-dimensional FFT uses the host's cores poorly, so
  from ~128³ points the host FFT makes the whole GP step faster (current figures and the command that
  measures them: ``docs/guide/condensates.md``). It is differentiable (custom VJP: the transpose of
  F⁻¹ diag(f) F is F diag(f) F⁻¹, and the factor's cotangent is (Fψ)·(F⁻¹ḡ)) and works under ``jit``,
  ``vmap`` (batched callback) and ``lax.scan``; it does not shard (use ``"xla"`` for sharded grids) and
  forward-mode ``jvp`` is not defined. ``ducc0`` is GPL-2.0-or-later, so it is an optional extra
  (``pip install 'ivhl_jax[cpu-fft]'``), never a dependency of this Apache-2.0 package.

The factor reaches the host in one of three ways under ``"ducc"``, cheapest first:

* a :class:`HostFactor` (built by :func:`host_factor`): a device copy ``value`` plus an int32 ``key``
  naming a host copy in this process's registry. Both are traced pytree leaves, so a stepper holding one
  can take a new factor (a new dt) without recompiling, yet only the 4-byte key crosses to the host per
  call. The GP solver's kinetic factors use this whenever dt (and Ω) are concrete.
* a NumPy array: a trace-time constant captured by the callback (nothing transferred, but a new value
  is a new program);
* a traced array (e.g. dt itself traced, under ``grad`` or ``vmap`` over dt): passed as a callback
  operand, i.e. copied to the host on every call.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Complex

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_choice

__all__ = ["FFT_BACKENDS", "check_backend", "spectral_multiply", "HostFactor", "host_factor"]

FFT_BACKENDS = ("xla", "ducc")


def _require_ducc():
    try:
        import ducc0
    except ImportError as e:
        raise ImportError(
            "fft='ducc' needs the ducc0 package (GPL-2.0-or-later, not installed by default): "
            "pip install 'ivhl_jax[cpu-fft]', or use fft='xla'"
        ) from e
    return ducc0


def check_backend(fft: str) -> str:
    """Validate an FFT backend name; ``"ducc"`` also needs ``ducc0`` (a ValueError naming the ``cpu-fft`` extra
    without it) and the CPU backend."""
    check_choice(fft, "fft", FFT_BACKENDS)
    if fft == "ducc":
        try:
            _require_ducc()
        except ImportError as e:  # a value this install cannot honour: a one-line argument error naming the extra
            raise ValueError(str(e)) from None
        if not backend.defaults().host_fft:
            raise ValueError(
                f"fft='ducc' computes on the host and is meant for the CPU backend; JAX runs on "
                f"{backend.platform()!r} here, where fft='xla' uses the device's FFT"
            )
    return fft


class HostFactor(struct.PyTreeNode):
    """A Fourier factor ``m`` with a host-side twin, for ``fft="ducc"`` inside compiled loops.

    Attributes:
      value: the factor on the device (complex array; a traced leaf). The ``"xla"`` backend and every
        gradient use it; the ``"ducc"`` forward and transpose never read it.
      key: int32 scalar (a traced leaf) naming the host copy of ``value`` in this process's registry
        (:func:`host_factor`). Keys are process-local: build the factor in the process that runs it.

    Built by :func:`host_factor`, which guarantees that the host copy equals ``value`` bit for bit.
    """

    value: Any
    key: Any


# Host copies of HostFactor values: key -> recipe (kept; tiny), recipe key -> int key, and a bounded
# LRU of computed arrays (a miss recomputes from the recipe, so eviction never loses a factor).
_HOST_LOCK = threading.Lock()
_HOST_KEYS: dict[Hashable, int] = {}
_HOST_RECIPES: list[Callable[[], np.ndarray]] = []
_HOST_CACHE: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
HOST_CACHE_BYTES = 1 << 30


def host_factor(compute: Callable[[], np.ndarray], key: Hashable) -> HostFactor:
    """A :class:`HostFactor` whose host copy is ``compute()`` (a complex NumPy array).

    ``key`` must describe everything ``compute()``'s result depends on (e.g. grid, dt, dtype): the same
    key returns the same registry entry, so rebuilding a stepper for a dt it has seen before registers
    nothing new. ``compute`` must be deterministic: the host copy may be evicted from a bounded cache
    (``HOST_CACHE_BYTES``) and recomputed later.
    """
    if not callable(compute):
        raise TypeError(
            f"compute must be a zero-argument callable returning the host array, got {type(compute).__name__}"
        )
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"key must be hashable (describe the grid, dt and dtype), got {type(key).__name__}") from e
    with _HOST_LOCK:
        k = _HOST_KEYS.get(key)
        if k is None:
            k = len(_HOST_RECIPES)
            _HOST_RECIPES.append(compute)
            _HOST_KEYS[key] = k
    return HostFactor(jnp.asarray(_host_value(k)), jnp.asarray(k, jnp.int32))


def _host_value(k: int) -> np.ndarray:
    with _HOST_LOCK:
        hit = _HOST_CACHE.get(k)
        if hit is not None:
            _HOST_CACHE.move_to_end(k)
            return hit
        if not 0 <= k < len(_HOST_RECIPES):
            raise KeyError(
                f"HostFactor key {k} is not registered in this process (keys are process-local; build "
                "the factor with host_factor() where it runs)"
            )
        recipe = _HOST_RECIPES[k]
    arr = np.ascontiguousarray(recipe())
    arr.setflags(write=False)
    with _HOST_LOCK:
        _HOST_CACHE[k] = arr
        total = sum(a.nbytes for a in _HOST_CACHE.values())
        while total > HOST_CACHE_BYTES and len(_HOST_CACHE) > 1:
            total -= _HOST_CACHE.popitem(last=False)[1].nbytes
    return arr


def spectral_multiply(
    psi: Complex[Array, "*shape"],
    factor_m1: Complex[Array | np.ndarray, " ..."] | HostFactor,
    axes: Sequence[int],
    fft: str = "xla",
) -> Complex[Array, "*shape"]:
    """``F⁻¹[(1 + m) F ψ]`` over ``axes`` (unitary pair: forward unscaled, inverse scaled by 1/N).

    Args:
      psi: complex array; leading axes not in ``axes`` are batch axes.
      factor_m1: ``m = f − 1``, broadcastable to ``psi`` (e.g. grid-shaped, or 1-D along one axis
        with size-1 axes elsewhere), complex, same precision as ``psi``; or a :class:`HostFactor`
        holding it (``"ducc"`` then sends only its key to the host: module docstring).
      axes: the transformed axes (negative or positive indices).
      fft: ``"xla"`` or ``"ducc"`` (module docstring).
    """
    host_key = None
    if isinstance(factor_m1, HostFactor):
        host_key, m = factor_m1.key, factor_m1.value
    else:
        m = factor_m1
    ndim = jnp.ndim(psi)
    try:
        axes = tuple(axes)
    except TypeError:
        raise TypeError(f"axes must be a sequence of axis indices of psi, got {axes!r}") from None
    if not all(isinstance(a, (int, np.integer)) and -ndim <= a < ndim for a in axes) or len(
        {int(a) % ndim for a in axes}
    ) != len(axes):
        raise ValueError(f"axes must be distinct axis indices of psi (ndim {ndim}), got {axes}")
    axes = tuple(int(a) % ndim for a in axes)
    try:  # a static (shape-only) check, so the hot path under jit pays nothing
        np.broadcast_shapes(np.shape(m), np.shape(psi))
    except ValueError:
        raise ValueError(
            f"factor_m1 of shape {np.shape(m)} does not broadcast to psi's shape {np.shape(psi)}"
        ) from None
    if np.broadcast_shapes(np.shape(m), np.shape(psi)) != tuple(np.shape(psi)):
        raise ValueError(f"factor_m1 of shape {np.shape(m)} would enlarge psi's shape {np.shape(psi)}")
    if fft == "xla":
        p = jnp.fft.fftn(psi, axes=axes)
        return jnp.fft.ifftn(p + p * m, axes=axes)
    check_backend(fft)
    if isinstance(m, np.ndarray):
        # A trace-time constant (concrete dt) stays on the host, captured by the callback: nothing to
        # transfer per call (passing a 128³ factor as an operand copies it to the host every step).
        return _ducc_static(psi, m.astype(psi.dtype), axes)
    if host_key is not None:
        return _ducc_keyed(psi, m.astype(psi.dtype), host_key, axes)
    return _ducc_multiply(psi, m.astype(psi.dtype), axes)


def _mul_add_inplace(out: np.ndarray, m: np.ndarray) -> None:
    """``out += out * m`` in ~1 MB blocks when m has out's trailing shape (no full-size temporary)."""
    if m.ndim >= 1 and m.shape == out.shape[out.ndim - m.ndim :]:
        mm = m.reshape(m.shape[0], -1)
        block = max(1, (1 << 20) // max(1, mm[0].nbytes))
        for o in out.reshape((-1,) + m.shape):
            rows = o.reshape(mm.shape)
            for i in range(0, rows.shape[0], block):
                r = rows[i : i + block]
                r += r * mm[i : i + block]
    else:
        out += out * m


def _host(psi: np.ndarray, m: np.ndarray, *, axes: tuple[int, ...], transpose: bool) -> np.ndarray:
    """NumPy/DUCC body: F⁻¹ (1+m) F ψ, or its transpose F (1+m) F⁻¹ ψ. ``axes`` are negative (batch-safe)."""
    ducc0 = _require_ducc()
    psi, m = np.asarray(psi), np.asarray(m)
    out = np.empty_like(psi)
    first, second = (False, True) if transpose else (True, False)
    # inorm=2 scales by 1/N: the inverse transform carries the 1/N, whichever comes first.
    ducc0.fft.c2c(psi, axes=axes, out=out, forward=first, inorm=0 if first else 2, nthreads=2)
    _mul_add_inplace(out, m)
    ducc0.fft.c2c(out, axes=axes, out=out, forward=second, inorm=0 if second else 2, nthreads=2)
    return out


def _callback(psi, m, axes, transpose):
    # Negative axes and an m of psi's rank stay aligned when vmap prepends a batch axis to both.
    neg = tuple(a - psi.ndim for a in axes)
    m = m.reshape((1,) * (psi.ndim - m.ndim) + m.shape)
    fn = functools.partial(_host, axes=neg, transpose=transpose)
    return jax.pure_callback(fn, jax.ShapeDtypeStruct(psi.shape, psi.dtype), psi, m, vmap_method="broadcast_all")


def _ducc_static(psi: jax.Array, m: np.ndarray, axes: tuple[int, ...]) -> jax.Array:
    """The host multiplier with a constant factor captured by the callback (psi-gradient only)."""
    neg = tuple(a - psi.ndim for a in axes)
    m = m.reshape(m.shape[max(0, m.ndim - psi.ndim) :])

    def call(x, transpose):
        fn = lambda a: _host(a, m, axes=neg, transpose=transpose)  # noqa: E731
        return jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="broadcast_all")

    @jax.custom_vjp
    def apply(x):
        return call(x, False)

    apply.defvjp(lambda x: (call(x, False), None), lambda _, g: (call(g, True),))
    return apply(psi)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _ducc_multiply(psi, m, axes):
    return _callback(psi, m, axes, False)


def _ducc_fwd(psi, m, axes):
    return _callback(psi, m, axes, False), (psi, m)


def _ducc_bwd(axes, res, g):
    psi, m = res
    # JAX's complex convention: the VJP of a holomorphic linear map is its transpose (no conjugate).
    d_psi = _callback(g, m, axes, True)
    return d_psi, _factor_cotangent(psi, m, g, axes)


def _factor_cotangent(psi, m, g, axes):
    # d/dm of F⁻¹(ψ̂ + ψ̂ m): cotangent ψ̂ · (F⁻¹)ᵀ ḡ = (Fψ) · (F⁻¹ ḡ), summed over broadcast axes of m.
    psi_k = jnp.fft.fftn(psi, axes=axes)
    g_x = jnp.fft.ifftn(g, axes=axes)
    d_m = psi_k * g_x
    extra = d_m.ndim - m.ndim
    d_m = jnp.sum(d_m, axis=tuple(range(extra))) if extra else d_m
    keep = tuple(i for i, s in enumerate(m.shape) if s == 1 and d_m.shape[i] != 1)
    d_m = jnp.sum(d_m, axis=keep, keepdims=True) if keep else d_m
    return d_m.astype(m.dtype)


_ducc_multiply.defvjp(_ducc_fwd, _ducc_bwd)


def _host_keyed(psi: np.ndarray, key: np.ndarray, *, axes: tuple[int, ...], transpose: bool) -> np.ndarray:
    """:func:`_host` with the factor looked up by key; ``key`` has psi's leading (vmap) batch shape."""
    psi, key = np.asarray(psi), np.asarray(key)
    first = int(key.flat[0])
    if key.ndim == 0 or bool(np.all(key == first)):
        return _host(psi, _host_value(first).astype(psi.dtype, copy=False), axes=axes, transpose=transpose)
    out = np.empty_like(psi)
    for idx in np.ndindex(key.shape):  # a vmap over factors (e.g. stacked steppers with different dt)
        out[idx] = _host(
            psi[idx], _host_value(int(key[idx])).astype(psi.dtype, copy=False), axes=axes, transpose=transpose
        )
    return out


def _keyed_callback(psi, key, axes, transpose):
    neg = tuple(a - psi.ndim for a in axes)
    fn = functools.partial(_host_keyed, axes=neg, transpose=transpose)
    return jax.pure_callback(fn, jax.ShapeDtypeStruct(psi.shape, psi.dtype), psi, key, vmap_method="broadcast_all")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ducc_keyed(psi, m, key, axes):
    # m (the device copy) is not an operand of the callback: only the key crosses to the host.
    del m
    return _keyed_callback(psi, key, axes, False)


def _ducc_keyed_fwd(psi, m, key, axes):
    return _keyed_callback(psi, key, axes, False), (psi, m, key)


def _ducc_keyed_bwd(axes, res, g):
    psi, m, key = res
    return _keyed_callback(g, key, axes, True), _factor_cotangent(psi, m, g, axes), None


_ducc_keyed.defvjp(_ducc_keyed_fwd, _ducc_keyed_bwd)
