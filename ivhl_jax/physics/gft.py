"""Group-field-theory (GFT) condensate toy model: a complex field on a periodic rank-r lattice.

The "GFT condensate" is a complex field φ on a rank-r lattice (r = 1…4 group arguments, discretised
as a periodic hypercubic lattice of unit spacing; lattice units throughout, ħ = 1) with the energy
functional

    V[φ] = Σ_x [ Σ_a |φ(x + e_a) − φ(x)|² + m² |φ(x)|² + (λ/2) |φ(x)|⁴ ]

and the Gross–Pitaevskii-type (Hamiltonian) dynamics i ∂φ/∂t = δV/δφ* :

    i ∂φ/∂t = −Δφ + m² φ + λ|φ|² φ,     Δφ(x) = Σ_a [φ(x + e_a) + φ(x − e_a) − 2φ(x)].

V is the Hamiltonian of the evolution: it is conserved up to the O(dt²) splitting error of the
Strang step (an explicit Euler step would be unconditionally unstable for this equation), and the U(1)
charge Q = Σ|φ|² is conserved exactly (both tested). The step is
:func:`ivhl_jax.numerics.splitstep.split_step`: the lattice Laplacian is diagonal in Fourier space with
eigenvalue −ε_k, ε_k = Σ_a 4 sin²(k_a/2), so the kinetic factor e^{−i ε_k dt} is exact, and the local
factor e^{−i dt/2 (m² + λ|φ|²)} is exact.

m² < 0 gives the symmetry-broken ("condensed") phase: the uniform vacuum |φ|² = −m²/λ with
energy −m⁴/(2λ) per site. ``strang(system, dt, imaginary=True)`` (imaginary time without
renormalisation, i.e. the gradient flow ∂φ/∂τ = −δV/δφ*) finds it; real-time runs from small noise show
the tachyonic growth of long-wavelength modes at constant V.

One door: :func:`strang` builds the stepper (it validates dt and holds it once, with the kinetic factor
derived from it); ``stepper.init(phi)`` validates the field; runs go through
:func:`ivhl_jax.numerics.rollout.trajectory` or :func:`~ivhl_jax.numerics.rollout.chunked` with
:func:`observe`. :func:`gft_evolve` is that call spelled out.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact

from ivhl_jax.core.precision import Policy, complex_state_dtype
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft
from ivhl_jax.numerics.fastmath import needs_full_range
from ivhl_jax.numerics.rollout import Stepper, trajectory
from ivhl_jax.numerics.spectral import spectral_multiply
from ivhl_jax.numerics.splitstep import phase_factor_m1, split_step

__all__ = [
    "GFTSystem",
    "strang",
    "observe",
    "gft_evolve",
    "gft_potential",
    "gft_rhs",
    "gft_charge",
    "lattice_dispersion",
    "gft_vacuum",
    "GFTParams",
]


class GFTSystem(struct.PyTreeNode):
    """GFT condensate parameters: lattice ``shape`` (rank r = len(shape), 1…4), mass² m², coupling λ.

    ``mass_sq`` and ``lam`` are pytree leaves (traceable, vmappable); the lattice shape is static.
    Fields may carry leading batch axes in front of the r lattice axes.
    """

    shape: tuple[int, ...] = struct.field(pytree_node=False)
    mass_sq: Any = -0.5
    lam: Any = 0.1
    # How φ's lattice axes are split over a device mesh (an ivhl_jax.numerics.distributed_fft.FFTLayout), or
    # None; with a layout the kinetic step uses the distributed FFT and φ and the factor are held in blocks.
    layout: Any = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        if self.layout is not None and isinstance(self.shape, tuple):
            object.__setattr__(self, "layout", distributed_fft.check_layout(self.layout, self.shape))
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
    if (
        not isinstance(shape, (tuple, list))
        or not shape
        or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
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
    if phi.ndim < system.rank or tuple(phi.shape[-system.rank :]) != system.shape:
        raise ValueError(f"phi must end in the lattice shape {system.shape} (batch axes in front), got {phi.shape}")
    if not jnp.issubdtype(phi.dtype, jnp.complexfloating):
        phi = phi.astype(jnp.result_type(phi.dtype, jnp.complex64))
    return phi


def gft_potential(
    phi: Inexact[ArrayLike, "*batch_and_lattice"], mass_sq: Any, lam: Any, rank: int | None = None
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


def gft_rhs(
    phi: Complex[ArrayLike, "*shape"], mass_sq: Any, lam: Any, rank: int | None = None
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
    return -m2 / lam_f, -(m2**2) / (2 * lam_f)


_DT_MESSAGE = (
    "dt is held once, with the kinetic factor derived from it; build a new stepper for a new step "
    "size: gft.strang(system, dt)"
)


class GFTParams(struct.PyTreeNode):
    """Everything one GFT Strang step reads (built by :func:`strang`; not constructed by hand).

    Attributes:
      system: the :class:`GFTSystem` (m², λ traced leaves: new values reuse the compiled loop).
      dt: the step size (a real scalar leaf).
      kin: e^{−i ε_k dt} − 1 (real time) or e^{−ε_k dt} − 1 (imaginary time), complex, lattice-shaped,
        derived from ``dt`` by the builder.
      imaginary: static; the gradient flow instead of real time.

    ``dt`` is held once: ``params.replace(dt=...)`` or ``replace(kin=...)`` raises (use ``strang(system, dt)``).
    """

    system: GFTSystem
    dt: Any
    kin: Any
    imaginary: bool = struct.field(pytree_node=False, default=False)


def _guarded_replace(self: GFTParams, **updates: Any) -> GFTParams:
    if "dt" in updates or "kin" in updates:
        raise ValueError(_DT_MESSAGE)
    new = updates.get("system")
    if isinstance(new, GFTSystem) and new.shape != self.system.shape:
        raise ValueError(
            f"the kinetic factor was built for the lattice {self.system.shape}, got {new.shape}; "
            "build a new stepper: gft.strang(system, dt)"
        )
    return _plain_replace(self, **updates)


# flax.struct installs ``replace`` on the class itself: wrap it so that dt and its factor cannot be edited apart.
_plain_replace = GFTParams.replace
GFTParams.replace = _guarded_replace  # type: ignore[method-assign,assignment]


def _plan(system: GFTSystem, dt: Any, imaginary: bool, dtype: Any) -> jax.Array:
    eps = lattice_dispersion(system.shape)
    if is_concrete(dt) and np.ndim(dt) == 0:
        return jnp.asarray(phase_factor_m1(float(np.asarray(dt)) * eps, imaginary, np.dtype(dtype)))
    return phase_factor_m1(jnp.asarray(dt) * jnp.asarray(eps, jnp.finfo(dtype).dtype), imaginary, dtype)


def _gft_step(phi: Complex[Array, "*shape"], params: GFTParams) -> Complex[Array, "*shape"]:
    """One Strang step of ``params`` (real time or the gradient flow: the static ``params.imaginary``)."""
    system = params.system
    phi = check_array(phi, "phi", kind="complex")  # static facts only: free under jit
    if phi.ndim < system.rank or tuple(phi.shape[-system.rank :]) != system.shape:
        raise ValueError(
            f"phi must end in the lattice shape {system.shape} (batch axes in front), got {tuple(phi.shape)}"
        )
    rdt = phi.real.dtype
    m2 = jnp.asarray(system.mass_sq, rdt)
    lam = jnp.asarray(system.lam, rdt)
    axes = _lattice_axes(phi, system.rank)
    kin = params.kin.astype(phi.dtype)
    step = functools.partial(
        split_step,
        local_energy=lambda p: m2 + lam * _abs2(p),
        kinetic=lambda p: _kinetic_fft(p, kin, axes, system.layout),
        dt=params.dt,
        imaginary=params.imaginary,
    )
    if params.imaginary:  # real decay factors: no phase to reduce
        return step(phi, full_range=False)
    # The local phase dt·U/2, |U| = |m² + λ|φ|²| ≤ |m²| + |λ|·Σ|φ|² (pointwise), needs the full-range sine
    # reduction only beyond the fast range.
    umax = jnp.abs(m2) + jnp.abs(lam) * 2 * jnp.sum(_abs2(phi))
    full = needs_full_range(0.5 * jnp.abs(jnp.asarray(params.dt, rdt)) * umax)
    return jax.lax.cond(full, functools.partial(step, full_range=True), functools.partial(step, full_range=False), phi)


def _kinetic_fft(phi: jax.Array, kin: jax.Array, axes: tuple[int, ...], layout: Any) -> jax.Array:
    """F⁻¹[(1 + m) F φ]: the one place the GFT step calls an FFT (the distributed FFT with a layout)."""
    if layout is not None:
        return distributed_fft.spectral_multiply(phi, kin, layout, axes)
    return spectral_multiply(phi, kin, axes)


def _gft_init(params: GFTParams, phi: Any) -> jax.Array:
    """Validate φ (lattice shape, finite) and cast it to the stepper's complex dtype; for concrete values also
    check that dt resolves the local phase dt·max|m² + λ|φ|²| ≤ 2π."""
    phi = _check_field(phi, params.system).astype(params.kin.dtype)
    values = [
        float(np.asarray(x))
        for x in (params.dt, params.system.mass_sq, params.system.lam)
        if is_concrete(x) and np.ndim(x) == 0
    ]
    if len(values) == 3 and is_concrete(phi):
        dtc, m2, lam = values
        umax = float(np.max(np.abs(m2 + lam * np.abs(np.asarray(phi)) ** 2)))
        if dtc * umax > 2 * np.pi:
            raise ValueError(
                f"dt={dtc} is too large: the local phase per step dt·max|m² + λ|φ|²| = {dtc * umax:.3g} "
                f"exceeds 2π, so the dynamics is not resolved; use dt <= {np.pi / umax:.3g}"
            )
    layout = params.system.layout
    return phi if layout is None else layout.place(phi, "phi")


def _policy_dtype(policy: str | Policy | None, dtype: Any) -> Any:
    """Complex field dtype under ``policy`` (complex64 for "f32", complex128 for "f64"); None is the default
    policy of ``dtype`` (:func:`~ivhl_jax.core.precision.default_policy`: ``dtype`` itself, which must be
    complex). bf16/f16 policies are a ValueError: XLA has no complex bf16 and no bf16 FFT (see
    :func:`ivhl_jax.core.precision.complex_state_dtype`)."""
    if policy is None:  # the dtype argument names the default policy: it must be a complex dtype
        cdt = jnp.dtype(dtype)
        if not jnp.issubdtype(cdt, jnp.complexfloating):
            raise TypeError(f"dtype must be complex (complex64/complex128), got {cdt}")
    return complex_state_dtype(policy, like=jax.ShapeDtypeStruct((), dtype), routine="the GFT split-step solver")


def _check_dt(dt: Any, system: GFTSystem, imaginary: bool) -> None:
    """dt > 0; real time: the kinetic phase dt·max ε_k ≤ π (split-step stability on a non-vanishing field,
    Weideman & Herbst 1986); both: the mass phase dt·|m²| ≤ 2π (the λ|φ|² part is checked by ``init``)."""
    check_scalar(dt, "dt", positive=True)
    if not (is_concrete(dt) and np.ndim(dt) == 0):
        return
    dtc = float(np.asarray(dt))
    if not imaginary:
        eps_max = float(np.max(lattice_dispersion(system.shape)))
        if dtc * eps_max > np.pi:
            raise ValueError(
                f"dt={dtc} is unstable on this lattice: the kinetic phase per step dt·max ε_k = "
                f"{dtc * eps_max:.3g} exceeds π (split-step instability); use dt <= {np.pi / eps_max:.3g}"
            )
    if is_concrete(system.mass_sq) and np.ndim(system.mass_sq) == 0:
        m2 = abs(float(np.asarray(system.mass_sq)))
        if dtc * m2 > 2 * np.pi:
            raise ValueError(
                f"dt={dtc} is too large: the mass phase per step dt·|m²| = {dtc * m2:.3g} exceeds 2π; "
                f"use dt <= {np.pi / m2:.3g}"
            )


def strang(
    system: GFTSystem,
    dt: Any,
    *,
    imaginary: bool = False,
    dtype: Any = jnp.complex64,
    policy: str | Policy | None = None,
) -> Stepper:
    """The Strang stepper of i∂φ/∂t = −Δφ + m²φ + λ|φ|²φ (lattice units; ``imaginary``: ∂φ/∂τ = −δV/δφ*).

    One step maps φ (complex, shape ``(*batch, *system.shape)``) to
    e^{−i dt/2 (m² + λ|φ|²)} e^{−i ε_k dt} e^{−i dt/2 (m² + λ|φ|²)} φ, ε_k = Σ_a 4 sin²(k_a/2), both
    factors exact. The kinetic factor is computed once from ``dt`` (float64 NumPy for a concrete dt) in
    ``dtype`` (complex128 needs x64) and held with dt in :class:`GFTParams`. ``policy`` (a precision
    policy or preset name) overrides ``dtype``: ``"f32"`` → complex64, ``"f64"`` → complex128 (needs
    ``jax.enable_x64``), ``"bf16"`` → ValueError naming ``policy``.

    Args:
      system: the :class:`GFTSystem`.
      dt: step size (> 0). Real time: dt·max ε_k ≤ π (≤ π/(4r) on an even lattice of rank r), else
        ValueError with the bound; dt·|m²| ≤ 2π; ``init`` also checks dt·max|m² + λ|φ|²| ≤ 2π.
      imaginary: the gradient flow ∂φ/∂τ = −δV/δφ* (no renormalisation: V decreases towards a minimum).
      dtype: complex dtype of the field.
      policy: precision policy or preset (overrides ``dtype``).

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper`; record with ``trajectory(stepper, phi, steps,
      observe=gft.observe)``.
    """
    if not isinstance(system, GFTSystem):
        raise TypeError(f"system must be a GFTSystem, got {type(system).__name__}")
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    _check_dt(dt, system, bool(imaginary))
    cdt = jnp.dtype(_policy_dtype(policy, dtype))
    rdt = jnp.finfo(cdt).dtype
    sys_ = system.replace(mass_sq=jnp.asarray(system.mass_sq, rdt), lam=jnp.asarray(system.lam, rdt))
    kin = _plan(system, dt, bool(imaginary), cdt)
    if system.layout is not None:  # the factor in the k-space blocks the distributed FFT multiplies
        kin = system.layout.place_factor(kin, system.shape)
    params = GFTParams(sys_, jnp.asarray(dt, rdt), kin, imaginary=bool(imaginary))
    return Stepper.create(
        _gft_step, params, init_fn=_gft_init, name="gft-strang-imaginary" if imaginary else "gft-strang"
    )


def observe(phi: Complex[Array, "*shape"], params: Any) -> dict[str, Array]:
    """The family's observable for :func:`ivhl_jax.numerics.rollout.trajectory`: V[φ] (``energy``), the charge
    Q = Σ|φ|², the condensate order parameter |⟨φ⟩| (lattice mean) and the mean |φ|², each with φ's batch shape.

    ``params`` is the stepper's params (``gft.strang(system, dt).params``; its ``system`` is read).
    """
    system = getattr(params, "system", None)
    if not isinstance(system, GFTSystem):
        raise TypeError(
            f"params must be the params of a GFT stepper (gft.strang(system, dt).params), got {type(params).__name__}"
        )
    phi = _check_field(phi, system)
    axes = _lattice_axes(phi, system.rank)
    return {
        "energy": gft_potential(phi, system.mass_sq, system.lam, system.rank),
        "charge": gft_charge(phi, system.rank),
        "order": jnp.abs(jnp.mean(phi, axis=axes)),
        "mean_abs2": jnp.mean(_abs2(phi), axis=axes),
    }


def gft_evolve(
    phi: Inexact[ArrayLike, "*shape"],
    system: GFTSystem,
    dt: Any,
    steps: int,
    save_every: int = 1,
    *,
    imaginary: bool = False,
    remat: bool = False,
    policy: str | Policy | None = None,
) -> tuple[Complex[Array, "*shape"], Any]:
    """``steps`` Strang steps from φ, recording :func:`observe` every ``save_every``: exactly
    ``trajectory(stepper, stepper.init(phi), steps, save_every=..., observe=observe, remat=...)`` with
    ``stepper = strang(system, dt, imaginary=..., dtype=<φ's complex dtype>, policy=...)``.
    ``imaginary=True`` is the (unnormalised) gradient flow."""
    phi = _check_field(phi, system)
    stepper = strang(system, dt, imaginary=imaginary, dtype=phi.dtype, policy=policy)
    return trajectory(stepper, stepper.init(phi), steps, save_every=save_every, observe=observe, remat=remat)
