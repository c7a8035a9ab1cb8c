"""GFT condensate simulation: a complex field on a periodic rank-r lattice, real time or gradient flow.

The field evolves under i∂φ/∂t = δV/δφ* = −Δφ + m²φ + λ|φ|²φ (lattice units) from small noise (m² < 0:
symmetry breaking), or under its gradient flow ∂φ/∂τ = −δV/δφ* with ``imaginary=true``
(:func:`ivhl_jax.physics.gft.strang`).

The time loop runs in jitted chunks (:func:`ivhl_jax.run.runner.run_chunked`) with checkpoints in
<out>/ckpt; an interrupted run resumes bit-exactly, and raising ``steps`` extends a finished one.
Outputs in <out>: density.png, phase.png (rank 3/4: the plane through the middle of the other axes, named in
the title), observables.png, observables.json (time series, summary and the uniform vacuum), final_state.npy,
and run.zarr: the run store (:func:`ivhl_jax.run.open_run`) with the records and the final state. Time: a
record's t is the number of steps done when it was taken times dt; the first is at t = save_every·dt.

  ivhl sim gft --set rank=3 --set grid=16 --set mass_sq=-0.5
  ivhl sim gft --set rank=2 --set imaginary=true --set dt=0.05 --out runs/gft_flow
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.distributed_fft import mesh_sizes, parse_mesh
from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import gft as G
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext, Simulation
from ivhl_jax.run.io import save_figure, save_npy, write_json
from ivhl_jax.run.runner import RunResult, run_chunked
from ivhl_jax.run.store import RunStore, write_final_state
from ivhl_jax.sims import entry_point
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class GFTConfig:
    """Run configuration (TOML/JSON keys; ``--set key=value``)."""

    rank: int = option(3, "rank r of the lattice (1..4)")
    grid: int = option(16, "points per lattice axis")
    mass_sq: float = option(-0.5, "mass term m² (< 0: symmetry breaking)")
    lam: float = option(0.1, "quartic coupling λ")
    noise: float = option(0.05, "amplitude of the initial complex noise")
    imaginary: bool = option(False, "gradient flow instead of real time")
    dt: float = option(2e-3, "time step (lattice units)")
    steps: int = option(2000, "evolution steps (raise it to extend a finished run)")
    steps_per_chunk: int = option(200, "steps per compiled chunk (progress granularity)")
    save_every: int = option(50, "steps between recorded observables")
    checkpoint_every: int = option(1000, "steps between checkpoints (a multiple of steps_per_chunk)")
    mesh: int | str = option(
        1,
        'Device mesh of the field: "1" (one device), "8" (a slab: the first lattice axis over 8 devices) or "4x2" '
        "(a pencil: the first two axes over 4 × 2); the product is the number of devices of all processes (also "
        "under `ivhl launch`), see ivhl_jax.numerics.distributed_fft.",
    )
    seed: int = option(0, "PRNG seed of the initial field")
    precision: Literal["float32", "float64"] = option(
        "float32", '"float32" (complex64 state) or "float64" (complex128)'
    )

    def validate(self) -> None:
        """Every value checked before any work (one ValueError naming the key and the fix)."""
        if not 1 <= self.rank <= 4:
            raise ValueError(f"rank must be 1..4, got {self.rank}")
        if self.grid < 2:
            raise ValueError(f"grid must be >= 2 (points per axis), got {self.grid}")
        for name in ("steps", "steps_per_chunk", "save_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dt", "lam"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not math.isfinite(self.mass_sq):
            raise ValueError(f"mass_sq must be a finite number, got {self.mass_sq}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, got {self.noise}")
        sizes = mesh_sizes(self.mesh)
        if len(sizes) >= self.rank and math.prod(sizes) > 1:
            raise ValueError(
                f"mesh={self.mesh!r} splits {len(sizes)} axes of a {self.rank}-D lattice; the "
                f"distributed FFT needs one axis unsplit: use at most {self.rank - 1} sizes "
                f"(e.g. mesh={math.prod(sizes)})"
            )
        if any(self.grid % p for p in sizes):
            raise ValueError(
                f"mesh={self.mesh!r} does not divide the lattice ({self.grid} points per axis): every "
                f"mesh size must divide {self.grid} (e.g. mesh={math.gcd(self.grid, math.prod(sizes))})"
            )
        if self.steps % self.steps_per_chunk:
            raise ValueError(f"steps ({self.steps}) must be a multiple of steps_per_chunk ({self.steps_per_chunk})")
        if self.steps_per_chunk % self.save_every:
            raise ValueError(
                f"steps_per_chunk ({self.steps_per_chunk}) must be a multiple of save_every ({self.save_every})"
            )
        if self.checkpoint_every % self.steps_per_chunk:
            raise ValueError(
                f"checkpoint_every ({self.checkpoint_every}) must be a multiple of steps_per_chunk "
                f"({self.steps_per_chunk})"
            )
        # The split-step stability bound of real time (the builder checks it too; here a bad dt fails before any
        # work). The gradient flow has no such bound.
        bound = G.max_stable_dt((self.grid,) * self.rank)
        if self.dt > bound and not self.imaginary:
            raise ValueError(
                f"dt={self.dt:g} is beyond the split-step stability bound of this lattice "
                f"(rank={self.rank}): use dt <= {bound:.3g} (or imaginary=true)"
            )


def precision_scope(cfg: GFTConfig) -> contextlib.AbstractContextManager:
    """The scope a run of ``cfg`` computes in: 64-bit JAX (``jax.enable_x64``) for ``precision=float64``, left as
    it was otherwise; the process-wide setting is never changed."""
    return jax.enable_x64(True) if cfg.precision == "float64" else contextlib.nullcontext()


def _dtype(cfg: GFTConfig):
    if cfg.precision == "float64" and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "precision=float64 needs 64-bit JAX: run inside sims.gft.precision_scope(cfg) (ivhl sim gft does) or "
            "`with jax.enable_x64(True):`"
        )
    return jnp.float64 if cfg.precision == "float64" else jnp.float32


def gft_system(cfg: GFTConfig) -> G.GFTSystem:
    return G.GFTSystem((cfg.grid,) * cfg.rank, cfg.mass_sq, cfg.lam, layout=parse_mesh(cfg.mesh, cfg.rank))


def initial_state(cfg: GFTConfig) -> jax.Array:
    """Complex Gaussian noise of amplitude ``noise`` on every site (seeded by ``seed``)."""
    shape = (cfg.grid,) * cfg.rank
    kr, ki = jax.random.split(jax.random.key(cfg.seed))
    rdt = _dtype(cfg)
    return cfg.noise * jax.lax.complex(jax.random.normal(kr, shape, rdt), jax.random.normal(ki, shape, rdt))


def simulate(
    cfg: GFTConfig, *, checkpointer: Checkpointer | None = None, progress: bool = True, sink: RunStore | None = None
) -> tuple[RunResult, dict]:
    """Build the stepper and run the chunked loop from the initial noise (or the checkpoint). With ``sink`` the
    observations go to disk chunk by chunk (``result.history`` holds none; ``extra["observation_like"]`` is the
    structure to read them back with)."""
    system = gft_system(cfg)
    stepper = G.strang(system, cfg.dt, imaginary=cfg.imaginary, policy="f64" if _dtype(cfg) == jnp.float64 else "f32")
    state = stepper.init(initial_state(cfg))
    advance = chunked(stepper, cfg.steps_per_chunk, save_every=cfg.save_every, observe=G.observe, donate=True)
    extra = {"system": system, "observation_like": jax.eval_shape(G.observe, state, stepper.params)}
    if sink is not None:  # lattice units (unit spacing, ħ = 1): time and every record are pure numbers
        sink.describe(time_unit="1", units={name: "1" for name in extra["observation_like"]})
    result = run_chunked(
        advance,
        state,
        n_chunks=cfg.steps // cfg.steps_per_chunk,
        steps_per_chunk=cfg.steps_per_chunk,
        checkpointer=checkpointer,
        metadata={"model": "gft"},
        progress=progress,
        description="gft",
        sink=sink,
    )
    return result, extra


def _slice2d(a: np.ndarray) -> np.ndarray:
    """The 2D plane of a 3D/4D array at the middle index of every axis beyond the first two."""
    while a.ndim > 2:
        a = a[..., a.shape[-1] // 2]
    return a


def _slice_label(cfg: GFTConfig, ndim: int) -> str:
    """What :func:`_slice2d` shows, for plot titles: '' for rank 1/2, else the fixed sites of the plane."""
    if ndim <= 2:
        return ""
    fixed = ", ".join(f"axis {a + 1} = {cfg.grid // 2}" for a in range(2, ndim))
    return f", slice {fixed} (of {cfg.grid} sites)"


def write_outputs(cfg: GFTConfig, result: RunResult, out: str, *, save_state: bool = True) -> dict[str, str]:
    """The plots, observables.json and (with ``save_state``) final_state.npy of a finished run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    state = result.state if isinstance(result.state, np.ndarray) else np.asarray(result.state)
    if save_state:
        save_npy(os.path.join(out, "final_state.npy"), state)
    plane = np.asarray(_slice2d(state))
    hist = {k: np.asarray(v) for k, v in result.history.items()}
    # Time of a record: the steps done when it was taken, times dt; the first is at t = save_every·dt.
    t = (np.arange(len(next(iter(hist.values())))) + 1) * cfg.save_every * cfg.dt
    summary: dict = {
        "config": config_dict(cfg),
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "wall_time_s": result.wall_time_s,
        "t": t,
        "observables": hist,
        "t_convention": "t = steps done when the record was taken x dt; first record at save_every x dt",
        "final": {k: float(v[-1]) for k, v in hist.items()},
        "vacuum": dict(zip(("abs2", "energy_per_site"), G.vacuum(cfg.mass_sq, cfg.lam))),
    }
    paths = {}
    for name, data, cmap, label in (
        ("density", np.abs(plane) ** 2, "viridis", "|φ|² (lattice units)"),
        ("phase", np.angle(plane), "twilight", "arg φ (rad)"),
    ):
        fig, ax = plt.subplots(figsize=(5, 4))
        if data.ndim == 1:
            ax.plot(np.arange(data.size), data)
            ax.set_ylabel(label)
            ax.set_xlabel("lattice site (lattice spacings)")
        else:
            im = ax.imshow(data.T, origin="lower", cmap=cmap)
            fig.colorbar(im, ax=ax, label=label)
            ax.set_xlabel("lattice axis 1 (lattice spacings)")
            ax.set_ylabel("lattice axis 2 (lattice spacings)")
        ax.set_title(f"gft: {label} at t = {t[-1]:.3g}{_slice_label(cfg, state.ndim)}", fontsize=9)
        paths[name] = save_figure(fig, os.path.join(out, f"{name}.png"))
    keys = [k for k in hist if k.startswith("energy") or k in ("charge", "order")]
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 1.6 * len(keys)), sharex=True)
    for ax, k in zip(np.atleast_1d(axes), keys):
        ax.plot(t, hist[k])
        ax.set_ylabel(f"{k} (lattice units)", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel("t (lattice units)")
    fig.suptitle("gft: observables")
    paths["observables_plot"] = save_figure(fig, os.path.join(out, "observables.png"))
    paths["observables"] = write_json(os.path.join(out, "observables.json"), summary)
    paths["final_state"] = os.path.join(out, "final_state.npy")
    return paths


class GFTSimulation(Simulation):
    """``ivhl sim gft``: the GFT condensate in real time or its gradient flow."""

    prog = "ivhl sim gft"
    config_type = GFTConfig
    extendable = ("steps",)
    multiprocess = True
    streams = True

    def run(self, cfg: GFTConfig, ctx: RunContext) -> dict[str, str]:
        with precision_scope(cfg):
            return self._run(cfg, ctx)

    def _run(self, cfg: GFTConfig, ctx: RunContext) -> dict[str, str]:
        result, extra = simulate(cfg, checkpointer=ctx.checkpointer, progress=ctx.progress, sink=ctx.sink)
        if ctx.sink is not None:  # streamed: the scalar time series come back from disk for the summary and plots
            result = dataclasses.replace(result, history=ctx.sink.read(like=extra["observation_like"]))
        save_state = True
        if ctx.sink is not None:  # the final state goes into the store, each process writing the shards it holds
            dims = tuple(f"axis{i + 1}" for i in range(cfg.rank))
            sites = np.arange(cfg.grid, dtype=np.int32)  # the lattice site index along each group argument
            kept = write_final_state(
                ctx.sink,
                ctx.out,
                result.state,
                dims,
                step=result.steps,
                coords={d: sites for d in dims},
                units={"final_state": "1", **{d: "1" for d in dims}},
            )
            if kept is None:  # under `ivhl launch`, process 0 writes the outputs
                return {}
            result, save_state = dataclasses.replace(result, state=kept[0]), kept[1]
        paths = write_outputs(cfg, result, ctx.out, save_state=save_state)
        print(result.rate_line())  # the driver said "resuming from step N" before the run
        return paths

    def default_out(self, cfg: GFTConfig, args: argparse.Namespace) -> str:
        return "runs/gft"

    def checkpoint_every(self, cfg: GFTConfig) -> int:
        return cfg.checkpoint_every


SIMULATION = GFTSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
