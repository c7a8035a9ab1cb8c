"""Run-folder locks: one run writes a run folder at a time.

:func:`run_dir_lock` (a context manager) holds an exclusive ``fcntl.flock`` on ``<out>/.lock`` while a run
writes the folder and releases it when the run ends (the kernel drops it too when the process dies, even on a
crash); a second run into the same folder fails at once with :class:`RunDirLockedError` naming the folder and
the holder's pid, instead of racing on the checkpoints. Within one process the holds nest: the driver, the run
store (:class:`ivhl_jax.run.store.RunStore`) and the checkpointer (:class:`ivhl_jax.train.checkpoint.Checkpointer`,
which locks the folder that holds its checkpoint folder) share one lock, released when the last of them lets
go. :func:`lock_run_dir` / :func:`release_run_dir` are the same hold without the ``with``.

The lock file is opened without following a symbolic link (``O_NOFOLLOW``): a ``.lock`` that is a link is
refused, so a crafted run folder cannot make a run truncate a file elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = [
    "run_dir_lock",
    "lock_run_dir",
    "release_run_dir",
    "check_out_dir",
    "check_not_link",
    "RunDirLockedError",
    "LOCK_NAME",
]

LOCK_NAME = ".lock"


class RunDirLockedError(RuntimeError, ValueError):
    """Another run holds the output folder's lock (a ValueError too, so CLIs report it like a config error)."""


# realpath of a run folder -> [lock file descriptor, holds]: the holds this process has taken and not yet
# released (an entry leaves when its last hold is released: nothing is held for the process's lifetime)
_HELD: dict[str, list[int]] = {}


def check_not_link(path: str | os.PathLike, what: str) -> str:
    """``path`` unless it is a symbolic link, which is refused in one line naming ``what`` (the run writes only
    into its own folder: a link would send its writes to another run's files)."""
    path = os.fspath(path)
    if os.path.islink(path):
        raise ValueError(
            f"{what} {path} is a symbolic link (to {os.readlink(path)}); a run writes only into its own folder: "
            "remove the link or use another --out"
        )
    return path


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
    """Take a hold of the exclusive ``fcntl.flock`` on ``out/.lock``; return the lock file's path. Release it with
    :func:`release_run_dir` (or use :func:`run_dir_lock`).

    A second run into the same folder fails at once with :class:`RunDirLockedError` instead of racing on the
    checkpoints; further holds in the process that holds the lock nest (the lock is released with the last).
    In a multi-process JAX run only process 0 locks (all processes share the folder). A ``.lock`` that is a
    symbolic link is refused (ValueError naming it).
    """
    out = check_out_dir(out)
    real = os.path.realpath(out)
    path = os.path.join(real, LOCK_NAME)
    if real in _HELD:
        _HELD[real][1] += 1
        return path
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized() and jax.process_index() != 0:
        return path
    os.makedirs(real, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            check_not_link(path, "the run folder's lock file")
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RunDirLockedError(
            f"output folder {out} is in use: another run holds its lock {path}"
            + (f" ({holder})" if holder else "")
            + "; wait for it to finish or use another --out"
        ) from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    _HELD[real] = [fd, 1]
    return path


def release_run_dir(out: str | os.PathLike) -> None:
    """Release one hold :func:`lock_run_dir` took on ``out``; the lock itself goes with the last hold (nothing
    if this process holds none)."""
    real = os.path.realpath(os.fspath(out))
    held = _HELD.get(real)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[real]
        fcntl.flock(held[0], fcntl.LOCK_UN)
        os.close(held[0])


@contextlib.contextmanager
def run_dir_lock(out: str | os.PathLike) -> Iterator[str]:
    """Hold the lock of run folder ``out`` for the ``with`` block (:func:`lock_run_dir`); yields the lock file's
    path. It is released when the block ends, however it ends."""
    path = lock_run_dir(out)
    try:
        yield path
    finally:
        release_run_dir(out)
