"""Multi-component condensates: C-component mixtures (coupling matrix g_ij) and spin-1 spinor condensates.

Units: ħ = m = 1 (every component has the same mass), lengths in trap units a_ho, times in 1/ω₀, energies in
ħω₀ (as in :mod:`ivhl_jax.physics.condensate`). Arrays use ``indexing="ij"`` on the component's :class:`Grid`.

**Mixture** (:class:`MixtureSystem`), ψ of shape (C, *grid), component i normalised to N_i = ∫|ψ_i|² dV::

    i ∂ψ_i/∂t = [−½∇² + V_i + Σ_j g_ij |ψ_j|²] ψ_i,
    E = Σ_i ∫ [½|∇ψ_i|² + V_i |ψ_i|²] dV + ½ Σ_ij g_ij ∫ |ψ_i|²|ψ_j|² dV,

g symmetric (C × C). Every N_i is conserved; two components mix for g₁₂² < g₁₁g₂₂ and separate for
g₁₂² > g₁₁g₂₂ (the homogeneous stability condition). With ``lhy=True`` (two components, 3-D) Petrov's
Lee–Huang–Yang energy (PRL 115, 155302 (2015); :mod:`ivhl_jax.physics.condensate.lhy`) joins the mean field::

    U_i ← U_i + (4/(3π²)) g_ii (g₁₁n₁ + g₂₂n₂)^{3/2},       E ← E + (8/(15π²)) ∫ (g₁₁n₁ + g₂₂n₂)^{5/2} dV,

which stops the collapse at g₁₂ < −√(g₁₁g₂₂): the mixture forms a self-bound quantum droplet.

**Spin-1** (:class:`Spin1System`), ψ of shape (3, *grid), components m = +1, 0, −1 in that order::

    i ∂ψ_m/∂t = [−½∇² + V + c₀ n − p m + q m²] ψ_m + c₂ Σ_m' (F·f)_mm' ψ_m',
    E = ∫ [Σ_m (½|∇ψ_m|² + (V − p m + q m²)|ψ_m|²) + ½c₀ n² + ½c₂ |F|²] dV,

with n = Σ_m |ψ_m|², F = ψ† f ψ the spin density (f the spin-1 matrices: F_z = |ψ₊₁|² − |ψ₋₁|²,
F₊ = F_x + iF_y = √2 (ψ₊₁* ψ₀ + ψ₀* ψ₋₁)), p and q the linear and quadratic Zeeman energies. N = ∫n dV and the
magnetisation M = ∫F_z dV are conserved (for every p: the linear Zeeman term commutes with F_z). c₂ < 0
(⁸⁷Rb) favours the ferromagnetic state |F| = n, c₂ > 0 (²³Na) the polar state |F| = 0.

Time stepping (second-order Strang splitting, each piece the exact flow of its part)::

    mixture:  e^{−i dt/2 U} · K(dt) · e^{−i dt/2 U},      U_i = V_i + Σ_j g_ij |ψ_j|² (+ the LHY term)
    spin-1:   D(dt/2) · S(dt/2) · K(dt) · S(dt/2) · D(dt/2)

K(dt) = F⁻¹ e^{−i k² dt/2} F is the exact kinetic propagator (the same for every component: the split-step
engine's plan, :func:`ivhl_jax.physics.condensate.system.kinetic_plan`: one transform pair per component on one
device, the distributed slab/pencil FFT, batched over the components, when the system has a ``layout``). U and the
diagonal spin-1 part D (phases V + c₀n − pm + qm², component by component) leave every |ψ_m| unchanged, so
evaluating them on the incoming ψ is exact. The spin-mixing part S is the flow of c₂ F·f, which leaves n and
F unchanged pointwise (F·f generates a rotation about F), so it is the exact matrix exponential of the
frozen 3 × 3 Hermitian matrix M = c₂ τ F·f, in closed form: M/|F| has eigenvalues −1, 0, 1, so
(F·f)³ = |F|²(F·f) and

    e^{−iτc₂F·f} = 1 − i τc₂ sinc(τc₂|F|) (F·f) − ½(τc₂)² sinc²(τc₂|F|/2) (F·f)²      (sinc x = sin x / x)

(each coefficient a smooth function of |F|², so the step is differentiable also where F = 0). Every factor
is applied in the "minus one" form ψ + (factor − 1)ψ (:func:`ivhl_jax.numerics.splitstep.phase_factor_m1`),
which keeps the float32 norm from drifting by a fixed bias per step.

Imaginary time (``imaginary=True``) replaces −i dt by −dt in every factor (sinc → sinhc, F frozen at the incoming
ψ) and projects ψ before the step, after the kinetic factor and after the step (the normalised gradient flow):
a mixture holds every N_i; a spin-1 condensate holds N, and also M when a magnetisation is requested (the
three-factor projection of Bao & Lim, SIAM J. Sci. Comput. 30, 1925 (2008), which keeps σ₊₁σ₋₁ = σ₀²).

Each system is an equation on the split-step engine (:data:`MIXTURE_EQUATION`, :data:`SPIN1_EQUATION`: its step,
start-state check, held targets, ground-state guess and energy), stepped by
:func:`~ivhl_jax.physics.condensate.strang` and searched by :func:`~ivhl_jax.physics.condensate.ground_state`
like every condensate system; energies by :func:`mixture_energy` and :func:`spin1_energy`; conserved quantities
by :func:`component_norms`, :func:`magnetization` and :func:`spin_density`; the overlap of two components
by :func:`overlap`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Complex, Float, Inexact

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import splitstep
from ivhl_jax.numerics.distributed_fft import check_layout, host_readable
from ivhl_jax.physics.condensate.lhy import MIXTURE_LHY, density_power
from ivhl_jax.physics.condensate.system import (
    Equation,
    EquationParams,
    Grid,
    SystemDtypes,
    check_local_step,
    check_step,
    place_state,
)

__all__ = [
    "MixtureSystem",
    "Spin1System",
    "MIXTURE_EQUATION",
    "SPIN1_EQUATION",
    "mixture_step",
    "spin1_step",
    "mixture_energy",
    "spin1_energy",
    "component_norms",
    "magnetization",
    "spin_density",
    "overlap",
]


# ----------------------------------------------------------------------------------------------
# Input checks shared by the systems (one line each, naming the argument)
# ----------------------------------------------------------------------------------------------
def _check_grid(grid: Any) -> Grid:
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a Grid (Grid.uniform(shape, length)), got {type(grid).__name__}")
    return grid


def _real_dtype(x: Any) -> Any:
    dt = jnp.result_type(x)
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.dtype(jnp.float32)


def _check_real_scalar(x: Any, name: str) -> None:
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
    if is_concrete(x) and np.iscomplexobj(np.asarray(x)):
        raise TypeError(f"{name} must be a real number, got {x!r}")
    check_scalar(x, name)  # finite, 0-d


def _check_layout(layout: Any, grid: Grid) -> Any:
    """None, or an FFTLayout the grid can use (:func:`~ivhl_jax.numerics.distributed_fft.check_layout`)."""
    return None if layout is None else check_layout(layout, grid.shape)


def _place(x: jax.Array, layout: Any, name: str) -> jax.Array:
    """A concrete ``x`` (ending in the grid axes) on the layout's blocks; a traced ``x`` or no layout: ``x`` as is."""
    return x if layout is None or not is_concrete(x) else layout.place(x, name)


