"""Dipolar condensates: the dipole–dipole interaction in k-space (with the spherical cutoff), its potential and
energy, the equation on the split-step engine (:data:`DIPOLAR_EQUATION`: stepped by
:func:`~ivhl_jax.physics.condensate.strang`, its imaginary-time ground state by
:func:`~ivhl_jax.physics.condensate.ground_state`), and the Thomas–Fermi aspect ratio.

Units: ħ = m = 1, trap units (as in :mod:`ivhl_jax.physics.condensate`); 3-D grids only. The GP equation with
dipoles polarised along the unit vector d̂::

    i ∂ψ/∂t = [−½∇² + V + g|ψ|² + Φ_dd + γ_QF|ψ|³] ψ,      Φ_dd = F⁻¹[Ṽ_dd(k) F|ψ|²],
    E = ∫ [½|∇ψ|² + V|ψ|² + ½g|ψ|⁴ + ½Φ_dd|ψ|² + (2/5)γ_QF|ψ|⁵] dV,

with the Fourier transform of U_dd(r) = (3g_dd/4π)(1 − 3cos²θ_r)/r³ (θ_r the angle between r and d̂)

    Ṽ_dd(k) = g_dd (3cos²θ_k − 1),                                       cos θ_k = k·d̂/|k|,

g_dd = C_dd/3 = ε_dd g (ε_dd the relative dipolar strength; ⁵²Cr: ε_dd ≈ 0.16, ¹⁶⁴Dy: ≈ 1.3). On a periodic box
the uncut kernel couples every image of the cloud; the standard remedy (Ronen, Bortolotti & Bohn,
PRA 74, 013623 (2006)) truncates U_dd to a sphere r < R_c, whose transform is

    Ṽ_dd(k) = g_dd (3cos²θ_k − 1) [1 + 3cos(R_c k)/(R_c k)² − 3 sin(R_c k)/(R_c k)³]

(→ the uncut form for R_c k ≫ 1, → 0 as k → 0). The pair interaction inside a cloud of diameter D is then
exact when R_c ≥ D and the box side L ≥ D + R_c (no image within R_c). Ṽ_dd(0) = 0 for both forms (the uncut
k = 0 value is direction dependent; 0 is its angular mean).

γ_QF|ψ|³ is the Lee–Huang–Yang (quantum-fluctuation) correction of Lima & Pelster (γ_QF = 0 without it; its
coefficient, the conversion from a species and the references in :mod:`ivhl_jax.physics.condensate.lhy`): with it
a dipolar condensate past ε_dd ≈ 1 forms self-bound droplets instead of collapsing.

Φ_dd is real and depends on ψ only through |ψ|², which the local factor e^{−iτ(V + g|ψ|² + Φ_dd + γ_QF|ψ|³)} does
not change, so the Strang step e^{−i dt/2 U} K(dt) e^{−i dt/2 U} keeps both factors exact, as for contact
interactions (U now also holds Φ_dd: one real FFT pair per half-step). K(dt) is the split-step engine's kinetic
factor (:func:`ivhl_jax.physics.condensate.system.kinetic_plan`). On a system with a ``layout`` (slab or pencil)
both K and Φ_dd use the distributed FFT (:mod:`ivhl_jax.numerics.distributed_fft`; Φ_dd by a complex transform
pair, the kernel held in the k-space blocks each device multiplies), so the field is never gathered. Imaginary
time (the normalised gradient flow) replaces −i dt by −dt and projects to N.

In the Thomas–Fermi limit of a cylindrically symmetric harmonic trap (frequencies ω_ρ, ω_z, dipoles along z)
the density is still an inverted parabola, with the aspect ratio κ = R_ρ/R_z the root of (Eberlein, Giovanazzi
& O'Dell, PRA 71, 033618 (2005))

    3κ²ε_dd [(γ²/2 + 1) f(κ)/(1 − κ²) − 1] + (ε_dd − 1)(κ² − γ²) = 0,       γ = ω_z/ω_ρ,
    f(κ) = (1 + 2κ²)/(1 − κ²) − 3κ² artanh(√(1 − κ²))/(1 − κ²)^{3/2}

(:func:`thomas_fermi_aspect_ratio`, solved in float64 with SciPy; κ = γ at ε_dd = 0).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import distributed_fft, splitstep
from ivhl_jax.numerics.distributed_fft import check_layout, host_readable
from ivhl_jax.physics.condensate import system as condensate_system
from ivhl_jax.physics.condensate.lhy import density_power, lhy_coefficient
from ivhl_jax.physics.condensate.system import (
    Equation,
    EquationParams,
    Grid,
    SystemDtypes,
    check_step,
    place_state,
)

__all__ = [
    "Dipolar",
    "DipolarSystem",
    "dipolar_kernel",
    "dipolar_potential",
    "dipolar_energy",
    "dipolar_gp_energy",
    "DIPOLAR_EQUATION",
    "dipolar_step",
    "thomas_fermi_aspect_ratio",
    "gaussian_energy_parts",
    "cutoff_factor",
]


# ----------------------------------------------------------------------------------------------
# The interaction spec and the system (data only; validated by ``create``)
# ----------------------------------------------------------------------------------------------
class Dipolar(struct.PyTreeNode):
    """A dipole–dipole interaction: strength, unit dipole axis d̂ (shape (3,)), spherical cutoff R_c or None.

    Build with :meth:`create`. ``strength`` is ε_dd (relative to the contact g of the system it joins) when
    ``relative`` (static) is True, else g_dd itself; ``strength``, ``axis`` and ``cutoff`` are leaves (traced,
    vmapped, differentiated).
    """

    strength: Any
    axis: Any
    cutoff: Any = None
    relative: bool = struct.field(pytree_node=False, default=True)

    @classmethod
    def create(
        cls,
        *,
        eps_dd: Any = None,
        g_dd: Any = None,
        axis: Sequence[float] | Any = (0.0, 0.0, 1.0),
        cutoff: Any = None,
    ) -> Dipolar:
        """Validated spec: exactly one of ``eps_dd`` (ε_dd = g_dd/g ≥ 0) or ``g_dd`` (≥ 0, energy × volume);
        ``axis`` any non-zero 3-vector (normalised here); ``cutoff`` R_c > 0 (trap units) or None (uncut)."""
        if (eps_dd is None) == (g_dd is None):
            raise ValueError("pass exactly one of eps_dd (relative to the contact g) or g_dd (absolute strength)")
        name, value = ("eps_dd", eps_dd) if eps_dd is not None else ("g_dd", g_dd)
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} must be a real number >= 0, got {value!r}")
        check_scalar(value, name, nonnegative=True)  # NaN/inf: "must be finite"; negative: ">= 0"
        if isinstance(axis, (str, bytes)):
            raise TypeError(f"axis must be a 3-vector (the dipole direction), got {axis!r}")
        ax = check_array(axis, "axis", shape=(3,), kind="numeric")
        if jnp.iscomplexobj(ax):
            raise TypeError(f"axis must be real, got dtype {ax.dtype}")
        if is_concrete(ax):
            host = np.asarray(ax, np.float64)
            if not np.all(np.isfinite(host)):
                raise ValueError(f"axis must be finite, got {host.tolist()}")
            length = float(np.linalg.norm(host))
            if not length > 0:
                raise ValueError(f"axis must be a non-zero vector (the dipole direction), got {host.tolist()}")
            ax_out: Any = host / length
        else:
            ax_out = ax / jnp.linalg.norm(ax)
        if cutoff is not None:
            if isinstance(cutoff, (str, bytes)):
                raise TypeError(f"cutoff must be a positive radius R_c or None, got {cutoff!r}")
            check_scalar(cutoff, "cutoff", positive=True)
        return cls(strength=value, axis=ax_out, cutoff=cutoff, relative=eps_dd is not None)


class DipolarSystem(SystemDtypes, struct.PyTreeNode):
    """A dipolar GP problem on a 3-D grid: trap V (grid-shaped), contact g, the :class:`Dipolar` interaction, and the
    LHY coefficient γ_QF (None: no beyond-mean-field term).

    Build with :meth:`create`. ``potential``, ``g``, ``gamma_qf`` and the spec's leaves are traced; the grid and the
    ``layout`` are static. The real dtype of ``potential`` is the working precision (float32 → complex64, float64 →
    complex128). ``layout``: how ψ is split over a device mesh (an
    :class:`~ivhl_jax.numerics.distributed_fft.FFTLayout`, slab or pencil) or None; with a layout the kinetic factor
    and Φ_dd use the distributed FFT and V and ψ (``strang(...).init``) are held in blocks, one per device.
    """

    grid: Grid = struct.field(pytree_node=False)
    potential: Any
    g: Any
    dipolar: Dipolar
    layout: Any = struct.field(pytree_node=False, default=None)
    gamma_qf: Any = None

    @classmethod
    def create(
        cls,
        grid: Grid,
        potential: Any,
        g: Any,
        dipolar: Dipolar,
        *,
        layout: Any = None,
        lhy: bool = False,
        gamma_qf: Any = None,
    ) -> DipolarSystem:
        """Validated system: ``grid`` 3-D, ``potential`` real of shape ``grid.shape``, ``g`` a real scalar,
        ``dipolar`` a :class:`Dipolar` (:meth:`Dipolar.create`), ``layout`` None or an FFTLayout of the grid
        (``distributed_fft.fft_layout(mesh, P("x"))``: V is placed on it here).

        The LHY term γ_QF|ψ|³ (module docstring): ``lhy=True`` computes γ_QF = (32/3)g√(a³/π)Q₅(ε_dd), a = g/4π,
        from g (> 0) and the spec's ε_dd (:func:`~ivhl_jax.physics.condensate.lhy.lhy_coefficient`), or pass
        ``gamma_qf`` ≥ 0 itself (e.g. 5/2 for Petrov's reduced droplet equation with g = −3, ε_dd = 0); not both.
        γ_QF is a leaf of its own: it does not follow a later ``replace(g=...)``, so differentiate through
        ``create`` (or with respect to ``gamma_qf``)."""
        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a Grid (Grid.uniform(shape, length)), got {type(grid).__name__}")
        if grid.ndim != 3:
            raise ValueError(f"grid must be 3-D for the dipole-dipole kernel (it is the 3-D one), got {grid.ndim}-D")
        if not isinstance(dipolar, Dipolar):
            raise TypeError(
                f"dipolar must be a Dipolar (Dipolar.create(eps_dd=..., axis=...)), got {type(dipolar).__name__}"
            )
        layout = None if layout is None else check_layout(layout, grid.shape)
        pot = check_array(potential, "potential", shape=grid.shape, kind="floating")
        if is_concrete(pot):
            check_array(pot, "potential", finite=True)
            if layout is not None:
                pot = layout.place(pot, "potential")
        if isinstance(g, (str, bytes)):
            raise TypeError(f"g must be a real number, got {g!r}")
        check_scalar(g, "g")
        rdt = jnp.result_type(pot)
        gamma = _lhy_setting(lhy, gamma_qf, g, dipolar)
        spec = dipolar.replace(
            strength=jnp.asarray(dipolar.strength, rdt),
            axis=jnp.asarray(dipolar.axis, rdt),
            cutoff=None if dipolar.cutoff is None else jnp.asarray(dipolar.cutoff, rdt),
        )
        gamma = None if gamma is None else jnp.asarray(gamma, rdt)
        return cls(grid=grid, potential=pot, g=jnp.asarray(g, rdt), dipolar=spec, layout=layout, gamma_qf=gamma)

    @property
    def g_dd(self) -> Any:
        """g_dd = ε_dd·g (relative spec) or the spec's strength."""
        d = self.dipolar
        return d.strength * self.g if d.relative else d.strength


def _lhy_setting(lhy: Any, gamma_qf: Any, g: Any, dipolar: Dipolar) -> Any:
    """γ_QF from ``create``'s settings: None (no LHY term), the given ``gamma_qf`` (≥ 0), or ``lhy=True``'s
    (32/3)g√(a³/π)Q₅(ε_dd) with ε_dd = g_dd/g."""
    if not isinstance(lhy, (bool, np.bool_)):
        raise TypeError(f"lhy must be True or False (compute gamma_qf from g and eps_dd), got {lhy!r}")
    if gamma_qf is not None:
        if lhy:
            raise ValueError("pass lhy=True (gamma_qf computed from g and eps_dd) or gamma_qf=..., not both")
        if isinstance(gamma_qf, (str, bytes)):
            raise TypeError(f"gamma_qf must be a real number >= 0, got {gamma_qf!r}")
        check_scalar(gamma_qf, "gamma_qf", nonnegative=True)
        return gamma_qf
    if not lhy:
        return None
    if is_concrete(g) and not float(np.asarray(g)) > 0:
        raise ValueError(
            f"lhy=True needs g > 0 (gamma_qf grows with the s-wave length a = g/4pi), got g={float(np.asarray(g))}; "
            "pass gamma_qf=... for another form"
        )
    eps = dipolar.strength if dipolar.relative else jnp.asarray(dipolar.strength) / jnp.asarray(g)
    return lhy_coefficient(g, eps)


def _check_system(system: Any) -> DipolarSystem:
    if not isinstance(system, DipolarSystem):
        raise TypeError(f"system must be a DipolarSystem (DipolarSystem.create(...)), got {type(system).__name__}")
    return system


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------
_SERIES_TERMS = 8


def cutoff_factor(x: Any) -> Any:
    """The spherical-cutoff factor 1 + 3cos x/x² − 3 sin x/x³ of x = R_c k (NumPy in float64 for NumPy input,
    else JAX): 0 at x = 0 (x²/10 − x⁴/280 + ..., summed as a series for x < 1, where the closed form cancels),
    → 1 for x ≫ 1."""
    xp = np if isinstance(x, (np.ndarray, np.generic, float, int)) else jnp
    x = xp.asarray(x)
    small = x < 1.0
    xs = xp.where(small, xp.ones_like(x), x)
    direct = 1 + 3 * xp.cos(xs) / xs**2 - 3 * xp.sin(xs) / xs**3
    # 1 + 3 Σ_n (−1)^{n+1} [1/(2n+2)! − 1/(2n+3)!] x^{2n}: the n = 0 term cancels the 1.
    y = x * x
    series = xp.zeros_like(x)
    for n in range(_SERIES_TERMS, 0, -1):
        coeff = 3 * (-1) ** (n + 1) * (1 / math.factorial(2 * n + 2) - 1 / math.factorial(2 * n + 3))
        series = (series + coeff) * y  # Horner: Σ_{n≥1} c_n yⁿ = ((c_N y + c_{N−1}) y + ... + c_1) y
    return xp.where(small, series, direct)


def _half_wavenumbers(grid: Grid) -> list[np.ndarray]:
    """k per axis broadcast over the real-FFT half spectrum (last axis rfftfreq), float64."""
    ks = [2 * np.pi * np.fft.fftfreq(n, d) for n, d in zip(grid.shape[:-1], grid.dx[:-1])]
    ks.append(2 * np.pi * np.fft.rfftfreq(grid.shape[-1], grid.dx[-1]))
    out = []
    for a, k in enumerate(ks):
        shp = [1] * grid.ndim
        shp[a] = -1
        out.append(k.reshape(shp))
    return out


@functools.lru_cache(maxsize=16)
def _shape_host(grid: Grid, axis: tuple[float, ...], cutoff: float | None, half: bool) -> np.ndarray:
    """(3cos²θ_k − 1)·cutoff(R_c k) in float64 NumPy (0 at k = 0)."""
    return _shape_at(_wavenumbers(grid, half), axis, cutoff)


def _wavenumbers(grid: Grid, half: bool) -> list[np.ndarray]:
    return _half_wavenumbers(grid) if half else [grid._bcast(k, a) for a, k in enumerate(grid.wavenumbers)]


def _shape_at(ks: Sequence[np.ndarray], axis: Any, cutoff: Any, rdt: Any = None) -> Any:
    """(3cos²θ_k − 1)·cutoff(R_c k) at the wavevectors ``ks`` (float64 NumPy components), 0 at k = 0: in float64
    NumPy for ``rdt`` None (``axis`` and ``cutoff`` floats), else on the device in ``rdt`` (traced ``axis`` or
    ``cutoff``; k² formed in float64 and cast once)."""
    xp: Any = np if rdt is None else jnp
    if rdt is None:
        k2 = sum(k * k for k in ks)
        kd = sum(k * d for k, d in zip(ks, axis))
    else:
        k2 = jnp.asarray(sum(k * k for k in ks), rdt)
        ax = jnp.asarray(axis, rdt)
        kd = sum(jnp.asarray(k, rdt) * ax[a] for a, k in enumerate(ks))
        cutoff = None if cutoff is None else jnp.asarray(cutoff, rdt)
    zero = k2 == 0
    k2s = xp.where(zero, 1.0, k2)
    s = 3 * kd * kd / k2s - 1
    if cutoff is not None:
        s = s * cutoff_factor(cutoff * xp.sqrt(k2s))
    return xp.where(zero, 0.0, s)


def _shape(grid: Grid, dip: Dipolar, rdt: Any, half: bool) -> jax.Array:
    ax, rc = dip.axis, dip.cutoff
    if is_concrete(ax) and (rc is None or is_concrete(rc)):
        axis = tuple(float(v) for v in np.asarray(ax, np.float64))
        cut = None if rc is None else float(np.asarray(rc))
        return jnp.asarray(_shape_host(grid, axis, cut, half), rdt)
    return _shape_at(_wavenumbers(grid, half), ax, rc, rdt)


@functools.lru_cache(maxsize=16)
def _full_representatives(grid: Grid) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], np.ndarray]:
    """Where the real-FFT pair evaluates the kernel for each bin of the full spectrum (float64, broadcastable).

    ``irfftn(h · rfftn(n))`` holds h on the half spectrum (last axis 0 … n//2, +k at its Nyquist index) and reads a
    bin of the other half as the conjugate partner −k (mod the grid) it holds; on the self-conjugate planes (last
    axis index 0 and n/2) it keeps the Hermitian part of the product, the mean of h(k) and h(−k). Returned: the
    wavevector components k⁽¹⁾ of the held bin, k⁽²⁾ of its partner, and the weight w (½ on the self-conjugate
    planes, else 0) of Ṽ_eff = (1 − w)Ṽ(k⁽¹⁾) + wṼ(k⁽²⁾). They differ from the plain ``fftfreq`` grid only where a
    Nyquist wavenumber enters a kernel that is not even in each component (a tilted dipole axis)."""
    shape, nd = grid.shape, grid.ndim
    n = shape[-1]
    k3 = np.arange(n)
    upper = k3 > n // 2
    kz = 2 * np.pi * np.fft.rfftfreq(n, grid.dx[-1])[np.where(upper, n - k3, k3)]
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    for a in range(nd - 1):
        m = shape[a]
        k = 2 * np.pi * np.fft.fftfreq(m, grid.dx[a])
        k_neg = k[(-np.arange(m)) % m]
        shp = [1] * nd
        shp[a] = m
        first.append(np.where(upper.reshape((1,) * (nd - 1) + (n,)), k_neg.reshape(shp), k.reshape(shp)))
        second.append(k_neg.reshape(shp))
    kz_b = kz.reshape((1,) * (nd - 1) + (n,))
    selfconj = (k3 == 0) | ((n % 2 == 0) & (k3 == n // 2))
    return tuple(first) + (kz_b,), tuple(second) + (kz_b,), np.where(selfconj, 0.5, 0.0)


@functools.lru_cache(maxsize=16)
def _full_shape_host(grid: Grid, axis: tuple[float, ...], cutoff: float | None) -> np.ndarray:
    first, second, w = _full_representatives(grid)
    return (1 - w) * _shape_at(first, axis, cutoff) + w * _shape_at(second, axis, cutoff)


def _layout_kernel(system: DipolarSystem) -> jax.Array:
    """Ṽ_dd on the full spectrum for the distributed complex transform pair, evaluated where the single-device real
    pair evaluates it (:func:`_full_representatives`), so both give the same Φ_dd to round-off."""
    rdt, dip, grid = system.real_dtype, system.dipolar, system.grid
    if is_concrete(dip.axis) and (dip.cutoff is None or is_concrete(dip.cutoff)):
        axis = tuple(float(v) for v in np.asarray(dip.axis, np.float64))
        cut = None if dip.cutoff is None else float(np.asarray(dip.cutoff))
        shape = jnp.asarray(_full_shape_host(grid, axis, cut), rdt)
    else:  # traced axis or cutoff: elementwise on the device (the wavevectors are constants of the program)
        first, second, w = _full_representatives(grid)
        s1 = _shape_at(first, dip.axis, dip.cutoff, rdt)
        s2 = _shape_at(second, dip.axis, dip.cutoff, rdt)
        wj = jnp.asarray(w, rdt)
        shape = (1 - wj) * s1 + wj * s2
    return jnp.asarray(system.g_dd, rdt) * shape


def dipolar_kernel(system: DipolarSystem, *, half: bool = False) -> Float[Array, "*kgrid"]:
    """Ṽ_dd(k) = g_dd(3cos²θ_k − 1)[cutoff(R_c k)] on the system's Fourier grid (module docstring), in the
    system's real dtype. Shape ``grid.shape`` in ``fftfreq`` order (``half=True``: the real-FFT half
    spectrum, last axis n//2 + 1). A concrete axis and cutoff are evaluated in float64 NumPy and cast once."""
    system = _check_system(system)
    rdt = system.real_dtype
    return jnp.asarray(system.g_dd, rdt) * _shape(system.grid, system.dipolar, rdt, half)


def dipolar_potential(density: Float[ArrayLike, "*grid"], system: DipolarSystem) -> Float[Array, "*grid"]:
    """Φ_dd = F⁻¹[Ṽ_dd F n] for a density n (real, grid-shaped; energy units ħω₀), by one real FFT pair."""
    system = _check_system(system)
    n = check_array(density, "density", shape=system.grid.shape, kind="floating", finite=host_readable(density))
    return _phi(n.astype(system.real_dtype), system)


def _phi(n: jax.Array, system: DipolarSystem) -> jax.Array:
    kern = dipolar_kernel(system, half=True)
    return jnp.fft.irfftn(kern * jnp.fft.rfftn(n), s=system.grid.shape)


def dipolar_energy(psi: Inexact[Array, "*grid"], system: DipolarSystem) -> Float[Array, ""]:
    """E_dd = ½∫Φ_dd|ψ|² dV (ħω₀)."""
    system = _check_system(system)
    psi = check_array(psi, "psi", shape=system.grid.shape, kind="inexact", finite=host_readable(psi))
    rdt = system.real_dtype
    n = (jnp.abs(psi) ** 2).astype(rdt)
    return 0.5 * jnp.sum(_phi(n, system) * n) * system.grid.cell_volume


def dipolar_gp_energy(psi: Inexact[Array, "*grid"], system: DipolarSystem) -> dict[str, Float[Array, ""]]:
    """E = ∫[½|∇ψ|² + V|ψ|² + ½g|ψ|⁴ + ½Φ_dd|ψ|² + (2/5)γ_QF|ψ|⁵] dV (ħω₀; totals). Returns ``kinetic``, ``trap``,
    ``interaction`` (contact), ``dipolar``, ``lhy`` (only for a system with γ_QF) and ``total``; the kinetic part
    spectral (Parseval)."""
    system = _check_system(system)
    grid = system.grid
    psi = check_array(psi, "psi", shape=grid.shape, kind="inexact", finite=host_readable(psi))
    psi = psi.astype(system.complex_dtype)
    rdt = system.real_dtype
    dv = grid.cell_volume
    psi_k = jnp.fft.fftn(psi)
    k2 = jnp.asarray(grid.k_squared(), rdt)
    ekin = 0.5 * jnp.sum(k2 * (psi_k.real**2 + psi_k.imag**2)) * dv / grid.size
    n = psi.real**2 + psi.imag**2
    etrap = jnp.sum(jnp.asarray(system.potential, rdt) * n) * dv
    eint = 0.5 * jnp.asarray(system.g, rdt) * jnp.sum(n * n) * dv
    edd = 0.5 * jnp.sum(_phi(n, system) * n) * dv
    parts = {"kinetic": ekin, "trap": etrap, "interaction": eint, "dipolar": edd}
    total = ekin + etrap + eint + edd
    if system.gamma_qf is not None:
        parts["lhy"] = 0.4 * jnp.asarray(system.gamma_qf, rdt) * jnp.sum(density_power(n, 2.5)) * dv
        total = total + parts["lhy"]
    return {**parts, "total": total}


# ----------------------------------------------------------------------------------------------
# The stepper
# ----------------------------------------------------------------------------------------------
def _phi_of(system: DipolarSystem) -> Any:
    """n ↦ Φ_dd = F⁻¹[Ṽ_dd F n] for the step, with the kernel built once (hoisted out of both half-kicks): one real
    FFT pair, or with a layout the distributed complex pair (the kernel constrained to the k-space blocks)."""
    grid, layout = system.grid, system.layout
    if layout is None:
        kern = dipolar_kernel(system, half=True)
        return lambda n: jnp.fft.irfftn(kern * jnp.fft.rfftn(n), s=grid.shape)
    kern_full = layout.place_factor(_layout_kernel(system), grid.shape)
    cdt = system.complex_dtype

    def phi(n: jax.Array) -> jax.Array:
        nk, _ = distributed_fft.fftn(n.astype(cdt), layout)
        return distributed_fft.ifftn(nk * kern_full, layout).real

    return phi


def dipolar_step(psi: Complex[Array, "*grid"], params: EquationParams) -> Complex[Array, "*grid"]:
    """One Strang step e^{−i dt/2 U} K(dt) e^{−i dt/2 U}, U = V + g|ψ|² + Φ_dd + γ_QF|ψ|³ (imaginary time:
    projected to N)."""
    system = params.system
    psi = check_step(psi, params, system.grid.shape)
    rdt = psi.real.dtype
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)
    phi = _phi_of(system)
    gamma = None if system.gamma_qf is None else jnp.asarray(system.gamma_qf, rdt)

    def local(p: jax.Array) -> jax.Array:
        n = p.real * p.real + p.imag * p.imag
        u = pot + g * n + phi(n)
        return u if gamma is None else u + gamma * density_power(n, 1.5)  # fused into the same elementwise pass

    project = splitstep.norm_projection(psi, params.target) if params.imaginary else None
    return splitstep.step(psi, params.plan, local, project=project)


def _dipolar_init(params: EquationParams, psi: Any) -> jax.Array:
    """Validate ψ (grid-shaped, finite), check that dt resolves the local phase dt·max|V + g|ψ|² + Φ_dd + γ_QF|ψ|³| ≤ 2π
    over the cloud (concrete values) and cast ψ to the system's complex dtype."""
    system = params.system
    arr = place_state(check_array(psi, "psi", shape=system.grid.shape, kind="inexact"), system)
    if is_concrete(arr) and host_readable(arr):
        check_array(arr, "psi", finite=True)
    arr = arr.astype(system.complex_dtype)

    def local(p: np.ndarray) -> np.ndarray:
        rho = np.abs(p.astype(np.complex128)) ** 2
        phi = np.asarray(_phi(jnp.asarray(rho, system.real_dtype), system), np.float64)
        u = np.asarray(system.potential, np.float64) + float(np.asarray(system.g)) * rho + phi
        return u if system.gamma_qf is None else u + float(np.asarray(system.gamma_qf)) * rho**1.5

    formula = "max|V + g|ψ|² + Φ_dd|" if system.gamma_qf is None else "max|V + g|ψ|² + Φ_dd + γ_QF|ψ|³|"
    condensate_system.check_local_step(params, arr, local, formula)
    return arr


def _dipolar_targets(system: DipolarSystem, norm: Any, magnetization: Any, imaginary: bool) -> jax.Array | None:
    """Imaginary time: the particle number N = ∫|ψ|² dV held, as a grid sum (None: the norm each step starts
    with)."""
    if norm is None:
        return None
    check_scalar(norm, "norm", positive=True)
    return jnp.asarray(norm, system.real_dtype) / jnp.asarray(system.grid.cell_volume, system.real_dtype)


def _dipolar_guess(system: DipolarSystem, psi0: Any, magnetization: Any) -> jax.Array:
    """The flow's start: ``psi0`` (grid-shaped, finite, not zero everywhere) or a unit-width Gaussian."""
    grid = system.grid
    if psi0 is None:
        arg = sum(grid._bcast(x * x / 2, a) for a, x in enumerate(grid.coords))
        return jnp.asarray(np.exp(-arg), system.complex_dtype)
    psi = check_array(psi0, "psi0", shape=grid.shape, kind="inexact")
    if is_concrete(psi):
        check_array(psi, "psi0", finite=True)
    psi = psi.astype(system.complex_dtype)
    if is_concrete(psi) and not np.any(np.asarray(psi) != 0):
        raise ValueError("psi0 is zero everywhere, so it cannot be normalised; pass a non-zero initial guess")
    return psi


#: The dipolar GP equation on the split-step engine: U = V + g|ψ|² + Φ_dd + γ_QF|ψ|³ (module docstring), N held.
#: A real problem (V real, Φ_dd and γ_QF|ψ|³ real functions of |ψ|²): the flow keeps ψ real, E[ψ] = E[|ψ|].
DIPOLAR_EQUATION = Equation(
    DipolarSystem, "dipolar", dipolar_step, _dipolar_init, _dipolar_targets, _dipolar_guess, real=True
)


# ----------------------------------------------------------------------------------------------
# Thomas–Fermi aspect ratio (float64 reference)
# ----------------------------------------------------------------------------------------------
def _f_over(kappa: float) -> float:
    """f(κ)/(1 − κ²) (module docstring), real for every κ > 0: the series Σ_{j≥1} 6 s^{2j−2}/((2j+1)(2j+3)),
    s² = 1 − κ², near κ = 1 (where the closed form is 0/0), artanh for κ < 1, arctan for κ > 1."""
    s2 = 1.0 - kappa * kappa
    if abs(s2) < 0.1:
        return sum(6.0 * s2 ** (j - 1) / ((2 * j + 1) * (2 * j + 3)) for j in range(1, 40))
    if s2 > 0:
        s = math.sqrt(s2)
        ratio = math.atanh(s) / s  # artanh(s)/s
    else:
        t = math.sqrt(-s2)
        ratio = math.atan(t) / t  # artanh(i t)/(i t)
    f = (1 + 2 * kappa * kappa) / s2 - 3 * kappa * kappa * ratio / s2
    return f / s2


def thomas_fermi_aspect_ratio(eps_dd: float, trap_ratio: float) -> float:
    """The Thomas–Fermi aspect ratio κ = R_ρ/R_z of a dipolar condensate in a cylindrical harmonic trap.

    Dipoles along the trap axis z; ``trap_ratio`` γ = ω_z/ω_ρ > 0; 0 ≤ ε_dd < 1 (``eps_dd``). The root of
    3κ²ε_dd[(γ²/2 + 1) f(κ)/(1 − κ²) − 1] + (ε_dd − 1)(κ² − γ²) = 0 (Eberlein, Giovanazzi & O'Dell 2005; module
    docstring), found in float64 by ``scipy.optimize.brentq`` to 1e-14: κ = γ at ε_dd = 0, and the dipoles
    stretch the cloud along z (κ < γ) for ε_dd > 0. For ε_dd ≥ 1 the homogeneous gas is unstable and the
    equation can have several roots or none, so that range is refused.
    """
    from scipy.optimize import brentq

    check_scalar(eps_dd, "eps_dd", nonnegative=True)
    check_scalar(trap_ratio, "trap_ratio", positive=True)
    eps, gam = float(eps_dd), float(trap_ratio)
    if not eps < 1:
        raise ValueError(
            f"eps_dd must be < 1 for the Thomas-Fermi aspect ratio (the homogeneous dipolar gas is unstable "
            f"beyond), got {eps}"
        )
    if eps == 0:
        return gam

    def h(log_k: float) -> float:
        k2 = math.exp(2 * log_k)
        return 3 * k2 * eps * ((gam * gam / 2 + 1) * _f_over(math.sqrt(k2)) - 1) + (eps - 1) * (k2 - gam * gam)

    # h > 0 as κ → 0 ((1 − ε)γ²) and h < 0 as κ → ∞ (−(1 + 2ε)κ²): bracket the sign change on a log grid.
    grid = np.log(gam) + np.linspace(-12.0, 12.0, 481)
    vals = [h(v) for v in grid]
    for a, b, fa, fb in zip(grid[:-1], grid[1:], vals[:-1], vals[1:]):
        if fa == 0:
            return float(math.exp(a))
        if fa * fb < 0:
            return float(math.exp(brentq(h, a, b, xtol=1e-14, rtol=1e-14)))
    raise ValueError(f"no Thomas-Fermi aspect ratio found for eps_dd={eps}, trap_ratio={gam}")  # pragma: no cover


def gaussian_energy_parts(
    sigma_rho: float,
    sigma_z: float,
    norm: float,
    g: float,
    eps_dd: float,
    *,
    gamma_qf: float = 0.0,
    trap: tuple[float, float] = (1.0, 1.0),
) -> dict[str, float]:
    """The energy of N = ``norm`` atoms in the Gaussian ψ ∝ exp(−ρ²/2σ_ρ² − z²/2σ_z²), dipoles along z, in free space
    (no periodic images) and the trap V = ½(ω_ρ²ρ² + ω_z²z²), ``trap`` = (ω_ρ, ω_z): the variational reference of
    dipolar droplets (Wächtler & Santos, PRA 94, 043618 (2016); Baillie et al., PRA 94, 021602(R) (2016)). float64,
    totals (ħω₀)::

        kinetic N[1/(2σ_ρ²) + 1/(4σ_z²)],        trap N[ω_ρ²σ_ρ²/2 + ω_z²σ_z²/4],
        interaction N²g/(2(2π)^{3/2}σ_ρ²σ_z),    dipolar −ε_dd f(σ_ρ/σ_z) × interaction,
        lhy N (2/5)γ_QF (2/5)^{3/2} (N/(π^{3/2}σ_ρ²σ_z))^{3/2}

    with f the function of the module docstring (f(1) = 0, f → 1 for a cigar, → −2 for a pancake). Returns the parts
    and ``total``; widths > 0 (checked)."""
    for name, v in (("sigma_rho", sigma_rho), ("sigma_z", sigma_z), ("norm", norm)):
        check_scalar(v, name, positive=True)
    sr, sz, n = float(sigma_rho), float(sigma_z), float(norm)
    kappa = sr / sz
    f = 1.0 if kappa < 1e-6 else _f_over(kappa) * (1 - kappa * kappa)  # f(κ) = 1 − O(κ²) for a thin cigar
    contact = n * n * float(g) / (2 * (2 * math.pi) ** 1.5 * sr * sr * sz)
    parts = {
        "kinetic": n * (1 / (2 * sr * sr) + 1 / (4 * sz * sz)),
        "trap": n * (float(trap[0]) ** 2 * sr * sr / 2 + float(trap[1]) ** 2 * sz * sz / 4),
        "interaction": contact,
        "dipolar": -float(eps_dd) * f * contact,
        "lhy": n * 0.4 * float(gamma_qf) * 0.4**1.5 * (n / (math.pi**1.5 * sr * sr * sz)) ** 1.5,
    }
    return {**parts, "total": sum(parts.values())}
