"""Gross–Pitaevskii condensate simulation: ground state, vortex imprints, real-time evolution.

The ground state of the trap (optionally in a rotating frame), then vortex imprints, then
real-time evolution i∂ψ/∂t = [−½∇² + V + g|ψ|² − Ω L_z]ψ (ħ = m = 1, trap units). The GFT condensate is its
own simulation, ``ivhl sim gft`` (:mod:`ivhl_jax.sims.gft`).

``system`` picks the condensate, each through the family's one door :func:`ivhl_jax.physics.condensate.strang`:
``scalar`` (the equation above, its settings the top-level keys), ``dipolar`` (3-D, plus the dipole–dipole
potential: the section ``dipolar.*``, strength ``dipolar.eps_dd`` along ``dipolar.axis``), ``mixture`` (C
components coupled by g_ij: ``g`` = g₁₁ and the section ``mixture.*``, ``mixture.g12``, ``mixture.g22``, or the
whole matrix ``mixture.couplings``; atom numbers ``mixture.norms``) or ``spin1`` (m = +1, 0, −1: the section
``spin1.*``, ``c0``, ``c2``, Zeeman ``p``, ``q``, a held ``magnetization``); ``dipolar.lhy`` / ``dipolar.gamma_qf``
and ``mixture.lhy`` add the Lee–Huang–Yang term (:mod:`ivhl_jax.physics.condensate.lhy`; the records gain
``energy_lhy``). A section is validated by building its
system with the library's ``create``; each system starts from its ground state; a setting of another
system's section is refused, and so are the scalar scheme's own (rotation, damping, imprints, noise, per-step
projection, host FFT) with another system; ``mesh`` spreads any system's field over devices (the distributed FFT of
its layout). The records hold N and the energy parts, a mixture's N_i (``norm_1`` …) and, for two components,
their ``overlap``, a spin-1 field's ``magnetization``; a mixture's or spin-1 field's state has its component axis
first (``component`` 1 … C, or ``m``), in final_state.npy and in the snapshots.

The ground-state search is ``ground_method``: ``auto`` (default) follows the library's rule for the system the run
builds (:func:`ivhl_jax.physics.condensate.ground.default_method`): ``cg``, the exact discrete ground state by
Riemannian conjugate gradient (one device, no time-step bias), except the imaginary-time ``flow`` with a mesh of
several devices, for spin-1 in float32 and when ``ground_dt`` is given (a step asks for the flow, as ``dt`` does
in the library); ``cg`` refuses ``ground_dt`` and a mesh. ``ground_steps`` is the budget (cg: iterations; the
flow: steps of ``ground_dt``, default 5e-3), ``ground_tol`` the convergence test (cg: the residual
‖Hψ − μψ‖/‖Hψ‖, default 1e-5 in float32 and 1e-11 in float64; the flow: the relative energy change per check of
100 steps, default 1e-7). The search runs in up to ten shares of the budget, each continuing from the last state,
with a progress line after each; observables.json's ``ground_state`` record names the ``method``, its ``steps``,
``residual``, ``delta`` and ``converged``, and the checkpoints keep it, so a resumed run reports it without
searching again.

The time loop runs in jitted chunks (:func:`ivhl_jax.run.runner.run_chunked`) with checkpoints in
<out>/ckpt; an interrupted run resumes bit-exactly, and raising ``steps`` extends a finished one.
Outputs in <out>: density.png, phase.png (3D: the plane through the middle of the z axis, named in the
title), observables.png, observables.json (time series and summary),
final_state.npy, and run.zarr: the run store (:func:`ivhl_jax.run.open_run`) with the records, the snapshots of
``snapshot_every`` and the final state, each written shard by shard by the process that holds it. Time: a
record's t is the number of steps done when it was taken times dt; records are taken after every ``save_every``
steps, so the first is at t = save_every·dt (the initial state is not recorded).

  ivhl sim bec --set dims=2 --set g=200 --set omega_rot=0.7 --set steps=2000
  ivhl sim bec --config run.toml --out runs/bec_vortex
  ivhl sim bec --set system=mixture --set g=100 --set mixture.g12=150 --set mixture.g22=100 --out runs/bec_mixture
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics import splitstep
from ivhl_jax.numerics.distributed_fft import host_readable, parse_mesh
from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate.ground import default_method
from ivhl_jax.run.config import option
from ivhl_jax.run.driver import RunContext
from ivhl_jax.run.io import save_figure, save_npy
from ivhl_jax.run.runner import RunResult
from ivhl_jax.run.runner import phase as runner_phase
from ivhl_jax.run.store import RunStore, Snapshots, natural_units
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import (
    FieldRunConfig,
    FieldSimulation,
    check_chunked_run,
    check_field_mesh,
    middle_plane,
    real_dtype,
    run_field_chunks,
    run_summary,
    write_observables,
)
from ivhl_jax.sims._common import precision_scope as precision_scope  # the scope a run computes in (tests, scripts)
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class MixtureSettings:
    """``system=mixture``: C components coupled by g_ij (``--set mixture.g12=150``); ``g`` is g₁₁."""

    g12: float | None = option(
        None, "the coupling g₁₂ between the two components (required, or couplings); they separate for g₁₂² > g₁₁g₂₂"
    )
    g22: float | None = option(None, "the coupling g₂₂ of the second component (default: g)")
    couplings: list[list[float]] | None = option(
        None, "the whole symmetric C × C matrix g_ij (C >= 2 components), instead of g, g12 and g22"
    )
    norms: list[float] | None = option(
        None, "the atom number N_i of each component, held by the ground-state search (default 1 each)"
    )
    lhy: bool = option(
        False,
        "add Petrov's Lee-Huang-Yang energy (8/(15π²))(g₁₁n₁ + g₂₂n₂)^{5/2} (two components, dims=3): past "
        "g₁₂ < −√(g₁₁g₂₂) the mixture forms a self-bound droplet instead of collapsing",
    )


@dataclasses.dataclass(frozen=True)
class Spin1Settings:
    """``system=spin1``: components m = +1, 0, −1 (``--set spin1.c0=100 --set spin1.c2=-5``)."""

    c0: float | None = option(None, "the density coupling c₀ (required)")
    c2: float | None = option(None, "the spin coupling c₂ (required): < 0 ferromagnetic (⁸⁷Rb), > 0 polar (²³Na)")
    p: float = option(0.0, "the linear Zeeman energy p")
    q: float = option(0.0, "the quadratic Zeeman energy q")
    magnetization: float | None = option(
        None,
        "the magnetisation M = ∫F_z dV (|M| < 1, the atom number) held by the ground-state search (default: free, "
        "the lowest state of any M); the evolution conserves it",
    )


@dataclasses.dataclass(frozen=True)
class DipolarSettings:
    """``system=dipolar`` (dims=3): the dipole-dipole interaction (``--set dipolar.eps_dd=0.5``)."""

    eps_dd: float | None = option(
        None, "the relative dipolar strength ε_dd = g_dd/g >= 0 (required; ¹⁶⁴Dy: 1.3, ⁵²Cr: 0.16)"
    )
    axis: tuple[float, float, float] = option((0.0, 0.0, 1.0), "the direction of the dipoles, a non-zero 3-vector")
    cutoff: float | None = option(
        None,
        "the radius R_c > 0 of the spherical cutoff of the dipolar kernel (trap lengths; exact for a cloud of "
        "diameter D when R_c >= D and length >= D + R_c); default: the uncut kernel",
    )
    lhy: bool = option(
        False,
        "add the Lee-Huang-Yang term γ_QF|ψ|³ with γ_QF = (32/3)g√(a³/π)Q₅(ε_dd), a = g/4π (needs g > 0): past "
        "ε_dd ≈ 1 the cloud forms droplets instead of collapsing",
    )
    gamma_qf: float | None = option(
        None,
        "the LHY coefficient γ_QF >= 0 itself, instead of lhy=true (e.g. 2.5 with g = -3, eps_dd = 0: Petrov's "
        "reduced droplet equation)",
    )


#: The section of each system other than the scalar one (``--set <system>.<key>=...``).
SECTIONS: dict[str, type] = {"mixture": MixtureSettings, "spin1": Spin1Settings, "dipolar": DipolarSettings}


@dataclasses.dataclass(frozen=True)
class BECConfig(FieldRunConfig):
    """Run configuration (TOML/JSON keys; ``--set key=value``); the loop keys and ``precision`` are those of
    :class:`~ivhl_jax.sims._common.FieldRunConfig`."""

    dims: int = option(2, "spatial dimensions: 1, 2 or 3")
    grid: int = option(128, "points per axis")
    length: float = option(20.0, "box side (trap units)")
    trap: tuple[float, ...] = option((1.0,), "trap frequencies ω (one, or one per axis)")
    g: float = option(200.0, "contact interaction strength g (trap units)")
    omega_rot: float = option(0.0, "rotation about z (2D/3D); the ground state is found in this frame")
    imprints: list[tuple[float, float, int]] = option(default_factory=list, help="(x, y, charge)")
    gamma: float = option(
        0.0,
        "damping rate γ >= 0 of the evolution, i∂ψ/∂t = (1 − iγ)(H − μ)ψ with the atom number held (0: the "
        "conservative GP equation); with omega_rot and noise > 0 a vortex lattice forms",
    )
    # --- which condensate ---
    system: Literal["scalar", "dipolar", "mixture", "spin1"] = option(
        "scalar",
        '"scalar" (the GP equation above, default), "dipolar" (plus the dipole-dipole interaction: dims=3, the '
        'section dipolar.*), "mixture" (C components with couplings g_ij: mixture.*) or "spin1" (components m = '
        "+1, 0, -1: spin1.*); omega_rot, gamma, imprints, noise, project_norm=true and fft=ducc apply to the "
        "scalar system only (mesh to every system), and a setting of another system's section is refused",
    )
    mixture: MixtureSettings = option(
        default_factory=MixtureSettings, help="system=mixture: its settings (--set mixture.g12=150)"
    )
    spin1: Spin1Settings = option(default_factory=Spin1Settings, help="system=spin1: its settings (--set spin1.c0=100)")
    dipolar: DipolarSettings = option(
        default_factory=DipolarSettings, help="system=dipolar: its settings (--set dipolar.eps_dd=0.5)"
    )
    ground_method: Literal["auto", "cg", "flow"] = option(
        "auto",
        'The ground-state search: "cg" (the exact discrete ground state by Riemannian conjugate gradient, one '
        'device), "flow" (imaginary-time steps of ground_dt) or "auto" (default: the library\'s rule, '
        "ivhl_jax.physics.condensate.ground.default_method: cg, except the flow with a mesh of several devices, "
        "for spin1 in float32, or when ground_dt is given)",
    )
    ground_dt: float | None = option(
        None,
        "the flow's imaginary-time step (default 5e-3); given with ground_method=auto it selects the flow, and "
        "ground_method=cg refuses it (cg has no time step)",
    )
    ground_steps: int = option(
        3000,
        "the search's budget: the flow's imaginary-time steps, cg's iterations (raise it if the ground state does "
        "not converge)",
    )
    ground_tol: float | None = option(
        None,
        "convergence: cg: the residual |Hψ - μψ|/|Hψ| (default 1e-5 in float32, 1e-11 in float64); flow: the "
        "relative energy change per check of 100 steps (default 1e-7)",
    )
    noise: float = option(0.0, "complex noise on the ground-state guess (nucleates lattices)")
    # --- time loop (and steps, steps_per_chunk, save_every, checkpoint_every) ---
    dt: float = option(2e-3, "time step of the evolution (trap units 1/ω)")
    project_norm: bool = option(
        False,
        "The float32 FFT round-off loses ~1e-7 of the norm per step (larger with cuFFT); ψ is rescaled to norm 1 "
        "after every save_every steps (false, the default) or after every step (true), see "
        "ivhl_jax.physics.condensate.strang.",
    )
    fft: Literal["xla", "ducc"] = option(
        "xla",
        'Kinetic-step FFT: "xla" (default, portable) or "ducc" (host FFT on CPU: faster from ~128³ on; needs pip '
        "install 'ivhl_jax[cpu-fft]'), see ivhl_jax.numerics.spectral.",
    )
    mesh: int | str = option(
        1,
        'Device mesh of the field: "1" (one device), "8" (a slab: the first grid axis over 8 devices) or "4x2" (a '
        "pencil: the first two axes over 4 × 2); the product is the number of devices of all processes (also under "
        "`ivhl launch`), see ivhl_jax.numerics.distributed_fft.",
    )
    seed: int = option(0, "PRNG seed of the ground-state noise")
    snapshot_every: int = option(
        0,
        "Steps between field snapshots written to <out>/run.zarr (0: none; a multiple of steps_per_chunk); each "
        "process writes the shards it holds.",
    )
    snapshot_fields: Literal["psi", "density_phase"] = option(
        "psi", '"psi" (complex ψ) or "density_phase" (|ψ|², arg ψ)'
    )
    snapshot_precision: Literal["float32", "float16", "float64"] = option("float32", "real precision of the snapshots")
    species: str | None = option(
        None,
        "the atom (87Rb, 23Na, 7Li, 39K, 133Cs, 52Cr, 164Dy), with omega_hz: run.zarr then gives every trap-unit "
        "quantity its SI unit (ħω in J, 1/ω in s, the trap length in m); the run itself is unchanged",
    )
    omega_hz: float | None = option(None, "with species: the trap frequency ω/2π (Hz) of the trap unit ω")

    def validate(self) -> None:
        """Every value checked before any work (one ValueError naming the key and the fix)."""
        if self.species is not None and self.species not in SPECIES_MASS_U:
            raise ValueError(f"species must be one of {', '.join(SPECIES_MASS_U)}, got {self.species!r}")
        if self.omega_hz is not None and not (math.isfinite(self.omega_hz) and self.omega_hz > 0):
            raise ValueError(f"omega_hz must be a finite frequency > 0 (Hz), got {self.omega_hz}")
        if (self.species is None) != (self.omega_hz is None):
            raise ValueError("species and omega_hz go together (the trap units in SI need both): set both or neither")
        if self.dims not in (1, 2, 3):
            raise ValueError(f"dims must be 1, 2 or 3, got {self.dims}")
        if self.grid < 2:
            raise ValueError(f"grid must be >= 2 (points per axis), got {self.grid}")
        for name in ("length", "dt", "ground_dt", "ground_tol"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        for name in ("g", "omega_rot"):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v}")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"gamma must be a finite number >= 0 (a damping rate), got {self.gamma}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, got {self.noise}")
        if len(self.trap) not in (1, self.dims):
            raise ValueError(f"trap must have 1 or dims={self.dims} frequencies, got {list(self.trap)}")
        if not all(math.isfinite(w) and w >= 0 for w in self.trap):
            raise ValueError(f"trap frequencies must be finite and >= 0, got {list(self.trap)}")
        if self.omega_rot and self.dims == 1:
            raise ValueError("omega_rot needs dims=2 or 3")
        if self.imprints and self.dims == 1:
            raise ValueError("imprints (vortices) need dims=2 or 3")
        for imp in self.imprints:
            if len(imp) != 3 or not all(math.isfinite(float(v)) for v in imp[:2]) or float(imp[2]) != int(imp[2]):
                raise ValueError(f"imprints must be [x, y, charge] with finite x, y and an integer charge, got {imp}")
        sizes = check_field_mesh(self.mesh, self.grid, self.dims, "grid")
        if self.ground_method == "cg" and self.ground_dt is not None:
            raise ValueError(
                f"ground_dt={self.ground_dt:g} is the flow's step and ground_method=cg has none: drop ground_dt or "
                "set ground_method=flow"
            )
        if self.ground_method == "cg" and math.prod(sizes) > 1:
            raise ValueError(
                f"ground_method=cg runs on one device, not on mesh={self.mesh}: set ground_method=flow (or auto) "
                "or mesh=1"
            )
        if math.prod(sizes) > 1 and self.fft != "xla":
            raise ValueError(
                f"mesh={self.mesh!r} needs fft='xla' (the distributed FFT runs XLA's FFT on each "
                f"shard), got fft={self.fft!r}"
            )
        check_chunked_run(self, ("ground_steps",))
        if self.snapshot_every < 0 or self.snapshot_every % self.steps_per_chunk:
            raise ValueError(
                f"snapshot_every ({self.snapshot_every}) must be 0 (no snapshots) or a multiple of "
                f"steps_per_chunk ({self.steps_per_chunk})"
            )
        if self.snapshot_fields == "psi" and self.snapshot_precision == "float16":
            raise ValueError(
                "snapshot_precision=float16 needs snapshot_fields=density_phase (there is no complex "
                "float16); use float32"
            )
        self._validate_system()
        # The split-step stability bound of the real-time steps (the builders check it too, after the
        # ground-state search; checked here so that a bad dt fails before any work).
        bound = C.max_stable_dt(C.Grid.uniform((self.grid,) * self.dims, self.length))
        what = f"grid={self.grid}, length={self.length:g}"
        if self.dt > bound:
            raise ValueError(
                f"dt={self.dt:g} is beyond the split-step stability bound of this grid ({what}): "
                f"use dt <= {bound:.3g} (or a coarser grid)"
            )

    def _validate_system(self) -> None:
        """The settings of the chosen ``system``: a changed setting of another system's section (or of the scalar
        scheme's own, with another system) is refused in one line naming it and the fix; the chosen section is
        checked by building its system with the library's ``create`` on a tiny grid (and its ground-state targets
        with ``strang``), the library's error renamed to the setting at fault."""
        system = self.system
        for name, section in SECTIONS.items():
            given, default = getattr(self, name), section()
            changed = [f.name for f in dataclasses.fields(given) if getattr(given, f.name) != getattr(default, f.name)]
            if name != system and changed:
                raise ValueError(
                    f"{name}.{changed[0]} applies to system={name}, not to system={system}: drop it or set "
                    f"system={name}"
                )
        if system == "scalar":
            return
        defaults = BECConfig()
        for key in SCALAR_ONLY:
            if getattr(self, key) != getattr(defaults, key):
                raise ValueError(
                    f"{key}={getattr(self, key)!r} applies to system=scalar, not to system={system} (its "
                    f"scheme has no {SCALAR_ONLY[key]}): drop it"
                )
        self._check_section_needs()
        tiny = C.Grid.uniform((2,) * self.dims, 1.0)  # the library's checks of the values need a grid; any grid does
        try:
            built = section_system(self, tiny, np.zeros(tiny.shape, np.float32))
            norm, extra = ground_targets(self, built)
            C.strang(built, 1e-3, imaginary=True, norm=norm, **extra)
        except (TypeError, ValueError) as e:
            raise ValueError(_setting_message(system, str(e))) from None

    def _check_section_needs(self) -> None:
        """What a section needs that its system's ``create`` cannot see: the required settings, one way to give
        the couplings, ``g`` only where it means something."""
        mix, spin = self.mixture, self.spin1
        if self.system == "mixture":
            if mix.couplings is None and mix.g12 is None:
                raise ValueError(
                    "system=mixture needs the inter-component coupling: --set mixture.g12=... (two components, g "
                    "is g_11, mixture.g22 defaults to g) or --set mixture.couplings=[[g11, g12], [g12, g22]]"
                )
            if mix.couplings is not None:
                for key in ("g12", "g22"):
                    if getattr(mix, key) is not None:
                        raise ValueError(f"mixture.{key} and mixture.couplings both give the couplings: give one")
                if self.g != BECConfig.g:
                    raise ValueError(
                        f"g={self.g:g} and mixture.couplings both give g_11: drop g (couplings[0][0] is g_11)"
                    )
                if len(mix.couplings) < 2:
                    raise ValueError(
                        f"mixture.couplings must be a C × C matrix with C >= 2 components (one component is "
                        f"system=scalar), got {mix.couplings}"
                    )
        elif self.system == "spin1":
            if self.g != BECConfig.g:
                raise ValueError(
                    f"g={self.g:g} does not apply to system=spin1 (its density coupling is spin1.c0): drop it"
                )
            for key in ("c0", "c2"):
                if getattr(spin, key) is None:
                    raise ValueError(
                        f"system=spin1 needs spin1.{key} (--set spin1.c0=... --set spin1.c2=...; c2 < 0 "
                        "ferromagnetic, > 0 polar)"
                    )
        elif self.system == "dipolar":
            if self.dims != 3:
                raise ValueError(
                    f"system=dipolar needs dims=3 (the dipole-dipole kernel is the 3-D one), got {self.dims}"
                )
            if self.dipolar.eps_dd is None:
                raise ValueError(
                    "system=dipolar needs dipolar.eps_dd, the relative dipolar strength g_dd/g (--set "
                    "dipolar.eps_dd=0.5)"
                )