def _check_potential(potential: Any, grid: Grid, shapes: tuple[tuple[int, ...], ...], what: str) -> jax.Array:
    pot = check_array(potential, "potential", kind="floating")
    if tuple(pot.shape) not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"potential must have shape {want} ({what}), got {tuple(pot.shape)}")
    if is_concrete(pot):
        check_array(pot, "potential", finite=True)
    return pot


# ----------------------------------------------------------------------------------------------
# Systems (data only; validated by their ``create`` constructors)
# ----------------------------------------------------------------------------------------------
class MixtureSystem(SystemDtypes, struct.PyTreeNode):
    """A C-component condensate: grid, potentials V_i (shape (C, *grid)), symmetric couplings g_ij (shape (C, C)).

    Build with :meth:`create` (which validates); ``potential`` and ``g`` are leaves (traced, vmapped and
    differentiated freely), the grid and the ``layout`` are static. The real dtype of ``potential`` is the working
    precision (float32 → complex64 state, float64 → complex128). ``layout``: how the grid axes of ψ are split over
    a device mesh (an :class:`~ivhl_jax.numerics.distributed_fft.FFTLayout`, slab or pencil) or None; with a
    layout the kinetic step runs on the distributed FFT and V and ψ (``strang(...).init``) are held in blocks.
    ``lhy`` (static): Petrov's LHY term (module docstring) is part of the equation and the energy.
    """

    grid: Grid = struct.field(pytree_node=False)
    potential: Any
    g: Any
    layout: Any = struct.field(pytree_node=False, default=None)
    lhy: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def create(cls, grid: Grid, potential: Any, g: Any, *, layout: Any = None, lhy: bool = False) -> MixtureSystem:
        """Validated mixture: ``potential`` grid-shaped (the same trap for every component) or (C, *grid);
        ``g`` a real symmetric (C, C) matrix (C ≥ 1), e.g. ``[[g11, g12], [g12, g22]]``; ``layout`` None or an
        FFTLayout of the grid (``distributed_fft.fft_layout(mesh, P("x"))``: V is placed on it here); ``lhy``
        True adds Petrov's LHY term (two components on a 3-D grid, g₁₁, g₂₂ > 0: it is the 3-D Bose–Bose form)."""
        grid = _check_grid(grid)
        layout = _check_layout(layout, grid)
        if isinstance(g, (str, bytes)):
            raise TypeError(f"g must be a real symmetric (C, C) coupling matrix, got {g!r}")
        gm = check_array(g, "g", ndim=2, kind="numeric")
        if gm.shape[0] != gm.shape[1] or gm.shape[0] < 1:
            raise ValueError(f"g must be a square (C, C) coupling matrix (C components), got shape {tuple(gm.shape)}")
        if jnp.iscomplexobj(gm):
            raise TypeError(f"g must be real (couplings g_ij), got dtype {gm.dtype}")
        c = int(gm.shape[0])
        pot = _check_potential(
            potential, grid, (grid.shape, (c,) + grid.shape), f"one trap for all {c} components, or one per component"
        )
        rdt = _real_dtype(pot)
        if is_concrete(gm):
            gh = np.asarray(gm, np.float64)
            if not np.all(np.isfinite(gh)):
                raise ValueError("g contains NaN or inf values")
            asym = np.abs(gh - gh.T)
            if np.any(asym > 1e-12 * max(1.0, float(np.max(np.abs(gh))))):
                i, j = np.unravel_index(int(np.argmax(asym)), asym.shape)
                raise ValueError(
                    f"g must be symmetric (g_ij = g_ji, one coupling per pair), got g[{i},{j}] = {gh[i, j]} but "
                    f"g[{j},{i}] = {gh[j, i]}"
                )
        _check_lhy(lhy, gm, grid)
        pot = _place(jnp.broadcast_to(pot, (c,) + grid.shape).astype(rdt), layout, "potential")
        return cls(grid=grid, potential=pot, g=gm.astype(rdt), layout=layout, lhy=bool(lhy))

    @property
    def n_components(self) -> int:
        return int(np.shape(self.g)[0])


