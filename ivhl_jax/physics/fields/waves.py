"""The point-source sum: :func:`superpose` (its block size :func:`default_chunk`, its kernels in
:mod:`ivhl_jax.numerics.fastmath` and :mod:`ivhl_jax.physics.fields_pallas`) and the pointwise observables
:func:`intensity` and :func:`phase` of a field."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Float, Num, Real

from ivhl_jax.core import backend
from ivhl_jax.core.precision import Policy
from ivhl_jax.core.validation import check_array, check_scalar
from ivhl_jax.numerics import fastmath
from ivhl_jax.physics.fields.inputs import per_source, points_and_sources, policy_dtypes, round_complex

__all__ = ["superpose", "default_chunk", "intensity", "phase"]

# Reverse mode through the fused-reduction kernel keeps 6 work-dtype values per (point, source) pair
# of a block (measured from the compiled gradient's temporaries: 24 bytes per pair in float32); the
# "memory" rule budgets 8, for the forward pass's own buffers and slack.
_RESIDUALS_PER_PAIR = 8
# Device memory assumed where the device reports none (``memory_stats()`` is None on CPU and on some
# plugins).
_FALLBACK_DEVICE_BYTES = 8 << 30


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
    pts, src = points_and_sources(points, sources, "points", "sources")
    # Round the stored inputs to the storage dtype, then widen to the work dtype.
    store, dtype, out_dtype = policy_dtypes(policy, (pts, src))
    pts, src = pts.astype(store).astype(dtype), src.astype(store).astype(dtype)
    m = src.shape[0]
    if m == 0:
        raise ValueError(
            "sources must hold at least one source, got shape (0, D); with no sources the field "
            "is identically zero (use jnp.zeros(N, jnp.complex64))"
        )
    amp, k, omega, phi = _source_values(amplitudes, wavenumbers, frequencies, phases, m, store, dtype)
    check_scalar(t, "t")
    check_scalar(softening, "softening", positive=True)
    n = pts.shape[0]
    tuning = backend.defaults(op="fields.superpose", size=n * m)
    chunk = min(default_chunk(m, dtype, n) if chunk is None else _checked_chunk(chunk), max(n, 1))
    args = (pts, src, amp, k, omega, phi, jnp.asarray(t, dtype), jnp.asarray(softening, dtype))
    if tuning.fields_method == "pallas" and dtype == jnp.float32:
        return _superpose_pallas_core(*args, chunk, out_dtype)
    method = "reduce" if tuning.fields_method == "pallas" else tuning.fields_method
    return _superpose_core(
        *args, chunk=chunk, out_dtype=out_dtype, method=method, serial_pairs=tuning.fields_serial_pairs
    )


def _source_values(
    amplitudes: Any, wavenumbers: Any, frequencies: Any, phases: Any, m: int, store: Any, dtype: Any
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(A, k, ω, φ) of :func:`superpose`, each checked and broadcast to (m,), rounded to the storage dtype
    ``store`` and widened to the work dtype; ω = k where ``frequencies`` is None."""
    amp = per_source(amplitudes, "amplitudes", m, dtype)
    k = per_source(wavenumbers, "wavenumbers", m, dtype)
    omega = k if frequencies is None else per_source(frequencies, "frequencies", m, dtype)
    phi = per_source(phases, "phases", m, dtype)
    amp, k, omega, phi = (a.astype(store).astype(dtype) for a in (amp, k, omega, phi))
    return amp, k, omega, phi


def _checked_chunk(chunk: Any) -> int:
    check_scalar(chunk, "chunk", integer=True, minimum=1)
    return int(chunk)


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


@functools.partial(jax.jit, static_argnames=("chunk", "out_dtype", "method", "serial_pairs"))
def _superpose_core(pts, src, amp, k, omega, phi, t, softening, *, chunk, out_dtype, method="loop", serial_pairs=None):
    # Jitted so that eager calls run as one compiled program (inlined when called under jit).
    re, im = fastmath.point_source_sum(
        pts, src, amp, k, phi - omega * t, softening, chunk=chunk, method=method, serial_pairs=serial_pairs
    )
    return round_complex(re, im, out_dtype)


@functools.partial(jax.jit, static_argnums=(8, 9))
def _superpose_pallas_core(pts, src, amp, k, omega, phi, t, softening, chunk, out_dtype):
    # The Pallas tile kernel (``fields_method="pallas"``, float32 work dtype); its VJP is the XLA "reduce" kernel's.
    # Imported here: Pallas costs ~0.2 s to import and only this (GPU) choice needs it.
    from ivhl_jax.physics import fields_pallas

    re, im = fields_pallas.point_source_sum(pts, src, jnp.stack([amp, k, phi - omega * t]), softening, chunk=chunk)
    return round_complex(re, im, out_dtype)


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
