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

import json
import os

import jax
import numpy as np
import pytest

from ivhl_jax.run import open_run
from ivhl_jax.sims import bec

SMALL_GP = [
    "--no-progress",
    *("--set", "grid=16", "--set", "length=12.0", "--set", "ground_steps=100", "--set", "g=50"),
    *("--set", "steps_per_chunk=50", "--set", "save_every=25", "--set", "checkpoint_every=100"),
]


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