# The settings of the scalar GP scheme alone (refused with another system when changed from their default), with
# what the other schemes lack.
SCALAR_ONLY: dict[str, str] = {
    "omega_rot": "rotating frame",
    "gamma": "damping",
    "imprints": "vortex imprints",
    "noise": "noisy ground-state guess",
    "project_norm": "per-step norm projection",
    "fft": "host FFT",
}
#: The library's names in its errors that are not a section's own setting, as the settings that give them.
LIBRARY_NAMES: dict[str, dict[str, str]] = {
    "mixture": {"g": "the couplings g_ij (g, mixture.g12, mixture.g22 or mixture.couplings)", "norm": "mixture.norms"},
}


def _setting_message(system: str, message: str) -> str:
    """The library's error about the ``system`` built from a section, its leading argument name replaced by the
    config key that sets it (``axis must be ...`` → ``dipolar.axis must be ...``)."""
    names = {f.name: f"{system}.{f.name}" for f in dataclasses.fields(SECTIONS[system])}
    names.update(LIBRARY_NAMES.get(system, {}))
    head = re.match(r"\w+", message)
    if head is not None and head.group() in names:
        return names[head.group()] + message[head.end() :]
    return f"system={system}: {message}"


def mixture_couplings(cfg: BECConfig) -> list[list[float]]:
    """The coupling matrix g_ij of ``system=mixture``: ``mixture.couplings``, or [[g, g12], [g12, g22]] (g22
    default g)."""
    mix = cfg.mixture
    if mix.couplings is not None:
        return [list(row) for row in mix.couplings]
    g12 = 0.0 if mix.g12 is None else mix.g12
    g22 = cfg.g if mix.g22 is None else mix.g22
    return [[cfg.g, g12], [g12, g22]]


