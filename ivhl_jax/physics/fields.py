"""Scalar wave fields from point sources, optical vortices, and phase-winding (vortex) detection.

Conventions used throughout (units: lengths in arbitrary units L, wavenumbers in 1/L, angular
frequencies in 1/T, time in T; the default ``frequencies=None`` means ω = c·k with c = 1 L/T):

* Time dependence is ``exp(−iωt)``: every source emits an **outgoing** spherical (3-D) or
  circular (2-D) wave ``A e^{i(k r − ω t + φ)} / (r + ε)``; its phase fronts move away from the
  source as t grows.
* Grids use ``indexing="ij"``: array axis 0 is x, axis 1 is y (axis 2 is z). A field evaluated at
  ``grid_points(shape, ...)`` reshapes to ``shape`` with that meaning.
* Vortex charge is positive when the phase increases **counter-clockwise** about the vortex axis
  (right-hand rule; in the (x, y) plane with the default axis +z, counter-clockwise seen from +z).
  :func:`vortex` with charge q, :func:`winding_number` of a loop traversed counter-clockwise around
  it, and :func:`vortex_map` at the plaquette that holds it all give q.

Public API: :func:`superpose`, :func:`vortex`, :func:`intensity`, :func:`phase`,
:func:`winding_number`, :func:`vortex_map`, :func:`grid_points`, :func:`helix_sources`,
:func:`focus_phases` (inverse design of source phases with optax), and the time loop:
:func:`superposition` (the stepper; it validates its settings) → ``trajectory(..., observe=observe)``.

Speed: :func:`superpose` takes its default block size and kernel from the backend table
(:func:`ivhl_jax.core.backend.defaults`): on CPU blocks of ``fields_pair_budget // M`` points through the
CPU loop kernels; on GPU/TPU the largest block whose reverse-mode residuals fit
``fields_memory_fraction`` of the device's memory, each block one fused XLA reduction over the sources.
``fields_method="pallas"`` (raced on GPUs by ``ivhl tune``) runs the Pallas tile kernel of
:mod:`ivhl_jax.physics.fields_pallas` instead for float32 work (other dtypes: the XLA reduction).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Int, Num, Real

from ivhl_jax.core import backend
from ivhl_jax.core.precision import Policy, physics_policy, real_compute_dtype
from ivhl_jax.core.validation import check_array, check_broadcastable, check_scalar, is_concrete
from ivhl_jax.numerics import fastmath
from ivhl_jax.numerics.rollout import Stepper

__all__ = [
    "superpose",
    "vortex",
    "intensity",
    "phase",
    "winding_number",
    "vortex_map",
    "grid_points",
    "helix_sources",
    "focus_phases",
    "WaveState",
    "SuperpositionParams",
    "superposition",
    "field_at",
    "observe",
]

# Reverse mode through the fused-reduction kernel keeps 6 work-dtype values per (point, source) pair
# of a block (measured from the compiled gradient's temporaries: 24 bytes per pair in float32); the
# "memory" rule budgets 8, for the forward pass's own buffers and slack.
_RESIDUALS_PER_PAIR = 8
# Device memory assumed where the device reports none (``memory_stats()`` is None on CPU and on some
# plugins).
_FALLBACK_DEVICE_BYTES = 8 << 30

# With traced (non-concrete) charges the integer power in `vortex` uses this many bits, so
# |q| <= 2**8 - 1 there; concrete charges use exactly as many bits as they need.
_TRACED_CHARGE_BITS = 8


def _float_dtype(*arrays: jax.Array) -> Any:
    """The floating dtype of the computation: the inputs' promoted type, ints promoted to float."""
    return jnp.result_type(*(a.dtype for a in arrays), float)


def _points_and_sources(points: Any, sources: Any, points_name: str, sources_name: str) -> tuple[jax.Array, jax.Array]:
    pts = check_array(points, points_name, ndim=2, kind="numeric", finite=True)
    src = check_array(sources, sources_name, ndim=2, kind="numeric", finite=True)
    if jnp.iscomplexobj(pts) or jnp.iscomplexobj(src):
        raise TypeError(f"{points_name} and {sources_name} must be real coordinates, got complex")
    d = pts.shape[1]
    if d not in (2, 3):
        raise ValueError(f"{points_name} must have shape (N, 2) or (N, 3) (D = 2 or 3), got {tuple(pts.shape)}")
    if src.shape[1] != d:
        raise ValueError(
            f"{sources_name} must have shape ({src.shape[0]}, {d}) to match {points_name}'s "
            f"dimension D = {d}, got {tuple(src.shape)}"
        )
    dtype = _float_dtype(pts, src)
    return pts.astype(dtype), src.astype(dtype)


