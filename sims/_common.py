"""What the training programs of ``ivhl train`` share (a module of the simulations package, not a simulation)."""

from __future__ import annotations

import argparse
import os
from typing import Any, ClassVar

from ivhl_jax.run.driver import Simulation

__all__ = ["TrainingSimulation"]


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
