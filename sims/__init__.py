"""Runnable simulations (imported as ``ivhl_jax.sims``).

Each simulation is a module ``ivhl_jax.sims.<name>`` holding one ``SIMULATION``, an instance of its
:class:`ivhl_jax.run.driver.Simulation` subclass: ``ivhl sim <name>`` runs it through :func:`run` (and
``ivhl train <name>`` the one of ``ivhl_jax.sims.train_<name>``). The module's ``main(argv=None) -> int``
(:func:`entry_point`) is the same command line as a function, for scripts and tests; it is also what
``python -m ivhl_jax.sims.<name>`` runs.

A simulation may offer other programs on its command line through ``commands``, ``{flag: program}``: a flag
present in the arguments runs ``program(argv) -> exit status`` on all of them instead of the simulation
(``ivhl train lm --generate`` samples from a trained run).

Importing this package starts nothing (the command line lists the simulations through it): the driver is
imported when a simulation runs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ivhl_jax.run.driver import Simulation

__all__ = ["run", "entry_point"]


def run(sim: Simulation, argv: Sequence[str] | None = None) -> int:
    """Run ``sim`` on the command line ``argv`` (default ``sys.argv[1:]``); the exit status.

    :func:`ivhl_jax.run.driver.run_main` does the run, unless ``argv`` holds a flag of ``sim.commands``, whose
    program then takes the whole of ``argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands: Mapping[str, Callable[[list[str]], int]] = getattr(sim, "commands", {})
    for flag, program in commands.items():
        if flag in args:
            return int(program(args) or 0)
    from ivhl_jax.run.driver import run_main

    return run_main(sim, args)


def entry_point(sim: Simulation, module: str) -> functools.partial[int]:
    """``sim``'s command line as a function ``main(argv=None) -> exit status`` (:func:`run` bound to ``sim``).

    ``module`` is the ``__name__`` of the simulation's module: ``"__main__"`` when it runs as a program
    (``python -m ivhl_jax.sims.NAME``), and then the command line runs at once and the process exits with its
    status (what ``if __name__ == "__main__": sys.exit(main())`` would say in every module)."""
    main = functools.partial(run, sim)
    if module == "__main__":
        sys.exit(main())
    return main
