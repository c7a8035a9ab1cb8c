"""An output folder that cannot be written is one line naming it and the fix, exit status 2: no bare errno."""

from __future__ import annotations

import errno
import os

import pytest

from ivhl_jax.run import driver
from ivhl_jax.sims import gft

ARGS = ["--set", "rank=1", "--set", "grid=8", "--set", "steps=10", "--set", "steps_per_chunk=10"]
ARGS += ["--set", "save_every=5", "--set", "checkpoint_every=10", "--no-progress"]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.EPERM])
def test_an_unwritable_out_is_one_line_naming_it(tmp_path, monkeypatch, capsys, code):
    out = tmp_path / "locked" / "run"

    def refuse(path, *args, **kwargs):  # what os.makedirs raises in a read-only or foreign folder
        raise OSError(code, os.strerror(code), str(tmp_path / "locked"))

    monkeypatch.setattr(driver, "prepare_run_dir", refuse)
    assert gft.main([*ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[Errno" not in err, err
    assert str(out) in err and os.strerror(code) in err and "--out" in err, err


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs /sys, where nobody may create a folder")
def test_a_folder_nobody_may_create_is_refused_without_a_traceback(capsys):
    out = "/sys/kernel/ivhl_out_test/run"
    if os.path.exists(out):
        pytest.skip("/sys accepted the folder")
    assert gft.main([*ARGS, "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ivhl sim gft: cannot write the output folder") and "[Errno" not in err, err