def _policy_dtypes(policy: str | Policy | None, like: Any) -> tuple[Any, Any, Any]:
    """(storage, work, output) dtypes of a field kernel under ``policy``; None is the default policy of the
    kernel's geometry ``like`` (:func:`~ivhl_jax.core.precision.default_policy`: its own dtype everywhere).

    The work dtype is the compute dtype raised to at least float32: the phase k·r + θ of a pair is
    tens to hundreds of radians and bfloat16 keeps 8 significant bits, so a bf16 phase near 50 rad
    is quantised to 0.25 rad (and a bf16 distance r ≈ 2 to 8e-3, i.e. k·8e-3 rad). Measured on
    777 points × 53 sources with inputs exactly representable in bf16 (norm-wise relative error
    against the float64 sum): bf16 arithmetic 2.0e-2 for k ≤ 8 and 0.11 for k ≤ 50; bf16 storage
    with the phase in float32 1.6e-3 for both (only the bf16 rounding of the outputs). Reduced
    precision is therefore only offered for storage (inputs rounded to ``param_dtype``) and for the
    returned Re ψ / Im ψ (rounded to ``output_dtype``; returned as complex64 when that is bf16/f16,
    because XLA has no complex bf16).
    """
    pol = physics_policy(policy, like=like)
    return jnp.dtype(pol.param_dtype), jnp.dtype(real_compute_dtype(pol)), jnp.dtype(pol.output_dtype)


def _per_source(x: Any, name: str, m: int, dtype: Any) -> jax.Array:
    arr = check_array(x, name, ndim=(0, 1), kind="numeric", finite=True)
    if jnp.iscomplexobj(arr):
        raise TypeError(f"{name} must be real (put complex phases into `phases`), got {arr.dtype}")
    return check_broadcastable(arr, name, m, "the number of sources").astype(dtype)


def superpose(
    points: Real[ArrayLike, "n d"],
    sources: Real[ArrayLike, "m d"],
    *,
    amplitudes: Any = 1.0,
    wavenumbers: Any = 1.0,
    frequencies: Any = None,
    phases: Any = 0.0,
    t: Any = 0.0,
    softening: Any = 0.1,
    chunk: int | None = None,
    policy: str | Policy | None = None,
) -> Complex[Array, " n"]:
    """Superposition of outgoing point-source waves at ``points`` and time ``t``.

        ψ(r, t) = Σ_j A_j · exp(i(k_j |r − r_j| − ω_j t + φ_j)) / (|r − r_j| + ε)

    The ``1/(r + ε)`` law is the 3-D Green's function amplitude without its ``1/4π`` factor,
    softened so that the field stays finite (|ψ| ≤ Σ|A_j|/ε) and differentiable on a source; the
    same law is used for D = 2 (a 2-D "slice world", not the 2-D Green's function).

    Args:
      points: (N, D) real coordinates, D = 2 or 3.
      sources: (M, D) real source positions (same D).
      amplitudes: A_j, shape (M,) or a scalar (broadcast). Real.
      wavenumbers: k_j, (M,) or scalar.
      frequencies: ω_j, (M,) or scalar; ``None`` means ω_j = k_j (wave speed c = 1).
      phases: φ_j, (M,) or scalar, radians.
      t: time (scalar; may be traced, e.g. under ``vmap`` over times).
      softening: ε > 0 (ε = 0 would make the field infinite on a source: refused).
      chunk: points per block (default: ``default_chunk``, from the backend table); peak
        temporary memory is about ``chunk × M`` values of a few arrays, never N × M.
      policy: a :class:`~ivhl_jax.core.precision.Policy` / preset name (``"f64"``, ``"f32"``, ``"bf16"``,
        ``"pure_bf16"``, ...); None (the default) is the policy of the points' and sources' promoted dtype
        (:func:`~ivhl_jax.core.precision.default_policy`). ``param_dtype`` is the storage of points, sources and
        per-source values (they are rounded to it); the pair arithmetic runs in ``compute_dtype`` raised to at
        least float32 (the phase k·r is large and bf16 keeps 8 bits of mantissa, so a bf16 phase is worthless:
        ``"bf16"`` therefore gives the float32 result); Re ψ and Im ψ are rounded to ``output_dtype``.
        ``"pure_bf16"`` is bf16 storage of points and outputs with the phase in float32. Measured errors:
        docs/guide/precision.md. ``"f64"`` needs ``jax.enable_x64``.

    Returns:
      complex (N,) of the policy's ``output_dtype`` (complex64 for bf16/f16/f32 outputs): by default
      complex64 for float32 inputs, complex128 for float64 (ints count as floats).

    Works under ``jit``, ``vmap`` (over ``t``, over stacked source sets or parameters) and ``grad``
    (w.r.t. points, sources, amplitudes, wavenumbers, frequencies, phases, t). The pair loop is
    :func:`ivhl_jax.numerics.fastmath.point_source_sum`.
    """
    pts, src = _points_and_sources(points, sources, "points", "sources")
    # Round the stored inputs to the storage dtype, then widen to the work dtype.
    store, dtype, out_dtype = _policy_dtypes(policy, (pts, src))
    pts, src = pts.astype(store).astype(dtype), src.astype(store).astype(dtype)
    m = src.shape[0]
    if m == 0:
        raise ValueError(
            "sources must hold at least one source, got shape (0, D); with no sources the field "
            "is identically zero (use jnp.zeros(N, jnp.complex64))"
        )
    amp = _per_source(amplitudes, "amplitudes", m, dtype)
    k = _per_source(wavenumbers, "wavenumbers", m, dtype)
    omega = k if frequencies is None else _per_source(frequencies, "frequencies", m, dtype)
    phi = _per_source(phases, "phases", m, dtype)
    amp, k, omega, phi = (a.astype(store).astype(dtype) for a in (amp, k, omega, phi))
    check_scalar(t, "t")
    check_scalar(softening, "softening", positive=True)
    n = pts.shape[0]
    tuning = backend.defaults(op="fields.superpose", size=n * m)
    if chunk is None:
        chunk = default_chunk(m, dtype, n)
    else:
        check_scalar(chunk, "chunk", integer=True, minimum=1)
        chunk = int(chunk)
    chunk = min(chunk, max(n, 1))
    if tuning.fields_method == "pallas" and dtype == jnp.float32:
        return _superpose_pallas_core(
            pts, src, amp, k, omega, phi, jnp.asarray(t, dtype), jnp.asarray(softening, dtype), chunk, out_dtype
        )
    return _superpose_core(
        pts,
        src,
        amp,
        k,
        omega,
        phi,
        jnp.asarray(t, dtype),
        jnp.asarray(softening, dtype),
        chunk=chunk,
        out_dtype=out_dtype,
        method="reduce" if tuning.fields_method == "pallas" else tuning.fields_method,
        serial_pairs=tuning.fields_serial_pairs,
    )


