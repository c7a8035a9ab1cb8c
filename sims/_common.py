"""What the training programs of ``ivhl train`` share (a module of the simulations package, not a simulation)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.run.config import option
from ivhl_jax.run.driver import RunContext, Simulation, run_checkpointer
from ivhl_jax.run.runner import Advance, RunResult, run_chunked
from ivhl_jax.run.store import RunStore
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
