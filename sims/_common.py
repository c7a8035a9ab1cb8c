"""What the training programs of ``ivhl train`` share (a module of the simulations package, not a simulation)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ivhl_jax.run.driver import Simulation, run_checkpointer
from ivhl_jax.run.runner import Advance, RunResult, run_chunked
from ivhl_jax.train.checkpoint import Checkpointer

__all__ = ["TrainingSimulation", "train_in_chunks"]


def train_in_chunks(
    cfg: Any,
    out: str,
    advance: Advance,
    state: Any,
    *,
    description: str,
    checkpointer: Checkpointer | None,
    resume: bool,
    progress: bool,
    save_every: int | None = None,
    keep: int = 2,
    n_chunks: int | None = None,
    metadata: Mapping[str, Any] | Callable[[int, Any], Mapping[str, Any]] | None = None,
) -> RunResult:
    """``cfg.steps // cfg.steps_per_chunk`` chunks (``n_chunks``: fewer) of ``advance`` from ``state``, resumed from
    the run's latest checkpoint: :func:`ivhl_jax.run.runner.run_chunked` with ``metadata`` under
    :func:`ivhl_jax.run.driver.run_checkpointer` — ``checkpointer`` (the driver's), or one the run folder ``out``
    opens for ``cfg``, saving every ``save_every`` steps (default: after each chunk) and keeping the last
    ``keep``."""
    with run_checkpointer(
        out,
        cfg,
        checkpointer=checkpointer,
        resume=resume,
        save_every=save_every or cfg.steps_per_chunk,
        keep=keep,
    ) as ckpt:
        return run_chunked(
            advance,
            state,
            n_chunks=cfg.steps // cfg.steps_per_chunk if n_chunks is None else n_chunks,
            steps_per_chunk=cfg.steps_per_chunk,
            checkpointer=ckpt,
            metadata=metadata,
            progress=progress,
            description=description,
        )


class TrainingSimulation(Simulation):
    """``ivhl train NAME``: optimiser steps in compiled chunks of ``cfg.steps_per_chunk``, a checkpoint after each
    chunk with the last two kept, the outputs in ``runs/<out_folder>`` by default; its command line adds
    ``--no-plots`` and an on/off option for each entry of ``switches`` (``{"--flag": "help"}``, read from the run
    context's ``args``).

    A subclass sets ``prog``, ``config_type`` and ``out_folder`` and implements :meth:`run`."""

    out_folder: ClassVar[str]
    switches: ClassVar[dict[str, str]] = {}

    def default_out(self, cfg: Any, args: argparse.Namespace) -> str:
        return os.path.join("runs", self.out_folder)

    def checkpoint_every(self, cfg: Any) -> int:
        return int(cfg.steps_per_chunk)

    def keep(self, cfg: Any) -> int:
        return 2

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--no-plots", action="store_true", help="write no figures (PNG)")
        for flag, meaning in self.switches.items():
            parser.add_argument(flag, action="store_true", help=meaning)