def _check_lhy(lhy: Any, g: jax.Array, grid: Grid) -> None:
    """Petrov's LHY term applies to two components in 3-D with repulsive g₁₁, g₂₂ (concrete values checked)."""
    if not isinstance(lhy, (bool, np.bool_)):
        raise TypeError(f"lhy must be True or False (Petrov's LHY term), got {lhy!r}")
    if not lhy:
        return
    if g.shape != (2, 2) or grid.ndim != 3:
        raise ValueError(
            f"lhy=True is Petrov's 3-D two-component form: it needs g of shape (2, 2) and a 3-D grid, got g of shape "
            f"{tuple(g.shape)} on a {grid.ndim}-D grid"
        )
    if is_concrete(g) and not bool(np.all(np.diag(np.asarray(g, np.float64)) > 0)):
        diag = np.diag(np.asarray(g, np.float64)).tolist()
        raise ValueError(f"lhy=True needs g11, g22 > 0 (repulsive intra-species couplings), got diag(g) = {diag}")


class Spin1System(SystemDtypes, struct.PyTreeNode):
    """A spin-1 condensate: grid, trap V (grid-shaped), density and spin couplings c₀, c₂, Zeeman p, q.

    Build with :meth:`create` (which validates). ψ has shape (3, *grid), components m = +1, 0, −1.
    ``potential``, ``c0``, ``c2``, ``p``, ``q`` are leaves (traced, vmapped, differentiated); the grid and the
    ``layout`` (as :class:`MixtureSystem`) are static.
    """

    grid: Grid = struct.field(pytree_node=False)
    potential: Any
    c0: Any
    c2: Any
    p: Any
    q: Any
    layout: Any = struct.field(pytree_node=False, default=None)

    @classmethod
    def create(
        cls, grid: Grid, potential: Any, c0: Any, c2: Any, *, p: Any = 0.0, q: Any = 0.0, layout: Any = None
    ) -> Spin1System:
        """Validated spin-1 system: ``potential`` real of shape ``grid.shape`` (one trap for all m), c₀, c₂,
        p, q real scalars (energies in ħω₀; c₀, c₂ times density); ``layout`` None or an FFTLayout of the grid
        (as :meth:`MixtureSystem.create`)."""
        grid = _check_grid(grid)
        layout = _check_layout(layout, grid)
        pot = _check_potential(potential, grid, (grid.shape,), "one trap for all three m components")
        rdt = _real_dtype(pot)
        for name, v in (("c0", c0), ("c2", c2), ("p", p), ("q", q)):
            _check_real_scalar(v, name)
        return cls(
            grid=grid,
            potential=_place(pot, layout, "potential"),
            c0=jnp.asarray(c0, rdt),
            c2=jnp.asarray(c2, rdt),
            p=jnp.asarray(p, rdt),
            q=jnp.asarray(q, rdt),
            layout=layout,
        )


def _check_system(system: Any, cls: type) -> Any:
    if not isinstance(system, cls):
        raise TypeError(f"system must be a {cls.__name__} ({cls.__name__}.create(...)), got {type(system).__name__}")
    return system


def _check_state(psi: Any, system: Any, n_comp: int, name: str = "psi") -> jax.Array:
    arr = check_array(psi, name, shape=(n_comp,) + system.grid.shape, kind="inexact")
    if is_concrete(arr):
        check_array(arr, name, finite=True)
    return arr.astype(system.complex_dtype)


