"""Gross–Pitaevskii condensate simulation: ground state, vortex imprints, real-time evolution.

The ground state of the trap (imaginary time, optionally in a rotating frame), then vortex imprints, then
real-time evolution i∂ψ/∂t = [−½∇² + V + g|ψ|² − Ω L_z]ψ (ħ = m = 1, trap units). The GFT condensate is its
own simulation, ``ivhl sim gft`` (:mod:`ivhl_jax.sims.gft`).

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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics import splitstep
from ivhl_jax.numerics.distributed_fft import host_readable, mesh_sizes, parse_mesh
from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import condensate as C
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext, Simulation, run_main
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import RunResult, run_chunked
from ivhl_jax.run.runner import phase as runner_phase
from ivhl_jax.run.store import RunStore, Snapshots, write_final_state
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class BECConfig:
    """Run configuration (TOML/JSON keys; ``--set key=value``)."""

    dims: int = option(2, "spatial dimensions: 1, 2 or 3")
    grid: int = option(128, "points per axis")
    length: float = option(20.0, "box side (trap units)")
    trap: tuple[float, ...] = option((1.0,), "trap frequencies ω (one, or one per axis)")
    g: float = option(200.0, "contact interaction strength g (trap units)")
    omega_rot: float = option(0.0, "rotation about z (2D/3D); the ground state is found in this frame")
    gamma: float = option(
        0.0,
        "damping rate γ >= 0 of the evolution, i∂ψ/∂t = (1 − iγ)(H − μ)ψ with the atom number held (0: the "
        "conservative GP equation); with omega_rot and noise > 0 a vortex lattice forms",
    )
    imprints: list[tuple[float, float, int]] = option(default_factory=list, help="(x, y, charge)")
    ground_dt: float = option(5e-3, "imaginary-time step of the ground-state search")
    ground_steps: int = option(3000, "maximum imaginary-time steps (raise it if the ground state does not converge)")
    ground_tol: float = option(1e-7, "relative energy change per check at which the ground state counts as converged")
    noise: float = option(0.0, "complex noise on the ground-state guess (nucleates lattices)")
    # --- time loop ---
    dt: float = option(2e-3, "time step of the evolution (trap units 1/ω)")
    steps: int = option(2000, "evolution steps (raise it to extend a finished run)")
    steps_per_chunk: int = option(200, "steps per compiled chunk (progress granularity)")
    save_every: int = option(50, "steps between recorded observables")
    checkpoint_every: int = option(1000, "steps between checkpoints (a multiple of steps_per_chunk)")
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
    precision: Literal["float32", "float64"] = option(
        "float32", '"float32" (complex64 state) or "float64" (complex128)'
    )

    def validate(self) -> None:
        """Every value checked before any work (one ValueError naming the key and the fix)."""
        if self.dims not in (1, 2, 3):
            raise ValueError(f"dims must be 1, 2 or 3, got {self.dims}")
        if self.grid < 2:
            raise ValueError(f"grid must be >= 2 (points per axis), got {self.grid}")
        for name in ("steps", "steps_per_chunk", "save_every", "checkpoint_every", "ground_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("length", "dt", "ground_dt", "ground_tol"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
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
        sizes = mesh_sizes(self.mesh)
        ndim, n = self.dims, self.grid
        if len(sizes) >= ndim and math.prod(sizes) > 1:
            raise ValueError(
                f"mesh={self.mesh!r} splits {len(sizes)} axes of a {ndim}-D grid; the distributed FFT "
                f"needs one axis unsplit: use at most {ndim - 1} sizes (e.g. mesh={math.prod(sizes)})"
            )
        if any(n % p for p in sizes):
            raise ValueError(
                f"mesh={self.mesh!r} does not divide the grid ({n} points per axis): every mesh size "
                f"must divide {n} (e.g. mesh={math.gcd(n, math.prod(sizes))})"
            )
        if math.prod(sizes) > 1 and self.fft != "xla":
            raise ValueError(
                f"mesh={self.mesh!r} needs fft='xla' (the distributed FFT runs XLA's FFT on each "
                f"shard), got fft={self.fft!r}"
            )
        if self.steps % self.steps_per_chunk:
            raise ValueError(f"steps ({self.steps}) must be a multiple of steps_per_chunk ({self.steps_per_chunk})")
        if self.steps_per_chunk % self.save_every:
            raise ValueError(
                f"steps_per_chunk ({self.steps_per_chunk}) must be a multiple of save_every ({self.save_every})"
            )
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
        if self.checkpoint_every % self.steps_per_chunk:
            raise ValueError(
                f"checkpoint_every ({self.checkpoint_every}) must be a multiple of steps_per_chunk "
                f"({self.steps_per_chunk})"
            )
        # The split-step stability bound of the real-time steps (the builders check it too, after the
        # ground-state search; checked here so that a bad dt fails before any work).
        bound = C.max_stable_dt(C.Grid.uniform((self.grid,) * self.dims, self.length))
        what = f"grid={self.grid}, length={self.length:g}"
        if self.dt > bound:
            raise ValueError(
                f"dt={self.dt:g} is beyond the split-step stability bound of this grid ({what}): "
                f"use dt <= {bound:.3g} (or a coarser grid)"
            )


def precision_scope(cfg: BECConfig) -> contextlib.AbstractContextManager:
    """The scope a run of ``cfg`` computes in: 64-bit JAX (``jax.enable_x64``) for ``precision=float64``, left as
    it was otherwise; the process-wide setting is never changed."""
    return jax.enable_x64(True) if cfg.precision == "float64" else contextlib.nullcontext()


def _dtype(cfg: BECConfig):
    if cfg.precision == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "precision=float64 needs 64-bit JAX: run inside sims.bec.precision_scope(cfg) (ivhl sim bec does) or "
            "`with jax.enable_x64(True):`"
        )
    return jnp.float64 if cfg.precision == "float64" else jnp.float32


def gp_system(cfg: BECConfig) -> C.GPSystem:
    grid = C.Grid.uniform((cfg.grid,) * cfg.dims, cfg.length)
    trap = cfg.trap[0] if len(cfg.trap) == 1 else cfg.trap
    return C.GPSystem(
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
    step = getattr(cfg, key)
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


def gp_initial_state(cfg: BECConfig, system: C.GPSystem, *, progress: bool = False) -> tuple[jax.Array, dict]:
    """Ground state (imaginary time) with the configured vortices imprinted.

    The search runs as up to :data:`GROUND_SEGMENTS` calls of :func:`ivhl_jax.physics.condensate.ground_state`,
    each continuing from the last state (``psi0``) for an equal share of ``ground_steps``, so that with
    ``progress`` a line reports the steps done, the energy and its relative change after each share: a large
    grid's search takes minutes and must not look like a hang. The segments are whole convergence blocks of
    :data:`GROUND_CHECK_EVERY` steps and stop as soon as one converges. Equal shares reuse one compiled program.
    """
    # The search starts from ground_state's default guess, the unit Gaussian: check its step against it here so
    # that the error names ground_dt or g (the library's own check names its argument, dt).
    check_local_step(cfg, system, C.gaussian(system.grid, 1.0, dtype=system.complex_dtype), "ground_dt", True)
    total_blocks = -(-cfg.ground_steps // GROUND_CHECK_EVERY)
    seg_blocks = -(-total_blocks // GROUND_SEGMENTS)
    budget = total_blocks * GROUND_CHECK_EVERY
    psi, steps, info = None, 0, {}
    with runner_phase(
        "ground state",
        detail=f"imaginary time, up to {budget} steps of dt={cfg.ground_dt:g}; compiling first",
        enabled=progress,
    ) as note:
        while steps < budget:
            n = min(seg_blocks * GROUND_CHECK_EVERY, budget - steps)
            first = psi is None
            psi, info = C.ground_state(
                system,
                1.0,
                dt=cfg.ground_dt,
                tol=cfg.ground_tol,
                max_steps=n,
                psi0=psi,
                check_every=GROUND_CHECK_EVERY,
                key=jax.random.key(cfg.seed) if first else None,
                noise=cfg.noise if first else 0.0,
            )
            steps += int(info["steps"])
            converged = bool(info["converged"])
            note(
                f"{steps}/{budget} steps, E = {float(info['energy']):.8g}, relative change "
                f"{float(info['delta']):.1e}" + (" (converged)" if converged else "")
            )
            if converged:
                break
    info = dict(info, steps=steps)
    if cfg.imprints:
        centers = jnp.asarray([[x, y] for x, y, _ in cfg.imprints])
        charges = jnp.asarray([q for _, _, q in cfg.imprints], jnp.int32)
        psi = C.imprint_vortices(psi, system.grid, centers, charges, core_size=0.5 / np.sqrt(max(cfg.g, 1.0)) + 0.1)
        psi = C.normalize(psi, system.grid)
    return psi, {k: np.asarray(v).item() for k, v in info.items()}


GP_UNITS = {
    "norm": "1",
    "energy_kinetic": "ħω",
    "energy_trap": "ħω",
    "energy_interaction": "ħω",
    "energy_rotation": "ħω",
    "energy_total": "ħω",
    "lz": "ħ",
}  # per particle, trap units


def gp_snapshots(cfg: BECConfig, system: C.GPSystem) -> Snapshots:
    """ψ (or |ψ|² and arg ψ) every ``snapshot_every`` steps at ``snapshot_precision``, on the grid's axes."""
    real = {"float16": jnp.float16, "float32": jnp.float32, "float64": jnp.float64}[cfg.snapshot_precision]
    dims = ("x", "y", "z")[: cfg.dims]

    def fields(psi: jax.Array) -> dict[str, jax.Array]:
        if cfg.snapshot_fields == "psi":
            return {"psi": psi.astype(jnp.result_type(real, jnp.complex64))}
        return {"density": (jnp.abs(psi) ** 2).astype(real), "phase": jnp.angle(psi).astype(real)}

    units = {
        "psi": "(trap length)^(-d/2)",
        "density": "(trap length)^-d",
        "phase": "rad",
        **{d: "trap length" for d in dims},
    }
    return Snapshots(
        every=cfg.snapshot_every,
        fields=fields,
        dims=dims,
        coords={d: np.asarray(c) for d, c in zip(dims, system.grid.coords)},
        units=units,
    )


