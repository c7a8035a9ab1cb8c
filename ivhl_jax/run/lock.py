"""Run-folder locks, for the run layer: :mod:`ivhl_jax.core.folder_lock` (kept below the train layer so that
:class:`ivhl_jax.train.checkpoint.Checkpointer` takes the same lock as the command line)."""

from __future__ import annotations

from ivhl_jax.core import folder_lock
from ivhl_jax.core.folder_lock import (  # noqa: F401 - the public names of this module
    LOCK_NAME,
    RunDirLockedError,
    check_not_link,
    check_out_dir,
    lock_run_dir,
    release_run_dir,
    run_dir_lock,
)

__all__ = folder_lock.__all__