# ----------------------------------------------------------------------------------------------
# Mixture
# ----------------------------------------------------------------------------------------------
def _mixture_local(system: MixtureSystem) -> Any:
    rdt = system.real_dtype
    pot = jnp.asarray(system.potential, rdt)
    g = jnp.asarray(system.g, rdt)
    diag = jnp.diagonal(g)
    shape = (-1,) + (1,) * system.grid.ndim

    def local(p: jax.Array) -> jax.Array:
        n = p.real * p.real + p.imag * p.imag
        u = pot + jnp.tensordot(g, n, axes=1)  # U_i = V_i + Σ_j g_ij n_j
        if not system.lhy:
            return u
        # μ_i^LHY = (4/(3π²)) g_ii X^{3/2}, X = g₁₁n₁ + g₂₂n₂: elementwise, fused into the same pass
        x = jnp.tensordot(diag, n, axes=1)
        return u + (2.5 * MIXTURE_LHY) * diag.reshape(shape) * density_power(x, 1.5)[None]

    return local


def mixture_step(psi: Complex[Array, "c ..."], params: EquationParams) -> Complex[Array, "c ..."]:
    """One Strang step e^{−i dt/2 U} K(dt) e^{−i dt/2 U} of a mixture (imaginary time: projected to N_i)."""
    system = params.system
    grid = system.grid
    psi = check_step(psi, params, (system.n_components,) + grid.shape)
    axes = tuple(range(1, grid.ndim + 1))
    project = splitstep.norm_projection(psi, params.target, axes) if params.imaginary else None
    return splitstep.step(psi, params.plan, _mixture_local(system), project=project)


def _mixture_init(params: EquationParams, psi: Any) -> jax.Array:
    """Validate ψ (shape (C, *grid), finite), check that dt resolves the local phase U_i = V_i + Σ_j g_ij|ψ_j|² over
    the cloud (concrete values), and cast ψ to the system's complex dtype."""
    system = params.system
    psi = place_state(_check_state(psi, system, system.n_components), system)

    def local(p: np.ndarray) -> np.ndarray:
        n = np.abs(p) ** 2
        g = np.asarray(system.g, np.float64)
        u = np.asarray(system.potential, np.float64) + np.tensordot(g, n, axes=1)
        if system.lhy:
            x = np.tensordot(np.diag(g), n, axes=1)
            u = u + 2.5 * MIXTURE_LHY * np.diag(g).reshape((-1,) + (1,) * x.ndim) * x**1.5
        return u

    check_local_step(params, psi, local, "max|U|")
    return psi


def _norm_targets(norm: Any, n_comp: int, grid: Grid, rdt: Any, name: str = "norm") -> jax.Array:
    """Per-component N_i (a scalar for all, or one per component) as grid sums N_i/dV."""
    arr = check_array(norm, name, kind="numeric")
    if arr.ndim == 0:
        arr = jnp.broadcast_to(arr, (n_comp,))
    if arr.shape != (n_comp,):
        raise ValueError(
            f"{name} must be a number or have {n_comp} entries (one per component), got {tuple(arr.shape)}"
        )
    if is_concrete(arr):
        host = np.asarray(arr, np.float64)
        if not np.all(np.isfinite(host) & (host > 0)):
            raise ValueError(f"{name} must be > 0 and finite for every component, got {host.tolist()}")
    return arr.astype(rdt) / jnp.asarray(grid.cell_volume, rdt)


def _mixture_targets(system: MixtureSystem, norm: Any, magnetization: Any, imaginary: bool) -> jax.Array | None:
    """Imaginary time: the particle numbers N_i = ∫|ψ_i|² dV held (``norm`` a number for all, or C of them) as grid
    sums; None holds the norms each step starts with."""
    return None if norm is None else _norm_targets(norm, system.n_components, system.grid, system.real_dtype)


def _grad_energy(psi: jax.Array, grid: Grid) -> jax.Array:
    """Σ over leading components of ½∫|∇ψ|² dV (spectral, Parseval), one value per component."""
    rdt = psi.real.dtype
    axes = tuple(range(psi.ndim - grid.ndim, psi.ndim))
    psi_k = jnp.fft.fftn(psi, axes=axes)
    k2 = jnp.asarray(grid.k_squared(), rdt)
    return 0.5 * jnp.sum(k2 * (psi_k.real**2 + psi_k.imag**2), axis=axes) * grid.cell_volume / grid.size


