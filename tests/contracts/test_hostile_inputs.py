"""Runs under faults and against hostile files: nothing lost, no one in.

* A sharded run (``--set mesh=8`` over the 8 emulated devices) interrupted mid-chunk, or finished and given
  more steps, resumes on its mesh and ends bit for bit where an uninterrupted run ends (store and final state).
* A run folder is the run's alone: no file the library writes follows a symbolic link out of it; a store or
  checkpoint folder that is a link is refused in one line; the lock is released when the run ends, and the
  API checkpointer takes the same lock as the CLI.
* Checkpoints know what they belong to: what the outputs report survives any number of resumes; a template of
  another dtype or structure is the template's fault and never marks a good checkpoint bad.
* Hostile files are refused before work, in one line naming the file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os

import jax
import jax.numpy as jnp
import matplotlib.figure
import numpy as np
import pytest

from ivhl_jax.run import open_run
from ivhl_jax.run.config import option
from ivhl_jax.run.driver import Simulation, run_main
from ivhl_jax.run.io import save_figure, save_npy
from ivhl_jax.run.lock import RunDirLockedError
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims import bec
from ivhl_jax.train.checkpoint import Checkpointer

SMALL_GP = [
    "--no-progress",
    *("--set", "grid=16", "--set", "length=12.0", "--set", "ground_steps=100", "--set", "g=50"),
    *("--set", "steps_per_chunk=50", "--set", "save_every=25", "--set", "checkpoint_every=100"),
]


@dataclasses.dataclass(frozen=True)
class _CountConfig:
    steps: int = option(4, "steps")


def _store_files(path) -> dict[str, object]:
    """Every file of a run store with its bytes (zarr.json parsed, less the run's environment and timing)."""
    out: dict[str, object] = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if f == "zarr.json":
                doc = json.load(open(p))
                for k in ("library", "runtime"):
                    doc.get("attributes", {}).pop(k, None)
                out[os.path.relpath(p, path)] = doc
            else:
                out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


def _interrupt_in_chunk(monkeypatch, n: int) -> None:
    """The chunked advance of ``ivhl sim bec`` raises KeyboardInterrupt (Ctrl-C) inside its ``n``-th chunk."""
    original = bec.chunked

    def chunked(*args, **kwargs):
        advance = original(*args, **kwargs)
        calls = [0]

        def interrupted(state):
            if not isinstance(state, jax.core.Tracer):  # run_chunked traces it once for its output shape
                calls[0] += 1
                if calls[0] == n:
                    raise KeyboardInterrupt
            return advance(state)

        return interrupted

    monkeypatch.setattr(bec, "chunked", chunked)


@pytest.mark.slow  # five small condensate runs on the 8-device mesh: about 40 s on two cores
def test_a_sharded_run_resumes_and_extends_bit_for_bit(tmp_path, monkeypatch):
    mesh = [*SMALL_GP, "--set", "mesh=8"]
    straight, extended, killed = tmp_path / "straight", tmp_path / "extended", tmp_path / "killed"
    assert bec.main([*mesh, "--set", "steps=200", "--out", str(straight)]) == 0
    assert bec.main([*mesh, "--set", "steps=100", "--out", str(extended)]) == 0
    assert bec.main([*mesh, "--set", "steps=200", "--out", str(extended)]) == 0  # a finished sharded run extended
    with monkeypatch.context() as m:
        _interrupt_in_chunk(m, 4)  # Ctrl-C inside the fourth chunk: the steps done (150) are checkpointed
        assert bec.main([*mesh, "--set", "steps=200", "--out", str(killed)]) == 130
    assert sorted(int(s) for s in os.listdir(killed / "ckpt") if s.isdigit()) == [100, 150]
    assert bec.main([*mesh, "--set", "steps=200", "--out", str(killed)]) == 0  # resumes from step 150, on the mesh
    want = np.load(straight / "final_state.npy")
    want_obs = json.loads((straight / "observables.json").read_text())
    assert _store_files(killed / "run.zarr") == _store_files(straight / "run.zarr")  # every file, bit for bit
    for folder, resumed_from in ((extended, 100), (killed, 150)):
        assert np.array_equal(np.load(folder / "final_state.npy"), want), folder
        run, ref = open_run(folder), open_run(straight)  # an extended store keeps its first run's chunking
        for key in ref.observations.data_vars:
            np.testing.assert_array_equal(run.observations[key].values, ref.observations[key].values, err_msg=key)
        assert np.array_equal(run.fields["final_state"].values, want)
        obs = json.loads((folder / "observables.json").read_text())
        assert obs["resumed_from"] == resumed_from and obs["observables"] == want_obs["observables"]
        assert obs["ground_state"] == want_obs["ground_state"] is not None


@pytest.mark.slow  # three small condensate runs: about 15 s
def test_the_ground_state_record_survives_every_resume(tmp_path):
    """Each resumed or extended run writes the record it restored into its own checkpoints, so a second resume
    still reports the ground-state search that ran before the first step."""
    out = tmp_path / "run"
    one = [*SMALL_GP, "--set", "checkpoint_every=50", "--out", str(out)]
    for steps in (50, 100, 150):
        assert bec.main([*one, "--set", f"steps={steps}"]) == 0
        record = json.loads((out / "observables.json").read_text())["ground_state"]
        assert record is not None and record["steps"] == 100, steps
        saved = json.loads((out / "ckpt" / str(steps) / "metadata" / "metadata").read_text())
        assert saved["ground_state"] == record


# --- a run folder is the run's alone ------------------------------------------------------------------------


class _CountSimulation(Simulation):
    """A streaming toy run: x += 1 per step, records in <out>/run.zarr, checkpoints every 2 steps."""

    prog = "ivhl sim count"
    config_type = _CountConfig
    description = "count"
    extendable = ("steps",)
    streams = True

    def run(self, cfg, ctx):
        res = run_chunked(
            lambda x: (x + 1.0, x[None]),
            jnp.zeros(2),
            n_chunks=cfg.steps,
            steps_per_chunk=1,
            checkpointer=ctx.checkpointer,
            progress=False,
            sink=ctx.sink,
        )
        return {"final_state": save_npy(os.path.join(ctx.out, "final_state.npy"), res.state)}

    def default_out(self, cfg, args):
        return "runs/count"

    def checkpoint_every(self, cfg):
        return 2


def _flock_free(folder) -> bool:
    """Whether another holder could take the run folder's lock now (flock is per open file description)."""
    with open(os.path.join(folder, ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_the_lock_is_released_when_the_run_ends_and_the_api_checkpointer_takes_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(_CountSimulation(), ["--out", str(out)]) == 0
    assert _flock_free(out)  # a finished run in a live process does not block the next command
    assert run_main(_CountSimulation(), ["--out", str(out), "--set", "steps=6"]) == 0  # extended in-process
    assert _flock_free(out)
    with Checkpointer(out / "ckpt") as ck:  # the API takes the lock the command line takes
        assert ck.latest_step() == 6 and not _flock_free(out)
        assert run_main(_CountSimulation(), ["--out", str(out), "--set", "steps=8"]) == 0  # the same process nests
    assert _flock_free(out)
    with open(out / ".lock", "a") as other:  # another holder (flock is per open file description)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirLockedError, match="is in use: another run holds its lock"):
            Checkpointer(out / "ckpt")
        capsys.readouterr()
        assert run_main(_CountSimulation(), ["--out", str(out), "--set", "steps=10"]) == 2
        assert "is in use" in capsys.readouterr().err
    for _ in range(3):  # a notebook's loop of runs keeps no lock file open
        with RunStore(tmp_path / "loop" / "run.zarr"):
            pass
    assert _flock_free(tmp_path / "loop")


def test_nothing_the_library_writes_follows_a_link_out_of_the_run_folder(tmp_path, capsys):
    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"precious")
    os.symlink(victim, out / ".lock")
    assert run_main(_CountSimulation(), ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a symbolic link" in err and ".lock" in err
    os.remove(out / ".lock")
    for name in ("final_state.npy", "config.json", "settings.json"):
        os.symlink(victim, out / name)
    assert run_main(_CountSimulation(), ["--out", str(out)]) == 0
    for name in ("final_state.npy", "config.json", "settings.json"):
        assert not os.path.islink(out / name) and os.path.isfile(out / name), name  # the link was replaced
    fig = matplotlib.figure.Figure()
    fig.add_subplot().plot([0, 1])
    os.symlink(victim, out / "density.png")
    save_figure(fig, out / "density.png")
    assert not os.path.islink(out / "density.png")
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("what", ["run.zarr", "ckpt"])
def test_a_store_or_checkpoint_folder_that_is_a_link_is_refused_in_one_line(tmp_path, capsys, what):
    other, out = tmp_path / "other", tmp_path / "run"
    assert run_main(_CountSimulation(), ["--out", str(other)]) == 0
    before = _store_files(other / what)
    out.mkdir()
    os.symlink(other / what, out / what)
    capsys.readouterr()
    assert run_main(_CountSimulation(), ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a symbolic link" in err and what in err
    assert _store_files(other / what) == before  # the other run's files untouched
    with pytest.raises(ValueError, match="is a symbolic link"):
        (RunStore if what == "run.zarr" else Checkpointer)(out / what)
