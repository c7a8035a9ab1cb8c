"""Performance kernels behind the public field functions.

``point_source_sum`` is the hot loop of :func:`ivhl_jax.physics.fields.superpose`: for N points and M
sources it evaluates

    ψ_n = Σ_j A_j · exp(i (k_j r_nj + θ_j)) / (r_nj + ε),    r_nj = |x_n − s_j|,

returning the real and imaginary parts.

Why it is written the way it is (measured on the 2-vCPU AMD EPYC CPU host; numbers in
``bench/results/fields_superpose.md``):

* XLA's CPU ``sin``/``cos`` are slow (~200–400 M elements/s), and a fused kernel that needs both
  computes the argument reduction twice. :func:`sincos` evaluates both from one Cody–Waite
  reduction by π and two short polynomials, written in plain ``jnp`` arithmetic so XLA
  fuses and vectorises it with the rest of the kernel.
* Layout: structure of arrays (one contiguous (C,) array per coordinate) and a loop over sources
  with a (C,) complex accumulator, so every loop iteration is ONE elementwise loop fusion over
  points (vectorised, split over the cores by XLA) with no reduction across lanes. A complex
  accumulator makes the real and imaginary parts outputs of the same fusion (two real
  accumulators give two fusions that each recompute the whole phase and sincos).
* The loop body is unrolled ``unroll`` times (default 4), so one fusion handles four sources per
  pass over the points: fewer passes over memory and fewer loop iterations.
* Points are processed in blocks of ``chunk``; within a block forward memory is O(chunk), and
  under reverse-mode autodiff each block is rematerialised (``jax.checkpoint``), so backward
  memory is O(chunk × M), never O(N × M).
"""

from __future__ import annotations

import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from ivhl_jax.core.validation import check_array, check_scalar

__all__ = ["safe_norm", "sincos", "point_source_sum"]

# Squared distances below this are treated as this value: the gradient of |d| at d = 0 is
# undefined (NaN in autodiff); this keeps the field and its gradient finite on a source.
_TINY_R2 = 1e-20

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


def _sincos_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    # q = nearest integer to x/π, r = x − qπ ∈ [−π/2, π/2]; sin x = (−1)^q sin r, cos x = (−1)^q cos r.
    # Reducing by π (not π/2) needs two more polynomial terms but no quadrant swap, no integer
    # conversion and no selects: measured ~15–20 % faster in the fused kernel than the π/2 form.
    q = jnp.round(x * _INV_PI)
    r = x - q * _PI_A
    r = r - q * _PI_B
    r = r - q * _PI_C
    z = r * r
    s = r + r * z * (_S[0] + z * (_S[1] + z * (_S[2] + z * _S[3])))
    c = 1.0 + z * (_C[0] + z * (_C[1] + z * (_C[2] + z * (_C[3] + z * _C[4]))))
    half = q * 0.5
    sign = 1.0 - 4.0 * (half - jnp.floor(half))  # +1 for even q, −1 for odd q (exact in float32)
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


def _block_sum(pts_t: tuple[jax.Array, ...], src_t: tuple[jax.Array, ...], amplitudes: jax.Array,
               wavenumbers: jax.Array, theta: jax.Array, softening: jax.Array, unroll: int) -> jax.Array:
    """Σ_j over sources for one block of points given as D coordinate arrays of shape (C,); complex (C,)."""
    ctype = jnp.result_type(pts_t[0].dtype, jnp.complex64)

    def body(j, acc):
        r2 = cast(jax.Array, sum((p - s[j]) * (p - s[j]) for p, s in zip(pts_t, src_t, strict=True)))
        r = _safe_sqrt(r2)
        w = amplitudes[j] / (r + softening)
        sn, cs = sincos(wavenumbers[j] * r + theta[j])
        return acc + jax.lax.complex(w * cs, w * sn)

    acc0 = jnp.zeros(pts_t[0].shape, ctype)
    return jax.lax.fori_loop(0, src_t[0].shape[0], body, acc0, unroll=max(1, min(unroll, src_t[0].shape[0])))


def point_source_sum(points: Float[ArrayLike, "n d"], sources: Real[ArrayLike, "m d"],
                     amplitudes: Real[ArrayLike, " m"], wavenumbers: Real[ArrayLike, " m"],
                     theta: Real[ArrayLike, " m"], softening: Real[ArrayLike, ""], *, chunk: int = 2048, unroll: int = 4
                     ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
    """Real and imaginary parts of Σ_j A_j e^{i(k_j r + θ_j)}/(r + ε) at every point.

    Args:
      points: (N, D) float. sources: (M, D). amplitudes, wavenumbers, theta: (M,).
      softening: ε ≥ 0 (scalar).
      chunk: points per block. Forward temporaries are O(chunk); reverse-mode autodiff keeps
        O(chunk × M) residuals for one block at a time (blocks are rematerialised).
      unroll: sources handled per pass over a block (loop unrolling; 4 is fastest on the CPU host).

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