def mixture_energy(psi: Inexact[Array, "c ..."], system: MixtureSystem) -> dict[str, Float[Array, ""]]:
    """E = Σ_i ∫[½|∇ψ_i|² + V_i|ψ_i|²] dV + ½Σ_ij g_ij ∫|ψ_i|²|ψ_j|² dV [+ (8/(15π²))∫(g₁₁n₁ + g₂₂n₂)^{5/2} dV with
    ``lhy``] (ħω₀; totals). Returns ``kinetic``, ``trap``, ``interaction``, ``lhy`` (only for a system with the LHY
    term) and ``total`` (the kinetic part spectral)."""
    system = _check_system(system, MixtureSystem)
    grid = system.grid
    psi = check_array(psi, "psi", shape=(system.n_components,) + grid.shape, kind="inexact", finite=host_readable(psi))
    psi = psi.astype(jnp.result_type(psi.dtype, jnp.complex64))
    rdt = psi.real.dtype
    axes = tuple(range(1, grid.ndim + 1))
    dv = grid.cell_volume
    n = psi.real**2 + psi.imag**2
    ekin = jnp.sum(_grad_energy(psi, grid))
    etrap = jnp.sum(jnp.asarray(system.potential, rdt) * n) * dv
    nn = jnp.tensordot(n, n, axes=(axes, axes)) * dv  # ∫ n_i n_j, (C, C)
    eint = 0.5 * jnp.sum(jnp.asarray(system.g, rdt) * nn)
    parts = {"kinetic": ekin, "trap": etrap, "interaction": eint}
    total = ekin + etrap + eint
    if system.lhy:
        x = jnp.tensordot(jnp.diagonal(jnp.asarray(system.g, rdt)), n, axes=1)
        parts["lhy"] = MIXTURE_LHY * jnp.sum(density_power(x, 2.5)) * dv
        total = total + parts["lhy"]
    return {**parts, "total": total}


def component_norms(psi: Inexact[Array, "c ..."], grid: Grid) -> Float[Array, " c"]:
    """N_i = ∫|ψ_i|² dV for each leading component (shape (C,))."""
    grid = _check_grid(grid)
    psi = check_array(psi, "psi", kind="inexact", finite=host_readable(psi))
    if psi.ndim != grid.ndim + 1 or tuple(psi.shape[1:]) != grid.shape:
        raise ValueError(f"psi must have shape (C, *{grid.shape}) (components first), got {tuple(psi.shape)}")
    return splitstep.sumsq(psi, tuple(range(1, grid.ndim + 1))) * grid.cell_volume