def dipole_spec(cfg: BECConfig) -> C.Dipolar:
    """The dipolar interaction of ``system=dipolar`` (ε_dd relative to g, the axis, the cutoff or None)."""
    d = cfg.dipolar
    return C.Dipolar.create(eps_dd=d.eps_dd, axis=d.axis, cutoff=d.cutoff)


def section_system(cfg: BECConfig, grid: C.Grid, potential: Any, layout: Any = None) -> Any:
    """The dipolar, mixture or spin-1 system of ``cfg.system``, its section's settings given to the system's
    ``create`` (which validates them) on ``grid`` with trap ``potential``."""
    if cfg.system == "dipolar":
        d = cfg.dipolar
        return C.DipolarSystem.create(
            grid, potential, cfg.g, dipole_spec(cfg), layout=layout, lhy=d.lhy, gamma_qf=d.gamma_qf
        )
    if cfg.system == "mixture":
        couplings = np.asarray(mixture_couplings(cfg))
        return C.MixtureSystem.create(grid, potential, couplings, layout=layout, lhy=cfg.mixture.lhy)
    s = cfg.spin1
    return C.Spin1System.create(grid, potential, s.c0, s.c2, p=s.p, q=s.q, layout=layout)


def ground_targets(cfg: BECConfig, system: Any) -> tuple[Any, dict[str, Any]]:
    """What the ground-state search of a dipolar, mixture or spin-1 ``system`` holds: the atom number (a mixture's
    N_i of ``mixture.norms``, default 1 each; else 1) and the keyword arguments of the rest (a spin-1 field's
    ``spin1.magnetization`` when given)."""
    if isinstance(system, C.MixtureSystem):
        norms = cfg.mixture.norms
        return ([1.0] * system.n_components if norms is None else list(norms)), {}
    magnetization = cfg.spin1.magnetization if isinstance(system, C.Spin1System) else None
    return 1.0, ({} if magnetization is None else {"magnetization": magnetization})


