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
  written in plain ``jnp`` arithmetic so XLA fuses and vectorises it with the rest of the kernel. That
  reduction is exact for |x| ≤ :data:`FAST_LIMIT` (2¹⁴). So that every phase stays in that range, each
  source's phase θ_j is first reduced exactly to [−π/2, π/2] (its sign (−1)^n goes into A_j: a late time
  −ωt costs nothing), and max|k r + θ| is bounded from the bounding boxes of points and sources; only when
  the bound exceeds the range does the sum run with XLA's ``sin``/``cos`` (correct for every finite float32,
  slower), a ``lax.cond`` between the two kernels.
* Per pair: one ``sqrt`` (custom JVP keeps the derivative finite at r = 0) and the sign (−1)^q of
  the sincos reduction folded into the weight A/(r + ε) (:func:`_make_phasor`).
* Points are processed in blocks of ``chunk``; within a block forward memory is O(chunk), and
  under reverse-mode autodiff each block is rematerialised (``jax.checkpoint``), so backward
  memory is O(chunk × M), never O(N × M).

Timings against PyTorch (eager and ``torch.compile``): ``bench/results/fields_vs_torch_compile.json``
(``python -m ivhl_jax.bench.ops_fields``); on an accelerator, ``python -m ivhl_jax.bench.gpu_checks``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_array, check_scalar

__all__ = [
    "safe_norm",
    "sincos",
    "sincos_static",
    "needs_full_range",
    "reduce_mod_pi",
    "FAST_LIMIT",
    "point_source_sum",
    "METHODS",
]

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
_S = tuple(
    np.float32(c) for c in (-0.16666661202907562, 0.008333087898790836, -0.00019811128731817007, 2.6089692255482078e-06)
)
_C = tuple(
    np.float32(c)
    for c in (-0.5, 0.04166664183139801, -0.00138884037733078, 2.476190093148034e-05, -2.607737030757562e-07)
)

# The Cody–Waite reduction above is exact for |x| ≤ 2**14 (|q| ≤ 5216 < 2**13). Beyond it, XLA's own float32
# sin/cos take over (correctly reduced over the whole finite range, measured max error 3.2e-8 over random bit
# patterns on CPU; libdevice's sinf/cosf on GPU), in a branch that only runs when some argument needs it.
_FAST_LIMIT = np.float32(2.0**14)
#: |x| up to which the fast (Cody–Waite) reduction of :func:`sincos_static` is exact.
FAST_LIMIT = float(_FAST_LIMIT)


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


def _fast_reduce_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(r, q) with q the nearest integer to x/π (a float) and r = x − qπ ∈ [−π/2, π/2]: the three-part
    Cody–Waite reduction, exact to ~1e-10 absolute for |x| ≤ :data:`_FAST_LIMIT` (beyond it, wrong)."""
    q = jnp.round(x * _INV_PI)
    r = x - q * _PI_A
    r = r - q * _PI_B
    r = r - q * _PI_C
    return r, q


def _parity_sign(q: jax.Array) -> jax.Array:
    half = q * 0.5
    return 1.0 - 4.0 * (half - jnp.floor(half))  # +1 for even q, −1 for odd q (exact in float32)


def _poly_sincos(r: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sin r, cos r) for |r| ≤ π/2 from the two near-minimax polynomials."""
    z = r * r
    s = r + r * z * (_S[0] + z * (_S[1] + z * (_S[2] + z * _S[3])))
    c = 1.0 + z * (_C[0] + z * (_C[1] + z * (_C[2] + z * (_C[3] + z * _C[4]))))
    return s, c


