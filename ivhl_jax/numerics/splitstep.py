"""Strang split-step kernels shared by the Gross–Pitaevskii and GFT condensate solvers.

Both solve i ∂ψ/∂t = [K + U(r, |ψ|²)] ψ with K diagonal in Fourier space and U a real local energy
(trap + interaction, or m² + λ|φ|²). One Strang step of size dt is

    ψ ← e^{−i dt/2 U} ψ  →  ψ ← F⁻¹ e^{−i dt K(k)} F ψ  →  ψ ← e^{−i dt/2 U} ψ,

second order in dt, unitary, with both factors exact (|ψ| is unchanged by the local factor, so U can be
evaluated on the incoming ψ). Imaginary time replaces −i dt by −dt.

Every factor f = e^{−iθ} is applied as ψ + ψ·(f − 1) (:func:`phase_factor_m1`): in float32, cos θ rounds
to 1 or to 1 − 6e-8 for the small θ of the occupied modes, so |f|² − 1 ~ ±1e-7 is the *same* every
step and would add up to a norm drift of ~1e-3 over 10⁴ steps; the "minus one" form represents the
small numbers −2 sin²(θ/2) − i sin θ to full relative precision.

:func:`run` runs n real-time steps with the closing half-step of each step merged into the opening half-step of
the next,

    e^{−i dt/2 U} · [K · e^{−i dt U}]^{n−1} · K · e^{−i dt/2 U},

the same scheme to round-off (U depends only on |ψ|², which the local factor does not change), with one
pass over the field per step fewer: 2 elementwise passes (kinetic factor, local factor) and 2 FFTs per step
instead of 3 and 2.

The engine. An equation supplies its kinetic symbol K(k) (one or more :class:`KineticTerm`: a real array per unit
time, the grid axes whose FFT diagonalises it, the fraction of dt it acts), its local propagator (a local energy
U(ψ), whose factor e^{−iτU} is :func:`kick`, or a sequence of exact local flows, :data:`LocalStage`) with a bound on
max|U|, and what it conserves (a projection, e.g. :func:`norm_projection`). :func:`plan` checks dt once
(:func:`check_dt`: the split-step stability bound dt·max K ≤ π, :func:`max_stable_dt`), builds the kinetic factors
(float64 NumPy for a concrete dt, cast once; a traced dt builds them on the device) and places them where the
distributed FFT multiplies them when the field has a layout (:mod:`ivhl_jax.numerics.distributed_fft`).
:func:`step` is the one Strang composition (opening local half-step, kinetic factor, closing local half-step, the
projection where the equation conserves something) of a :class:`SplitStepPlan`, :func:`run` ``n`` real-time steps
with merged half-steps; both pick the local phase's sine reduction (:mod:`ivhl_jax.numerics.fastmath`) from the bound.
:func:`check_local_dt` is the local-phase check over a concrete field (dt·max|U| ≤ 2π where there are particles),
:func:`check_placement` refuses a field sharded over a mesh when the plan has no layout (every step would
gather it onto one device).

A plan built with ``increment=True`` applies each kinetic stage as ψ + F⁻¹[(f − 1) F ψ] instead of F⁻¹[f F ψ]: the
FFT pair's round-off (complex64 transforms lose ~5e-8 of the norm each, always downwards) then falls on the small
increment only, so a float32 scheme without a norm projection (the mixture, spin-1 and dipolar steps) keeps its
norm, for one more elementwise pass over the field.

The plan holds only data derived from dt: the kinetic factors and the local half-step time ``half_dt``; dt itself
is not a field (``plan.dt`` reads 2·half_dt), so no setting can be edited apart from the factors built from it: a
new dt is a new plan.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Complex, Inexact

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.numerics.fastmath import needs_full_range, sincos, sincos_static
from ivhl_jax.numerics.spectral import host_factor, spectral_multiply

__all__ = [
    "phase_factor_m1",
    "kick",
    "sumsq",
    "project_norm",
    "KineticTerm",
    "SplitStepPlan",
    "plan",
    "check_dt",
    "max_stable_dt",
    "check_local_dt",
    "local_energy_max",
    "check_placement",
    "kinetic",
    "step",
    "run",
    "diagonal",
    "LocalStage",
    "norm_projection",
    "concrete_float",
]


def _check_imaginary(imaginary: Any) -> bool:
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    return bool(imaginary)


def phase_factor_m1(
    theta: Any, imaginary: bool, dtype: Any, full_range: bool | None = None, damping: Any = None
) -> Any:
    """The propagator factor minus one: e^{−iθ} − 1 (real time) or e^{−θ} − 1 (imaginary time); with a damping
    rate γ (real time only) e^{−i(1 − iγ)θ} − 1 = e^{−γθ}(e^{−iθ} − 1) + (e^{−γθ} − 1), each part to full relative
    precision.

    Args:
      theta: real phase (NumPy: a trace-time constant, evaluated in float64; or a JAX array).
      imaginary: static choice of real (False) or imaginary (True) time.
      dtype: complex dtype of the result.
      full_range: how a JAX θ's sine is reduced (:mod:`ivhl_jax.numerics.fastmath`): None checks θ
        (:func:`~ivhl_jax.numerics.fastmath.sincos`); False is the fast reduction, exact for |θ|/2 ≤
        ``FAST_LIMIT`` (the caller guarantees it); True is correct for every finite θ.
      damping: None (no damping), or γ ≥ 0 (a float, or a JAX scalar for a JAX θ): the phenomenological
        dissipation of i∂ψ/∂t = (1 − iγ)Hψ.

    Returns:
      ``f − 1`` with θ's shape in ``dtype`` (NumPy for NumPy θ, else a JAX array).
    """
    _check_imaginary(imaginary)
    if damping is not None and imaginary:
        raise ValueError("damping applies to real-time factors; imaginary time is already a gradient flow")
    if isinstance(theta, np.ndarray):
        if imaginary:
            return np.expm1(-theta).astype(dtype)
        s = np.sin(0.5 * theta)
        m = -2 * s * s - 1j * np.sin(theta)
        if damping is not None:
            m = np.exp(-damping * theta) * m + np.expm1(-damping * theta)
        return m.astype(dtype)
    rdt = jnp.finfo(dtype).dtype
    theta_j = theta.astype(rdt)
    if imaginary:
        return jnp.expm1(-theta_j).astype(dtype)
    # One shared range reduction for sin and cos (XLA's CPU sin/cos are much slower); relative precision
    # at small θ is kept because the odd polynomial is x·(1 + O(x²)).
    half = 0.5 * theta_j
    sj, cj = sincos(half) if full_range is None else sincos_static(half, full_range)
    mj = jax.lax.complex(-2 * sj * sj, -2 * sj * cj)
    if damping is not None:
        decay = -jnp.asarray(damping, rdt) * theta_j
        mj = jnp.exp(decay) * mj + jnp.expm1(decay)
    return mj.astype(dtype)


def kick(
    psi: Complex[Array, "*shape"],
    local_energy: Callable[[jax.Array], jax.Array],
    tau: Any,
    imaginary: bool,
    full_range: bool | None = None,
    damping: Any = None,
) -> Complex[Array, "*shape"]:
    """The local factor ψ ← e^{−i τ U(ψ)} ψ (imaginary time: e^{−τ U(ψ)} ψ), applied in the "minus one" form.

    ``local_energy(psi)`` returns the real U (shape broadcastable to ψ); ``tau`` is the (real) time it acts;
    ``full_range`` and ``damping`` as in :func:`phase_factor_m1`.
    """
    u = local_energy(psi)
    theta = u * jnp.asarray(tau, u.dtype)
    return psi + psi * phase_factor_m1(theta, imaginary, psi.dtype, full_range, damping)


def sumsq(psi: Inexact[Array, "*shape"], axes: tuple[int, ...] | None = None) -> Any:
    """Σ|ψ|² over ``axes`` (None: every axis), as Σ(Re² + Im²) (no square root, no complex abs)."""
    psi = check_array(psi, "psi", kind="inexact")  # static facts only: free under jit
    return jnp.sum(psi.real * psi.real + psi.imag * psi.imag, axis=axes)


def project_norm(
    psi: Inexact[Array, "*shape"], target: Any, axes: tuple[int, ...] | None = None
) -> Inexact[Array, "*shape"]:
    """ψ rescaled so that Σ|ψ|² over ``axes`` equals ``target`` (None: one sum over every axis; else one factor per
    index of the other axes, ``target`` of their shape): ψ(1 + δ), δ = √(n₀/n₁) − 1 = (n₀ − n₁)/(n₁ + √(n₀n₁)).
    Written so because a float32 scale factor near 1 is quantised to 6e-8 and would bias every projection by that
    much; the norm projection of every imaginary-time flow (and of the projected real-time schemes)."""
    psi = check_array(psi, "psi", kind="inexact")
    n1 = sumsq(psi, axes)
    delta = (target - n1) / (n1 + jnp.sqrt(target * n1))
    if axes is not None:
        delta = jnp.expand_dims(delta, axes)
    return psi + psi * delta.astype(psi.real.dtype)


# ----------------------------------------------------------------------------------------------
# The engine: the plan (dt checked once, kinetic factors derived from it) and the steps that read it
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KineticTerm:
    """One factor e^{−i·fraction·dt·K} of the kinetic propagator, diagonal after an FFT over ``axes``.

    Attributes:
      symbol: K per unit time (real): a zero-argument function returning a float64 NumPy array (couplings
        concrete: evaluated once per dt, cached under ``key``) or a JAX array (traced couplings); broadcastable
        to the grid shape.
      axes: the grid axes (0 … ndim − 1) whose FFT diagonalises K.
      fraction: the fraction of dt the factor acts (the rotating GP's A(dt/2) B(dt) A(dt/2) has 0.5, 1.0).
      key: hashable description of ``symbol`` (grid, couplings) under which its factors are cached and, with
        ``fft="ducc"``, registered on the host; None builds them afresh.
    """

    symbol: Any
    axes: tuple[int, ...]
    fraction: float = 1.0
    key: Hashable = None


class SplitStepPlan(struct.PyTreeNode):
    """What one Strang step needs besides U: the kinetic factors and the local half-step time, both from one dt.

    Built by :func:`plan` only. Leaves: ``half_dt`` (dt/2 in the real working dtype) and ``factors`` (e^{−iθ} − 1
    per :class:`KineticTerm`, or :class:`~ivhl_jax.numerics.spectral.HostFactor`), and ``damping`` (the damping
    rate γ of a dissipative real-time plan, which the local factors also apply; None: no damping). Static:
    ``stages`` (the factors applied in order, each with its grid axes), the grid ``shape``, ``imaginary``, the
    FFT backend, the distributed-FFT ``layout`` (or None) and ``increment`` (each stage applied as
    ψ + F⁻¹[(f − 1) F ψ], module docstring).
    """

    half_dt: Any
    factors: tuple[Any, ...]
    stages: tuple[tuple[int, tuple[int, ...]], ...] = struct.field(pytree_node=False)
    shape: tuple[int, ...] = struct.field(pytree_node=False)
    imaginary: bool = struct.field(pytree_node=False, default=False)
    fft: str = struct.field(pytree_node=False, default="xla")
    layout: Any = struct.field(pytree_node=False, default=None)
    damping: Any = None
    increment: bool = struct.field(pytree_node=False, default=False)

    @property
    def dt(self) -> Any:
        """The step size (2·half_dt, exact in binary floating point)."""
        return 2 * self.half_dt


def concrete_float(x: Any) -> float | None:
    """``x`` as a Python float when it is a concrete scalar, else None (traced or not a scalar)."""
    if is_concrete(x) and np.ndim(x) == 0:
        try:
            return float(np.asarray(x))
        except TypeError:
            return None
    return None


def max_stable_dt(kinetic_max: Any) -> float:
    """π / max K: the largest real-time step for which the kinetic phase of the highest mode stays below π.

    Split-step Fourier on a non-vanishing background is unstable beyond it (Weideman & Herbst, SIAM J. Numer.
    Anal. 23, 485 (1986)). ``kinetic_max``: max K (a number) or the symbol K(k) itself (an array)."""
    try:
        k = np.abs(np.asarray(kinetic_max, np.float64))
    except (TypeError, ValueError):
        raise TypeError(f"kinetic_max must be a real number or array (max K or K(k)), got {kinetic_max!r}") from None
    if not k.size or not np.all(np.isfinite(k)):
        raise ValueError(f"kinetic_max must be finite (max K or K(k) of the grid), got {kinetic_max!r}")
    kmax = float(np.max(k))
    return float(np.pi / kmax) if kmax > 0 else float("inf")


def check_dt(dt: Any, *, kinetic_max: float, imaginary: bool, label: str = "max K") -> None:
    """dt > 0; real time also dt·max K ≤ π (:func:`max_stable_dt`, max K named by ``label`` in the message). A traced
    dt: only its static facts are checked. One-line ValueError with the bound."""
    check_scalar(dt, "dt", positive=True)
    dtc = concrete_float(dt)
    if dtc is None or imaginary:
        return
    bound = max_stable_dt(kinetic_max)
    if dtc > bound:
        raise ValueError(
            f"dt={dtc} is unstable on this grid: the kinetic phase per step dt·{label} = {dtc * np.pi / bound:.3g} "
            f"exceeds π (split-step instability); use dt <= {bound:.3g} or a coarser grid"
        )


def local_energy_max(u: Any, rho: Any = None) -> float:
    """max|U| over the points that hold the field: where ρ > 1e-6·max ρ (empty corners of a box may have any U),
    or everywhere when ``rho`` is None (float64 NumPy)."""
    u = np.abs(np.asarray(u, np.float64))
    if not np.all(np.isfinite(u)):
        raise ValueError("u (the local energy) contains NaN or inf; check the potential and the couplings")
    if rho is not None:
        rho = np.broadcast_to(np.asarray(rho, np.float64), u.shape)
        if not rho.size or not rho.max() > 0:
            return 0.0
        u = u[rho > 1e-6 * rho.max()]
    return float(np.max(u)) if u.size else 0.0


def check_local_dt(dt: float, umax: float, imaginary: bool, *, formula: str = "max|U|", name: str = "local") -> None:
    """The local factor must be resolved: the phase (real time) or decay (imaginary time) per step dt·max|U| stays
    below 2π (beyond it the dynamics is not resolved; in imaginary time the fixed point is the ground state of a
    grossly distorted operator, or e^{−dt·U/2} underflows). ``umax``: max|U| over the field
    (:func:`local_energy_max`) or a static bound of it; ``formula`` names U and ``name`` the term in the message."""
    check_scalar(dt, "dt", positive=True)
    check_scalar(umax, "umax", nonnegative=True)
    if dt * umax > 2 * np.pi:
        what = "decay" if imaginary else "phase"
        raise ValueError(
            f"dt={dt} is too large: the {name} {what} per step dt·{formula} = {dt * umax:.3g} over the field exceeds "
            f"2π, so the dynamics is not resolved; use dt <= {np.pi / umax:.3g}"
        )


def check_placement(psi: Any, layout: Any, ndim: int, name: str = "psi") -> None:
    """Refuse a concrete field sharded over a mesh along its grid axes when there is no ``layout``: the
    single-device FFT would gather it onto one device twice per step, with no word."""
    if layout is not None or not isinstance(psi, jax.Array) or isinstance(psi, jax.core.Tracer):
        return
    spec = getattr(psi.sharding, "spec", None)
    if spec is None or len(psi.sharding.device_set) < 2:
        return
    entries = tuple(spec) + (None,) * (psi.ndim - len(tuple(spec)))
    grid_spec = entries[psi.ndim - ndim :]
    if any(e is not None for e in grid_spec):
        shown = "P(" + ", ".join(repr(e) for e in grid_spec) + ")"
        raise ValueError(
            f"{name} is sharded over a mesh as {shown} but the system has no layout, so every step would gather "
            f"it onto one device; give the system layout=distributed_fft.fft_layout(mesh, {shown}) or pass "
            f"{name} unsharded"
        )


# Kinetic factors of concrete (symbol, dt) pairs, float64 NumPy cast once: a stepper rebuilt for a dt it has seen
# reuses them (bounded; a miss recomputes).
_FACTORS: collections.OrderedDict[Hashable, np.ndarray] = collections.OrderedDict()
_FACTORS_LOCK = threading.Lock()
_FACTORS_MAX = 32


def _host_factor_value(key: Hashable, compute: Callable[[], np.ndarray]) -> np.ndarray:
    if key is None:
        return compute()
    with _FACTORS_LOCK:
        hit = _FACTORS.get(key)
        if hit is not None:
            _FACTORS.move_to_end(key)
            return hit
    value = compute()
    with _FACTORS_LOCK:
        _FACTORS[key] = value
        while len(_FACTORS) > _FACTORS_MAX:
            _FACTORS.popitem(last=False)
    return value


def _numpy_factor(term: KineticTerm, dtc: float, imaginary: bool, cname: str, gamma: float | None = None) -> np.ndarray:
    theta = term.fraction * dtc * np.asarray(term.symbol(), np.float64)
    return phase_factor_m1(theta, imaginary, np.dtype(cname), damping=gamma)


def _factor(
    term: KineticTerm, dtc: float | None, dt_leaf: Any, imaginary: bool, cdt: Any, fft: str, damping: Any = None
) -> Any:
    rdt = jnp.finfo(cdt).dtype
    cname = np.dtype(cdt).name
    gamma = None if damping is None else concrete_float(damping)
    if callable(term.symbol):
        if dtc is not None and (damping is None or gamma is not None):
            key = None if term.key is None else ("splitstep", term.key, term.fraction, dtc, imaginary, cname, gamma)
            recipe = functools.partial(_numpy_factor, term, dtc, imaginary, cname, gamma)
            compute = functools.partial(_host_factor_value, key, recipe)
            if fft == "ducc" and key is not None:
                return host_factor(compute, key)
            return jnp.asarray(compute())
        sym = jnp.asarray(np.asarray(term.symbol(), np.float64), rdt)
    else:
        sym = jnp.asarray(term.symbol, rdt)
    return phase_factor_m1(term.fraction * dt_leaf * sym, imaginary, cdt, damping=damping)


def plan(
    terms: Sequence[KineticTerm],
    dt: Any,
    *,
    shape: Sequence[int],
    imaginary: bool,
    dtype: Any,
    kinetic_max: float,
    label: str = "max K",
    stages: Sequence[int] | None = None,
    fft: str = "xla",
    layout: Any = None,
    damping: Any = None,
    increment: bool = False,
) -> SplitStepPlan:
    """Check dt once (:func:`check_dt`) and build the :class:`SplitStepPlan` of steps of size dt.

    Args:
      terms: the kinetic symbol as :class:`KineticTerm` s.
      dt: step size (> 0; a concrete value builds the factors in float64 NumPy, a traced one on the device).
      shape: the grid shape (the trailing axes of the field).
      imaginary: static; imaginary-time factors e^{−dt K}.
      dtype: complex dtype of the field.
      kinetic_max: max K over the grid (the stability bound, :func:`check_dt`), named ``label`` in its message.
      label: how max K is named in the stability message.
      stages: the order the terms are applied in, as indices into ``terms`` (default: each once, in order).
      fft: FFT backend (``"xla"`` or ``"ducc"``, :mod:`ivhl_jax.numerics.spectral`).
      layout: an :class:`~ivhl_jax.numerics.distributed_fft.FFTLayout` (factors placed in the k-space blocks the
        distributed FFT multiplies) or None.
      damping: None, or the damping rate γ ≥ 0 of a dissipative real-time scheme, i∂ψ/∂t = (1 − iγ)Hψ (a scalar
        leaf: concrete builds the factors in NumPy, traced on the device); every factor, kinetic and local,
        becomes e^{−i(1 − iγ)θ}.
      increment: apply each kinetic stage as ψ + F⁻¹[(f − 1) F ψ] (module docstring; the ``"xla"`` backend, with or
        without a layout) instead of F⁻¹[f F ψ].
    """
    imaginary = _check_plan_flags(imaginary, increment, fft, damping)
    check_dt(dt, kinetic_max=kinetic_max, imaginary=imaginary, label=label)
    shape = tuple(int(n) for n in shape)
    cdt = jnp.dtype(dtype)
    rdt = jnp.finfo(cdt).dtype
    terms = tuple(terms)
    order = tuple(range(len(terms))) if stages is None else tuple(int(i) for i in stages)
    dt_leaf = jnp.asarray(dt, rdt)
    factors = tuple(_factor(t, concrete_float(dt), dt_leaf, imaginary, cdt, fft, damping) for t in terms)
    if layout is not None:
        factors = tuple(layout.place_factor(f, shape, t.axes) for f, t in zip(factors, terms))
    return SplitStepPlan(
        half_dt=0.5 * dt_leaf,
        factors=factors,
        stages=tuple((i, tuple(terms[i].axes)) for i in order),
        shape=shape,
        imaginary=imaginary,
        fft=fft,
        layout=layout,
        damping=None if damping is None else jnp.asarray(damping, rdt),
        increment=bool(increment),
    )


def _check_plan_flags(imaginary: Any, increment: Any, fft: str, damping: Any) -> bool:
    """The static choices of a plan, each refused in one line when it cannot be met."""
    imaginary = _check_imaginary(imaginary)
    if not isinstance(increment, (bool, np.bool_)):
        raise TypeError(f"increment must be a bool (a static choice of the kinetic form), got {increment!r}")
    if increment and fft != "xla":
        raise ValueError(f"increment=True applies the kinetic factor with XLA's FFT; use fft='xla' (got fft={fft!r})")
    if damping is not None and imaginary:
        raise ValueError("damping applies to real-time steps; imaginary time is already a gradient flow")
    return imaginary


def kinetic(psi: Complex[Array, "*batch_and_grid"], plan: SplitStepPlan) -> Complex[Array, "*batch_and_grid"]:
    """The kinetic propagator of ``plan``: each stage's F⁻¹[(1 + m) F ψ] over its axes, in order (the distributed
    FFT when the plan has a layout); ψ + F⁻¹[m F ψ] for an ``increment`` plan. Leading axes of ψ beyond the grid are
    batch axes."""
    psi = check_array(psi, "psi", kind="complex")  # static facts only: free under jit
    ndim = len(plan.shape)
    if psi.ndim < ndim or tuple(psi.shape[psi.ndim - ndim :]) != plan.shape:
        raise ValueError(
            f"psi must end in the grid shape {plan.shape} the kinetic factors were built for, got "
            f"{tuple(psi.shape)}; build a new stepper for another grid"
        )
    lead = psi.ndim - ndim
    for i, axes in plan.stages:
        ax = tuple(lead + a for a in axes)
        m = plan.factors[i]
        if plan.increment:
            psi = _plus_increment(psi, m, plan.layout, ax)
        elif plan.layout is not None:
            psi = distributed_fft.spectral_multiply(psi, m, plan.layout, ax)
        else:
            psi = spectral_multiply(psi, m, ax, plan.fft)
    return psi


def _plus_increment(psi: jax.Array, m: Any, layout: Any, axes: tuple[int, ...]) -> jax.Array:
    """ψ + F⁻¹[m F ψ] over ``axes``: the distributed transform pair when there is a layout (``m`` placed on its
    k-space blocks by :func:`plan`; one batched pair over leading axes), else XLA's, one pair and one sum per leading
    index, stacked (XLA:CPU runs a batched transform of a few components, or a sum over the stacked transforms that
    the following elementwise steps slice, slower than this form: bench/results/condensate_terms_engine.json)."""
    if layout is not None:
        pk, _ = distributed_fft.fftn(psi, layout, axes)
        return psi + distributed_fft.ifftn(pk * m, layout, axes)
    lead = min(axes)
    if lead == 0:
        return psi + jnp.fft.ifftn(jnp.fft.fftn(psi, axes=axes) * m, axes=axes)
    grid_axes = tuple(a - lead for a in axes)
    flat = psi.reshape((-1,) + psi.shape[lead:])
    parts = [c + jnp.fft.ifftn(jnp.fft.fftn(c, axes=grid_axes) * m, axes=grid_axes) for c in flat]
    return jnp.stack(parts).reshape(psi.shape)


# ----------------------------------------------------------------------------------------------
# The Strang composition: the one step every equation runs
# ----------------------------------------------------------------------------------------------
LocalStage = Callable[..., jax.Array]
"""One factor of an equation's local propagator: ``stage(psi, tau, imaginary, full_range, damping) -> psi``, the
exact flow of the local part over the time τ (``full_range`` and ``damping`` as in :func:`phase_factor_m1`; a stage
that has no phase to reduce or no damping ignores them)."""


def diagonal(local_energy: Callable[[jax.Array], jax.Array]) -> LocalStage:
    """The default local propagator: ψ ← e^{−iτU(ψ)} ψ of a real local energy U (:func:`kick`)."""

    def stage(psi: jax.Array, tau: Any, imaginary: bool, full_range: bool | None = None, damping: Any = None):
        return kick(psi, local_energy, tau, imaginary, full_range, damping)

    return stage


def _stages(local: Any) -> tuple[LocalStage, ...]:
    """``local`` as the stages of the opening half-step: a callable is a local energy U (:func:`diagonal`), a sequence
    holds the stages in the order the opening half-step applies them (the closing one applies them reversed)."""
    if callable(local):
        return (diagonal(local),)
    stages = tuple(local)
    if not stages or not all(callable(s) for s in stages):
        raise TypeError(f"local must be a local energy U(psi) or a sequence of local stages, got {local!r}")
    return stages


def _half(psi: jax.Array, plan: SplitStepPlan, stages: Sequence[LocalStage], full_range: bool | None) -> jax.Array:
    for stage in stages:
        psi = stage(psi, plan.half_dt, plan.imaginary, full_range, plan.damping)
    return psi


def _strang(
    psi: jax.Array, plan: SplitStepPlan, stages: tuple[LocalStage, ...], project: Any, full_range: bool | None
) -> jax.Array:
    """Opening half-step, kinetic factor (imaginary time: then the projection), closing half-step."""
    psi = kinetic(_half(psi, plan, stages, full_range), plan)
    if project is not None and plan.imaginary:
        psi = project(psi)  # the closing half-step sees the density at the held norm
    return _half(psi, plan, stages[::-1], full_range)


def _reduction(plan: SplitStepPlan, umax: Any) -> Any:
    """The local phase's sine reduction: a static choice (imaginary time: no phase; no bound: checked per array by
    :func:`~ivhl_jax.numerics.fastmath.sincos`) or the traced flag of the real-time bound dt·umax/2."""
    if plan.imaginary:
        return False
    if umax is None:
        return None
    return needs_full_range(jnp.abs(plan.half_dt) * umax)


def _by_reduction(fn: Callable[..., jax.Array], full: Any, psi: jax.Array) -> jax.Array:
    """``fn(psi, full_range)`` with a static reduction, or both compiled behind a ``lax.cond`` on a traced one."""
    if full is None or isinstance(full, bool):
        return fn(psi, full_range=full)
    return jax.lax.cond(full, functools.partial(fn, full_range=True), functools.partial(fn, full_range=False), psi)


def step(
    psi: Complex[Array, "*shape"],
    plan: SplitStepPlan,
    local: Any,
    umax: Any = None,
    *,
    project: Callable[[jax.Array], jax.Array] | None = None,
) -> Complex[Array, "*shape"]:
    """One Strang step L(dt/2) K(dt) L(dt/2)ᵀ of ``plan`` (real or imaginary time: ``plan.imaginary``).

    Args:
      psi: complex field (leading axes beyond the plan's grid are components or batch axes).
      plan: the kinetic factors and the half-step time (:func:`plan`).
      local: the equation's local propagator: a local energy ``U(psi)`` (real, broadcastable to ψ; the factor
        e^{−iτU}, :func:`diagonal`), or a sequence of :data:`LocalStage` s applied in order in the opening half-step
        and in reverse order in the closing one (spin-1: the diagonal phases, then the spin mixing).
      umax: a bound on max|U| over the step (a scalar, may be traced): the real-time local phase uses the fast sine
        reduction when dt·umax/2 stays within its range, else the full-range one (``lax.cond``, both compiled);
        None checks each phase array (:func:`~ivhl_jax.numerics.fastmath.sincos`).
      project: what the equation conserves, as the map onto it (e.g. the norm, :func:`norm_projection`), or None.
        Applied after the step; in imaginary time (the normalised gradient flow) also before it and after the
        kinetic factor, so that each local half-step sees the density at the held norm.
    """
    psi = check_array(psi, "psi", kind="complex")  # static facts only: free under jit
    stages = _stages(local)
    if project is not None and plan.imaginary:
        psi = project(psi)
    one = functools.partial(_strang, plan=plan, stages=stages, project=project)
    out = _by_reduction(one, _reduction(plan, umax), psi)
    return out if project is None else project(out)


def run(
    psi: Complex[Array, "*shape"],
    plan: SplitStepPlan,
    local: Any,
    umax: Any,
    n: int,
) -> Complex[Array, "*shape"]:
    """``n`` real-time Strang steps of ``plan`` with the local half-steps of neighbours merged (module docstring:
    2 FFTs and 2 passes over the field per step for a diagonal U); ``local`` and ``umax`` as in :func:`step`. The
    closing half-step of one step and the opening one of the next meet at the first stage, which then acts over dt.
    ``n`` is a static int ≥ 1; the interior steps run in a ``lax.fori_loop`` (the field is the loop carry)."""
    psi = check_array(psi, "psi", kind="complex")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of steps), got {n!r}")
    if plan.imaginary or plan.damping is not None:
        raise ValueError(
            "run merges norm-preserving real-time half-steps; an imaginary-time or damped plan runs single steps (step)"
        )
    stages = _stages(local)
    first, rest = stages[0], stages[1:]

    dt = plan.dt  # formed once, outside the loop and the branches: no scalar kernel per step

    def many(p: jax.Array, full_range: bool | None) -> jax.Array:
        def interior(_, q):
            q = _half(kinetic(q, plan), plan, rest[::-1], full_range)
            return _half(first(q, dt, False, full_range), plan, rest, full_range)

        p = jax.lax.fori_loop(0, int(n) - 1, interior, _half(p, plan, stages, full_range))
        return _half(kinetic(p, plan), plan, stages[::-1], full_range)

    return _by_reduction(many, _reduction(plan, umax), psi)


def norm_projection(
    psi: Inexact[Array, "*shape"], target: Any = None, axes: tuple[int, ...] | None = None
) -> Callable[[jax.Array], jax.Array]:
    """The map onto the norm a step holds: ψ ↦ :func:`project_norm` (ψ, target, axes), the target Σ|ψ|² over
    ``axes`` (None: every axis; else one per index of the other axes) that of the incoming ``psi`` when ``target``
    is None. A fixed target makes the projection self-correcting: a float32 correction too small to change some
    elements is not lost but retried next step."""
    n0 = sumsq(psi, axes) if target is None else jnp.asarray(target, psi.real.dtype)
    return functools.partial(project_norm, target=n0, axes=axes)