def _dtype(cfg: BECConfig) -> Any:
    return real_dtype(cfg, "bec")


def gp_system(cfg: BECConfig) -> C.GPSystem:
    grid = C.Grid.uniform((cfg.grid,) * cfg.dims, cfg.length)
    trap = cfg.trap[0] if len(cfg.trap) == 1 else cfg.trap
    return C.GPSystem.create(
        grid,
        C.harmonic(grid, trap, dtype=_dtype(cfg)),
        cfg.g,
        cfg.omega_rot,
        fft=cfg.fft,
        layout=parse_mesh(cfg.mesh, cfg.dims),
        gamma=cfg.gamma,
    )


def check_local_step(cfg: BECConfig, system: C.GPSystem, psi: jax.Array, key: str, imaginary: bool) -> None:
    """The local factor must be resolved over the cloud: (step)·max|V + g|ψ|²| ≤ 2π (the phase per step in real
    time, the decay in imaginary time). The error names the configuration key at fault: ``key`` (``dt`` or
    ``ground_dt``, the step) when the trap alone breaks the bound, else ``g``, each with the value that fixes it.
    """
    if not (host_readable(psi) and host_readable(system.potential)):
        return  # spread over several processes: no host copy to read (the library keeps its own step checks)
    step = flow_dt(cfg) if key == "ground_dt" else getattr(cfg, key)
    rho = np.abs(np.asarray(psi)) ** 2
    pot = np.asarray(system.potential, np.float64)
    # over the cloud (the engine's criterion: empty corners of the box may have any V)
    umax = splitstep.local_energy_max(pot + cfg.g * rho, rho)
    if step * umax <= 2 * math.pi:
        return
    what = "decay" if imaginary else "phase"
    detail = (
        f"the local {what} per step {key}·max|V + g|ψ|²| = {step * umax:.3g} over the cloud exceeds 2π, so the "
        "dynamics is not resolved"
    )
    vmax = splitstep.local_energy_max(pot, rho)
    rho_max = float(np.max(rho))
    if cfg.g != 0 and step * vmax <= math.pi:  # the trap alone is resolved: the interaction is at fault
        g_max = (2 * math.pi / step - vmax) / rho_max
        raise ValueError(
            f"g={cfg.g:g} is too large for {key}={step:g}: {detail}; use |g| <= {g_max:.3g} "
            f"(or {key} <= {math.pi / umax:.3g})"
        )
    raise ValueError(f"{key}={step:g} is too large: {detail}; use {key} <= {math.pi / umax:.3g}")


