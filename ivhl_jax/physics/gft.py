"""Group-field-theory (GFT) condensate toy model: a complex field on a periodic rank-r lattice.

The seed project's "GFT condensate" is a complex field φ on a rank-r lattice (r = 1…4 group
arguments, discretised as a periodic hypercubic lattice of unit spacing; lattice units throughout,
ħ = 1) with the energy functional

    V[φ] = Σ_x [ Σ_a |φ(x + e_a) − φ(x)|² + m² |φ(x)|² + (λ/2) |φ(x)|⁴ ]

and the Gross–Pitaevskii-type (Hamiltonian) dynamics i ∂φ/∂t = δV/δφ* :

    i ∂φ/∂t = −Δφ + m² φ + λ|φ|² φ,     Δφ(x) = Σ_a [φ(x + e_a) + φ(x − e_a) − 2φ(x)].

Unlike the seed (forward Euler, unconditionally unstable; an energy functional that was not the
one its step conserved), V here *is* the Hamiltonian of the evolution: it is conserved up to the
O(dt²) splitting error of the Strang step, and the U(1) charge Q = Σ|φ|² is conserved exactly
(both tested). The step reuses :func:`ivhl_jax.physics.condensate.split_step`: the lattice Laplacian is
diagonal in Fourier space with eigenvalue −ε_k, ε_k = Σ_a 4 sin²(k_a/2), so the kinetic factor
e^{−i ε_k dt} is exact, and the local factor e^{−i dt/2 (m² + λ|φ|²)} is exact.

m² < 0 gives the symmetry-broken ("condensed") phase: the uniform vacuum |φ|² = −m²/λ with
energy −m⁴/(2λ) per site. :func:`gft_relax` (imaginary time without renormalisation, i.e. the
gradient flow ∂φ/∂τ = −δV/δφ*) finds it; real-time runs from small noise show the tachyonic growth
of long-wavelength modes at constant V.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact

from ivhl_jax.core.precision import Policy, complex_state_dtype, physics_policy
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics.rollout import Stepper, trajectory
from ivhl_jax.numerics.spectral import spectral_multiply
from ivhl_jax.physics.condensate import phase_factor_m1, split_step

__all__ = ["GFTSystem", "gft_potential", "gft_rhs", "gft_charge", "gft_step", "gft_evolve", "gft_relax",
           "lattice_dispersion", "gft_vacuum", "strang", "GFTParams", "gft_strang_real", "gft_strang_imaginary",
           "default_observables"]


class GFTSystem(struct.PyTreeNode):
    """GFT condensate parameters: lattice ``shape`` (rank r = len(shape), 1…4), mass² m², coupling λ.

    ``mass_sq`` and ``lam`` are pytree leaves (traceable, vmappable); the lattice shape is static.
    Fields may carry leading batch axes in front of the r lattice axes.
    """

    shape: tuple[int, ...] = struct.field(pytree_node=False)
    mass_sq: Any = -0.5
    lam: Any = 0.1

    def __post_init__(self):
        if isinstance(self.shape, tuple) and not 1 <= len(self.shape) <= 4:
            raise ValueError(f"shape must have rank 1..4 (one entry per group argument), got {self.shape}")
        if isinstance(self.shape, tuple) and any(int(n) < 2 for n in self.shape):
            raise ValueError(f"shape entries must be >= 2, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)


@functools.lru_cache(maxsize=32)
def lattice_dispersion(shape: tuple[int, ...]) -> Float[np.ndarray, "*lattice"]:
    """ε_k = Σ_a 4 sin²(k_a/2), the spectrum of −Δ for the periodic unit-spacing lattice (float64).

    ``shape``: the lattice extent per axis, positive integers."""
    if (not isinstance(shape, (tuple, list)) or not shape
            or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in shape)):
        raise ValueError(f"shape must be a non-empty tuple of positive integers (sites per axis), got {shape!r}")
    out = np.zeros(shape)
    for a, n in enumerate(shape):
        k = 2 * np.pi * np.fft.fftfreq(n)
        shp = [1] * len(shape)
        shp[a] = -1
        out = out + (4 * np.sin(k / 2) ** 2).reshape(shp)
    return out


def _lattice_axes(phi: jax.Array, rank: int) -> tuple[int, ...]:
    return tuple(range(phi.ndim - rank, phi.ndim))


def _lattice_rank(phi: jax.Array, rank: int | None) -> int:
    """The number of lattice axes: ``rank`` (1..phi.ndim; leading axes beyond them are batch axes) or all."""
    if rank is None:
        return phi.ndim
    check_scalar(rank, "rank", integer=True, minimum=1, maximum=phi.ndim)
    return int(rank)


def _check_field(phi: Any, system: GFTSystem) -> jax.Array:
    if not isinstance(system, GFTSystem):
        raise TypeError(f"system must be a GFTSystem, got {type(system).__name__}")
    phi = check_array(phi, "phi", kind="inexact", finite=True)
    if phi.ndim < system.rank or tuple(phi.shape[-system.rank:]) != system.shape:
        raise ValueError(f"phi must end in the lattice shape {system.shape} (batch axes in front), got {phi.shape}")
    if not jnp.issubdtype(phi.dtype, jnp.complexfloating):
        phi = phi.astype(jnp.result_type(phi.dtype, jnp.complex64))
    return phi


def gft_potential(phi: Inexact[ArrayLike, "*batch_and_lattice"], mass_sq: Any, lam: Any, rank: int | None = None
                  ) -> Float[Array, "*batch"]:
    """V[φ] = Σ_x [Σ_a |φ(x+e_a) − φ(x)|² + m²|φ|² + (λ/2)|φ|⁴] (periodic forward differences).

    Args:
      phi: complex field; its last ``rank`` axes are the lattice (default: all axes).
      mass_sq: m² (scalar, traceable).
      lam: λ (scalar, traceable).
      rank: number of lattice axes (leading axes beyond them are batch axes, summed separately).

    Returns:
      Real V with the batch shape (a scalar without batch axes). Lattice units (spacing 1).
    """
    phi = check_array(phi, "phi", kind="inexact", finite=True)
    rank = _lattice_rank(phi, rank)
    check_scalar(mass_sq, "mass_sq")
    check_scalar(lam, "lam")
    axes = _lattice_axes(phi, rank)
    rho = phi.real * phi.real + phi.imag * phi.imag
    grad2 = sum(_abs2(jnp.roll(phi, -1, axis=a) - phi) for a in axes)
    rdt = rho.dtype
    dens = grad2 + jnp.asarray(mass_sq, rdt) * rho + 0.5 * jnp.asarray(lam, rdt) * rho * rho
    return jnp.sum(dens, axis=axes)


def _abs2(z: jax.Array) -> jax.Array:
    return z.real * z.real + z.imag * z.imag


def gft_rhs(phi: Complex[ArrayLike, "*shape"], mass_sq: Any, lam: Any, rank: int | None = None
            ) -> Complex[Array, "*shape"]:
    """δV/δφ* = −Δφ + m²φ + λ|φ|²φ (the right-hand side of i∂φ/∂t), finite-difference form."""
    phi = check_array(phi, "phi", kind="complex", finite=True)
    rank = _lattice_rank(phi, rank)
    check_scalar(mass_sq, "mass_sq")
    check_scalar(lam, "lam")
    axes = _lattice_axes(phi, rank)
    lap = sum(jnp.roll(phi, 1, axis=a) + jnp.roll(phi, -1, axis=a) - 2 * phi for a in axes)
    rdt = phi.real.dtype
    return -lap + (jnp.asarray(mass_sq, rdt) + jnp.asarray(lam, rdt) * _abs2(phi)) * phi


def gft_charge(phi: Inexact[Array, "*batch_and_lattice"], rank: int | None = None) -> Float[Array, "*batch"]:
    """U(1) charge Q = Σ_x |φ|² (conserved exactly by the real-time evolution)."""
    phi = check_array(phi, "phi", kind="inexact", finite=True)
    rank = _lattice_rank(phi, rank)
    return jnp.sum(_abs2(phi), axis=_lattice_axes(phi, rank))


def gft_vacuum(mass_sq: float, lam: float) -> tuple[float, float]:
    """Uniform minimum of V: (|φ|², energy per site) = (−m²/λ, −m⁴/(2λ)) for m² < 0, else (0, 0)."""
    check_scalar(mass_sq, "mass_sq")
    check_scalar(lam, "lam", positive=True)  # λ > 0 (finite): a bounded potential
    m2, lam_f = float(np.asarray(mass_sq)), float(np.asarray(lam))
    if m2 >= 0:
        return 0.0, 0.0
    return -m2 / lam_f, -(m2 ** 2) / (2 * lam_f)


class GFTParams(struct.PyTreeNode):
    """Everything one GFT Strang step reads: the system (m², λ), dt and the kinetic factor.

    ``kin`` = e^{−i ε_k dt} − 1 (real time) or e^{−ε_k dt} − 1 (imaginary time), complex, lattice-shaped;
    ``dt`` a real scalar. All leaves are traced: new dt/m²/λ values reuse the compiled loop.
    """

    system: GFTSystem
    dt: Any
    kin: Any


def _plan(system: GFTSystem, dt: Any, imaginary: bool, dtype: Any) -> jax.Array:
    eps = lattice_dispersion(system.shape)
    if is_concrete(dt) and np.ndim(dt) == 0:
        return jnp.asarray(phase_factor_m1(float(np.asarray(dt)) * eps, imaginary, np.dtype(dtype)))
    return phase_factor_m1(jnp.asarray(dt) * jnp.asarray(eps, jnp.finfo(dtype).dtype), imaginary, dtype)


def _step_plan(phi: jax.Array, system: GFTSystem, dt: Any, kin: jax.Array, imaginary: bool) -> jax.Array:
    rdt = phi.real.dtype
    m2 = jnp.asarray(system.mass_sq, rdt)
    lam = jnp.asarray(system.lam, rdt)
    axes = _lattice_axes(phi, system.rank)

    return split_step(phi, lambda p: m2 + lam * _abs2(p), lambda p: spectral_multiply(p, kin, axes), dt, imaginary)


def _check_step_state(phi: Any, params: GFTParams) -> jax.Array:
    """Shape and dtype of a state handed to a step function (static: free under jit; values are checked once
    by :func:`strang`'s ``init``)."""
    phi = check_array(phi, "phi", kind="complex")
    if phi.ndim < params.system.rank or tuple(phi.shape[-params.system.rank:]) != params.system.shape:
        raise ValueError(f"phi must end in the lattice shape {params.system.shape} (batch axes in front), "
                         f"got {tuple(phi.shape)}")
    return phi


def gft_strang_real(phi: Complex[Array, "*shape"], params: GFTParams) -> Complex[Array, "*shape"]:
    """One real-time Strang step of i∂φ/∂t = δV/δφ* (``step_fn`` of :func:`strang`)."""
    phi = _check_step_state(phi, params)
    return _step_plan(phi, params.system, params.dt, params.kin.astype(phi.dtype), False)


def gft_strang_imaginary(phi: Complex[Array, "*shape"], params: GFTParams) -> Complex[Array, "*shape"]:
    """One Strang step of the gradient flow ∂φ/∂τ = −δV/δφ* (no renormalisation)."""
    phi = _check_step_state(phi, params)
    return _step_plan(phi, params.system, params.dt, params.kin.astype(phi.dtype), True)


def _gft_init(params: GFTParams, phi: Any) -> jax.Array:
    return _check_field(phi, params.system)


def _policy_dtype(policy: str | Policy | None, dtype: Any) -> Any:
    """Complex field dtype under ``policy`` (complex64 for "f32", complex128 for "f64"); ``dtype`` without one.
    bf16/f16 policies are a ValueError: XLA has no complex bf16 and no bf16 FFT (see
    :func:`ivhl_jax.core.precision.complex_state_dtype`)."""
    if policy is None:
        return dtype
    return complex_state_dtype(policy, routine="the GFT split-step solver")


def _output(phi: jax.Array, policy: str | Policy | None) -> jax.Array:
    pol = physics_policy(policy)
    return phi if pol is None else phi.astype(jnp.result_type(pol.output_dtype, jnp.complex64))


def strang(system: GFTSystem, dt: Any, *, imaginary: bool = False, dtype: Any = jnp.complex64,
           policy: str | Policy | None = None) -> Stepper:
    """The Strang stepper of i∂φ/∂t = −Δφ + m²φ + λ|φ|²φ (lattice units; ``imaginary``: ∂φ/∂τ = −δV/δφ*).

    One step maps φ (complex, shape ``(*batch, *system.shape)``) to
    e^{−i dt/2 (m² + λ|φ|²)} e^{−i ε_k dt} e^{−i dt/2 (m² + λ|φ|²)} φ, ε_k = Σ_a 4 sin²(k_a/2), both
    factors exact. The kinetic factor is computed once (float64 NumPy for a concrete dt) in ``dtype``
    (the field's complex dtype; complex128 needs x64) and stored with dt in :class:`GFTParams`.
    ``policy`` (a precision policy or preset name) overrides ``dtype``: ``"f32"`` → complex64,
    ``"f64"`` → complex128 (needs ``jax.enable_x64``), ``"bf16"`` → ValueError naming ``policy``.

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper` for :func:`ivhl_jax.numerics.rollout.trajectory`.
    """
    if not isinstance(system, GFTSystem):
        raise TypeError(f"system must be a GFTSystem, got {type(system).__name__}")
    _check_dt(dt)
    cdt = jnp.dtype(_policy_dtype(policy, dtype))
    if not jnp.issubdtype(cdt, jnp.complexfloating):
        raise TypeError(f"dtype must be complex (complex64/complex128), got {cdt}")
    rdt = jnp.finfo(cdt).dtype
    sys_ = system.replace(mass_sq=jnp.asarray(system.mass_sq, rdt), lam=jnp.asarray(system.lam, rdt))
    params = GFTParams(sys_, jnp.asarray(dt, rdt), _plan(system, dt, imaginary, cdt))
    fn, name = (gft_strang_imaginary, "gft-strang-imaginary") if imaginary else (gft_strang_real, "gft-strang")
    return Stepper(fn, params, init_fn=_gft_init, name=name)


def _check_dt(dt: Any) -> Any:
    check_scalar(dt, "dt", positive=True)
    return dt


def gft_step(phi: Inexact[ArrayLike, "*shape"], system: GFTSystem, dt: Any, *, imaginary: bool = False,
             policy: str | Policy | None = None) -> Complex[Array, "*shape"]:
    """One Strang step of i∂φ/∂t = δV/δφ* (or, ``imaginary``, of the gradient flow ∂φ/∂τ = −δV/δφ*).
    With ``policy`` the field is cast to its complex state dtype (see :func:`strang`) and the result
    to the policy's output dtype."""
    phi = _check_field(phi, system)
    phi = phi.astype(_policy_dtype(policy, phi.dtype))
    _check_dt(dt)
    return _output(_step_plan(phi, system, dt, _plan(system, dt, imaginary, phi.dtype), imaginary), policy)


def default_observables(phi: Complex[Array, "*shape"], system: GFTSystem) -> dict[str, Array]:
    """V[φ], the charge Q = Σ|φ|² and the condensate order parameter |⟨φ⟩| (lattice mean)."""
    phi = _check_field(phi, system)
    axes = _lattice_axes(phi, system.rank)
    return {"energy": gft_potential(phi, system.mass_sq, system.lam, system.rank),
            "charge": gft_charge(phi, system.rank),
            "order": jnp.abs(jnp.mean(phi, axis=axes)),
            "mean_abs2": jnp.mean(_abs2(phi), axis=axes)}


@dataclasses.dataclass(frozen=True)
class _SystemObserve:
    """``observe(phi, system)`` as a stepper-protocol ``observe(phi, params)``; hashes as ``fn``."""

    fn: Callable[[jax.Array, Any], Any]

    def __call__(self, state: Any, params: Any) -> Any:
        return self.fn(state, params.system)


def gft_evolve(phi: Inexact[ArrayLike, "*shape"], system: GFTSystem, dt: Any, steps: int, save_every: int = 1, *,
               imaginary: bool = False, observe: Callable[[jax.Array, GFTSystem], Any] | None = None,
               remat: bool = False, policy: str | Policy | None = None) -> tuple[Complex[Array, "*shape"], Any]:
    """``steps`` Strang steps: ``trajectory(strang(system, dt, imaginary=...), phi, steps)``.

    Compiled once per (shapes, dtypes, steps, save_every, imaginary, observe, remat): a new φ, dt, m²
    or λ reuses the compiled loop (pass ``observe`` as a module-level function).

    Returns (final φ, observations every ``save_every`` steps; default :func:`default_observables`).
    ``imaginary=True`` is the (unnormalised) gradient flow, see :func:`gft_relax`. ``policy``: the
    field is evolved in the policy's complex state dtype (:func:`strang`; observations in it too) and
    the final φ is returned in its output dtype.
    """
    phi = _check_field(phi, system)
    phi = phi.astype(_policy_dtype(policy, phi.dtype))
    stepper = strang(system, dt, imaginary=imaginary, dtype=phi.dtype)
    obs = _SystemObserve(observe if observe is not None else default_observables)
    final, observed = trajectory(stepper, phi, steps, save_every=save_every, observe=obs, remat=remat)
    return _output(final, policy), observed


def gft_relax(phi: Inexact[ArrayLike, "*shape"], system: GFTSystem, dt: Any = 0.05, steps: int = 2000,
              save_every: int = 100, *, policy: str | Policy | None = None) -> tuple[Complex[Array, "*shape"], Any]:
    """Gradient flow ∂φ/∂τ = −δV/δφ* (imaginary time, no renormalisation): V decreases monotonically
    (for small dt) towards a minimum, the symmetry-broken vacuum |φ|² = −m²/λ when m² < 0."""
    return gft_evolve(phi, system, dt, steps, save_every, imaginary=True, policy=policy)
