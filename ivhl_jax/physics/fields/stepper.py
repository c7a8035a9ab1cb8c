"""The wave-field time loop as a stepper (:mod:`ivhl_jax.numerics.rollout`): :func:`superposition` builds it,
:func:`field_at` is the field it evaluates, :func:`observe` its per-frame observations. The field of moving-phase
sources is sampled at t0 + dt, t0 + 2 dt, ... (the state after k steps is at t0 + k dt, as in every family) with
running intensity statistics."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Real

from ivhl_jax.core.precision import Policy, physics_policy, real_compute_dtype
from ivhl_jax.core.validation import check_array, check_scalar
from ivhl_jax.numerics.rollout import Stepper
from ivhl_jax.physics.fields.inputs import per_source, points_and_sources
from ivhl_jax.physics.fields.waves import intensity, superpose

__all__ = ["SuperpositionParams", "WaveState", "superposition", "field_at", "observe"]


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
    pts, src = points_and_sources(points, sources, "points", "sources")
    pol = physics_policy(policy, like=(pts, src))
    m = src.shape[0]
    if m == 0:
        raise ValueError("sources must hold at least one source, got shape (0, D)")
    check_scalar(dt, "dt", positive=True)
    check_scalar(softening, "softening", nonnegative=True)
    store, f32 = jnp.dtype(pol.param_dtype), jnp.dtype(real_compute_dtype(pol))
    cplx = jnp.result_type(f32, jnp.complex64)
    amp, k, ph = (
        jnp.broadcast_to(per_source(x, name, m, store), (m,))
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
