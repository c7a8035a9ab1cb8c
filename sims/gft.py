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

import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.distributed_fft import parse_mesh
from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import gft as G
from ivhl_jax.run.config import option
from ivhl_jax.run.driver import RunContext
from ivhl_jax.run.io import save_figure, save_npy
from ivhl_jax.run.runner import RunResult
from ivhl_jax.run.store import RunStore
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
class GFTConfig(FieldRunConfig):
    """Run configuration (TOML/JSON keys; ``--set key=value``); the loop keys and ``precision`` are those of
    :class:`~ivhl_jax.sims._common.FieldRunConfig`."""

    rank: int = option(3, "rank r of the lattice (1..4)")
    grid: int = option(16, "points per lattice axis")
    mass_sq: float = option(-0.5, "mass term m² (< 0: symmetry breaking)")
    lam: float = option(0.1, "quartic coupling λ")
    noise: float = option(0.05, "amplitude of the initial complex noise")
    imaginary: bool = option(False, "gradient flow instead of real time")
    dt: float = option(2e-3, "time step (lattice units)")
    mesh: int | str = option(
        1,
        'Device mesh of the field: "1" (one device), "8" (a slab: the first lattice axis over 8 devices) or "4x2" '
        "(a pencil: the first two axes over 4 × 2); the product is the number of devices of all processes (also "
        "under `ivhl launch`), see ivhl_jax.numerics.distributed_fft.",
    )
    seed: int = option(0, "PRNG seed of the initial field")

    def validate(self) -> None:
        """Every value checked before any work (one ValueError naming the key and the fix)."""
        if not 1 <= self.rank <= 4:
            raise ValueError(f"rank must be 1..4, got {self.rank}")
        if self.grid < 2:
            raise ValueError(f"grid must be >= 2 (points per axis), got {self.grid}")
        for name in ("dt", "lam"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not math.isfinite(self.mass_sq):
            raise ValueError(f"mass_sq must be a finite number, got {self.mass_sq}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, got {self.noise}")
        check_field_mesh(self.mesh, self.grid, self.rank, "lattice")
        check_chunked_run(self)
        # The split-step stability bound of real time (the builder checks it too; here a bad dt fails before any
        # work). The gradient flow has no such bound.
        bound = G.max_stable_dt((self.grid,) * self.rank)
        if self.dt > bound and not self.imaginary:
            raise ValueError(
                f"dt={self.dt:g} is beyond the split-step stability bound of this lattice "
                f"(rank={self.rank}): use dt <= {bound:.3g} (or imaginary=true)"
            )


def _dtype(cfg: GFTConfig) -> Any:
    return real_dtype(cfg, "gft")


def gft_system(cfg: GFTConfig) -> G.GFTSystem:
    return G.GFTSystem.create((cfg.grid,) * cfg.rank, cfg.mass_sq, cfg.lam, layout=parse_mesh(cfg.mesh, cfg.rank))


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
    result = run_field_chunks(
        cfg, advance, state, "gft", checkpointer=checkpointer, metadata={"model": "gft"}, progress=progress, sink=sink
    )
    return result, extra


def _slice_label(cfg: GFTConfig, ndim: int) -> str:
    """What :func:`~ivhl_jax.sims._common.middle_plane` shows, for plot titles: '' for rank 1/2, else the fixed
    sites of the plane."""
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
    plane = np.asarray(middle_plane(state))
    t, summary = run_summary(cfg, result)
    summary["vacuum"] = dict(zip(("abs2", "energy_per_site"), G.vacuum(cfg.mass_sq, cfg.lam)))
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
    keys = [k for k in summary["observables"] if k.startswith("energy") or k in ("charge", "order")]
    paths.update(write_observables(out, summary, keys, "gft", (" (lattice units)", "t (lattice units)")))
    return paths


class GFTSimulation(FieldSimulation):
    """``ivhl sim gft``: the GFT condensate in real time or its gradient flow."""

    prog = "ivhl sim gft"
    config_type = GFTConfig
    out_folder = "gft"

    def simulate(self, cfg: GFTConfig, ctx: RunContext) -> tuple[RunResult, dict]:
        return simulate(cfg, checkpointer=ctx.checkpointer, progress=ctx.progress, sink=ctx.sink)

    def state_axes(self, cfg: GFTConfig, extra: dict) -> tuple[tuple[str, ...], dict, dict]:
        dims = tuple(f"axis{i + 1}" for i in range(cfg.rank))
        sites = np.arange(cfg.grid, dtype=np.int32)  # the lattice site index along each group argument
        return dims, {d: sites for d in dims}, {"final_state": "1", **{d: "1" for d in dims}}

    def write_outputs(self, cfg: GFTConfig, result: RunResult, extra: dict, out: str, *, save_state: bool) -> dict:
        return write_outputs(cfg, result, out, save_state=save_state)


SIMULATION = GFTSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