GROUND_CHECK_EVERY = 100  # imaginary-time steps per convergence check (ground_state's check_every)
GROUND_SEGMENTS = 10  # progress lines of the ground-state search (at most)
GROUND_FLOW_DT = 5e-3  # the flow's imaginary-time step when ground_dt is not given
GROUND_FLOW_TOL = 1e-7  # the flow's relative energy change per check when ground_tol is not given


def flow_dt(cfg: BECConfig) -> float:
    """The imaginary-time step of the flow: ``ground_dt``, or :data:`GROUND_FLOW_DT`."""
    return GROUND_FLOW_DT if cfg.ground_dt is None else cfg.ground_dt


def ground_method(cfg: BECConfig, system: Any) -> str:
    """The search ``system`` gets: ``ground_method``, or with ``auto`` the library's rule
    (:func:`~ivhl_jax.physics.condensate.ground.default_method`: the flow with a mesh layout, for spin-1 in float32,
    or when ``ground_dt`` is given; else cg)."""
    if cfg.ground_method != "auto":
        return cfg.ground_method
    return default_method(system, cfg.ground_dt)


def _segmented_search(cfg: BECConfig, method: str, search, psi, *, progress: bool) -> tuple[jax.Array, dict]:
    """The search as up to :data:`GROUND_SEGMENTS` calls ``search(psi, n, first)`` of a ground-state routine, each
    continuing from the last state for an equal share of ``ground_steps`` (the flow: whole convergence blocks of
    :data:`GROUND_CHECK_EVERY` steps; cg: iterations), stopping as soon as one converges (or cg stops short of its
    share: it stalled at its round-off floor); with ``progress`` a line after each share reports the steps done,
    the energy and the convergence measure (the flow: the relative energy change; cg: the residual). Equal shares
    reuse one compiled program."""
    if method == "flow":
        unit = GROUND_CHECK_EVERY
        detail, counted, measure = f"imaginary time, up to {{}} steps of dt={flow_dt(cfg):g}", "steps", "delta"
    else:
        unit, detail, counted, measure = 1, "conjugate gradient, up to {} iterations", "iterations", "residual"
    total = -(-cfg.ground_steps // unit)
    seg = -(-total // GROUND_SEGMENTS) * unit
    budget = total * unit
    steps, info, first = 0, {}, True
    label = "relative change" if method == "flow" else "residual"
    with runner_phase("ground state", detail=detail.format(budget) + "; compiling first", enabled=progress) as note:
        while steps < budget:
            n = min(seg, budget - steps)
            psi, info = search(psi, n, first)
            first = False
            done = int(info["steps"])
            steps += done
            converged = bool(info["converged"])
            note(
                f"{steps}/{budget} {counted}, E = {float(info['energy']):.8g}, {label} "
                f"{float(info[measure]):.1e}" + (" (converged)" if converged else "")
            )
            if converged or (method == "cg" and done < n):
                break
    return psi, dict(info, steps=steps)


def _record(method: str, info: dict) -> dict:
    """The ground-state record of observables.json and the checkpoints: ``method`` and the search's info, as plain
    numbers (lists where a value has one entry per component)."""
    return {"method": method, **{k: np.asarray(v).tolist() for k, v in info.items()}}


def _method_args(cfg: BECConfig, method: str) -> dict[str, Any]:
    """The keyword arguments of :func:`~ivhl_jax.physics.condensate.ground_state` that ``method`` takes: cg its
    residual tolerance ``ground_tol`` (None: the library's default); the flow its step, tolerance and check
    interval."""
    if method == "cg":
        return {"method": "cg", "tol": cfg.ground_tol}
    tol = GROUND_FLOW_TOL if cfg.ground_tol is None else cfg.ground_tol
    return {"method": "flow", "dt": flow_dt(cfg), "tol": tol, "check_every": GROUND_CHECK_EVERY}


def gp_initial_state(cfg: BECConfig, system: C.GPSystem, *, progress: bool = False) -> tuple[jax.Array, dict]:
    """Ground state (:func:`ground_method`: cg or imaginary time) with the configured vortices imprinted.

    The search runs as up to :data:`GROUND_SEGMENTS` calls of :func:`ivhl_jax.physics.condensate.ground_state`
    (:func:`_segmented_search`), each continuing from the last state (``psi0``) for an equal share of
    ``ground_steps``, so that with ``progress`` a line reports the steps done, the energy and the convergence
    measure after each share: a large grid's search takes minutes and must not look like a hang.
    """
    method = ground_method(cfg, system)
    if method == "flow":
        # The search starts from ground_state's default guess, the unit Gaussian: check its step against it here so
        # that the error names ground_dt or g (the library's own check names its argument, dt).
        check_local_step(cfg, system, C.gaussian(system.grid, 1.0, dtype=system.complex_dtype), "ground_dt", True)
    args = _method_args(cfg, method)

    def search(psi, n, first):
        key = jax.random.key(cfg.seed) if first else None
        return C.ground_state(system, 1.0, max_steps=n, psi0=psi, key=key, noise=cfg.noise if first else 0.0, **args)

    psi, info = _segmented_search(cfg, method, search, None, progress=progress)
    if cfg.imprints:
        centers = jnp.asarray([[x, y] for x, y, _ in cfg.imprints])
        charges = jnp.asarray([q for _, _, q in cfg.imprints], jnp.int32)
        psi = C.imprint_vortices(psi, system.grid, centers, charges, core_size=0.5 / np.sqrt(max(cfg.g, 1.0)) + 0.1)
        psi = C.normalize(psi, system.grid)
    return psi, _record(method, info)


# The guesses of the ground-state searches of the other systems. Mixture: unit Gaussians displaced along x by
# MIXTURE_GUESS_SHIFT trap lengths from each other (a symmetric guess is a stationary point of the flow also
# where the components would separate). Spin-1: a unit Gaussian times a spinor that is neither polar nor
# ferromagnetic (with all three m populated, as a held magnetisation needs), so either ground state is reached.
MIXTURE_GUESS_SHIFT = 0.5
SPIN1_GUESS_SPINOR = (0.6, 0.5 + 0.4j, 0.3)


def condensate_system(cfg: BECConfig) -> C.GPSystem | C.DipolarSystem | C.MixtureSystem | C.Spin1System:
    """The system of ``cfg.system`` on the configured grid and trap (``system=scalar``: :func:`gp_system`)."""
    if cfg.system == "scalar":
        return gp_system(cfg)
    grid = C.Grid.uniform((cfg.grid,) * cfg.dims, cfg.length)
    trap = cfg.trap[0] if len(cfg.trap) == 1 else cfg.trap
    pot = C.harmonic(grid, trap, dtype=_dtype(cfg))
    return section_system(cfg, grid, pot, parse_mesh(cfg.mesh, cfg.dims))


def _guess(cfg: BECConfig, system) -> jax.Array:
    """The first state of the ground-state search of a dipolar, mixture or spin-1 system (see above)."""
    grid, cdt = system.grid, system.complex_dtype
    if isinstance(system, C.MixtureSystem):
        c = system.n_components
        shifts = (np.arange(c) - (c - 1) / 2) * MIXTURE_GUESS_SHIFT
        return jnp.stack(
            [
                C.gaussian(grid, n, center=(s,) + (0.0,) * (grid.ndim - 1), dtype=cdt)
                for n, s in zip(ground_targets(cfg, system)[0], shifts)
            ]
        )
    if isinstance(system, C.Spin1System):
        zeta = np.asarray(SPIN1_GUESS_SPINOR) / np.linalg.norm(SPIN1_GUESS_SPINOR)
        return C.gaussian(grid, 1.0, dtype=cdt)[None] * jnp.asarray(zeta.reshape((3,) + (1,) * grid.ndim), cdt)
    return C.gaussian(grid, 1.0, dtype=cdt)


def initial_state(cfg: BECConfig, system, *, progress: bool = False) -> tuple[jax.Array, dict]:
    """The ground state of ``system`` (imaginary time, :func:`_segmented_search`): :func:`gp_initial_state` for
    the scalar GP system; for the others the library's ground-state routine of that system from :func:`_guess`,
    holding N = 1 (mixture: each N_i of ``norms``; spin-1: also ``magnetization`` when given)."""
    if isinstance(system, C.GPSystem):
        return gp_initial_state(cfg, system, progress=progress)
    guess = _guess(cfg, system)
    method = ground_method(cfg, system)
    common = _method_args(cfg, method)
    norm, extra = ground_targets(cfg, system)
    if method == "flow":
        # The library's check of the local step over the guess names its argument, dt: here it is ground_dt.
        try:
            C.strang(system, flow_dt(cfg), imaginary=True, norm=norm, **extra).init(guess)
        except ValueError as e:
            raise ValueError(re.sub(r"\bdt\b", "ground_dt", str(e))) from None

    def search(psi, n, first):
        return C.ground_state(system, norm, max_steps=n, psi0=psi, **common, **extra)

    psi, info = _segmented_search(cfg, method, search, guess, progress=progress)
    return psi, _record(method, info)


# Atomic masses (u) of the species whose trap units a run store can give in SI (AME2016), ħ (J s) and u (kg)
SPECIES_MASS_U = {
    "87Rb": 86.909180531,
    "23Na": 22.9897692820,
    "7Li": 7.0160034366,
    "39K": 38.9637064864,
    "133Cs": 132.905451961,
    "52Cr": 51.9405075,
    "164Dy": 163.9291748,
}
HBAR_J_S, ATOMIC_MASS_KG = 1.054571817e-34, 1.66053906660e-27


def _store_units(cfg: BECConfig, natural: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(units, long_names)`` of the store from the natural (trap) units: numbers ("1"), or with ``species`` and
    ``omega_hz`` the SI units of that atom's trap units: ħω in J, 1/ω in s, a_ho = √(ħ/(mω)) in m."""
    scales = {}
    if cfg.species is not None and cfg.omega_hz is not None:
        omega = 2 * math.pi * cfg.omega_hz
        a_ho = math.sqrt(HBAR_J_S / (SPECIES_MASS_U[cfg.species] * ATOMIC_MASS_KG * omega))
        scales = {"ħω": f"{HBAR_J_S * omega:.9g} J", "ħ": f"{HBAR_J_S:.9g} J s", "1/ω": f"{1 / omega:.9g} s"}
        scales |= {"trap length": f"{a_ho:.9g} m", "(trap length)^-d": f"{a_ho**-cfg.dims:.9g} m-{cfg.dims}"}
        if cfg.dims == 2:  # ψ in m^(-d/2): an integer power in 2-D only (UDUNITS has no half powers)
            scales["(trap length)^(-d/2)"] = f"{1 / a_ho:.9g} m-1"
    return natural_units(natural, scales)


GP_UNITS = {
    "norm": "1",
    "energy_kinetic": "ħω",
    "energy_trap": "ħω",
    "energy_interaction": "ħω",
    "energy_rotation": "ħω",
    "energy_total": "ħω",
    "lz": "ħ",
}  # per particle, trap units


def _axes(cfg: BECConfig, system) -> tuple[tuple[str, ...], dict]:
    """``(dims, coords)`` of a state's axes: a mixture's ``component`` (1 … C) or a spin-1 field's ``m`` (+1, 0,
    −1) first, then the grid's ``x, y, z`` (trap lengths)."""
    dims = ("x", "y", "z")[: cfg.dims]
    coords = {d: np.asarray(c) for d, c in zip(dims, system.grid.coords)}
    if isinstance(system, C.MixtureSystem):
        return ("component", *dims), {"component": np.arange(1, system.n_components + 1), **coords}
    if isinstance(system, C.Spin1System):
        return ("m", *dims), {"m": np.array([1, 0, -1]), **coords}
    return dims, coords


def gp_snapshots(cfg: BECConfig, system) -> Snapshots:
    """ψ (or |ψ|² and arg ψ) every ``snapshot_every`` steps at ``snapshot_precision``, on the state's axes
    (:func:`_axes`: a mixture's or spin-1 field's component axis first, each component's density its own)."""
    real = {"float16": jnp.float16, "float32": jnp.float32, "float64": jnp.float64}[cfg.snapshot_precision]
    dims, coords = _axes(cfg, system)

    def fields(psi: jax.Array) -> dict[str, jax.Array]:
        if cfg.snapshot_fields == "psi":
            return {"psi": psi.astype(jnp.result_type(real, jnp.complex64))}
        return {"density": (jnp.abs(psi) ** 2).astype(real), "phase": jnp.angle(psi).astype(real)}

    units = _store_units(cfg, _field_units(cfg))[0]  # trap units (numbers, or SI with a species)
    return Snapshots(every=cfg.snapshot_every, fields=fields, dims=dims, coords=coords, units=units)


def _field_units(cfg: BECConfig) -> dict[str, str]:
    """The natural unit of each field and axis a run stores (trap units; ``component`` and ``m`` are labels)."""
    return {
        "psi": "(trap length)^(-d/2)",
        "final_state": "(trap length)^(-d/2)",
        "density": "(trap length)^-d",
        "phase": "rad",
        "component": "1",
        "m": "1",
        **{d: "trap length" for d in ("x", "y", "z")[: cfg.dims]},
    }


def _units(names) -> dict[str, str]:
    """The unit of each observable of a dipolar, mixture or spin-1 run (energies in ħω, the rest numbers)."""
    return {k: "ħω" if k.startswith("energy_") else "1" for k in names}


def simulate(
    cfg: BECConfig,
    *,
    checkpointer: Checkpointer | None = None,
    progress: bool = True,
    resuming: bool = False,
    sink: RunStore | None = None,
) -> tuple[RunResult, dict]:
    """Prepare the initial state (skipped when resuming) and run the chunked real-time loop. With ``sink`` the
    observations go to disk chunk by chunk (``result.history`` holds none; ``extra["observation_like"]`` is the
    structure to read them back with)."""
    extra: dict = {}
    system = condensate_system(cfg)
    scalar = isinstance(system, C.GPSystem)
    if resuming:  # template; restored from the checkpoint
        state = jnp.zeros(_state_shape(system), system.complex_dtype)
    else:
        state, extra["ground_state"] = initial_state(cfg, system, progress=progress)
        gs = extra["ground_state"]
        if not gs["converged"]:
            if gs["method"] == "flow":
                tol = GROUND_FLOW_TOL if cfg.ground_tol is None else cfg.ground_tol
                what = (
                    f"{gs['steps']} imaginary-time steps (last relative change {gs['delta']:.2e} > ground_tol {tol:g})"
                )
                fix = "raise ground_steps or ground_dt, or loosen ground_tol"
            else:
                what = f"{gs['steps']} conjugate-gradient iterations (residual {gs['residual']:.2e})"
                fix = "raise ground_steps or loosen ground_tol (the residual; float32 stalls near 1e-5)"
            print(
                f"warning: the ground state did not converge in {what}; the evolution starts from it anyway: {fix}",
                file=sys.stderr,
            )
        if isinstance(system, C.GPSystem):
            check_local_step(cfg, system, state, "dt", False)

    if scalar:
        # The norm projection pins the ground state's norm, 1, for the whole run (resumes included): once per
        # block of save_every steps by default, after every step with project_norm=true.
        stepper = C.strang(system, cfg.dt, project_norm=True if cfg.project_norm else None, norm=1.0)
    else:
        # The other schemes are each exact in their conserved quantities up to round-off (no projection).
        stepper = C.strang(system, cfg.dt)
        if not resuming:
            state = stepper.init(state)  # checks that dt resolves the local phase over the cloud (names dt)
    observe = C.observe
    # donate: each chunk writes the field into the previous one's buffers (one copy of ψ in memory)
    advance = chunked(stepper, cfg.steps_per_chunk, save_every=cfg.save_every, observe=observe, donate=True)
    extra["system"] = system
    extra["observation_like"] = jax.eval_shape(observe, state, stepper.params)
    if sink is not None:
        obs_units = GP_UNITS if scalar else _units(extra["observation_like"])
        units, long_names = _store_units(cfg, {"time": "1/ω", **obs_units, **_field_units(cfg)})
        sink.describe(
            time_unit=units.pop("time"),
            units=units,
            long_names=long_names,
            snapshots=gp_snapshots(cfg, system) if cfg.snapshot_every else None,
        )
    # the ground-state record travels with every checkpoint, so a resumed run reports it too
    result = run_field_chunks(
        cfg,
        advance,
        state,
        "bec",
        checkpointer=checkpointer,
        metadata={"ground_state": extra.get("ground_state")},
        progress=progress,
        sink=sink,
    )
    if resuming and result.metadata is not None and extra.get("ground_state") is None:
        extra["ground_state"] = result.metadata.get("ground_state")
    return result, extra


def _state_shape(system) -> tuple[int, ...]:
    """The state's shape: the grid's, with a mixture's C or a spin-1 field's 3 components first."""
    if isinstance(system, C.MixtureSystem):
        return (system.n_components, *system.grid.shape)
    if isinstance(system, C.Spin1System):
        return (3, *system.grid.shape)
    return system.grid.shape


def _density(a: np.ndarray) -> np.ndarray:
    return np.abs(a) ** 2


def _slice_label(cfg: BECConfig, ndim: int) -> str:
    """What :func:`~ivhl_jax.sims._common.middle_plane` shows, for plot titles: '' in 1D/2D, else the z coordinate
    of the plane."""
    if ndim <= 2:
        return ""
    z = C.Grid.uniform((cfg.grid,) * cfg.dims, cfg.length).coords[2][cfg.grid // 2]
    return f", slice z = {z:.3g} (index {cfg.grid // 2} of {cfg.grid})"


def _state_axes(cfg: BECConfig, system) -> tuple[tuple[str, ...], dict, dict]:
    """``(dims, coords, units)`` of the state's axes (:func:`_axes`): ``x, y, z`` in trap lengths, after the
    component axis of a mixture or spin-1 field."""
    dims, coords = _axes(cfg, system)
    return dims, coords, _store_units(cfg, _field_units(cfg))[0]


def write_outputs(
    cfg: BECConfig, result: RunResult, extra: dict, out: str, *, save_state: bool = True
) -> dict[str, str]:
    """The plots, observables.json and (with ``save_state``) final_state.npy of a finished run. ``result.state``
    may be a memory map (the field is only read through the 2-D plane that the plots show)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    state = result.state if isinstance(result.state, np.ndarray) else np.asarray(result.state)
    if save_state:
        save_npy(os.path.join(out, "final_state.npy"), state)
    grid = extra["system"].grid
    ndim = grid.ndim
    # What the plots show, per component (a mixture's or spin-1 field's leading axis): the field itself in 1D/2D,
    # the middle plane above. A single field (scalar, dipolar) has one, named "".
    single = state.ndim == ndim
    if single:
        fields = [("", state)]
    else:
        names = (
            [f"m = {m:+d}" for m in (1, 0, -1)] if cfg.system == "spin1" else [f"ψ_{i + 1}" for i in range(len(state))]
        )
        fields = list(zip(names, state))
    planes = [(name, np.asarray(middle_plane(f))) for name, f in fields]
    plane = planes[0][1]
    t, summary = run_summary(cfg, result)
    summary["ground_state"] = extra.get("ground_state")
    hist = summary["observables"]
    paths = {}
    extent = None
    if grid.ndim >= 2:
        x, y = grid.coords[0], grid.coords[1]
        extent = (x[0], x[-1], y[0], y[-1])
        if grid.ndim == 3:
            summary["plot_slice"] = _slice_label(cfg, 3).lstrip(", ")
    if grid.ndim >= 2 and single:
        pos, q = C.vortex_positions(jnp.asarray(plane), grid, min_density=0.1, window=4)
        summary["vortices"] = {
            "positions": pos,
            "charges": q,
            "count": int(np.abs(q).sum()),
            "net_charge": int(q.sum()),
        }
    what = "gp" if cfg.system == "scalar" else cfg.system
    for name, part, cmap, label in (("density", _density, "viridis", "|ψ|²"), ("phase", np.angle, "twilight", "arg ψ")):
        fig, axs = plt.subplots(1, len(planes), figsize=(5 if single else 4.2 * len(planes), 4), squeeze=False)
        for ax, (comp, pl) in zip(axs[0], planes):
            data = part(pl)
            if data.ndim == 1:
                ax.plot(C.Grid.uniform(cfg.grid, cfg.length).coords[0], data)
                ax.set_ylabel(label)
                ax.set_xlabel("x (trap units)")
            else:
                im = ax.imshow(data.T, origin="lower", cmap=cmap, extent=extent)
                fig.colorbar(im, ax=ax, label=label)
                ax.set_xlabel("x (trap units)")
                ax.set_ylabel("y (trap units)")
                if "vortices" in summary and len(summary["vortices"]["charges"]):
                    p = summary["vortices"]["positions"]
                    ax.scatter(p[:, 0], p[:, 1], s=8, c="r", marker="x")
            head = f"{what}: {label}" if single else f"{what} {comp}: {label}"
            ax.set_title(f"{head} at t = {t[-1]:.3g}{_slice_label(cfg, ndim)}", fontsize=9)
        paths[name] = save_figure(fig, os.path.join(out, f"{name}.png"))
    keys = [k for k in hist if k.startswith(("energy", "norm")) or k in ("lz", "magnetization", "overlap")]
    paths.update(write_observables(out, summary, keys, what, ("", "t (trap units 1/ω)")))
    return paths


class BECSimulation(FieldSimulation):
    """``ivhl sim bec``: a Gross–Pitaevskii condensate (the GFT condensate is ``ivhl sim gft``)."""

    prog = "ivhl sim bec"
    config_type = BECConfig
    out_folder = "bec"

    def simulate(self, cfg: BECConfig, ctx: RunContext) -> tuple[RunResult, dict]:
        return simulate(cfg, checkpointer=ctx.checkpointer, progress=ctx.progress, resuming=ctx.resuming, sink=ctx.sink)

    def state_axes(self, cfg: BECConfig, extra: dict) -> tuple[tuple[str, ...], dict, dict]:
        return _state_axes(cfg, extra["system"])

    def write_outputs(self, cfg: BECConfig, result: RunResult, extra: dict, out: str, *, save_state: bool) -> dict:
        return write_outputs(cfg, result, extra, out, save_state=save_state)


SIMULATION = BECSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
