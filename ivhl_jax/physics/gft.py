"""Group-field-theory (GFT) condensate toy model: a complex field on a periodic rank-r lattice.

The "GFT condensate" is a complex field φ on a rank-r lattice (r = 1…4 group arguments, discretised
as a periodic hypercubic lattice of unit spacing; lattice units throughout, ħ = 1) with the energy
functional

    V[φ] = Σ_x [ Σ_a |φ(x + e_a) − φ(x)|² + m² |φ(x)|² + (λ/2) |φ(x)|⁴ ]

and the Gross–Pitaevskii-type (Hamiltonian) dynamics i ∂φ/∂t = δV/δφ* :

    i ∂φ/∂t = −Δφ + m² φ + λ|φ|² φ,     Δφ(x) = Σ_a [φ(x + e_a) + φ(x − e_a) − 2φ(x)].

V is the Hamiltonian of the evolution: it is conserved up to the O(dt²) splitting error of the
Strang step (an explicit Euler step would be unconditionally unstable for this equation), and the U(1)
charge Q = Σ|φ|² is conserved exactly (both tested). The step is the split-step engine
:mod:`ivhl_jax.numerics.splitstep` with the kinetic symbol ε_k and the local energy U = m² + λ|φ|²: the lattice
Laplacian is diagonal in Fourier space with eigenvalue −ε_k, ε_k = Σ_a 4 sin²(k_a/2), so the kinetic factor
e^{−i ε_k dt} is exact, and the local factor e^{−i dt/2 (m² + λ|φ|²)} is exact.

m² < 0 gives the symmetry-broken ("condensed") phase: the uniform vacuum |φ|² = −m²/λ with
energy −m⁴/(2λ) per site. ``strang(system, dt, imaginary=True)`` (imaginary time without
renormalisation, i.e. the gradient flow ∂φ/∂τ = −δV/δφ*) finds it; real-time runs from small noise show
the tachyonic growth of long-wavelength modes at constant V.

One door: :func:`strang` builds the stepper (it checks dt once and holds the kinetic factor derived from it);
``stepper.init(phi)`` validates the field; runs go through :func:`ivhl_jax.numerics.rollout.trajectory` or
:func:`~ivhl_jax.numerics.rollout.chunked` with :func:`observe` (the stepper's ``run_fn`` merges the local
half-steps of neighbouring steps between two observations).
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
from ivhl_jax.numerics import distributed_fft, splitstep
from ivhl_jax.numerics.rollout import Stepper

__all__ = [
    "GFTSystem",
    "strang",
    "observe",
    "potential",
    "rhs",
    "charge",
    "lattice_dispersion",
    "vacuum",
    "max_stable_dt",
    "StrangParams",
]


class GFTSystem(struct.PyTreeNode, eq=False):
    """GFT condensate parameters: lattice ``shape`` (rank r = len(shape), 1…4), mass² m², coupling λ.

    Build with :meth:`create` (``GFTSystem.create(shape, mass_sq=-0.5, lam=0.1, layout=None)``), which validates its
    input once; pytree reconstruction rebuilds the fields as they are. ``mass_sq`` and ``lam`` are pytree leaves
    (traceable, vmappable); the lattice shape and the layout are static. Fields may carry leading batch axes in
    front of the r lattice axes. ``layout``: how φ's lattice axes are split over a device mesh (an
    :class:`~ivhl_jax.numerics.distributed_fft.FFTLayout`) or None; with a layout the kinetic step uses the
    distributed FFT and φ and the factor are held in blocks. The fields have no defaults (the raw constructor
    checks nothing); ``replace`` validates like :meth:`create`.
    """

    shape: tuple[int, ...] = struct.field(pytree_node=False)
    mass_sq: Any
    lam: Any
    layout: Any = struct.field(pytree_node=False)

    @classmethod
    def create(cls, shape: tuple[int, ...], mass_sq: Any = -0.5, lam: Any = 0.1, layout: Any = None) -> GFTSystem:
        """The validated system: ``shape`` a tuple of 1..4 ints ≥ 2, ``mass_sq`` and ``lam`` real, ``layout`` None or
        an FFTLayout of the lattice."""
        if not isinstance(shape, tuple) or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape
        ):
            raise TypeError(f"shape must be a tuple of ints (sites per axis), got {shape!r}")
        if not 1 <= len(shape) <= 4:
            raise ValueError(f"shape must have rank 1..4 (one entry per group argument), got {shape}")
        if any(int(n) < 2 for n in shape):
            raise ValueError(f"shape entries must be >= 2, got {shape}")
        shape = tuple(int(n) for n in shape)
        for name, v in (("mass_sq", mass_sq), ("lam", lam)):
            if isinstance(v, (str, bytes)):
                raise TypeError(f"{name} must be a real number (or array), got {type(v).__name__} {v!r}")
        if layout is not None:
            layout = distributed_fft.check_layout(layout, shape)
        return cls(shape, mass_sq, lam, layout)

    def __repr__(self) -> str:
        return f"GFTSystem(shape={self.shape}, mass_sq={self.mass_sq!r}, lam={self.lam!r}, layout={self.layout!r})"

    @property
    def rank(self) -> int:
        return len(self.shape)


def _replace_gft(self: GFTSystem, **updates: Any) -> GFTSystem:
    """A new system with ``updates``, validated like :meth:`GFTSystem.create`."""
    fields = {"shape": self.shape, "mass_sq": self.mass_sq, "lam": self.lam, "layout": self.layout}
    return GFTSystem.create(**{**fields, **updates})


# (the dataclass transform installs an unchecked ``replace``; this one goes through ``create``)
setattr(GFTSystem, "replace", _replace_gft)  # noqa: B010


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


def potential(
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


def rhs(phi: Complex[ArrayLike, "*shape"], mass_sq: Any, lam: Any, rank: int | None = None) -> Complex[Array, "*shape"]:
    """δV/δφ* = −Δφ + m²φ + λ|φ|²φ (the right-hand side of i∂φ/∂t), finite-difference form."""
    phi = check_array(phi, "phi", kind="complex", finite=True)
    rank = _lattice_rank(phi, rank)
    check_scalar(mass_sq, "mass_sq")
    check_scalar(lam, "lam")
    axes = _lattice_axes(phi, rank)
    lap = sum(jnp.roll(phi, 1, axis=a) + jnp.roll(phi, -1, axis=a) - 2 * phi for a in axes)
    rdt = phi.real.dtype
    return -lap + (jnp.asarray(mass_sq, rdt) + jnp.asarray(lam, rdt) * _abs2(phi)) * phi


def charge(phi: Inexact[Array, "*batch_and_lattice"], rank: int | None = None) -> Float[Array, "*batch"]:
    """U(1) charge Q = Σ_x |φ|² (conserved exactly by the real-time evolution)."""
    phi = check_array(phi, "phi", kind="inexact", finite=True)
    rank = _lattice_rank(phi, rank)
    return jnp.sum(_abs2(phi), axis=_lattice_axes(phi, rank))


def vacuum(mass_sq: float, lam: float) -> tuple[float, float]:
    """Uniform minimum of V: (|φ|², energy per site) = (−m²/λ, −m⁴/(2λ)) for m² < 0, else (0, 0)."""
    check_scalar(mass_sq, "mass_sq")
    check_scalar(lam, "lam", positive=True)  # λ > 0 (finite): a bounded potential
    m2, lam_f = float(np.asarray(mass_sq)), float(np.asarray(lam))
    if m2 >= 0:
        return 0.0, 0.0
    return -m2 / lam_f, -(m2**2) / (2 * lam_f)


class StrangParams(struct.PyTreeNode):
    """Everything one GFT Strang step reads (built by :func:`strang`).

    Attributes:
      system: the :class:`GFTSystem` (m², λ traced leaves: new values reuse the compiled loop).
      plan: the kinetic factor e^{−i ε_k dt} − 1 (real time) or e^{−ε_k dt} − 1 (imaginary time) and the half-step
        time, both derived from one dt (:class:`ivhl_jax.numerics.splitstep.SplitStepPlan`; ``params.dt`` reads
        the step size). ``plan.imaginary`` (static) is the gradient flow instead of real time.
    """

    system: GFTSystem
    plan: splitstep.SplitStepPlan

    @property
    def dt(self) -> Any:
        """The step size (a real scalar)."""
        return self.plan.dt

    @property
    def imaginary(self) -> bool:
        return self.plan.imaginary


def _gft_local(system: GFTSystem, rdt: Any):
    m2 = jnp.asarray(system.mass_sq, rdt)
    lam = jnp.asarray(system.lam, rdt)
    return (lambda p: m2 + lam * _abs2(p)), m2, lam


def _check_step_field(phi: Any, params: StrangParams) -> jax.Array:
    """Static facts only (free under jit)."""
    system = params.system
    phi = check_array(phi, "phi", kind="complex")
    if phi.ndim < system.rank or tuple(phi.shape[-system.rank :]) != system.shape:
        raise ValueError(
            f"phi must end in the lattice shape {system.shape} (batch axes in front), got {tuple(phi.shape)}"
        )
    if params.plan.shape != system.shape:
        raise ValueError(
            f"the kinetic factor was built for the lattice {params.plan.shape}, got a system on {system.shape}; "
            "build a new stepper: gft.strang(system, dt)"
        )
    splitstep.check_placement(phi, system.layout, system.rank, "phi")
    return phi


def _umax(phi: jax.Array, m2: jax.Array, lam: jax.Array) -> jax.Array:
    # |U| = |m² + λ|φ|²| ≤ |m²| + |λ|·Σ|φ|² pointwise; twice the sum covers the round-off drift of a run.
    return jnp.abs(m2) + jnp.abs(lam) * 2 * jnp.sum(_abs2(phi))


def _gft_step(phi: Complex[Array, "*shape"], params: StrangParams) -> Complex[Array, "*shape"]:
    """One Strang step of ``params`` (real time or the gradient flow: the static ``params.plan.imaginary``)."""
    phi = _check_step_field(phi, params)
    local, m2, lam = _gft_local(params.system, phi.real.dtype)
    umax = None if params.plan.imaginary else _umax(phi, m2, lam)
    return splitstep.step(phi, params.plan, local, umax)


def _gft_run(phi: Complex[Array, "*shape"], params: StrangParams, n: int) -> Complex[Array, "*shape"]:
    """``n`` steps: real time merges the local half-steps of neighbouring steps
    (:func:`ivhl_jax.numerics.splitstep.run`, the same scheme to round-off, one pass over the field per step
    fewer); the gradient flow runs single steps."""
    phi = _check_step_field(phi, params)
    if params.plan.imaginary:
        return jax.lax.fori_loop(0, n, lambda _, p: _gft_step(p, params), phi)
    local, m2, lam = _gft_local(params.system, phi.real.dtype)
    return splitstep.run(phi, params.plan, local, _umax(phi, m2, lam), n)


def _check_start(phi: Any, params: StrangParams) -> None:
    """A start state handed to ``trajectory``/``chunked`` without ``init``: refused when it is sharded over a mesh
    the system has no layout for (every step would gather it onto one device)."""
    splitstep.check_placement(phi, params.system.layout, params.system.rank, "phi")


def _gft_init(params: StrangParams, phi: Any) -> jax.Array:
    """Validate φ (lattice shape, finite) and cast it to the stepper's complex dtype; for concrete values also
    check that dt resolves the local phase dt·max|m² + λ|φ|²| ≤ 2π."""
    system = params.system
    phi = _check_field(phi, system)
    splitstep.check_placement(phi, system.layout, system.rank, "phi")
    phi = phi.astype(_plan_dtype(params.plan))
    values = [
        float(np.asarray(x)) for x in (params.dt, system.mass_sq, system.lam) if is_concrete(x) and np.ndim(x) == 0
    ]
    if len(values) == 3 and is_concrete(phi) and distributed_fft.host_readable(phi):
        dtc, m2, lam = values
        u = m2 + lam * np.abs(np.asarray(phi)) ** 2
        splitstep.check_local_dt(dtc, splitstep.local_energy_max(u), False, formula="max|m² + λ|φ|²|")
    layout = system.layout
    return phi if layout is None else layout.place(phi, "phi")


def _plan_dtype(plan: splitstep.SplitStepPlan) -> Any:
    return jnp.result_type(plan.half_dt, jnp.complex64)


def max_stable_dt(shape: tuple[int, ...]) -> float:
    """The largest real-time step on a lattice of ``shape``: π / max ε_k (π/(4r) on an even lattice of rank r),
    :func:`ivhl_jax.numerics.splitstep.max_stable_dt`; :func:`strang` refuses a larger dt."""
    return splitstep.max_stable_dt(lattice_dispersion(tuple(shape)))


def strang(
    system: GFTSystem,
    dt: Any,
    *,
    imaginary: bool = False,
    policy: str | Policy | None = None,
) -> Stepper:
    """The Strang stepper of i∂φ/∂t = −Δφ + m²φ + λ|φ|²φ (lattice units; ``imaginary``: ∂φ/∂τ = −δV/δφ*).

    One step maps φ (complex, shape ``(*batch, *system.shape)``) to
    e^{−i dt/2 (m² + λ|φ|²)} e^{−i ε_k dt} e^{−i dt/2 (m² + λ|φ|²)} φ, ε_k = Σ_a 4 sin²(k_a/2), both
    factors exact (the split-step engine :mod:`ivhl_jax.numerics.splitstep`). The kinetic factor is computed once
    from ``dt`` (float64 NumPy for a concrete dt) and held in :class:`StrangParams`.

    Args:
      system: the :class:`GFTSystem`.
      dt: step size (> 0). Real time: dt·max ε_k ≤ π (≤ π/(4r) on an even lattice of rank r,
        :func:`max_stable_dt`), else ValueError with the bound; dt·|m²| ≤ 2π; ``init`` also checks
        dt·max|m² + λ|φ|²| ≤ 2π.
      imaginary: the gradient flow ∂φ/∂τ = −δV/δφ* (no renormalisation: V decreases towards a minimum).
      policy: None (the couplings' precision: complex64, complex128 for float64 m² and λ or Python floats under
        ``jax.enable_x64``) or a precision policy / preset: ``"f32"`` → complex64, ``"f64"`` → complex128 (needs
        ``jax.enable_x64``), ``"bf16"`` → ValueError naming ``policy``.

    Returns:
      A :class:`ivhl_jax.numerics.rollout.Stepper` (with ``run_fn``: merged half-steps between observations);
      record with ``trajectory(stepper, stepper.init(phi), steps, observe=gft.observe)``.
    """
    if not isinstance(system, GFTSystem):
        raise TypeError(f"system must be a GFTSystem, got {type(system).__name__}")
    if not isinstance(imaginary, (bool, np.bool_)):
        raise TypeError(f"imaginary must be a bool (a static choice of the scheme), got {imaginary!r}")
    check_scalar(system.mass_sq, "mass_sq")
    check_scalar(system.lam, "lam")
    like = jax.ShapeDtypeStruct((), jnp.result_type(float, system.mass_sq, system.lam))
    cdt = jnp.dtype(complex_state_dtype(policy, like=like, routine="the GFT split-step solver"))
    rdt = jnp.finfo(cdt).dtype
    m2c = splitstep.concrete_float(system.mass_sq)
    eps = functools.partial(lattice_dispersion, system.shape)
    plan = splitstep.plan(
        (splitstep.KineticTerm(eps, tuple(range(system.rank)), 1.0, ("gft-dispersion", system.shape)),),
        dt,
        shape=system.shape,
        imaginary=bool(imaginary),
        dtype=cdt,
        layout=system.layout,
        kinetic_max=float(np.max(lattice_dispersion(system.shape))),
        label="max ε_k",
    )
    dtc = splitstep.concrete_float(dt)
    if dtc is not None and m2c is not None:  # the mass term alone bounds the local phase (or decay) per step
        splitstep.check_local_dt(dtc, abs(m2c), bool(imaginary), formula="|m²|", name="mass")
    sys_ = system.replace(mass_sq=jnp.asarray(system.mass_sq, rdt), lam=jnp.asarray(system.lam, rdt))
    params = StrangParams(sys_, plan)
    return Stepper.create(
        _gft_step,
        params,
        init_fn=_gft_init,
        run_fn=_gft_run,
        name="gft-strang-imaginary" if imaginary else "gft-strang",
        check_fn=_check_start,
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
        "energy": potential(phi, system.mass_sq, system.lam, system.rank),
        "charge": charge(phi, system.rank),
        "order": jnp.abs(jnp.mean(phi, axis=axes)),
        "mean_abs2": jnp.mean(_abs2(phi), axis=axes),
    }
