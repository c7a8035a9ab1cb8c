"""Performance kernels behind the public field functions.

``point_source_sum`` is the hot loop of :func:`ivhl_jax.physics.fields.superpose`: for N points and M
sources it evaluates

    ψ_n = Σ_j A_j · exp(i (k_j r_nj + θ_j)) / (r_nj + ε),    r_nj = |x_n − s_j|,

returning the real and imaginary parts.

Two kernels compute it (``method``); :func:`ivhl_jax.physics.fields.superpose` picks one from the backend
table (:func:`ivhl_jax.core.backend.defaults`, ``fields_method``; measured per machine by ``ivhl tune``):

* ``"reduce"`` (the accelerator rows): each block of points is ONE XLA reduction over the sources whose (C, M)
  elementwise producer is fused into it (a variadic reduction of the real and imaginary parts), so the
  compiled program is a single kernel over all pairs with no (C, M) temporary and no loop.
* ``"loop"`` (the CPU row): structure of arrays (one contiguous (C,) array per coordinate) and a loop over sources
  with a (C,) complex accumulator, so every loop iteration is ONE elementwise loop fusion over points with
  no reduction across lanes; the real and imaginary parts are outputs of the same fusion. The body is
  unrolled ``unroll`` times (default 4): fewer passes over memory. XLA:CPU splits every large-enough loop
  fusion over the cores, and each split costs a wake-up of (and a wait for) another thread, so blocks of up
  to ``_SERIAL_PAIRS`` pairs run as :func:`_serial_sum`, whose fusions end in an in-place
  ``dynamic_update_slice`` (never split) and sum 16 sources per pass.

Both kernels share the per-pair arithmetic:

* XLA's CPU ``sin``/``cos`` are slow, and a fused kernel that needs both computes the argument reduction
  twice. :func:`sincos` evaluates both from one Cody–Waite reduction by π and two short polynomials,
  written in plain ``jnp`` arithmetic so XLA fuses and vectorises it with the rest of the kernel.
* Per pair: one ``sqrt`` (custom JVP keeps the derivative finite at r = 0) and the sign (−1)^q of
  the sincos reduction folded into the weight A/(r + ε) (:func:`_phasor`).
* Points are processed in blocks of ``chunk``; within a block forward memory is O(chunk), and
  under reverse-mode autodiff each block is rematerialised (``jax.checkpoint``), so backward
  memory is O(chunk × M), never O(N × M).

Timings against PyTorch (eager and ``torch.compile``): ``bench/results/fields_vs_torch_compile.json``
(``python -m ivhl_jax.bench.ops_fields``); on an accelerator, ``python -m ivhl_jax.bench.gpu_checks``.
"""

from __future__ import annotations

import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_array, check_scalar

__all__ = ["safe_norm", "sincos", "point_source_sum", "METHODS"]

# Squared distances below this are treated as this value: the gradient of |d| at d = 0 is
# undefined (NaN in autodiff); this keeps the field and its gradient finite on a source.
_TINY_R2 = 1e-20


# Blocks of at most this many (point, source) pairs run on one thread (`_serial_sum`), larger ones as
# per-source-group loop fusions that XLA splits over the cores (`_block_sum`), when the caller passes no
# `serial_pairs`: the CPU row of the backend table (`fields_serial_pairs`, measured per machine by `ivhl tune`).
_SERIAL_PAIRS = backend.TABLE["cpu"].fields_serial_pairs
# Sources summed per fusion (per pass over the points) in the serial kernel.
_SERIAL_GROUP = 16

# Cody–Waite split of π into three float32 constants with short mantissas (8 and 11 significant
# bits for the first two), so q·_PI_A and q·_PI_B are exact in float32 for |q| < 2**13, i.e.
# |x| ≲ 2.5e4: there the reduced argument r = x − qπ is accurate to ~1e-10 absolute.
_INV_PI = np.float32(1.0 / np.pi)
_PI_A = np.float32(3.140625)
_PI_B = np.float32(9.675025939941406e-4)
_PI_C = np.float32(1.5099580252808664e-7)
# Polynomials on [−π/2, π/2] fitted (weighted least squares → near-minimax) in float64:
#   sin r ≈ r + r z (S0 + z (S1 + z (S2 + z S3))),   max truncation error 8e-9
#   cos r ≈ 1 + z (C0 + z (C1 + z (C2 + z (C3 + z C4)))),   z = r², max truncation error 3e-10
# so the float32 evaluation error (~1.4e-7 absolute, ~1 ulp of 1) dominates.
_S = tuple(np.float32(c) for c in (-0.16666661202907562, 0.008333087898790836, -0.00019811128731817007,
                                   2.6089692255482078e-06))
