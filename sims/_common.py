"""What the training programs of ``ivhl train`` share (a module of the simulations package, not a simulation)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.numerics.distributed_fft import mesh_sizes
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext, Simulation, run_checkpointer
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import Advance, RunResult, run_chunked
from ivhl_jax.run.store import RunStore, write_final_state
from ivhl_jax.train.checkpoint import Checkpointer

__all__ = [
    "SHARED_KEYS",
    "shared_key",
    "TrainingSimulation",
    "TrainingRun",
    "train_in_chunks",
    "check_training_steps",
    "checkpoint_every",
    "kept_checkpoints",
    "FieldRunConfig",
    "precision_scope",
    "real_dtype",
    "check_chunked_run",
    "check_field_mesh",
    "middle_plane",
    "run_summary",
    "write_observables",
    "run_field_chunks",
    "FieldSimulation",
]


#: The meaning of each config key several programs share (``--help`` shows it beside the key); the step keys
#: are checked by name by :func:`check_training_steps` in the training programs.
SHARED_KEYS = {
    "steps": "optimiser steps (a multiple of steps_per_chunk)",
    "steps_per_chunk": "steps per compiled chunk (progress lines; checkpoints fall between chunks)",
    "save_every": "steps between recorded observations (divides steps_per_chunk)",
    "warmup_steps": "linear warm-up steps of the learning rate (at most steps)",
    "checkpoint_every": "steps between checkpoints (a multiple of steps_per_chunk; 0: after every chunk)",
    "keep_checkpoints": "how many of the newest checkpoints are kept",
    "clip_norm": "global gradient-norm clip (the largest L2 norm of all the gradients together)",
}


def shared_key(name: str, default: Any) -> Any:
    """The config field of the shared key ``name`` (a key of :data:`SHARED_KEYS`, whose meaning it shows) with its
    ``default``: ``steps_per_chunk: int = shared_key("steps_per_chunk", 50)``."""
    if name not in SHARED_KEYS:
        raise ValueError(f"name must be one of the shared keys {list(SHARED_KEYS)}, got {name!r}")
    return option(default, SHARED_KEYS[name])


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """Where and how a training program's ``train(cfg, run)`` runs.

    Attributes:
      out: the run folder: ``summary.json``, ``metrics.json``, the figures and (without ``checkpointer``) the
        checkpoints under ``out/ckpt``.
      resume: without ``checkpointer``, continue from the latest checkpoint in ``out/ckpt`` (False: start afresh).
      progress: show progress lines.
      plots: write the figures (PNG).
      checkpointer: the driver's checkpointer; None: the run folder ``out`` opens its own.
      stop_after_chunks: end this invocation after that many chunks (as an interruption would; a later run of the
        same configuration resumes from its checkpoint and finishes bit-identically); None: run to ``cfg.steps``.
      sink: the run store the records stream to (the driver's ``run.zarr``): per step over ``time``, per chunk
        over ``chunk_time``; None: the records are kept in memory.
    """

    out: str
    resume: bool = True
    progress: bool = True
    plots: bool = True
    checkpointer: Checkpointer | None = None
    stop_after_chunks: int | None = None
    sink: RunStore | None = None

    @classmethod
    def of(cls, ctx: RunContext) -> TrainingRun:
        """The run the driver prepared (its folder, checkpointer and progress; figures unless ``--no-plots``)."""
        plots = not ctx.args.no_plots
        return cls(ctx.out, progress=ctx.progress, plots=plots, checkpointer=ctx.checkpointer, sink=ctx.sink)


def check_training_steps(cfg: Any) -> None:
    """The step keys of a training configuration, checked by name as every training program reads them:
    ``steps`` and ``steps_per_chunk`` integers >= 1, ``steps`` a whole number of chunks; where the config has
    them, ``warmup_steps`` an integer in [0, steps], ``checkpoint_every`` an integer >= 0 and a multiple of
    ``steps_per_chunk`` (0: after every chunk) and ``keep_checkpoints`` an integer >= 1. A ValueError or
    TypeError names the key."""
    check_scalar(cfg.steps, "steps", integer=True, minimum=1)
    check_scalar(cfg.steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    if cfg.steps % cfg.steps_per_chunk:
        raise ValueError(f"steps ({cfg.steps}) must be a multiple of steps_per_chunk ({cfg.steps_per_chunk})")
    if hasattr(cfg, "warmup_steps"):
        check_scalar(cfg.warmup_steps, "warmup_steps", integer=True, nonnegative=True)
        if cfg.warmup_steps > cfg.steps:
            raise ValueError(f"warmup_steps ({cfg.warmup_steps}) must be <= steps ({cfg.steps})")
    if hasattr(cfg, "checkpoint_every"):
        check_scalar(cfg.checkpoint_every, "checkpoint_every", integer=True, minimum=0)
        if cfg.checkpoint_every % cfg.steps_per_chunk:
            raise ValueError(
                f"checkpoint_every ({cfg.checkpoint_every}) must be a multiple of steps_per_chunk "
                f"({cfg.steps_per_chunk}): checkpoints are written between chunks"
            )
    if hasattr(cfg, "keep_checkpoints"):
        check_scalar(cfg.keep_checkpoints, "keep_checkpoints", integer=True, minimum=1)


def checkpoint_every(cfg: Any) -> int:
    """Steps between the checkpoints of a training run: ``cfg.checkpoint_every`` where the config has it and it is
    not 0, else ``cfg.steps_per_chunk`` (after every chunk)."""
    return int(getattr(cfg, "checkpoint_every", 0) or cfg.steps_per_chunk)


def kept_checkpoints(cfg: Any) -> int:
    """How many checkpoints a training run keeps: ``cfg.keep_checkpoints`` where the config has it, else 2."""
    return int(getattr(cfg, "keep_checkpoints", 2))


def train_in_chunks(
    cfg: Any,
    run: TrainingRun,
    advance: Advance,
    state: Any,
    description: str,
    /,
    *,
    metadata: Mapping[str, Any] | Callable[[int, Any], Mapping[str, Any]] | None = None,
    units: Mapping[str, str] | None = None,
    long_names: Mapping[str, str] | None = None,
) -> RunResult:
    """``cfg.steps // cfg.steps_per_chunk`` chunks (``run.stop_after_chunks``: fewer) of ``advance`` from ``state``,
    resumed from the run's latest checkpoint, shown as ``description`` (with ``run.progress``):
    :func:`ivhl_jax.run.runner.run_chunked` with ``metadata`` under :func:`ivhl_jax.run.driver.run_checkpointer` —
    ``run.checkpointer`` (the driver's), or one the run folder ``run.out`` opens for ``cfg`` (``run.resume``: from
    its latest checkpoint; :func:`checkpoint_every`, :func:`kept_checkpoints`). With ``run.sink`` the records
    stream to the store, described by ``units`` and ``long_names`` (UDUNITS strings, ``"1"`` for a number), and
    the result's ``history`` is read back from it (shaped by the zero-record history ``run_chunked`` returns with a
    sink: ``advance`` is traced once, by ``run_chunked``)."""
    if run.sink is not None:
        run.sink.describe(units=units, long_names=long_names)
    with run_checkpointer(
        run.out,
        cfg,
        checkpointer=run.checkpointer,
        resume=run.resume,
        save_every=checkpoint_every(cfg),
        keep=kept_checkpoints(cfg),
    ) as ckpt:
        n_chunks = cfg.steps // cfg.steps_per_chunk
        if run.stop_after_chunks is not None:
            n_chunks = min(n_chunks, int(run.stop_after_chunks))
        res = run_chunked(
            advance,
            state,
            n_chunks=n_chunks,
            steps_per_chunk=cfg.steps_per_chunk,
            checkpointer=ckpt,
            metadata=metadata,
            progress=run.progress,
            description=description,
            sink=run.sink,
        )
    if run.sink is not None:  # the streamed history holds no record, only the records' tree, names and dtypes
        res.history = run.sink.read(like=res.history)
    return res


class TrainingSimulation(Simulation):
    """``ivhl train NAME``: optimiser steps in compiled chunks of ``cfg.steps_per_chunk``, checkpointed as
    :func:`checkpoint_every` and :func:`kept_checkpoints` say, the outputs in ``runs/<out_folder>`` by default. Its
    command line adds ``--no-plots`` and an on/off option for each entry of ``switches`` (``{"--flag": "help"}``,
    read from the run context's ``args``).

    A subclass sets ``prog``, ``config_type`` and ``out_folder`` and implements :meth:`run`."""

    out_folder: ClassVar[str]
    streams = True
    switches: ClassVar[dict[str, str]] = {}

    def default_out(self, cfg: Any, args: argparse.Namespace) -> str:
        return os.path.join("runs", self.out_folder)

    def checkpoint_every(self, cfg: Any) -> int:
        return checkpoint_every(cfg)

    def keep(self, cfg: Any) -> int:
        return kept_checkpoints(cfg)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--no-plots", action="store_true", help="write no figures (PNG)")
        for flag, meaning in self.switches.items():
            parser.add_argument(flag, action="store_true", help=meaning)


# ----------------------------------------------------------------------------------------------
# What the field simulations (``ivhl sim bec``, ``ivhl sim gft``) share
# ----------------------------------------------------------------------------------------------
def precision_scope(cfg: Any) -> contextlib.AbstractContextManager:
    """The scope a run of ``cfg`` computes in: 64-bit JAX (``jax.enable_x64``) for ``precision=float64``, left as
    it was otherwise; the process-wide setting is never changed."""
    return jax.enable_x64(True) if cfg.precision == "float64" else contextlib.nullcontext()


def real_dtype(cfg: Any, sim: str) -> Any:
    """The real dtype of ``cfg.precision`` (float64 only inside :func:`precision_scope`, else a ValueError naming
    the scope of the simulation module ``sim``, e.g. ``"bec"``)."""
    if cfg.precision == "float64" and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            f"precision=float64 needs 64-bit JAX: run inside sims.{sim}.precision_scope(cfg) (ivhl sim {sim} does) "
            "or `with jax.enable_x64(True):`"
        )
    return jnp.float64 if cfg.precision == "float64" else jnp.float32


@dataclasses.dataclass(frozen=True)
class FieldRunConfig:
    """The loop and precision keys of every field simulation (``ivhl sim bec``, ``ivhl sim gft``), whose
    configurations extend this one (checked by :func:`check_chunked_run`; ``precision`` read by
    :func:`precision_scope` and :func:`real_dtype`)."""

    steps: int = option(2000, "evolution steps (raise it to extend a finished run)")
    steps_per_chunk: int = option(200, "steps per compiled chunk (progress granularity)")
    save_every: int = option(50, "steps between recorded observables")
    checkpoint_every: int = option(1000, "steps between checkpoints (a multiple of steps_per_chunk)")
    precision: Literal["float32", "float64"] = option(
        "float32", '"float32" (complex64 state) or "float64" (complex128)'
    )


def check_chunked_run(cfg: Any, counts: tuple[str, ...] = ()) -> None:
    """The loop keys of a field simulation: ``steps``, ``steps_per_chunk``, ``save_every``, ``checkpoint_every``
    (and the other ``counts``) >= 1, ``steps`` whole chunks, a chunk whole records, checkpoints between chunks."""
    for name in ("steps", "steps_per_chunk", "save_every", "checkpoint_every", *counts):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.steps % cfg.steps_per_chunk:
        raise ValueError(f"steps ({cfg.steps}) must be a multiple of steps_per_chunk ({cfg.steps_per_chunk})")
    if cfg.steps_per_chunk % cfg.save_every:
        raise ValueError(f"steps_per_chunk ({cfg.steps_per_chunk}) must be a multiple of save_every ({cfg.save_every})")
    if cfg.checkpoint_every % cfg.steps_per_chunk:
        raise ValueError(
            f"checkpoint_every ({cfg.checkpoint_every}) must be a multiple of steps_per_chunk ({cfg.steps_per_chunk})"
        )


def check_field_mesh(mesh: int | str, n: int, ndim: int, what: str) -> tuple[int, ...]:
    """The sizes of ``mesh`` (:func:`~ivhl_jax.numerics.distributed_fft.mesh_sizes`) for a field of ``n`` points
    on each of ``ndim`` axes (``what``: "grid", "lattice"): one axis left unsplit for the distributed FFT, every
    size dividing ``n``; else a ValueError with a mesh that works."""
    sizes = mesh_sizes(mesh)
    if len(sizes) >= ndim and math.prod(sizes) > 1:
        raise ValueError(
            f"mesh={mesh!r} splits {len(sizes)} axes of a {ndim}-D {what}; the distributed FFT needs one axis "
            f"unsplit: use at most {ndim - 1} sizes (e.g. mesh={math.prod(sizes)})"
        )
    if any(n % p for p in sizes):
        raise ValueError(
            f"mesh={mesh!r} does not divide the {what} ({n} points per axis): every mesh size must divide {n} "
            f"(e.g. mesh={math.gcd(n, math.prod(sizes))})"
        )
    return sizes


def middle_plane(a: np.ndarray) -> np.ndarray:
    """The 2D plane of a 3D/4D array at the middle index of every axis beyond the first two."""
    while a.ndim > 2:
        a = a[..., a.shape[-1] // 2]
    return a


def run_summary(cfg: Any, result: RunResult) -> tuple[np.ndarray, dict]:
    """The record times and the summary a field simulation writes to observables.json: t of a record is the steps
    done when it was taken times dt (records follow every ``save_every`` steps, so the first is at
    t = save_every·dt; the initial state is not a record); the config, the steps, the time series and their
    final values."""
    hist = {k: np.asarray(v) for k, v in result.history.items()}
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
    }
    return t, summary


def write_observables(out: str, summary: dict, keys: list[str], title: str, units: tuple[str, str]) -> dict[str, str]:
    """observables.png (one panel per record of ``keys`` against t, ``units``: the y-label suffix and the x label)
    and observables.json (``summary``); returns their paths and final_state.npy's."""
    import matplotlib.pyplot as plt

    hist, t = summary["observables"], summary["t"]
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 1.6 * len(keys)), sharex=True)
    for ax, k in zip(np.atleast_1d(axes), keys):
        ax.plot(t, hist[k])
        ax.set_ylabel(f"{k}{units[0]}", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel(units[1])
    fig.suptitle(f"{title}: observables")
    return {
        "observables_plot": save_figure(fig, os.path.join(out, "observables.png")),
        "observables": write_json(os.path.join(out, "observables.json"), summary),
        "final_state": os.path.join(out, "final_state.npy"),
    }


class FieldSimulation(Simulation):
    """A field simulation (``ivhl sim bec``, ``ivhl sim gft``): run in :func:`precision_scope`, the records and
    the final state streamed to the run store (each process writing the shards it holds), the outputs in
    ``runs/<out_folder>`` by default, ``steps`` extendable.

    A subclass sets ``prog``, ``config_type`` and ``out_folder`` and implements :meth:`simulate` (the run: its
    :class:`~ivhl_jax.run.runner.RunResult` and an ``extra`` dict holding ``"observation_like"``),
    :meth:`state_axes` (the final state's dims, coords and units in the store) and :meth:`write_outputs`."""

    out_folder: ClassVar[str]
    extendable = ("steps",)
    multiprocess = True
    streams = True

    def simulate(self, cfg: Any, ctx: RunContext) -> tuple[RunResult, dict]:
        raise NotImplementedError

    def state_axes(self, cfg: Any, extra: dict) -> tuple[tuple[str, ...], dict, dict]:
        raise NotImplementedError

    def write_outputs(self, cfg: Any, result: RunResult, extra: dict, out: str, *, save_state: bool) -> dict:
        raise NotImplementedError

    def run(self, cfg: Any, ctx: RunContext) -> dict[str, str]:
        with precision_scope(cfg):
            result, extra = self.simulate(cfg, ctx)
            if ctx.sink is not None:  # streamed: the time series come back from disk for the summary and plots
                result = dataclasses.replace(result, history=ctx.sink.read(like=extra["observation_like"]))
            save_state = True
            if ctx.sink is not None:  # the final state goes into the store, each process writing its shards
                dims, coords, units = self.state_axes(cfg, extra)
                kept = write_final_state(
                    ctx.sink, ctx.out, result.state, dims, step=result.steps, coords=coords, units=units
                )
                if kept is None:  # under `ivhl launch`, process 0 writes the outputs
                    return {}
                result, save_state = dataclasses.replace(result, state=kept[0]), kept[1]
            paths = self.write_outputs(cfg, result, extra, ctx.out, save_state=save_state)
        print(result.rate_line())  # the driver said "resuming from step N" before the run
        return paths

    def default_out(self, cfg: Any, args: argparse.Namespace) -> str:
        return os.path.join("runs", self.out_folder)

    def checkpoint_every(self, cfg: Any) -> int:
        return int(cfg.checkpoint_every)


def run_field_chunks(
    cfg: Any,
    advance: Advance,
    state: Any,
    description: str,
    *,
    checkpointer: Checkpointer | None,
    metadata: Mapping[str, Any],
    progress: bool,
    sink: RunStore | None,
) -> RunResult:
    """``cfg.steps // cfg.steps_per_chunk`` chunks of ``advance`` from ``state`` (or the checkpoint), shown as
    ``description``: :func:`ivhl_jax.run.runner.run_chunked` with ``metadata`` in every checkpoint and the records
    streamed to ``sink`` when given."""
    return run_chunked(
        advance,
        state,
        n_chunks=cfg.steps // cfg.steps_per_chunk,
        steps_per_chunk=cfg.steps_per_chunk,
        checkpointer=checkpointer,
        metadata=metadata,
        progress=progress,
        description=description,
        sink=sink,
    )
