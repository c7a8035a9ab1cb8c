"""Run-folder locks: one run writes a run folder at a time.

:func:`lock_run_dir` takes an exclusive ``fcntl.flock`` on ``<out>/.lock`` for the rest of the process (the
kernel drops it when the process ends, even on a crash); a second run into the same folder fails at once with
:class:`RunDirLockedError` naming the folder and the holder's pid, instead of racing on the checkpoints.
:func:`ivhl_jax.run.config.prepare_run_dir` and :class:`ivhl_jax.run.store.RunStore` take it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import sys
from typing import Any

__all__ = ["lock_run_dir", "release_run_dir", "check_out_dir", "RunDirLockedError"]


class RunDirLockedError(RuntimeError, ValueError):
    """Another run holds the output folder's lock (a ValueError too, so CLIs report it like a config error)."""


_RUN_LOCKS: dict[str, Any] = {}  # realpath of a run folder -> the open lock file this process holds


def _release_run_locks() -> None:
    for path in list(_RUN_LOCKS):
        release_run_dir(path)


atexit.register(_release_run_locks)


def check_out_dir(out: Any) -> str:
    """``out`` as a non-empty path string that is, or can become, a folder (the nearest existing part of the
    path is a folder); a ValueError naming ``--out`` otherwise."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise ValueError(f"out must be a non-empty folder path (--out), got {out!r}")
    out = os.fspath(out)
    probe = out
    while not os.path.exists(probe):  # the nearest part of the path that exists must be a folder
        parent = os.path.dirname(os.path.abspath(probe))
        if parent == os.path.abspath(probe):
            break
        probe = parent
    if os.path.exists(probe) and not os.path.isdir(probe):
        where = "is a file" if probe == out else f"lies under {probe}, which is a file"
        raise ValueError(
            f"output folder {out} (--out) {where}, not a folder; pass a folder path (it is created if missing)"
        )
    return out


def lock_run_dir(out: str | os.PathLike) -> str:
    """Take an exclusive ``fcntl.flock`` on ``out/.lock`` for the rest of this process; return the lock file's path.

    The lock is held until :func:`release_run_dir` or process exit (the kernel drops it even on a crash), so a
    second run into the same folder fails at once with :class:`RunDirLockedError` instead of racing on the
    checkpoints. Taking it again in the process that holds it is a no-op. In a multi-process JAX run only
    process 0 locks (all processes share the folder).
    """
    out = check_out_dir(out)
    real = os.path.realpath(out)
    path = os.path.join(real, ".lock")
    if real in _RUN_LOCKS:
        return path
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized() and jax.process_index() != 0:
        return path
    os.makedirs(real, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise RunDirLockedError(
            f"output folder {out} is in use: another run holds its lock {path}"
            + (f" ({holder})" if holder else "")
            + "; wait for it to finish or use another --out"
        ) from e
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    _RUN_LOCKS[real] = f
    return path


def release_run_dir(out: str | os.PathLike) -> None:
    """Release the lock :func:`lock_run_dir` took on ``out`` (nothing if this process holds none)."""
    f = _RUN_LOCKS.pop(os.path.realpath(os.fspath(out)), None)
    if f is not None:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
