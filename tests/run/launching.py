"""What the tests of ``ivhl launch`` share: the launcher's command line, the environment its jobs run in, and a
run store's files to compare two runs by."""

from __future__ import annotations

import json
import os
import sys


def launch_command(
    *program: str,
    nproc: int = 2,
    devices_per_process: int | None = None,
    heartbeat_timeout: float | None = None,
    grace: float | None = None,
    timeout: float | None = None,
) -> list[str]:
    """``python -m ivhl_jax.run.launch --nproc N [options] -- python PROGRAM...``: ``program`` is what each
    process runs after the interpreter (a script and its arguments, or ``-m module ...``)."""
    cmd = [sys.executable, "-m", "ivhl_jax.run.launch", "--nproc", str(nproc)]
    for flag, value in (
        ("--devices-per-process", devices_per_process),
        ("--heartbeat-timeout", heartbeat_timeout),
        ("--grace", grace),
        ("--timeout", timeout),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return [*cmd, "--", sys.executable, *program]


def launch_env(**extra: str) -> dict[str, str]:
    """This process's environment less every ``IVHL_`` variable, on the CPU, with no persistent compilation cache
    and a headless plot backend (``extra`` added last)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IVHL_")}
    env.update(JAX_PLATFORMS="cpu", IVHL_COMPILATION_CACHE="0", MPLBACKEND="Agg", **extra)
    return env


def store_files(path) -> dict[str, object]:
    """Every file of a run store by its path in the store: its bytes, a ``zarr.json`` parsed and less what differs
    between two runs of one configuration (the library and runtime it ran on, its settings and creation date)."""
    out: dict[str, object] = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if f == "zarr.json":
                with open(p) as fh:
                    doc = json.load(fh)
                for k in ("library", "runtime", "settings", "date_created"):
                    doc.get("attributes", {}).pop(k, None)
                out[os.path.relpath(p, path)] = doc
            else:
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, path)] = fh.read()
    return out