def _gp_observe(psi: jax.Array, params: C.StrangParams) -> dict:
    """The condensate's own observables, plus ⟨L_z⟩ in 2D/3D."""
    obs = C.observe(psi, params)
    if params.system.grid.ndim >= 2:
        obs["lz"] = C.angular_momentum(psi, params.system)
    return obs


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
    system = gp_system(cfg)
    if resuming:
        state = jnp.zeros(system.grid.shape, system.complex_dtype)  # template; restored from the checkpoint
    else:
        state, extra["ground_state"] = gp_initial_state(cfg, system, progress=progress)
        gs = extra["ground_state"]
        if not gs["converged"]:
            print(
                f"warning: the ground state did not converge in {gs['steps']} imaginary-time steps (last "
                f"relative change {gs['delta']:.2e} > ground_tol {cfg.ground_tol:g}); the evolution starts "
                "from it anyway: raise ground_steps or ground_dt, or loosen ground_tol",
                file=sys.stderr,
            )
        check_local_step(cfg, system, state, "dt", False)

    # The norm projection pins the ground state's norm, 1, for the whole run (resumes included): once per
    # block of save_every steps by default, after every step with project_norm=true.
    stepper = C.strang(system, cfg.dt, project_norm=True if cfg.project_norm else None, norm=1.0)
    # donate: each chunk writes the field into the previous one's buffers (one copy of ψ in memory)
    advance = chunked(stepper, cfg.steps_per_chunk, save_every=cfg.save_every, observe=_gp_observe, donate=True)
    extra["system"] = system
    extra["observation_like"] = jax.eval_shape(_gp_observe, state, stepper.params)
    if sink is not None:
        sink.describe(
            time_unit="1/ω (trap units)",
            units=GP_UNITS,
            snapshots=gp_snapshots(cfg, system) if cfg.snapshot_every else None,
        )
    # the ground-state record travels with every checkpoint, so a resumed run reports it too
    result = run_chunked(
        advance,
        state,
        n_chunks=cfg.steps // cfg.steps_per_chunk,
        steps_per_chunk=cfg.steps_per_chunk,
        checkpointer=checkpointer,
        metadata={"ground_state": extra.get("ground_state")},
        progress=progress,
        description="bec",
        sink=sink,
    )
    if resuming and result.metadata is not None and extra.get("ground_state") is None:
        extra["ground_state"] = result.metadata.get("ground_state")
    return result, extra