def overlap(psi: Inexact[Array, "c ..."], grid: Grid, i: int = 0, j: int = 1) -> Float[Array, ""]:
    """The overlap Λ = (∫n_i n_j)² / (∫n_i² ∫n_j²) of components i and j: 1 for proportional densities
    (miscible), → 0 for separated ones (immiscible)."""
    grid = _check_grid(grid)
    psi = check_array(psi, "psi", kind="inexact", finite=host_readable(psi))
    if psi.ndim != grid.ndim + 1 or tuple(psi.shape[1:]) != grid.shape:
        raise ValueError(f"psi must have shape (C, *{grid.shape}) (components first), got {tuple(psi.shape)}")
    c = psi.shape[0]
    for name, v in (("i", i), ("j", j)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v < c:
            raise ValueError(f"{name} must be a component index in [0, {c}), got {v!r}")
    n = psi.real**2 + psi.imag**2
    ni, nj = n[i], n[j]
    return jnp.sum(ni * nj) ** 2 / (jnp.sum(ni * ni) * jnp.sum(nj * nj))


# ----------------------------------------------------------------------------------------------
# Spin-1
# ----------------------------------------------------------------------------------------------
_SQRT_HALF = float(np.sqrt(0.5))
_SQRT_TWO = float(np.sqrt(2.0))


def spin_density(psi: Inexact[Array, "3 ..."]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The spin density (F_x, F_y, F_z) = ψ† f ψ of a spin-1 field (components m = +1, 0, −1), each
    grid-shaped: F₊ = F_x + iF_y = √2(ψ₊₁*ψ₀ + ψ₀*ψ₋₁), F_z = |ψ₊₁|² − |ψ₋₁|²."""
    psi = check_array(psi, "psi", kind="inexact", finite=host_readable(psi))
    if psi.ndim < 2 or psi.shape[0] != 3:
        raise ValueError(f"psi must have shape (3, *grid) (components m = +1, 0, -1), got {tuple(psi.shape)}")
    fp = _f_plus(psi)
    a, b = psi[0], psi[2]
    return fp.real, fp.imag, (a.real**2 + a.imag**2) - (b.real**2 + b.imag**2)


def _f_plus(psi: jax.Array) -> jax.Array:
    return _SQRT_TWO * (jnp.conj(psi[0]) * psi[1] + jnp.conj(psi[1]) * psi[2])  # a Python float: weakly typed


def magnetization(psi: Inexact[Array, "3 ..."], grid: Grid) -> Float[Array, ""]:
    """M = ∫ (|ψ₊₁|² − |ψ₋₁|²) dV (conserved by the spin-1 dynamics)."""
    grid = _check_grid(grid)
    _, _, fz = spin_density(psi)
    if tuple(fz.shape) != grid.shape:
        raise ValueError(f"psi must have shape (3, *{grid.shape}), got {(3,) + tuple(fz.shape)}")
    return jnp.sum(fz) * grid.cell_volume


def _apply_f(psi: jax.Array, fz: jax.Array, fp: jax.Array) -> jax.Array:
    """(F·f)ψ for the spin-1 matrices: rows (F_z ψ₊ + F₋ψ₀/√2, (F₊ψ₊ + F₋ψ₋)/√2, F₊ψ₀/√2 − F_z ψ₋)."""
    fm = jnp.conj(fp)
    a, b, c = psi[0], psi[1], psi[2]
    return jnp.stack(
        [fz * a + _SQRT_HALF * fm * b, _SQRT_HALF * (fp * a + fm * c), _SQRT_HALF * fp * b - fz * c], axis=0
    )


def _sinc_sq(y: jax.Array, imaginary: bool) -> jax.Array:
    """sin(√y)/√y (imaginary: sinh(√y)/√y) for y ≥ 0, smooth in y (series below y = 1e-2, so the value and its
    derivative are finite at y = 0)."""
    small = y < 1e-2
    ys = jnp.where(small, jnp.ones_like(y), y)
    r = jnp.sqrt(ys)
    direct = (jnp.sinh(r) if imaginary else jnp.sin(r)) / r
    s = 1.0 if imaginary else -1.0
    # Σ_k (s y)^k/(2k+1)!: the truncation error at y = 1e-2 is y⁴/9! ~ 3e-14.
    series = 1 + s * y / 6 * (1 + s * y / 20 * (1 + s * y / 42 * (1 + s * y / 72)))
    return jnp.where(small, series, direct)


def _spin_mix(psi: jax.Array, c2: jax.Array, tau: Any, imaginary: bool) -> jax.Array:
    """ψ ← e^{−iτc₂F·f}ψ (imaginary: e^{−τc₂F·f}ψ) with F frozen at the incoming ψ (exact in real time: the flow
    conserves F), from the closed form 1 − i a sinc(a|F|) A − ½a² sinc²(a|F|/2) A², A = F·f, a = τc₂
    (imaginary: 1 − a sinhc(a|F|) A + ½a² sinhc²(a|F|/2) A²)."""
    rdt = psi.real.dtype
    fp = _f_plus(psi)
    a0, a2 = psi[0], psi[2]
    fz = (a0.real**2 + a0.imag**2) - (a2.real**2 + a2.imag**2)
    f2 = fz * fz + fp.real**2 + fp.imag**2
    a = jnp.asarray(c2, rdt) * jnp.asarray(tau, rdt)
    y = (a * a) * f2
    s1 = a * _sinc_sq(y, imaginary)
    h = _sinc_sq(0.25 * y, imaginary)
    s2 = 0.5 * (a * a) * h * h
    fz_c = fz.astype(psi.dtype)
    af = _apply_f(psi, fz_c, fp)
    aaf = _apply_f(af, fz_c, fp)
    # The small update is summed first and added to ψ once: adding its first- and second-order parts one after
    # the other rounds ψ twice, which in float32 biased the norm upwards by ~5e-9 per application (measured).
    if imaginary:
        return psi + (s2.astype(psi.dtype) * aaf - s1.astype(psi.dtype) * af)
    return psi + (-1j * s1.astype(psi.dtype) * af - s2.astype(psi.dtype) * aaf)


def _spin1_diag(system: Spin1System, rdt: Any) -> Any:
    pot = jnp.asarray(system.potential, rdt)
    c0 = jnp.asarray(system.c0, rdt)
    p = jnp.asarray(system.p, rdt)
    q = jnp.asarray(system.q, rdt)
    zee = jnp.stack([q - p, jnp.zeros_like(p), q + p])  # −p m + q m² for m = +1, 0, −1
    zee = zee.reshape((3,) + (1,) * system.grid.ndim)

    def local(psi: jax.Array) -> jax.Array:
        n = jnp.sum(psi.real * psi.real + psi.imag * psi.imag, axis=0)
        return (pot + c0 * n)[None] + zee

    return local


def _project_spin1(psi: jax.Array, target: jax.Array, target_m: Any, axes: tuple[int, ...]) -> jax.Array:
    """ψ projected to Σ|ψ|² = N (one factor for all m) or, with ``target_m``, also to Σ(|ψ₊|² − |ψ₋|²) = M by
    σ_m ψ_m with σ₊σ₋ = σ₀² (Bao & Lim 2008): σ₀² = (N² − M²)/(N N₀ + √(4(N² − M²)N₊N₋ + M²N₀²)),
    σ_±² = (N ± M − σ₀²N₀)/(2N_±)."""
    if target_m is None:
        return splitstep.project_norm(psi, target)
    comp = splitstep.sumsq(psi, axes)  # (3,)
    tiny = jnp.finfo(comp.dtype).tiny
    n_p, n_0, n_m = comp[0], comp[1], comp[2]
    nn, mm = target, target_m
    d = nn * nn - mm * mm
    s0 = d / (nn * n_0 + jnp.sqrt(4 * d * n_p * n_m + mm * mm * n_0 * n_0) + tiny)
    sp = jnp.sqrt(jnp.maximum(nn + mm - s0 * n_0, 0.0) / (2 * n_p + tiny))
    sm = jnp.sqrt(jnp.maximum(nn - mm - s0 * n_0, 0.0) / (2 * n_m + tiny))
    sigma = jnp.stack([sp, jnp.sqrt(s0), sm]).reshape((3,) + (1,) * len(axes))
    return psi * sigma.astype(psi.real.dtype)


def spin1_step(psi: Complex[Array, "3 ..."], params: EquationParams) -> Complex[Array, "3 ..."]:
    """One Strang step D(dt/2) S(dt/2) K(dt) S(dt/2) D(dt/2) of the spin-1 GP equation (module docstring):
    the local propagator is the diagonal phases D then the spin mixing S; imaginary time projects to N (and M)."""
    system = params.system
    grid = system.grid
    psi = check_step(psi, params, (3,) + grid.shape)
    rdt = psi.real.dtype
    c2 = jnp.asarray(system.c2, rdt)

    def mix(p: jax.Array, tau: Any, imaginary: bool, full_range: Any = None, damping: Any = None) -> jax.Array:
        return _spin_mix(p, c2, tau, imaginary)

    project = _spin1_projection(psi, params) if params.imaginary else None
    local = (splitstep.diagonal(_spin1_diag(system, rdt)), mix)
    return splitstep.step(psi, params.plan, local, project=project)


def _spin1_projection(psi: jax.Array, params: EquationParams) -> Any:
    """What the imaginary-time spin-1 flow holds: N (the target, or the incoming ψ's), and M when asked for."""
    rdt = psi.real.dtype
    axes = tuple(range(1, psi.ndim))
    target, target_m = params.target
    target = jnp.sum(splitstep.sumsq(psi, axes)) if target is None else jnp.asarray(target, rdt)
    target_m = None if target_m is None else jnp.asarray(target_m, rdt)
    return lambda p: _project_spin1(p, target, target_m, axes)


def _spin1_init(params: EquationParams, psi: Any) -> jax.Array:
    """Validate ψ (shape (3, *grid), finite), check that dt resolves the local phase (|V + c₀n| + |c₂||F| + |p| + |q|
    over the cloud, concrete values) and cast ψ to the system's complex dtype."""
    system = params.system
    psi = place_state(_check_state(psi, system, 3), system)

    def local(p: np.ndarray) -> np.ndarray:
        n = np.sum(np.abs(p) ** 2, axis=0)
        fp = np.sqrt(2.0) * (np.conj(p[0]) * p[1] + np.conj(p[1]) * p[2])
        fz = np.abs(p[0]) ** 2 - np.abs(p[2]) ** 2
        f = np.sqrt(fz**2 + np.abs(fp) ** 2)
        c0, c2, pz, qz = (float(np.asarray(getattr(system, k))) for k in ("c0", "c2", "p", "q"))
        return np.abs(np.asarray(system.potential, np.float64) + c0 * n) + abs(c2) * f + abs(pz) + abs(qz)

    check_local_step(params, psi, local, "max|U|")
    return psi


def _spin1_targets(norm: Any, magnetization: Any, grid: Grid, rdt: Any) -> tuple[Any, Any]:
    target: Any = None
    target_m: Any = None
    if norm is not None:
        check_scalar(norm, "norm", positive=True)
        target = jnp.asarray(norm, rdt) / jnp.asarray(grid.cell_volume, rdt)
    if magnetization is not None:
        if norm is None:
            raise ValueError("magnetization needs norm (the total N it is a part of): pass norm=N as well")
        _check_real_scalar(magnetization, "magnetization")
        if is_concrete(magnetization) and is_concrete(norm) and not abs(float(magnetization)) < float(norm):
            raise ValueError(
                f"magnetization must satisfy |M| < N = {float(norm)} (|M| = N is a single component: use "
                f"a scalar condensate), got {float(magnetization)}"
            )
        target_m = jnp.asarray(magnetization, rdt) / jnp.asarray(grid.cell_volume, rdt)
    return target, target_m


def _spin1_checked_targets(system: Spin1System, norm: Any, magnetization: Any, imaginary: bool) -> tuple[Any, Any]:
    """Imaginary time: the total N = ∫n dV held (None: the norm each step starts with) and the magnetisation
    M = ∫F_z dV held as well (|M| < N; needs ``norm``; None leaves M free), as grid sums. Real time holds neither."""
    if not imaginary and (norm is not None or magnetization is not None):
        raise ValueError(
            "norm and magnetization are held by imaginary-time steps only; drop them or pass imaginary=True"
        )
    return _spin1_targets(norm, magnetization, system.grid, system.real_dtype)


def spin1_energy(psi: Inexact[Array, "3 ..."], system: Spin1System) -> dict[str, Float[Array, ""]]:
    """E = ∫[Σ_m(½|∇ψ_m|² + (V − pm + qm²)|ψ_m|²) + ½c₀n² + ½c₂|F|²] dV (ħω₀; totals). Returns ``kinetic``,
    ``trap``, ``zeeman``, ``density`` (the c₀ part), ``spin`` (the c₂ part) and ``total``."""
    system = _check_system(system, Spin1System)
    grid = system.grid
    psi = check_array(psi, "psi", shape=(3,) + grid.shape, kind="inexact", finite=host_readable(psi))
    psi = psi.astype(jnp.result_type(psi.dtype, jnp.complex64))
    rdt = psi.real.dtype
    dv = grid.cell_volume
    nm = psi.real**2 + psi.imag**2
    n = jnp.sum(nm, axis=0)
    fx, fy, fz = spin_density(psi)
    p, q = jnp.asarray(system.p, rdt), jnp.asarray(system.q, rdt)
    ekin = jnp.sum(_grad_energy(psi, grid))
    etrap = jnp.sum(jnp.asarray(system.potential, rdt) * n) * dv
    ezee = (-p * jnp.sum(fz) + q * jnp.sum(nm[0] + nm[2])) * dv
    edens = 0.5 * jnp.asarray(system.c0, rdt) * jnp.sum(n * n) * dv
    espin = 0.5 * jnp.asarray(system.c2, rdt) * jnp.sum(fx * fx + fy * fy + fz * fz) * dv
    return {
        "kinetic": ekin,
        "trap": etrap,
        "zeeman": ezee,
        "density": edens,
        "spin": espin,
        "total": ekin + etrap + ezee + edens + espin,
    }


# ----------------------------------------------------------------------------------------------
# Ground states: what the normalised gradient flow (the package's one search) needs of each equation
# ----------------------------------------------------------------------------------------------
def _gaussian_components(grid: Grid, weights: np.ndarray, centers: np.ndarray | None, dtype: Any) -> jax.Array:
    out = []
    for c in range(len(weights)):
        arg = np.zeros(grid.shape)
        for a, x in enumerate(grid.coords):
            shift = 0.0 if centers is None else centers[c][a]
            arg = arg + grid._bcast((x - shift) ** 2 / 2, a)
        out.append(weights[c] * np.exp(-arg))
    return jnp.asarray(np.stack(out), dtype)


def _mixture_guess(system: MixtureSystem, psi0: Any, magnetization: Any) -> jax.Array:
    """The flow's start: ``psi0`` (shape (C, *grid), every component non-zero) or unit-width Gaussians at the origin
    (a symmetric guess is a stationary point of the flow also when the components would separate, so a guess that
    breaks the symmetry finds an immiscible ground state)."""
    c = system.n_components
    if psi0 is None:
        return _gaussian_components(system.grid, np.ones(c), None, system.complex_dtype)
    psi = _check_state(psi0, system, c, "psi0")
    if is_concrete(psi):
        zero = np.asarray(splitstep.sumsq(psi, tuple(range(1, system.grid.ndim + 1)))) == 0
        if np.any(zero):
            raise ValueError(
                f"psi0 component(s) {np.flatnonzero(zero).tolist()} are zero everywhere, so they cannot be "
                "normalised; pass a non-zero initial guess for every component"
            )
    return psi


def _spin1_guess(system: Spin1System, psi0: Any, magnetization: Any) -> jax.Array:
    """The flow's start: ``psi0`` (shape (3, *grid)) or a unit-width Gaussian times the generic spinor
    (0.6, 0.5 + 0.4i, 0.3)/|·|, which is neither polar nor ferromagnetic, so either can be reached; a held
    magnetization needs both m = ±1 components populated. The spin-mixing term fixes the relative phase
    θ₊₁ + θ₋₁ − 2θ₀ while the global phase and a spin rotation about z stay free, so the flow runs complex."""
    if psi0 is None:
        zeta = np.array([0.6, 0.5 + 0.4j, 0.3])
        zeta = zeta / np.linalg.norm(zeta)
        psi = _gaussian_components(system.grid, np.ones(3), None, system.complex_dtype) * jnp.asarray(
            zeta.reshape((3,) + (1,) * system.grid.ndim), system.complex_dtype
        )
    else:
        psi = _check_state(psi0, system, 3, "psi0")
    if is_concrete(psi):
        comp = np.asarray(splitstep.sumsq(psi, tuple(range(1, system.grid.ndim + 1))))
        if not comp.sum() > 0:
            raise ValueError("psi0 is zero everywhere, so it cannot be normalised; pass a non-zero initial guess")
        if magnetization is not None and not (comp[0] > 0 and comp[2] > 0):
            raise ValueError(
                "psi0 needs non-zero m = +1 and m = -1 components to hold a magnetization (the projection "
                "rescales them); pass a guess with all three components populated"
            )
    return psi


# One row per equation: system type, name, step, init, targets, guess (:class:`Equation`'s fields, in order).
#: The mixture on the split-step engine: U_i = V_i + Σ_j g_ij|ψ_j|² (+ LHY); every N_i held; a real problem.
MIXTURE_EQUATION = Equation(
    MixtureSystem, "mixture", mixture_step, _mixture_init, _mixture_targets, _mixture_guess, real=True
)
#: The spin-1 condensate on the split-step engine: D(dt/2) S(dt/2) K(dt) S(dt/2) D(dt/2); N (and M) held; complex.
SPIN1_EQUATION = Equation(
    Spin1System, "spin1", spin1_step, _spin1_init, _spin1_checked_targets, _spin1_guess, real=False
)
