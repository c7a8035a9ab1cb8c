"""Gross–Pitaevskii condensates: a Strang split-step Fourier solver in 1, 2 and 3 dimensions.

Units: dimensionless, ħ = m = 1; lengths in trap units a_ho = √(ħ/(mω₀)), times in 1/ω₀, energies
in ħω₀. The wave function is normalised to the particle number, ∫|ψ|² dV = N, and solves

    i ∂ψ/∂t = [−½∇² + V(r) + g|ψ|² − Ω L_z] ψ,        L_z = −i (x ∂_y − y ∂_x),

on a periodic box centred at 0 (:class:`Grid`). Arrays use ``indexing="ij"``: array axis i is
coordinate i (x, y, z).

Time stepping (second-order Strang splitting, one step of size dt)::

    ψ ← e^{−i dt/2 (V + g|ψ|²)} ψ  →  kinetic(dt)  →  ψ ← e^{−i dt/2 (V + g|ψ|²)} ψ

The potential half-steps are exact (|ψ| does not change under them); without rotation the
kinetic step is exact in Fourier space, e^{−i k² dt/2}. With rotation the kinetic + rotation part
½p² − Ω L_z is split (ADI-type, as in Bao–Wang 2006 / GPELab) into two pieces that are each
diagonal after a 1D (resp. (d−1)-D) FFT:

    A = ½p_x² + Ω y p_x           (FFT along x at fixed y: phase ½k_x² + Ω y k_x)
    B = ½p_y² + ½p_z² − Ω x p_y   (FFT along y, z at fixed x: phase ½k_y² + ½k_z² − Ω x k_y)

applied symmetrically as A(dt/2) B(dt) A(dt/2), so the whole step stays second order and unitary.
Imaginary time (``imaginary=True``) replaces −i dt by −dt in every factor and projects ψ back to
its norm before the step, after the kinetic factor and after the step (normalised gradient flow).
The projection before the second nonlinear half-step matters: without it g|ψ|² is evaluated at the
wrong norm and the fixed point's virial residual is 3e-2 (1D, gN = 1000, dt = 2e-3); with it 1.3e-5.

Every factor e^{−iθ} is applied as ψ + ψ·(e^{−iθ} − 1) (:func:`ivhl_jax.numerics.splitstep.phase_factor_m1`):
a float32 e^{−iθ} has |e^{−iθ}|² − 1 ~ ±1e-7 for the small θ of occupied modes, the same at every step,
which would add up to a norm drift of ~1e-3 over 10⁴ steps; the "minus one" form removes that bias.

One door: :func:`strang` builds the stepper (an adapter over the split-step engine
:mod:`ivhl_jax.numerics.splitstep`: it checks dt against the grid once, :func:`max_stable_dt`, and holds the
kinetic factors derived from it); ``stepper.init(psi)`` validates the state; every run goes through
:func:`ivhl_jax.numerics.rollout.trajectory` or :func:`~ivhl_jax.numerics.rollout.chunked`, recording
:func:`observe`, e.g. ``trajectory(st, st.init(psi), steps, save_every=..., observe=observe)`` with
``st = strang(system, dt)``; :func:`ground_state` iterates imaginary-time steps to convergence.

The package is split by job: :mod:`~ivhl_jax.physics.condensate.system` (grid, system, potentials),
:mod:`~ivhl_jax.physics.condensate.stepper` (the Strang stepper),
:mod:`~ivhl_jax.physics.condensate.ground` (ground states),
:mod:`~ivhl_jax.physics.condensate.observables` (energy, norm, μ, virial, vortex charges),
:mod:`~ivhl_jax.physics.condensate.states` (Gaussian, solitons, Thomas–Fermi, vortex imprint),
:mod:`~ivhl_jax.physics.condensate.vortices` (2-D vortex tracking and 3-D vortex lines, jitted and batched) and
:mod:`~ivhl_jax.physics.condensate.bogoliubov` (the Bogoliubov–de Gennes spectrum, matrix-free).
"""

from ivhl_jax.physics.condensate.bogoliubov import BogoliubovModes, bogoliubov
from ivhl_jax.physics.condensate.dipolar import (
    Dipolar,
    DipolarSystem,
    dipolar_kernel,
    dipolar_potential,
    thomas_fermi_aspect_ratio,
)
from ivhl_jax.physics.condensate.ground import ground_state
from ivhl_jax.physics.condensate.mixture import (
    MixtureSystem,
    Spin1System,
    component_norms,
    magnetization,
    overlap,
    spin_density,
)
from ivhl_jax.physics.condensate.observables import (
    angular_momentum,
    chemical_potential,
    density,
    energy,
    norm,
    normalize,
    observe,
    phase,
    residual,
    virial_residual,
    vortex_charges,
    vortex_positions,
)
from ivhl_jax.physics.condensate.states import (
    bright_soliton,
    dark_soliton_pair,
    gaussian,
    imprint_vortices,
    thomas_fermi_density,
    thomas_fermi_mu,
)
from ivhl_jax.physics.condensate.stepper import StrangParams, max_stable_dt, strang
from ivhl_jax.physics.condensate.system import GPSystem, Grid, harmonic
from ivhl_jax.physics.condensate.vortices import VortexLines, Vortices, vortex_lines, vortices

__all__ = [
    "Grid",
    "GPSystem",
    "harmonic",
    "strang",
    "observe",
    "max_stable_dt",
    "ground_state",
    "norm",
    "normalize",
    "density",
    "phase",
    "energy",
    "chemical_potential",
    "virial_residual",
    "residual",
    "angular_momentum",
    "vortex_charges",
    "vortex_positions",
    "gaussian",
    "bright_soliton",
    "dark_soliton_pair",
    "thomas_fermi_mu",
    "thomas_fermi_density",
    "imprint_vortices",
    "StrangParams",
    "vortices",
    "vortex_lines",
    "Vortices",
    "VortexLines",
    "bogoliubov",
    "BogoliubovModes",
    "MixtureSystem",
    "Spin1System",
    "component_norms",
    "overlap",
    "spin_density",
    "magnetization",
    "Dipolar",
    "DipolarSystem",
    "dipolar_kernel",
    "dipolar_potential",
    "thomas_fermi_aspect_ratio",
]