@functools.cache
def _device_memory_bytes() -> int:
    """Memory of the default device: ``memory_stats()["bytes_limit"]`` where reported, else the fallback."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # a plugin without the call
        stats = None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else _FALLBACK_DEVICE_BYTES


def default_chunk(m: int, dtype: Any = jnp.float32, n: int | None = None) -> int:
    """Points per block :func:`superpose` uses for ``m`` sources when ``chunk`` is not given.

    From the backend table (:func:`ivhl_jax.core.backend.defaults`): ``fields_chunking="pair_budget"``
    (CPU) gives ``fields_pair_budget // m`` (the block's temporaries stay in cache);
    ``"memory"`` (GPU/TPU) gives the largest block whose reverse-mode residuals, 8 values of ``dtype``
    per (point, source) pair, fit ``fields_memory_fraction`` of the device's memory
    (``memory_stats()["bytes_limit"]``, or 8 GiB where the device reports none). On an accelerator that
    is usually every point at once: one fused kernel over all pairs. The budget is per call, i.e. per
    ``vmap`` lane: a call vmapped over B source sets needs B times the memory (pass ``chunk`` then).
    With ``n`` (the number of points) the settings measured for ``n × m`` pairs on this machine apply
    (``ivhl tune``'s cache, :func:`ivhl_jax.core.backend.defaults`).
    """
    tuning = backend.defaults(op="fields.superpose", size=None if n is None else int(n) * max(int(m), 1))
    m = max(int(m), 1)
    if tuning.fields_chunking == "pair_budget":
        return max(1, tuning.fields_pair_budget // m)
    budget = tuning.fields_memory_fraction * _device_memory_bytes()
    return max(1, int(budget // (_RESIDUALS_PER_PAIR * jnp.dtype(dtype).itemsize * m)))


def _round_complex(re: jax.Array, im: jax.Array, out_dtype: Any) -> jax.Array:
    """Re/Im rounded to ``out_dtype`` and packed as complex (complex64 for bf16/f16: no complex bf16)."""
    wide = jnp.promote_types(out_dtype, jnp.float32)
    return jax.lax.complex(re.astype(out_dtype).astype(wide), im.astype(out_dtype).astype(wide))


@functools.partial(jax.jit, static_argnames=("chunk", "out_dtype", "method", "serial_pairs"))
def _superpose_core(pts, src, amp, k, omega, phi, t, softening, *, chunk, out_dtype, method="loop", serial_pairs=None):
    # Jitted so that eager calls run as one compiled program (inlined when called under jit).
    re, im = fastmath.point_source_sum(
        pts, src, amp, k, phi - omega * t, softening, chunk=chunk, method=method, serial_pairs=serial_pairs
    )
    return _round_complex(re, im, out_dtype)


@functools.partial(jax.jit, static_argnums=(8, 9))
def _superpose_pallas_core(pts, src, amp, k, omega, phi, t, softening, chunk, out_dtype):
    # The Pallas tile kernel (``fields_method="pallas"``, float32 work dtype); its VJP is the XLA "reduce" kernel's.
    # Imported here: Pallas costs ~0.2 s to import and only this (GPU) choice needs it.
    from ivhl_jax.physics import fields_pallas

    re, im = fields_pallas.point_source_sum(pts, src, jnp.stack([amp, k, phi - omega * t]), softening, chunk=chunk)
    return _round_complex(re, im, out_dtype)


def _int_power(w: jax.Array, n: jax.Array, bits: int) -> jax.Array:
    """w**n for a non-negative integer array n by binary exponentiation (smooth in w, exact for n < 2**bits)."""
    result = jnp.ones_like(w)
    base = w
    for b in range(bits):
        result = jnp.where(((n >> b) & 1).astype(bool), result * base, result)
        base = base * base
    return result


def _plane_basis(axes: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Right-handed orthonormal (e1, e2, n) for each axis (V, 3); n = +z gives e1 = x̂, e2 = ŷ."""
    n = axes / jnp.linalg.norm(axes, axis=-1, keepdims=True)
    x_hat = jnp.array([1.0, 0.0, 0.0], n.dtype)
    y_hat = jnp.array([0.0, 1.0, 0.0], n.dtype)
    # Project x̂ onto the plane unless the axis is nearly along x̂ (then use ŷ): a well-conditioned seed.
    seed = jnp.where(jnp.abs(n[:, :1]) > 0.9, y_hat, x_hat)
    e1 = seed - jnp.sum(seed * n, axis=-1, keepdims=True) * n
    e1 = e1 / jnp.linalg.norm(e1, axis=-1, keepdims=True)
    e2 = jnp.cross(n, e1)
    return e1, e2, n


def vortex(
    points: Real[ArrayLike, "n d"],
    centers: Real[ArrayLike, "v d"],
    charges: Int[ArrayLike, " v"] | Int[ArrayLike, ""],
    *,
    core_size: Any = 0.1,
    axes: Real[ArrayLike, " 3"] | Real[ArrayLike, "v 3"] | None = None,
    policy: str | Policy | None = None,
) -> Complex[Array, " n"]:
    """Product of straight optical vortex lines (phase singularities) evaluated at ``points``.

        χ(r) = Π_v f_{|q_v|}(ρ_v) · exp(i q_v θ_v),   f_n(ρ) = (ρ / √(ρ² + ξ²))^n

    ρ_v and θ_v are the polar coordinates of ``r − c_v`` in the plane normal to the vortex axis n̂_v
    (θ counter-clockwise about n̂_v, measured from the in-plane direction of x̂, or of ŷ when n̂_v is
    within ~26° of x̂). The core profile f_n is the Padé form of the GP vortex core: it vanishes like
    (ρ/ξ)^{|q|} on the axis, tends to 1 far away (1 − |q|ξ²/2ρ² + …), and |χ| ≤ 1. Because
    f_{|q|}·e^{iqθ} = (u ± iv)^{|q|} / (ρ² + ξ²)^{|q|/2} with (u, v) the in-plane coordinates, χ is
    a smooth (real-analytic) function of the points and centres: value and gradient are finite
    everywhere, including on the axis (no atan2, no division by ρ).

    Multiply a wave field by χ to imprint vortices: ``superpose(...) * vortex(...)``.

    Args:
      points: (N, D), D = 2 (the (x, y) plane; axes must be None) or 3.
      centers: (V, D) a point on each vortex line.
      charges: (V,) integer topological charges (any sign; 0 gives a factor 1).
      core_size: ξ > 0, the core radius (same length unit as the points).
      axes: None (all along +z), a (3,) axis shared by all vortices, or (V, 3) per vortex (need
        not be normalised). Only for D = 3.
      policy: as in :func:`superpose`: points and centres rounded to ``param_dtype``, the
        arithmetic in ``compute_dtype`` raised to at least float32 (the core profile and the
        powers (u ± iv)^|q| lose |q|·2⁻⁹ relative per factor in bf16), Re χ / Im χ rounded to
        ``output_dtype``.

    Returns:
      complex (N,), complex64 for float32 inputs (with a policy: complex of ``output_dtype``,
      complex64 for bf16).
    """
    pts, ctr = _points_and_sources(points, centers, "points", "centers")
    store, dtype, out_dtype = _policy_dtypes(policy, (pts, ctr))
    pts, ctr = pts.astype(store).astype(dtype), ctr.astype(store).astype(dtype)
    v = ctr.shape[0]
    q = check_array(charges, "charges", kind="integer")
    if q.ndim == 0:
        q = jnp.broadcast_to(q, (v,))
    if q.shape != (v,):
        raise ValueError(f"charges must have shape ({v},) to match centers, got {tuple(q.shape)}")
    q = q.astype(jnp.int32)
    check_scalar(core_size, "core_size", positive=True)
    d = pts.shape[1]
    if d == 2:
        if axes is not None:
            raise ValueError("axes must be None for 2-D points: 2-D vortices are normal to the (x, y) plane")
        delta = pts[:, None, :] - ctr[None, :, :]
        u, w = delta[..., 0], delta[..., 1]
    else:
        if axes is None:
            ax = jnp.broadcast_to(jnp.array([0.0, 0.0, 1.0], dtype), (v, 3))
        else:
            ax = check_array(axes, "axes", ndim=(1, 2), kind="numeric", finite=True).astype(dtype)
            if ax.shape == (3,):
                ax = jnp.broadcast_to(ax, (v, 3))
            elif ax.shape != (v, 3):
                raise ValueError(f"axes must have shape (3,) or ({v}, 3), got {tuple(ax.shape)}")
            if is_concrete(ax) and not np.all(np.linalg.norm(np.asarray(ax), axis=-1) > 0):
                raise ValueError("axes must be non-zero vectors")
        e1, e2, _ = _plane_basis(ax)
        delta = pts[:, None, :] - ctr[None, :, :]
        u = jnp.sum(delta * e1[None], axis=-1)
        w = jnp.sum(delta * e2[None], axis=-1)
    if is_concrete(q):
        bits = max(1, int(np.max(np.abs(np.asarray(q)), initial=0)).bit_length())
    else:
        bits = _TRACED_CHARGE_BITS
    return _vortex_core(u, w, q, jnp.asarray(core_size, dtype), bits=bits, out_dtype=out_dtype)


@functools.partial(jax.jit, static_argnames=("bits", "out_dtype"))
def _vortex_core(u, w, q, xi, *, bits, out_dtype):
    denom = jax.lax.rsqrt(u * u + w * w + xi * xi)
    z = jax.lax.complex(u * denom, jnp.where(q >= 0, w, -w) * denom)
    factors = _int_power(z, jnp.abs(q)[None, :], bits)
    chi = jnp.prod(factors, axis=1)
    return _round_complex(chi.real, chi.imag, out_dtype)


def intensity(psi: Num[ArrayLike, "*shape"]) -> Real[Array, "*shape"]:
    """I = |ψ|² = Re(ψ)² + Im(ψ)², real, same shape (no square root: smooth gradient at ψ = 0)."""
    psi = check_array(psi, "psi", kind="numeric")
    if jnp.iscomplexobj(psi):
        return psi.real * psi.real + psi.imag * psi.imag
    return psi * psi


def phase(psi: Num[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
    """arg ψ in (−π, π], same shape, real. (Its gradient is undefined where ψ = 0.)"""
    psi = check_array(psi, "psi", kind="numeric")
    return jnp.angle(psi)


def _wrap(dtheta: jax.Array) -> jax.Array:
    """Map angle differences to [−π, π)."""
    return dtheta - 2 * jnp.pi * jnp.round(dtheta / (2 * jnp.pi))


def _phases_of(values: jax.Array) -> jax.Array:
    return jnp.angle(values) if jnp.iscomplexobj(values) else values


def winding_number(values_on_closed_loop: Num[ArrayLike, "*batch loop"]) -> Int[Array, "*batch"]:
    """Integer winding of the phase along a closed discrete loop (last axis; batch axes allowed).

        w = (1/2π) Σ_k wrap(θ_{k+1} − θ_k),   k = 0 … L−1, θ_L ≡ θ_0 (the loop is closed for you)

    with wrap(·) ∈ [−π, π). Exact (an integer) for any sampling; it equals the enclosed vortex charge
    when the loop is traversed counter-clockwise and is sampled finely enough that the true phase
    changes by less than π between neighbours.

    Args:
      values_on_closed_loop: (..., L) complex field values, or real phase angles in radians; L ≥ 2.
        Do not repeat the first point at the end.

    Returns:
      int32 array of shape (...).
    """
    vals = check_array(values_on_closed_loop, "values_on_closed_loop", kind="numeric")
    if vals.ndim < 1 or vals.shape[-1] < 2:
        raise ValueError(f"values_on_closed_loop must have a last axis of length >= 2, got {tuple(vals.shape)}")
    return _winding_core(vals)


@jax.jit
def _winding_core(vals):
    theta = _phases_of(vals)
    d = _wrap(jnp.roll(theta, -1, axis=-1) - theta)
    return jnp.round(jnp.sum(d, axis=-1) / (2 * jnp.pi)).astype(jnp.int32)


def vortex_map(field_2d: Num[ArrayLike, "*batch h w"]) -> Int[Array, "*batch h-1 w-1"]:
    """Integer vortex charge of every plaquette of a 2-D grid (batch axes in front allowed).

    Plaquette (i, j) has corners (i, j) → (i+1, j) → (i+1, j+1) → (i, j+1), which is
    counter-clockwise in the (x, y) plane because array axis 0 is x and axis 1 is y
    (``meshgrid(..., indexing="ij")``, as :func:`grid_points` produces). Its value is the
    :func:`winding_number` of that loop: +q for a :func:`vortex` of charge q (axis +z) inside it.
    Counting vortices: ``jnp.sum(vortex_map(f) != 0)``; net charge: ``jnp.sum(vortex_map(f))``.

    Resolution: each edge contributes a wrapped step in [−π, π), so one plaquette generically holds
    a charge of −1, 0 or +1 (±2 only in degenerate cases). A vortex of charge |q| ≥ 2 therefore shows
    up as |q| unit charges in the plaquettes around its centre (their sum is q); for its total charge
    sum a neighbourhood, or use :func:`winding_number` on a larger loop. The sum over any block of
    plaquettes equals the winding of the block's boundary exactly (discrete Stokes theorem).

    Args:
      field_2d: (..., H, W) complex field, or real phase angles in radians; H, W ≥ 2.

    Returns:
      int32 (..., H−1, W−1).
    """
    f = check_array(field_2d, "field_2d", kind="numeric")
    if f.ndim < 2 or f.shape[-2] < 2 or f.shape[-1] < 2:
        raise ValueError(f"field_2d must have shape (..., H, W) with H, W >= 2, got {tuple(f.shape)}")
    return _vortex_map_core(f)


@jax.jit
def _vortex_map_core(f):
    th = _phases_of(f)
    a = th[..., :-1, :-1]
    b = th[..., 1:, :-1]
    c = th[..., 1:, 1:]
    e = th[..., :-1, 1:]
    total = _wrap(b - a) + _wrap(c - b) + _wrap(e - c) + _wrap(a - e)
    return jnp.round(total / (2 * jnp.pi)).astype(jnp.int32)


def grid_points(
    shape: Sequence[int],
    lower: Any = -1.0,
    upper: Any = 1.0,
    *,
    z: float | None = None,
    dtype: Any = jnp.float32,
) -> Float[Array, "points d"]:
    """Points of a regular grid, flattened in ``indexing="ij"`` order (axis 0 = x, 1 = y, 2 = z).

    ``field = f(grid_points(shape, ...)).reshape(shape)`` then has ``field[i, j]`` at
    (x_i, y_j). Endpoints are included: x_i = lower + i (upper − lower)/(n − 1).

    Args:
      shape: (H, W) for a 2-D grid or (H, W, L) for a 3-D grid; every entry ≥ 2.
      lower: lower bound, a scalar or one per grid axis.
      upper: upper bound, a scalar or one per grid axis.
      z: for a 2-D ``shape``, place the grid in the plane z = ``z`` of 3-D space (points (H·W, 3));
        None gives 2-D points (H·W, 2).
      dtype: floating dtype of the result.

    Returns:
      (prod(shape), D) array, D = len(shape), or 3 when ``z`` is given.
    """
    try:
        entries = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, (H, W) or (H, W, L), got {shape!r}") from None
    for s in entries:
        check_scalar(s, "shape", integer=True)  # (2.5, 3) is an error, not (2, 3)
    shape = tuple(int(s) for s in entries)
    if len(shape) not in (2, 3) or any(s < 2 for s in shape):
        raise ValueError(f"shape must be (H, W) or (H, W, L) with every entry >= 2, got {shape}")
    if z is not None and len(shape) != 2:
        raise ValueError("z is only meaningful for a 2-D shape (a slice of 3-D space)")
    lo = np.broadcast_to(np.asarray(lower, np.float64), (len(shape),))
    hi = np.broadcast_to(np.asarray(upper, np.float64), (len(shape),))
    if np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)) or np.any(hi <= lo):
        raise ValueError(f"need finite lower < upper on every axis, got lower={lower}, upper={upper}")
    axes = [np.linspace(lo[i], hi[i], n) for i, n in enumerate(shape)]
    mesh = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([m.reshape(-1) for m in mesh], axis=-1)
    if z is not None:
        check_scalar(z, "z")
        pts = np.concatenate([pts, np.full((pts.shape[0], 1), float(z))], axis=-1)
    return jnp.asarray(pts, dtype=dtype)


def helix_sources(
    count: int,
    radius: float = 1.0,
    pitch: float = 0.5,
    turns: float = 3.0,
    *,
    dtype: Any = jnp.float32,
) -> Float[Array, "count 3"]:
    """``count`` points evenly spaced in angle along a circular helix about the z axis.

        s_i = i / count,  α_i = 2π · turns · s_i,
        r_i = (radius cos α_i, radius sin α_i, pitch · turns · s_i − z̄),

    ``pitch`` is the rise per turn; z̄ centres the helix on z = 0.

    Returns:
      (count, 3) source positions.
    """
    check_scalar(count, "count", integer=True, minimum=1)
    check_scalar(radius, "radius", nonnegative=True)
    check_scalar(pitch, "pitch")
    check_scalar(turns, "turns")
    s = np.arange(int(count), dtype=np.float64) / int(count)
    alpha = 2 * np.pi * float(turns) * s
    zz = float(pitch) * float(turns) * s
    zz = zz - 0.5 * (zz[0] + zz[-1])
    pts = np.stack([float(radius) * np.cos(alpha), float(radius) * np.sin(alpha), zz], axis=-1)
    return jnp.asarray(pts, dtype=dtype)


def focus_phases(
    sources: Real[ArrayLike, "m d"],
    target: Real[ArrayLike, " d"],
    *,
    amplitudes: Any = 1.0,
    wavenumbers: Any = 1.0,
    softening: Any = 0.1,
    init_phases: Any = 0.0,
    steps: int = 200,
    learning_rate: float = 0.05,
) -> tuple[Float[Array, " m"], Float[Array, " steps"]]:
    """Inverse design: optimise source phases so that the intensity at ``target`` is maximal.

    Minimises  L(φ) = −I(target; φ) / I_max  with Adam (optax), where I comes from
    :func:`superpose` at t = 0 (gradient through it) and I_max = (Σ_j |A_j| / (r_j + ε))² is the
    analytic optimum reached by phase conjugation φ_j = −k_j r_j (all waves arrive in phase). The
    loop is a ``lax.scan`` inside one module-level jitted function: a second call with the same shapes and
    ``steps`` compiles nothing (new sources, target, amplitudes, wavenumbers, softening or learning rate are
    traced values).

    Args:
      sources: (M, D) source positions.
      target: (D,) focus point.
      amplitudes: as in :func:`superpose`.
      wavenumbers: as in :func:`superpose`.
      softening: ε of :func:`superpose`.
      init_phases: (M,) or scalar starting phases.
      steps: optimiser steps.
      learning_rate: Adam step size (radians).

    Returns:
      (phases (M,), history (steps,) of the normalised target intensity I/I_max before each step).
    """
    src, tgt = _points_and_sources(sources, jnp.reshape(jnp.asarray(target), (1, -1)), "sources", "target")
    tgt = tgt[0]
    check_scalar(steps, "steps", integer=True, minimum=1)
    check_scalar(learning_rate, "learning_rate", positive=True)
    m = src.shape[0]
    amp = _per_source(amplitudes, "amplitudes", m, src.dtype)
    k = _per_source(wavenumbers, "wavenumbers", m, src.dtype)
    phi0 = _per_source(init_phases, "init_phases", m, src.dtype)
    check_scalar(softening, "softening", nonnegative=True)
    eps = jnp.asarray(softening, src.dtype)
    return _focus_run(phi0, tgt, src, amp, k, eps, jnp.asarray(learning_rate, src.dtype), steps=int(steps))


@functools.partial(jax.jit, static_argnames=("steps",))
def _focus_run(phi0, tgt, src, amp, k, softening, learning_rate, *, steps):
    """The Adam loop of :func:`focus_phases` on checked arrays: (phases, history of I/I_max)."""
    import optax

    r = jnp.linalg.norm(src - tgt[None], axis=-1)
    i_max = jnp.sum(jnp.abs(amp) / (r + softening)) ** 2
    opt = optax.adam(learning_rate)

    def normalised_intensity(phi):
        psi = superpose(tgt[None], src, amplitudes=amp, wavenumbers=k, phases=phi, softening=softening)
        return intensity(psi)[0] / i_max

    def body(carry, _):
        phi, opt_state = carry
        val, g = jax.value_and_grad(normalised_intensity)(phi)
        updates, opt_state = opt.update(-g, opt_state, phi)
        return (optax.apply_updates(phi, updates), opt_state), val

    (phi, _), hist = jax.lax.scan(body, (phi0, opt.init(phi0)), None, length=steps)
    return phi, hist


# ----------------------------------------------------------------------------------------------
# time evolution as a stepper (ivhl_jax.numerics.rollout): the field of moving-phase sources sampled
# at t0 + dt, t0 + 2 dt, ... (the state after k steps is at t0 + k dt, as in every family) with running
# intensity statistics


class SuperpositionParams(flax.struct.PyTreeNode):
    """Everything the wave-field step reads (a pytree; every leaf traced); built and checked by
    :func:`superposition`.

    Shapes: ``points`` (N, 3), ``sources`` (M, 3), ``amplitudes``/``wavenumbers``/``phases`` (M,),
    ``imprint`` (N,) complex multiplicative factor (a vortex imprint; ones for none), scalars
    ``softening`` and ``dt`` (time step, units L/c with c = 1). ``policy`` (static; :func:`superposition` sets
    it) is the precision policy :func:`field_at` passes to :func:`superpose`.
    """

    points: jax.Array
    sources: jax.Array
    amplitudes: jax.Array
    wavenumbers: jax.Array
    phases: jax.Array
    imprint: jax.Array
    softening: jax.Array
    dt: jax.Array
    policy: Policy = flax.struct.field(pytree_node=False, default_factory=Policy)


class WaveState(flax.struct.PyTreeNode):
    """Time-loop state: time ``t``, step count, the field ψ (N,) at the last evaluated time, and the
    running sum and maximum of |ψ|² over evaluated frames (N,)."""

    t: jax.Array
    step: jax.Array
    field: jax.Array
    intensity_sum: jax.Array
    intensity_peak: jax.Array


def superposition(
    points: Real[ArrayLike, "n d"],
    sources: Real[ArrayLike, "m d"],
    *,
    amplitudes: Any,
    wavenumbers: Any,
    phases: Any,
    dt: float,
    softening: float = 1e-3,
    imprint: Any = None,
    policy: str | Policy | None = None,
) -> Stepper[WaveState, SuperpositionParams]:
    """The wave-field time loop of the sources' superposition (:func:`superpose`): the one way to run it.

    ``step`` advances t by ``dt`` and evaluates ψ(points, t) · imprint there (:func:`field_at`), adding |ψ|²
    to the running sum and maximum, so the state after k steps holds the field at t0 + k·dt;
    ``init(t0=0.0)`` is the zero-statistics state at ``t0`` (its field is not evaluated). Drive it
    with :func:`ivhl_jax.numerics.rollout.trajectory` (``observe=fields.observe`` records per-frame
    intensity statistics) or ``chunked``.

    Arguments as in :func:`superpose` (``amplitudes``, ``wavenumbers``, ``phases``: (M,) or scalars; at least one
    source), ``dt > 0`` the time step, ``softening >= 0``, ``imprint`` None or (N,) complex factors per point;
    all checked here. Under ``policy`` the geometry is stored in ``param_dtype`` (bf16 halves its memory), the
    scalars, time and imprint in the work dtype (compute raised to ≥ float32, see :func:`superpose`). None is
    the default policy of the points and sources (float32 geometry and a complex64 imprint for float32 inputs).
    """
    pts, src = _points_and_sources(points, sources, "points", "sources")
    pol = physics_policy(policy, like=(pts, src))
    m = src.shape[0]
    if m == 0:
        raise ValueError("sources must hold at least one source, got shape (0, D)")
    check_scalar(dt, "dt", positive=True)
    check_scalar(softening, "softening", nonnegative=True)
    store, f32 = jnp.dtype(pol.param_dtype), jnp.dtype(real_compute_dtype(pol))
    cplx = jnp.result_type(f32, jnp.complex64)
    amp, k, ph = (
        jnp.broadcast_to(_per_source(x, name, m, store), (m,))
        for x, name in ((amplitudes, "amplitudes"), (wavenumbers, "wavenumbers"), (phases, "phases"))
    )
    if imprint is None:
        imp = jnp.ones(pts.shape[0], cplx)
    else:
        imp = jnp.asarray(imprint, cplx)
        if imp.shape != (pts.shape[0],):
            raise ValueError(f"imprint must have shape ({pts.shape[0]},) (one factor per point); got {imp.shape}")
        check_array(imp, "imprint", kind="numeric", finite=True)
    params = SuperpositionParams(
        points=jnp.asarray(pts, store),
        sources=jnp.asarray(src, store),
        amplitudes=amp,
        wavenumbers=k,
        phases=ph,
        imprint=imp,
        softening=jnp.asarray(softening, f32),
        dt=jnp.asarray(dt, f32),
        policy=pol,
    )
    return Stepper.create(_wave_step, params, init_fn=_init_wave, name="fields.superposition")


def field_at(params: SuperpositionParams, t: Real[ArrayLike, ""]) -> Complex[Array, " n"]:
    """ψ(points, t) · imprint, shape (N,): :func:`superpose` of the sources at time ``t`` (``params`` is a
    :func:`superposition` stepper's ``params``)."""
    if not isinstance(params, SuperpositionParams):
        raise TypeError(
            f"params must be SuperpositionParams (fields.superposition(...).params); got {type(params).__name__}"
        )
    psi = superpose(
        params.points,
        params.sources,
        amplitudes=params.amplitudes,
        wavenumbers=params.wavenumbers,
        phases=params.phases,
        t=t,
        softening=params.softening,
        policy=params.policy,
    )
    return psi * params.imprint.astype(psi.dtype)


def _wave_step(state: WaveState, params: SuperpositionParams) -> WaveState:
    """Advance ``t`` by ``dt``, evaluate the field there, accumulate |ψ|² statistics: the state after k steps
    holds the field at t0 + k·dt (the time convention of every family: a record after k steps is at k·dt)."""
    t = state.t + params.dt
    psi = field_at(params, t)
    i = intensity(psi)
    return WaveState(
        t=t,
        step=state.step + 1,
        field=psi,
        intensity_sum=state.intensity_sum + i,
        intensity_peak=jnp.maximum(state.intensity_peak, i),
    )


def _init_wave(params: SuperpositionParams, t0: Any = 0.0) -> WaveState:
    check_scalar(t0, "t0")
    n = params.points.shape[0]
    rdt = params.dt.dtype  # the policy's work dtype
    cdt = jnp.result_type(params.policy.output_dtype, jnp.complex64)
    return WaveState(
        t=jnp.asarray(t0, rdt),
        step=jnp.zeros((), jnp.int32),
        field=jnp.zeros(n, cdt),
        intensity_sum=jnp.zeros(n, jnp.finfo(cdt).dtype),
        intensity_peak=jnp.zeros(n, jnp.finfo(cdt).dtype),
    )


def observe(state: WaveState, params: SuperpositionParams) -> dict[str, Array]:
    """Per-frame observations for ``trajectory(superposition(...), ..., observe=fields.observe)``.

    Returns ``{"t": time of the frame in state.field (state.t), "max_intensity": max |ψ|²,
    "mean_intensity": mean |ψ|²}``, scalars in the state's real dtype.
    """
    i = intensity(state.field)
    return {"t": state.t, "max_intensity": jnp.max(i), "mean_intensity": jnp.mean(i)}