_C = tuple(np.float32(c) for c in (-0.5, 0.04166664183139801, -0.00138884037733078, 2.476190093148034e-05,
                                   -2.607737030757562e-07))


def safe_norm(d: Real[ArrayLike, "*shape"], axis: int = -1) -> Float[Array, " ..."]:
    """Euclidean norm along ``axis`` whose value and gradient are finite at 0 (gradient 0 there).

    ``d`` has any shape (real); the result has its shape without ``axis``."""
    d = jnp.asarray(d)
    ndim = d.ndim
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -ndim <= axis < ndim:
        raise ValueError(f"axis must be an integer axis of d (ndim {ndim}), got {axis!r}")
    r2 = jnp.sum(d * d, axis=axis)
    return _safe_sqrt(r2)


def _safe_sqrt(r2: jax.Array) -> jax.Array:
    safe = r2 > _TINY_R2
    return jnp.where(safe, jnp.sqrt(jnp.where(safe, r2, 1.0)), 0.0)


def _reduced_sincos_f32(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sin r, cos r, (−1)^q) with q the nearest integer to x/π and r = x − qπ ∈ [−π/2, π/2], so that
    sin x = (−1)^q sin r and cos x = (−1)^q cos r.

    Reducing by π (not π/2) needs two more polynomial terms but no quadrant swap, no integer
    conversion and no selects: fewer operations per element in the fused kernel than the π/2 form.
    """
    q = jnp.round(x * _INV_PI)
    r = x - q * _PI_A
    r = r - q * _PI_B
    r = r - q * _PI_C
    z = r * r
    s = r + r * z * (_S[0] + z * (_S[1] + z * (_S[2] + z * _S[3])))
    c = 1.0 + z * (_C[0] + z * (_C[1] + z * (_C[2] + z * (_C[3] + z * _C[4]))))
    half = q * 0.5
    sign = 1.0 - 4.0 * (half - jnp.floor(half))  # +1 for even q, −1 for odd q (exact in float32)
    return s, c, sign


def _sincos_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    s, c, sign = _reduced_sincos_f32(x)
    return sign * s, sign * c


@jax.custom_jvp
def sincos(x: Float[ArrayLike, "*shape"]) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """(sin x, cos x) from one shared argument reduction.

    float32 (and narrower floats, computed in float32): Cody–Waite reduction by π and near-minimax
    polynomials; measured max abs error 1.5e-7 against float64 for |x| ≤ 1e4 (``jnp.sin``: 3e-8).
    Beyond |x| ≈ 2.5e4 the three-part split of π is no longer exact and the error grows slowly
    (a float32 x that large has an ulp of ≥ 2e-3 anyway). float64: ``jnp.sin``/``jnp.cos``.
    The derivative is exact by construction: d(sin, cos) = (cos, −sin)·dx (custom JVP, so it
    also costs no extra transcendental work). Elementwise, any shape; works under jit/vmap/grad.
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"sincos: x must be a real floating array, got {x.dtype}")
    if jnp.finfo(x.dtype).bits > 32:
        return jnp.sin(x), jnp.cos(x)
    if x.dtype != jnp.float32:
        s, c = _sincos_f32(x.astype(jnp.float32))
        return s.astype(x.dtype), c.astype(x.dtype)
    return _sincos_f32(x)


@sincos.defjvp
def _sincos_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    s, c = sincos(x)
    return (s, c), (c * dx, -s * dx)