def _slice2d(a: np.ndarray) -> np.ndarray:
    """The 2D plane of a 3D/4D array at the middle index of every axis beyond the first two."""
    while a.ndim > 2:
        a = a[..., a.shape[-1] // 2]
    return a


def _slice_label(cfg: BECConfig, ndim: int) -> str:
    """What :func:`_slice2d` shows, for plot titles: '' in 1D/2D, else the z coordinate of the plane."""
    if ndim <= 2:
        return ""
    z = C.Grid.uniform((cfg.grid,) * cfg.dims, cfg.length).coords[2][cfg.grid // 2]
    return f", slice z = {z:.3g} (index {cfg.grid // 2} of {cfg.grid})"


def _state_axes(cfg: BECConfig, system: C.GPSystem) -> tuple[tuple[str, ...], dict, dict]:
    """``(dims, coords, units)`` of the state's axes: ``x, y, z`` in trap lengths."""
    dims = ("x", "y", "z")[: cfg.dims]
    return (
        dims,
        {d: np.asarray(c) for d, c in zip(dims, system.grid.coords)},
        {"final_state": "(trap length)^(-d/2)", **{d: "trap length" for d in dims}},
    )


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
        np.save(os.path.join(out, "final_state.npy"), state)
    ndim = state.ndim
    plane = np.asarray(_slice2d(state))  # what the plots show: the field itself in 1D/2D, the middle plane above
    hist = {k: np.asarray(v) for k, v in result.history.items()}
    # Time of a record: the steps done when it was taken, times dt. Records are taken after every save_every
    # steps, so the first is at t = save_every·dt; the initial state (t = 0) is not a record.
    t = (np.arange(len(next(iter(hist.values())))) + 1) * cfg.save_every * cfg.dt
    paths = {}
    rho = np.abs(plane) ** 2
    ph = np.angle(plane)
    grid = extra["system"].grid
    summary: dict = {
        "config": config_dict(cfg),
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "wall_time_s": result.wall_time_s,
        "t": t,
        "observables": hist,
        "t_convention": "t = steps done when the record was taken x dt; first record at save_every x dt",
        "final": {k: float(v[-1]) for k, v in hist.items()},
        "ground_state": extra.get("ground_state"),
    }
    extent = None
    if grid.ndim >= 2:
        x, y = grid.coords[0], grid.coords[1]
        extent = (x[0], x[-1], y[0], y[-1])
        pos, q = C.vortex_positions(jnp.asarray(plane), grid, min_density=0.1, window=4)
        if grid.ndim == 3:
            summary["plot_slice"] = _slice_label(cfg, 3).lstrip(", ")
        summary["vortices"] = {
            "positions": pos,
            "charges": q,
            "count": int(np.abs(q).sum()),
            "net_charge": int(q.sum()),
        }
    for name, data, cmap, label in (("density", rho, "viridis", "|ψ|²"), ("phase", ph, "twilight", "arg ψ")):
        fig, ax = plt.subplots(figsize=(5, 4))
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
        ax.set_title(f"gp: {label} at t = {t[-1]:.3g}{_slice_label(cfg, ndim)}", fontsize=9)
        paths[name] = save_figure(fig, os.path.join(out, f"{name}.png"))
    keys = [k for k in hist if k.startswith("energy") or k in ("norm", "lz")]
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 1.6 * len(keys)), sharex=True)
    for ax, k in zip(np.atleast_1d(axes), keys):
        ax.plot(t, hist[k])
        ax.set_ylabel(k, fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel("t (trap units 1/ω)")
    fig.suptitle("gp: observables")
    paths["observables_plot"] = save_figure(fig, os.path.join(out, "observables.png"))
    paths["observables"] = write_json(os.path.join(out, "observables.json"), summary)
    paths["final_state"] = os.path.join(out, "final_state.npy")
    return paths


class BECSimulation(Simulation):
    """``ivhl sim bec``: a Gross–Pitaevskii condensate (the GFT condensate is ``ivhl sim gft``)."""

    prog = "ivhl sim bec"
    config_type = BECConfig
    extendable = ("steps",)
    multiprocess = True
    streams = True

    def run(self, cfg: BECConfig, ctx: RunContext) -> dict[str, str]:
        with precision_scope(cfg):
            return self._run(cfg, ctx)

    def _run(self, cfg: BECConfig, ctx: RunContext) -> dict[str, str]:
        result, extra = simulate(
            cfg, checkpointer=ctx.checkpointer, progress=ctx.progress, resuming=ctx.resuming, sink=ctx.sink
        )
        if ctx.sink is not None:  # streamed: the scalar time series come back from disk for the summary and plots
            result = dataclasses.replace(result, history=ctx.sink.read(like=extra["observation_like"]))
        save_state = True
        if ctx.sink is not None:  # the final state goes into the store, each process writing the shards it holds
            dims, coords, units = _state_axes(cfg, extra["system"])
            kept = write_final_state(
                ctx.sink, ctx.out, result.state, dims, step=result.steps, coords=coords, units=units
            )
            if kept is None:  # under `ivhl launch`, process 0 writes the outputs
                return {}
            result, save_state = dataclasses.replace(result, state=kept[0]), kept[1]
        paths = write_outputs(cfg, result, extra, ctx.out, save_state=save_state)
        print(result.rate_line())  # the driver said "resuming from step N" before the run
        return paths

    def default_out(self, cfg: BECConfig, args: argparse.Namespace) -> str:
        return "runs/bec"

    def checkpoint_every(self, cfg: BECConfig) -> int:
        return cfg.checkpoint_every


SIMULATION = BECSimulation()


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(SIMULATION, argv)


if __name__ == "__main__":
    sys.exit(main())