def _reduced_sincos_f32(x: jax.Array, full: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sin r, cos r, (−1)^q) with sin x = (−1)^q sin r and cos x = (−1)^q cos r.

    Fast path (``full=False``): q the nearest integer to x/π and r = x − qπ ∈ [−π/2, π/2] by the Cody–Waite
    reduction, exact for |x| ≤ :data:`_FAST_LIMIT` only. Reducing by π (not π/2) needs two more polynomial
    terms but no quadrant swap, no integer conversion and no selects: fewer operations per element in the
    fused kernel than the π/2 form. ``full=True``: XLA's ``sin``/``cos`` of x (r = x, q = 0), correct for every
    finite x and slower; non-finite x give NaN in both.
    """
    if full:
        return jnp.sin(x), jnp.cos(x), jnp.ones_like(x)
    r, q = _fast_reduce_f32(x)
    s, c = _poly_sincos(r)
    return s, c, _parity_sign(q)


@jax.custom_batching.custom_vmap
def _uniform_any(flag: jax.Array) -> jax.Array:
    """``flag`` (a bool scalar) unchanged; under ``vmap`` the OR over the batch, unbatched.

    A ``lax.cond`` whose predicate is batched becomes a select that runs BOTH branches; with this predicate
    the cond between the fast and the full-range kernel stays a cond under ``vmap`` (the full-range kernel,
    correct everywhere, runs for the whole batch when any member needs it)."""
    return flag


@_uniform_any.def_vmap
def _uniform_any_vmap(axis_size, in_batched, flag):
    del axis_size
    return (jnp.any(flag) if in_batched[0] else flag), False


def needs_full_range(bound: Real[ArrayLike, ""]) -> jax.Array:
    """Whether a phase bounded by ``bound`` (≥ max |x|, a scalar, may be traced) needs the full-range
    reduction: a bool scalar that stays unbatched under ``vmap`` (OR over the batch), for ``lax.cond``."""
    b = jax.lax.stop_gradient(check_array(bound, "bound", shape=(), kind="floating").astype(jnp.float32))
    return _uniform_any(jnp.logical_not(b <= _FAST_LIMIT))  # NaN bound: full range


def _sincos_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    def run(full: bool):
        def f(v):
            s, c, sign = _reduced_sincos_f32(v, full)
            return sign * s, sign * c

        return f

    if x.size == 0:
        return run(False)(x)
    big = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0))
    return jax.lax.cond(needs_full_range(big), run(True), run(False), x)


@jax.custom_jvp
def sincos(x: Float[ArrayLike, "*shape"]) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """(sin x, cos x) from one shared argument reduction, correct for every finite x.

    float32 (and narrower floats, computed in float32): for |x| ≤ 2¹⁴ a three-part Cody–Waite reduction by π
    (exact to ~1e-10) and near-minimax polynomials on [−π/2, π/2]; the absolute error against float64
    ``np.sin``/``np.cos`` of the same float32 value is ≤ 2.4e-7 (the float32 rounding of the reduced argument
    and of the result, 2 ulp of 1; measured 1.5e-7). The array is checked once (max |x|): when some element
    is beyond 2¹⁴ the whole array takes XLA's ``sin``/``cos`` instead (correct for every finite float32,
    measured 3.2e-8, slower), a ``lax.cond`` that under ``vmap`` decides for the whole batch.
    float64: ``jnp.sin``/``jnp.cos`` (XLA's float64 reduction is correct over the whole range).
    ±inf and NaN give NaN, as in NumPy.
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


def _make_static_sincos(full: bool):
    @jax.custom_jvp
    def f(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        if jnp.finfo(x.dtype).bits > 32:
            return jnp.sin(x), jnp.cos(x)
        s, c, sign = _reduced_sincos_f32(x.astype(jnp.float32), full)
        return (sign * s).astype(x.dtype), (sign * c).astype(x.dtype)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (dx,) = primals, tangents
        s, c = f(x)
        return (s, c), (c * dx, -s * dx)

    return f


_STATIC_SINCOS = {False: _make_static_sincos(False), True: _make_static_sincos(True)}


def sincos_static(
    x: Float[ArrayLike, "*shape"], full_range: bool
) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """:func:`sincos` with the reduction chosen statically, for fused kernels that know a bound on |x|
    (no check of x, no ``lax.cond``): ``full_range=False`` is the fast reduction, exact only for
    |x| ≤ :data:`FAST_LIMIT` (the caller guarantees it, e.g. with :func:`needs_full_range` on a bound);
    ``full_range=True`` is correct for every finite x. float64: ``jnp.sin``/``jnp.cos``. Exact JVP."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"sincos_static: x must be a real floating array, got {x.dtype}")
    return _STATIC_SINCOS[bool(full_range)](x)


@jax.custom_jvp
def reduce_mod_pi(x: Float[Array, "*shape"]) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """(r, σ) for float32 x: x = r + nπ (mod 2π), |r| ≤ π/2, σ = (−1)^n, so that e^{ix} = σ e^{ir}, for every
    finite x: r = x for |x| ≤ π/2, the exact Cody–Waite reduction up to :data:`_FAST_LIMIT`, and beyond it
    r from XLA's correctly reduced sin/cos (atan2, to ~1 ulp of π). dr/dx = 1 (custom JVP); σ is piecewise
    constant."""
    r, q = _fast_reduce_f32(x)
    sign = _parity_sign(q)
    big = jnp.abs(x) > _FAST_LIMIT
    a = jnp.arctan2(jnp.sin(x), jnp.cos(x))  # x mod 2π in (−π, π]
    flip = jnp.abs(a) > np.float32(np.pi / 2)
    a = jnp.where(flip, a - jnp.copysign(np.float32(np.pi), a), a)
    return jnp.where(big, a, r), jnp.where(big, jnp.where(flip, np.float32(-1.0), np.float32(1.0)), sign)


@reduce_mod_pi.defjvp
def _reduce_mod_pi_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    r, sign = reduce_mod_pi(x)
    return (r, sign), (dx, jnp.zeros_like(sign))


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


def _make_phasor(full: bool):
    """``phasor(w, x) = (w cos x, w sin x)``. float32: the sign (−1)^q of the π-reduction is folded into w (one
    multiply instead of two); the reduction is the fast one, or with ``full`` the one correct for every finite
    x (:func:`_reduced_sincos_f32`); other dtypes: :func:`sincos`. JVP: (c dw − w s dx, s dw + w c dx)."""

    def sc(x):
        if x.dtype != jnp.float32:
            return sincos(x)
        s, c, sign = _reduced_sincos_f32(x, full)
        return sign * s, sign * c

    @jax.custom_jvp
    def phasor(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        if x.dtype != jnp.float32:
            s, c = sincos(x)
            return w * c, w * s
        s, c, sign = _reduced_sincos_f32(x, full)
        ws = w * sign  # w·(−1)^q, exact
        return ws * c, ws * s

    @phasor.defjvp
    def phasor_jvp(primals, tangents):
        (w, x), (dw, dx) = primals, tangents
        s, c = sc(x)
        re, im = w * c, w * s
        return (re, im), (c * dw - im * dx, s * dw + re * dx)

    return phasor


# The kernels' phasor: fast (|phase| ≤ _FAST_LIMIT everywhere, checked per call) and full-range.
_PHASOR = {False: _make_phasor(False), True: _make_phasor(True)}


class _Waves(NamedTuple):
    """The per-source values of one sum in the work dtype: the coordinates as D arrays (M,), A, k and θ (M,) and
    the softening ε (scalar)."""

    coords: tuple[jax.Array, ...]
    amplitudes: jax.Array
    wavenumbers: jax.Array
    theta: jax.Array
    softening: jax.Array


def _source_term(pts_t: tuple[jax.Array, ...], waves: _Waves, j: Any, full: bool = False) -> jax.Array:
    """A_j e^{i(k_j r + θ_j)}/(r + ε) for one source j at the points of a block, complex (C,); ``full``
    (static): the full-range phase reduction."""
    src_j = tuple(s[j] for s in waves.coords)
    amplitude, wavenumber, theta = waves.amplitudes[j], waves.wavenumbers[j], waves.theta[j]
    r2 = cast(jax.Array, sum((p - s) * (p - s) for p, s in zip(pts_t, src_j, strict=True)))
    r = _sqrt_fwd(r2)
    re, im = _PHASOR[full](amplitude / (r + waves.softening), wavenumber * r + theta)
    return jax.lax.complex(re, im)


def _block_sum(pts_t: tuple[jax.Array, ...], waves: _Waves, unroll: int, full: bool = False) -> jax.Array:
    """Σ_j over sources for one block of points given as D coordinate arrays of shape (C,); complex (C,).

    One elementwise loop fusion per ``unroll`` sources, which XLA splits over the cores."""
    ctype = jnp.result_type(pts_t[0].dtype, jnp.complex64)

    def body(j, acc):
        return acc + _source_term(pts_t, waves, j, full)

    acc0 = jnp.zeros(pts_t[0].shape, ctype)
    m = waves.coords[0].shape[0]
    return jax.lax.fori_loop(0, m, body, acc0, unroll=max(1, min(unroll, m)))


def _serial_sum(pts_t: tuple[jax.Array, ...], waves: _Waves, full: bool = False) -> jax.Array:
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
    m = waves.coords[0].shape[0]
    group = min(m, _SERIAL_GROUP)
    n_groups, rest = divmod(m, group)

    def add_group(out, start, first, size):
        blk = tuple(jax.lax.dynamic_slice_in_dim(p, start, half) for p in padded)
        acc = jax.lax.dynamic_slice_in_dim(out, start, half)
        for u in range(size):
            acc = acc + _source_term(blk, waves, first + u, full)
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


def _reduce_sum(pts_t: tuple[jax.Array, ...], waves: _Waves, full: bool = False) -> jax.Array:
    """The same sum as :func:`_block_sum` written as ONE reduction over the sources, complex (C,).

    The (C, M) pair terms are a broadcast expression that XLA fuses into the reduction's input, so the
    compiled program is a single reduction fusion that reads C points and M sources and writes C values:
    no loop, no (C, M) temporary in the forward pass. On an accelerator this is one kernel over all
    pairs (the loop kernels serialise the device over sources or blocks)."""
    r2 = cast(
        jax.Array,
        sum((p[:, None] - s[None, :]) * (p[:, None] - s[None, :]) for p, s in zip(pts_t, waves.coords, strict=True)),
    )
    r = _sqrt_fwd(r2)
    re, im = _PHASOR[full](
        waves.amplitudes[None, :] / (r + waves.softening), waves.wavenumbers[None, :] * r + waves.theta[None, :]
    )
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


def point_source_sum(
    points: Float[ArrayLike, "n d"],
    sources: Real[ArrayLike, "m d"],
    amplitudes: Real[ArrayLike, " m"],
    wavenumbers: Real[ArrayLike, " m"],
    theta: Real[ArrayLike, " m"],
    softening: Real[ArrayLike, ""],
    *,
    chunk: int = 2048,
    unroll: int = 4,
    method: str = "loop",
    serial_pairs: int | None = None,
) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
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
    static: dict[str, Any] = {
        "chunk": max(1, int(chunk)),
        "unroll": unroll,
        "method": method,
        "out_dtype": out_dtype,
        "serial_pairs": _SERIAL_PAIRS if serial_pairs is None else int(serial_pairs),
    }
    if work == jnp.float32:
        return _sum_float32((points, sources, amplitudes, wavenumbers, theta, softening), static)
    return _sum_points(points, sources, amplitudes, wavenumbers, theta, softening, full=False, **static)


def _sum_float32(arrays: tuple[jax.Array, ...], static: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    """:func:`_sum_points` for float32 work on its ``arrays`` (points, sources, amplitudes, wavenumbers, θ, ε):
    each θ_j reduced exactly by π first, then the fast kernel where the phase bound allows it and the full-range
    one elsewhere (``lax.cond``; ``static``: its keyword settings)."""
    points, sources, amplitudes, wavenumbers, theta, softening = arrays
    # e^{i(kr + θ)} = σ e^{i(kr + θ_r)} with θ = θ_r + nπ, σ = (−1)^n, |θ_r| ≤ π/2: exact per source (a large
    # θ, e.g. −ωt at late times, no longer enters the per-pair phase), the sign goes into the amplitude.
    theta, sigma = reduce_mod_pi(theta)
    amplitudes = amplitudes * sigma
    # max |k r + θ_r| over all pairs, bounded from the bounding boxes of points and sources (O(N + M)):
    # the fast phase reduction covers it, or the full-range kernel runs (lax.cond: one of the two).
    span = jnp.maximum(
        jnp.max(points, axis=0) - jnp.min(sources, axis=0), jnp.max(sources, axis=0) - jnp.min(points, axis=0)
    )
    bound = jnp.max(jnp.abs(wavenumbers)) * jnp.sqrt(jnp.sum(span * span)) * 1.01 + np.pi / 2
    return jax.lax.cond(
        needs_full_range(bound),
        functools.partial(_sum_points, full=True, **static),
        functools.partial(_sum_points, full=False, **static),
        points,
        sources,
        amplitudes,
        wavenumbers,
        theta,
        softening,
    )


def _sum_points(
    points: jax.Array,
    sources: jax.Array,
    amplitudes: jax.Array,
    wavenumbers: jax.Array,
    theta: jax.Array,
    softening: jax.Array,
    *,
    chunk: int,
    unroll: int,
    method: str,
    out_dtype: Any,
    serial_pairs: int,
    full: bool,
) -> tuple[jax.Array, jax.Array]:
    """The blocked sum of :func:`point_source_sum` on validated work-dtype inputs; ``full``: the full-range
    phase reduction (static); ``serial_pairs``: the one-thread block limit."""
    n, d = points.shape
    waves = _Waves(tuple(sources[:, i] for i in range(d)), amplitudes, wavenumbers, theta, softening)
    if full and method == "loop":
        # The rare full-range branch (XLA's sin/cos, slower): one source per loop iteration, a small program (it
        # is compiled with every call and mostly not run).
        method, unroll = "block", 1
    if method == "reduce":
        block = functools.partial(_reduce_sum, waves=waves, full=full)
    elif method == "loop" and min(n, chunk) * sources.shape[0] <= serial_pairs:
        block = functools.partial(_serial_sum, waves=waves, full=full)
    else:
        block = functools.partial(_block_sum, waves=waves, unroll=unroll, full=full)
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
