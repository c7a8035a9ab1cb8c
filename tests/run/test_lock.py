"""ivhl_jax.run.lock: a run folder is locked while a run writes it; a second holder is refused by name."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

from ivhl_jax.run.config import prepare_run_dir
from ivhl_jax.run.lock import RunDirLockedError, lock_run_dir, release_run_dir, run_dir_lock


@dataclasses.dataclass(frozen=True)
class _LockCfg:
    n: int = 1


def test_run_dir_lock_conflicts_with_another_holder(tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    # flock is per open file description: a second open + flock conflicts even within one process.
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirLockedError, match=r"run.* is in use: another run holds its lock"):
            prepare_run_dir(out, _LockCfg(), resume=True)
        fcntl.flock(other, fcntl.LOCK_UN)
    with run_dir_lock(out):  # a run holds the lock for as long as it runs; its own holds nest inside
        assert prepare_run_dir(out, _LockCfg(), resume=True) == os.path.join(out, "ckpt")
        prepare_run_dir(out, _LockCfg(), resume=False)  # the holder itself may prepare the folder again
        with open(out / ".lock", "a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the run ended
        fcntl.flock(other, fcntl.LOCK_UN)
    prepare_run_dir(out, _LockCfg(), resume=True)  # alone, it holds the lock while it prepares the folder
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_run_dir_lock_between_processes(tmp_path):
    out = str(tmp_path / "run")
    code = textwrap.dedent(f"""
        import sys
        from ivhl_jax.run.lock import lock_run_dir
        lock_run_dir({out!r})
        print("locked", flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLockedError, match="another run holds") as info:
            lock_run_dir(out)
        assert out in str(info.value) and f"pid {p.pid}" in str(info.value)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    try:
        lock_run_dir(out)  # the lock died with its process
    finally:
        release_run_dir(out)