@jax.custom_jvp
def _sqrt_fwd(r2: jax.Array) -> jax.Array:
    """sqrt(r²) with a finite derivative at r² = 0 (0 there): one ``sqrt`` in the forward pass.

    The forward value is the plain square root (the compare-and-select of :func:`_safe_sqrt`
    differs from it only for r² ≤ 1e-20 and costs three more vector operations per pair)."""
    return jnp.sqrt(r2)


@_sqrt_fwd.defjvp
def _sqrt_fwd_jvp(primals, tangents):
    (r2,), (dr2,) = primals, tangents
    safe = r2 > _TINY_R2
    r = jnp.sqrt(r2)
    return r, jnp.where(safe, 0.5 * dr2 / jnp.where(safe, r, 1.0), 0.0)


@jax.custom_jvp
def _phasor(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(w cos x, w sin x). float32: the sign (−1)^q of the π-reduction is folded into w (one
    multiply instead of two); otherwise :func:`sincos`. JVP: (c dw − w s dx, s dw + w c dx)."""
    if x.dtype != jnp.float32:
        s, c = sincos(x)
        return w * c, w * s
    s, c, sign = _reduced_sincos_f32(x)
    ws = w * sign  # w·(−1)^q, exact
    return ws * c, ws * s


@_phasor.defjvp
def _phasor_jvp(primals, tangents):
    (w, x), (dw, dx) = primals, tangents
    s, c = sincos(x)
    re, im = w * c, w * s
    return (re, im), (c * dw - im * dx, s * dw + re * dx)


def _pair_term(pts_t: tuple[jax.Array, ...], src_j: tuple[jax.Array, ...], amplitude: jax.Array,
               wavenumber: jax.Array, theta: jax.Array, softening: jax.Array) -> jax.Array:
    """A_j e^{i(k_j r + θ_j)}/(r + ε) for one source j at the points of a block, complex (C,)."""
    r2 = cast(jax.Array, sum((p - s) * (p - s) for p, s in zip(pts_t, src_j, strict=True)))
    r = _sqrt_fwd(r2)
    re, im = _phasor(amplitude / (r + softening), wavenumber * r + theta)
    return jax.lax.complex(re, im)


def _block_sum(pts_t: tuple[jax.Array, ...], src_t: tuple[jax.Array, ...], amplitudes: jax.Array,
               wavenumbers: jax.Array, theta: jax.Array, softening: jax.Array, unroll: int) -> jax.Array:
    """Σ_j over sources for one block of points given as D coordinate arrays of shape (C,); complex (C,).

    One elementwise loop fusion per ``unroll`` sources, which XLA splits over the cores."""
    ctype = jnp.result_type(pts_t[0].dtype, jnp.complex64)

    def body(j, acc):
        return acc + _pair_term(pts_t, tuple(s[j] for s in src_t), amplitudes[j], wavenumbers[j], theta[j],
                                softening)

    acc0 = jnp.zeros(pts_t[0].shape, ctype)
    return jax.lax.fori_loop(0, src_t[0].shape[0], body, acc0, unroll=max(1, min(unroll, src_t[0].shape[0])))


def _serial_sum(pts_t: tuple[jax.Array, ...], src_t: tuple[jax.Array, ...], amplitudes: jax.Array,
                wavenumbers: jax.Array, theta: jax.Array, softening: jax.Array) -> jax.Array:
    """The same sum as :func:`_block_sum` for small problems, run on ONE thread.

    XLA's CPU backend splits every large-enough elementwise loop fusion over the cores; for a few
    thousand pairs the hand-off to the second thread costs more than the work
    (bench/results/fields_vs_torch_compile.json). A fusion whose root is an in-place
    ``dynamic_update_slice`` is never split, so the points are processed as two halves, each
    written into the output by one such fusion that sums groups of up to :data:`_SERIAL_GROUP`
    sources (a loop over groups when there are more).
    """
    ctype = jnp.result_type(pts_t[0].dtype, jnp.complex64)
    c = pts_t[0].shape[0]
    half = -(-c // 2)
    padded = tuple(jnp.pad(p, (0, 2 * half - c)) for p in pts_t)
    m = src_t[0].shape[0]
    group = min(m, _SERIAL_GROUP)
    n_groups, rest = divmod(m, group)

    def add_group(out, start, first, size):
        blk = tuple(jax.lax.dynamic_slice_in_dim(p, start, half) for p in padded)
        acc = jax.lax.dynamic_slice_in_dim(out, start, half)
        for u in range(size):
            j = first + u
            acc = acc + _pair_term(blk, tuple(s[j] for s in src_t), amplitudes[j], wavenumbers[j], theta[j],
                                   softening)
        return jax.lax.dynamic_update_slice_in_dim(out, acc, start, 0)

    def over_halves(i, out):
        start = i * half
        if n_groups == 1:
            out = add_group(out, start, 0, group)
        else:
            out = jax.lax.fori_loop(0, n_groups, lambda g, o: add_group(o, start, g * group, group), out)
        if rest:
            out = add_group(out, start, n_groups * group, rest)
        return out

    out = jax.lax.fori_loop(0, 2, over_halves, jnp.zeros((2 * half,), ctype))
    return out[:c]


def _reduce_sum(pts_t: tuple[jax.Array, ...], src_t: tuple[jax.Array, ...], amplitudes: jax.Array,
                wavenumbers: jax.Array, theta: jax.Array, softening: jax.Array) -> jax.Array:
    """The same sum as :func:`_block_sum` written as ONE reduction over the sources, complex (C,).

    The (C, M) pair terms are a broadcast expression that XLA fuses into the reduction's input, so the
    compiled program is a single reduction fusion that reads C points and M sources and writes C values:
    no loop, no (C, M) temporary in the forward pass. On an accelerator this is one kernel over all
    pairs (the loop kernels serialise the device over sources or blocks)."""
    r2 = cast(jax.Array, sum((p[:, None] - s[None, :]) * (p[:, None] - s[None, :])
                             for p, s in zip(pts_t, src_t, strict=True)))
    r = _sqrt_fwd(r2)
    re, im = _phasor(amplitudes[None, :] / (r + softening), wavenumbers[None, :] * r + theta[None, :])
    re_sum, im_sum = _sum_pair(re, im)
    return jax.lax.complex(re_sum, im_sum)


@jax.custom_jvp
def _sum_pair(re: jax.Array, im: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(Σ_j re[:, j], Σ_j im[:, j]) as ONE variadic reduction: XLA fuses the producers of both into it
    (two ``jnp.sum`` or a complex sum compile on CPU to a materialised (C, M) array and a tree of
    reduce-windows). Its JVP is the two plain sums, which are linear and transpose for reverse mode."""
    zero = jnp.zeros((), re.dtype)
    return jax.lax.reduce((re, im), (zero, zero), lambda a, b: (a[0] + b[0], a[1] + b[1]), (1,))


@_sum_pair.defjvp
def _sum_pair_jvp(primals, tangents):
    return _sum_pair(*primals), (jnp.sum(tangents[0], axis=1), jnp.sum(tangents[1], axis=1))


#: Kernels of :func:`point_source_sum`: ``"loop"`` (a loop over sources with a (C,) accumulator, tuned for
#: CPUs) and ``"reduce"`` (one fused reduction over the sources per block, for accelerators).
METHODS = ("loop", "reduce")


def point_source_sum(points: Float[ArrayLike, "n d"], sources: Real[ArrayLike, "m d"],
                     amplitudes: Real[ArrayLike, " m"], wavenumbers: Real[ArrayLike, " m"],
                     theta: Real[ArrayLike, " m"], softening: Real[ArrayLike, ""], *, chunk: int = 2048,
                     unroll: int = 4, method: str = "loop",
                     serial_pairs: int | None = None) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
    """Real and imaginary parts of Σ_j A_j e^{i(k_j r + θ_j)}/(r + ε) at every point.

    Args:
      points: (N, D) float. sources: (M, D). amplitudes, wavenumbers, theta: (M,).
      softening: ε ≥ 0 (scalar).
      chunk: points per block. Forward temporaries are O(chunk); reverse-mode autodiff keeps
        O(chunk × M) residuals for one block at a time (blocks are rematerialised).
      unroll: sources handled per pass over a block of the ``"loop"`` kernel (loop unrolling).
      method: ``"loop"`` (the CPU kernels: a loop over sources, serial for small blocks) or ``"reduce"``
        (each block one fused XLA reduction over the sources; no (chunk, M) temporary in the forward
        pass; reverse mode keeps O(chunk × M) residuals). Same values to float32 rounding.
      serial_pairs: ``"loop"`` blocks of at most this many pairs run on one thread (:func:`_serial_sum`);
        None: ``_SERIAL_PAIRS`` (:func:`ivhl_jax.fields.superpose` passes the backend's
        ``fields_serial_pairs``, measured per machine by ``ivhl tune``).

    Returns:
      (re, im), each (N,) in the points' dtype (float16/bfloat16 are computed in float32).

    Value and gradient are finite where a point coincides with a source (r = 0 there, with zero
    gradient of r). float32 accuracy against a float64 evaluation of the same inputs, relative to
    Σ_j |A_j|/(r + ε): ~5e-7 for phases of tens of radians; for larger phases the float32 rounding
    of r and k·r themselves (≈ |k r|·6e-8 rad, the same for ``jnp.cos``/``jnp.sin``) dominates,
    e.g. ~3e-6 at |k r + θ| ≈ 500 rad. :func:`sincos` itself adds ≤ 1.5e-7 (absolute).

    Raises:
      ValueError: naming the argument, for wrong ranks, mismatched lengths, a negative or non-finite
        ``softening`` (when concrete), or a ``chunk``/``unroll`` that is not a positive integer.
      TypeError: naming the argument, for a wrong dtype.
    """
    points = check_array(points, "points", ndim=2, kind="floating")
    sources = check_array(sources, "sources", shape=(None, points.shape[1]), kind="numeric")
    m = sources.shape[0]
    for name, a in (("amplitudes", amplitudes), ("wavenumbers", wavenumbers), ("theta", theta)):
        check_array(a, name, shape=(m,), kind="numeric")
    check_scalar(softening, "softening", nonnegative=True)
    check_scalar(chunk, "chunk", integer=True, minimum=1)
    check_scalar(unroll, "unroll", integer=True, minimum=1)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    unroll = int(unroll)
    out_dtype = points.dtype
    work = jnp.promote_types(out_dtype, jnp.float32)
    points = points.astype(work)
    sources = sources.astype(work)
    amplitudes, wavenumbers, theta = (jnp.asarray(a, work) for a in (amplitudes, wavenumbers, theta))
    softening = jnp.asarray(softening, work)
    n, d = points.shape
    if sources.shape[0] == 0:
        zero = jnp.zeros((n,), out_dtype)
        return zero, zero
    chunk = max(1, int(chunk))
    src_t = tuple(sources[:, i] for i in range(d))
    if method == "reduce":
        block = functools.partial(_reduce_sum, src_t=src_t, amplitudes=amplitudes, wavenumbers=wavenumbers,
                                  theta=theta, softening=softening)
    elif min(n, chunk) * sources.shape[0] <= (_SERIAL_PAIRS if serial_pairs is None else int(serial_pairs)):
        block = functools.partial(_serial_sum, src_t=src_t, amplitudes=amplitudes, wavenumbers=wavenumbers,
                                  theta=theta, softening=softening)
    else:
        block = functools.partial(_block_sum, src_t=src_t, amplitudes=amplitudes, wavenumbers=wavenumbers,
                                  theta=theta, softening=softening, unroll=unroll)
    if n <= chunk:
        out = block(tuple(points[:, i] for i in range(d)))
    else:
        n_blocks = -(-n // chunk)
        pad = n_blocks * chunk - n
        # (n_blocks, D, chunk): each block is D contiguous coordinate arrays (structure of arrays).
        blocks = jnp.pad(points, ((0, pad), (0, 0))).reshape(n_blocks, chunk, d).transpose(0, 2, 1)
        remat = jax.checkpoint(lambda b: block(tuple(b[i] for i in range(d))))
        out = jax.lax.map(remat, blocks).reshape(-1)[:n]
    return out.real.astype(out_dtype), out.imag.astype(out_dtype)
