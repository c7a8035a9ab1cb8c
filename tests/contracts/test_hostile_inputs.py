"""Runs under faults and against hostile files: nothing lost, no one in.

* A sharded run of every simulation that takes a mesh (``--set mesh=8`` over the 8 emulated devices, in one
  process or two under ``ivhl launch``) interrupted mid-chunk or at a checkpoint, or finished and given more
  steps, resumes on its mesh and ends bit for bit where an uninterrupted run ends (store and final state).
* A run folder is the run's alone: no file the library writes follows a symbolic link out of it; a store or
  checkpoint folder that is a link is refused in one line; the lock is released when the run ends, and the
  API checkpointer takes the same lock as the CLI.
* Checkpoints know what they belong to: what the outputs report survives any number of resumes; a template of
  another dtype or structure is the template's fault and never marks a good checkpoint bad.
* Hostile files are refused before work, in one line naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import matplotlib.figure
import numpy as np
import pytest

from ivhl_jax.bench.hostile_inputs import CountConfig, CountSimulation
from ivhl_jax.nn import gru
from ivhl_jax.numerics import rollout
from ivhl_jax.physics import fields
from ivhl_jax.run import open_run
from ivhl_jax.run.config import load_config
from ivhl_jax.run.driver import run_main
from ivhl_jax.run.io import save_figure
from ivhl_jax.run.lock import RunDirLockedError
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.run.store import RunStore, StoreError, export_npy, read_observations
from ivhl_jax.sims import bec, gft
from ivhl_jax.train.checkpoint import CHECKSUM_FILE, RUN_ITEM, CheckpointCorruptError, Checkpointer
from tests.run.launching import launch_command, launch_env, store_files

SMALL_GP = [
    "--no-progress",
    *("--set", "grid=16", "--set", "length=12.0", "--set", "ground_steps=100", "--set", "g=50"),
    *("--set", "steps_per_chunk=50", "--set", "save_every=25", "--set", "checkpoint_every=100"),
]


SMALL_GFT = [
    "--no-progress",
    *("--set", "rank=2", "--set", "grid=16"),
    *("--set", "steps_per_chunk=50", "--set", "save_every=25", "--set", "checkpoint_every=100"),
]

# Every `ivhl sim` whose field takes a device mesh (no `ivhl train` command takes one), with a small run of it
# and its mesh over the 8 emulated devices (in one process, or two processes of four under `ivhl launch`).
MESH_SIMS = {"bec": (bec, [*SMALL_GP, "--set", "mesh=8"]), "gft": (gft, [*SMALL_GFT, "--set", "mesh=8"])}


def _interrupt(monkeypatch, module, where: str) -> None:
    """Ctrl-C in a run of ``module`` (``ivhl sim bec`` or ``gft``): raised inside its fourth chunk (``"chunk"``:
    the steps done, 150, are checkpointed on the way out), or arriving as a signal while step 100 is saved
    (``"checkpoint"``: the run stops after that save, with nothing more to write)."""
    original_chunked, original_save = module.chunked, Checkpointer.save

    def chunked(*args, **kwargs):
        advance = original_chunked(*args, **kwargs)
        calls = [0]

        def interrupted(state):
            if not isinstance(state, jax.core.Tracer):  # run_chunked traces it once for its output shape
                calls[0] += 1
                if where == "chunk" and calls[0] == 4:
                    raise KeyboardInterrupt
            return advance(state)

        return interrupted

    def save(self, step, *args, **kwargs):
        done = original_save(self, step, *args, **kwargs)
        if where == "checkpoint" and step == 100:
            os.kill(os.getpid(), signal.SIGINT)  # the run's handler notes it; the loop stops after this save
        return done

    monkeypatch.setattr(module, "chunked", chunked)
    monkeypatch.setattr(Checkpointer, "save", save)


def _same_run(folder, straight, resumed_from: int) -> None:
    """``folder`` (resumed from ``resumed_from``) ends bit for bit where the uninterrupted ``straight`` ends:
    final state, every store record and observables.json less its timing."""
    want = np.load(straight / "final_state.npy")
    assert np.array_equal(np.load(folder / "final_state.npy"), want), folder
    run, ref = open_run(folder), open_run(straight)  # an extended store keeps its first run's chunking
    for key in ref.observations.data_vars:
        np.testing.assert_array_equal(run.observations[key].values, ref.observations[key].values, err_msg=key)
    assert np.array_equal(run.fields["final_state"].values, want)
    got, ref_obs = (json.loads((d / "observables.json").read_text()) for d in (folder, straight))
    assert got["resumed_from"] == resumed_from
    timing = {"resumed_from", "wall_time_s"}
    assert {k: v for k, v in got.items() if k not in timing} == {k: v for k, v in ref_obs.items() if k not in timing}
    if "ground_state" in ref_obs:
        assert got["ground_state"] is not None


@pytest.fixture(scope="module")
def mesh_straight(tmp_path_factory):
    """``straight(sim)``: an uninterrupted 200-step run of ``sim`` on its mesh, made once per module."""
    done: dict[str, object] = {}

    def straight(sim: str):
        if sim not in done:
            module, args = MESH_SIMS[sim]
            out = tmp_path_factory.mktemp(f"{sim}_mesh") / "straight"
            assert module.main([*args, "--set", "steps=200", "--out", str(out)]) == 0
            done[sim] = out
        return done[sim]

    return straight


@pytest.mark.slow  # small field runs on a mesh of emulated devices: 10-40 s each on two cores
@pytest.mark.parametrize("sim", sorted(MESH_SIMS))
def test_a_sharded_run_extends_bit_for_bit(tmp_path, mesh_straight, sim):
    """A finished sharded run given more steps resumes from its last checkpoint on its mesh and ends bit for bit
    where an uninterrupted run ends."""
    module, args = MESH_SIMS[sim]
    out = tmp_path / "extended"
    assert module.main([*args, "--set", "steps=100", "--out", str(out)]) == 0
    assert module.main([*args, "--set", "steps=200", "--out", str(out)]) == 0  # restored on the mesh
    _same_run(out, mesh_straight(sim), 100)


@pytest.mark.slow  # small field runs on a mesh of emulated devices: 10-40 s each on two cores
@pytest.mark.parametrize("where", ["chunk", "checkpoint"])
@pytest.mark.parametrize("sim", sorted(MESH_SIMS))
def test_an_interrupted_sharded_run_resumes_bit_for_bit(tmp_path, monkeypatch, mesh_straight, sim, where):
    """Ctrl-C inside a chunk or at a checkpoint of a sharded run; the same command resumes on the mesh from the
    newest checkpoint and ends where an uninterrupted run ends, every store file bit for bit."""
    module, args = MESH_SIMS[sim]
    out = tmp_path / "interrupted"
    with monkeypatch.context() as m:
        _interrupt(m, module, where)
        assert module.main([*args, "--set", "steps=200", "--out", str(out)]) == 130
    kept = {"chunk": [100, 150], "checkpoint": [100]}[where]
    assert sorted(int(s) for s in os.listdir(out / "ckpt") if s.isdigit()) == kept
    assert module.main([*args, "--set", "steps=200", "--out", str(out)]) == 0
    _same_run(out, mesh_straight(sim), kept[-1])
    assert store_files(out / "run.zarr") == store_files(mesh_straight(sim) / "run.zarr")


@pytest.mark.slow  # three small condensate runs: about 15 s
def test_the_ground_state_record_survives_every_resume(tmp_path):
    """Each resumed or extended run writes the record it restored into its own checkpoints, so a second resume
    still reports the ground-state search that ran before the first step."""
    out = tmp_path / "run"
    one = [*SMALL_GP, "--set", "checkpoint_every=50", "--out", str(out)]
    first = None
    for steps in (50, 100, 150):
        assert bec.main([*one, "--set", f"steps={steps}"]) == 0
        record = json.loads((out / "observables.json").read_text())["ground_state"]
        first = first or record  # the search of the first run (at most ground_steps=100)
        assert record is not None and record == first and 0 < record["steps"] <= 100, steps
        saved = json.loads((out / "ckpt" / str(steps) / "metadata" / "metadata").read_text())
        assert saved["ground_state"] == record


# --- a run folder is the run's alone ------------------------------------------------------------------------


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
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
    assert _flock_free(out)  # a finished run in a live process does not block the next command
    assert run_main(CountSimulation(), ["--out", str(out), "--set", "steps=6"]) == 0  # extended in-process
    assert _flock_free(out)
    with Checkpointer(out / "ckpt") as ck:  # the API takes the lock the command line takes
        assert ck.latest_step() == 6 and not _flock_free(out)
        assert run_main(CountSimulation(), ["--out", str(out), "--set", "steps=8"]) == 0  # the same process nests
    assert _flock_free(out)
    with open(out / ".lock", "a") as other:  # another holder (flock is per open file description)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirLockedError, match="is in use: another run holds its lock"):
            Checkpointer(out / "ckpt")
        capsys.readouterr()
        assert run_main(CountSimulation(), ["--out", str(out), "--set", "steps=10"]) == 2
        assert "is in use" in capsys.readouterr().err
    with open(tmp_path / ".lock", "a") as other:  # a folder that is not <out>/ckpt is locked by itself, so two
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # scratch checkpointers in one parent never clash
        with Checkpointer(tmp_path / "scratch") as ck:
            assert not _flock_free(tmp_path / "scratch") and ck.latest_step() is None
    for _ in range(3):  # a notebook's loop of runs keeps no lock file open
        with RunStore(tmp_path / "loop" / "run.zarr"):
            pass
    assert _flock_free(tmp_path / "loop")


def test_nothing_the_library_writes_follows_a_link_out_of_the_run_folder(tmp_path, capsys):
    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"precious")
    os.symlink(victim, out / ".lock")
    assert run_main(CountSimulation(), ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a symbolic link" in err and ".lock" in err
    os.remove(out / ".lock")
    for name in ("final_state.npy", "config.json", "settings.json"):
        os.symlink(victim, out / name)
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
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
    assert run_main(CountSimulation(), ["--out", str(other)]) == 0
    before = store_files(other / what)
    out.mkdir()
    os.symlink(other / what, out / what)
    capsys.readouterr()
    assert run_main(CountSimulation(), ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a symbolic link" in err and what in err
    assert store_files(other / what) == before  # the other run's files untouched
    with pytest.raises(ValueError, match="is a symbolic link"):
        (RunStore if what == "run.zarr" else Checkpointer)(out / what)


def test_a_checkpoint_folder_holding_a_link_is_refused_in_one_line(tmp_path, capsys):
    """A step folder that is a link to a folder elsewhere is neither restored from nor deleted through."""
    out, victim = tmp_path / "run", tmp_path / "victim"
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
    victim.mkdir()
    (victim / "precious").write_text("mine")
    os.symlink(victim, out / "ckpt" / "1")
    capsys.readouterr()
    assert run_main(CountSimulation(), ["--out", str(out), "--set", "steps=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a symbolic link" in err and os.path.join("ckpt", "1") in err, err
    assert (victim / "precious").read_text() == "mine"
    with pytest.raises(ValueError, match="checkpoint folder entry .* is a symbolic link"):
        Checkpointer(out / "ckpt")


# --- checkpoints know what they belong to ---------------------------------------------------------------------


def test_a_checkpoint_of_another_configuration_is_refused_naming_the_keys(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_main(CountSimulation(), ["--out", str(a), "--set", "rate=2.0"]) == 0
    assert run_main(CountSimulation(), ["--out", str(b), "--set", "steps=2"]) == 0
    shutil.rmtree(b / "ckpt")
    shutil.copytree(a / "ckpt", b / "ckpt")  # same shapes, other physics
    capsys.readouterr()
    assert run_main(CountSimulation(), ["--out", str(b), "--set", "steps=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "written by a different configuration (differs in ['rate']" in err
    assert sorted(os.listdir(b / "ckpt")) == sorted(os.listdir(a / "ckpt"))  # nothing marked bad or moved
    for step in (s for s in os.listdir(a / "ckpt") if s.isdigit()):  # each step records its writer
        item = a / "ckpt" / step / RUN_ITEM
        (record,) = (json.loads(f.read_text()) for f in item.iterdir() if f.suffix != ".txt")
        assert record["config"]["rate"] == 2.0 and record["library"] == importlib.metadata.version("ivhl_jax")


def _two_steps(folder):
    with Checkpointer(folder) as ck:
        for step in (1, 2):
            ck.save(step, {"x": jnp.full(8, step, jnp.float32)}, metadata={"step": step})


@pytest.mark.parametrize(
    "template, message",
    [
        ({"x": jnp.zeros(8, jnp.int32)}, r"has dtype int32 but .* holds float32 there \(a restore never casts\)"),
        ({"x": jnp.zeros(8), "y": jnp.zeros(8)}, r"leaf \['y'\] is not in checkpoint step 2"),
        ({"y": jnp.zeros(8)}, r"leaf \['y'\] is not in checkpoint step 2"),
        ([jnp.zeros(8)], r"is not in checkpoint step 2"),
    ],
)
def test_a_template_of_another_dtype_or_structure_is_its_own_fault(tmp_path, template, message):
    d = tmp_path / "ckpt"
    _two_steps(d)
    with Checkpointer(d) as ck:
        for step in (None, 2):
            with pytest.raises(ValueError, match=message) as e:
                ck.restore(template, step)
            assert "checkpoint itself is fine" in str(e.value) and not isinstance(e.value, CheckpointCorruptError)
        assert ck.latest_step() == 2
        ck.save(2, {"x": jnp.full(8, 2.0, jnp.float32)}, force=True)  # never moves the good step aside
        step, restored, meta = ck.restore({"x": jnp.zeros(8, jnp.float32)})
    assert step == 2 and meta == {"step": 2} and float(restored["x"][0]) == 2.0
    assert not os.path.exists(str(d) + ".bad")


def test_checksums_are_committed_with_the_step_and_a_step_without_them_is_summed(tmp_path):
    d = tmp_path / "ckpt"
    _two_steps(d)
    os.remove(d / "2" / CHECKSUM_FILE)  # a kill after Orbax's commit, before the checksum file
    record = json.loads((d / "2" / RUN_ITEM / "metadata").read_text())
    assert record["sums"]["['x']"]["shape"] == [8] and record["library"]
    shutil.rmtree(d / "1" / RUN_ITEM)  # a step written with no record committed with it
    os.remove(d / "1" / CHECKSUM_FILE)
    with Checkpointer(d) as ck:
        ck.restore({"x": jnp.zeros(8, jnp.float32)}, 1)
    sums = json.loads((d / "1" / CHECKSUM_FILE).read_text())  # summed once found good: later damage is caught
    assert len(sums["['x']"]["sha256"]) == 64


def test_a_step_off_the_schedule_is_skipped_with_a_warning(tmp_path, capfd):
    def advance(x):
        return x + 1.0, x[None]

    with Checkpointer(tmp_path / "ckpt", save_every=10) as ck:
        run_chunked(advance, jnp.zeros(1), n_chunks=2, steps_per_chunk=10, checkpointer=ck, progress=False)
        ck.save(25, {"state": jnp.zeros(1), "history": jnp.zeros((2, 1))}, force=True)  # a stray step
    with Checkpointer(tmp_path / "ckpt", save_every=10) as ck:
        res = run_chunked(advance, jnp.zeros(1), n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False)
    assert res.resumed_from == 20 and float(res.state[0]) == 4.0
    err = capfd.readouterr().err
    assert "skipped step 25" in err and "not a multiple of steps_per_chunk=10" in err


# --- hostile files are refused before work, in one line naming the file ------------------------------------


@pytest.mark.parametrize("array", ["value", "time"])
def test_a_store_declaring_a_huge_shape_is_refused_before_any_resize(tmp_path, capsys, array):
    out = tmp_path / "run"
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
    meta, root = out / "run.zarr" / array / "zarr.json", out / "run.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = [10**12, *doc["shape"][1:]]  # 8 TB of float64 records
    meta.write_text(json.dumps(doc))
    top = json.loads(root.read_text())  # and the copy in the root's consolidated metadata
    top["consolidated_metadata"]["metadata"][array]["shape"] = doc["shape"]
    root.write_text(json.dumps(top))
    capsys.readouterr()
    t0 = time.perf_counter()
    assert run_main(CountSimulation(), ["--out", str(out), "--set", "steps=6"]) == 2
    assert time.perf_counter() - t0 < 30
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(meta) in err and "1000000000000" in err and "--no-resume" in err


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("deep.json", "[" * 100_000 + "]" * 100_000, "not readable|too deeply|not valid JSON"),
        ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000, "too deeply|not valid TOML"),
        ("nested.json", json.dumps({"a": json.loads("[" * 40 + "]" * 40)}), "nests lists or tables more than 32"),
        ("list.json", "[1, 2]", "holds a JSON list, not a table"),
        ("bytes.json", b"\xff\xfe{", "not valid JSON"),
    ],
)
def test_a_hostile_config_file_is_one_line_naming_it(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=message) as e:
        load_config(CountConfig, path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("text", ["[1, 2]", "{trunc", "\xff", "[" * 100_000])
def test_a_hostile_config_json_in_the_run_folder_is_one_line_naming_it(tmp_path, capsys, text):
    out = tmp_path / "run"
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
    (out / "config.json").write_bytes(text.encode("latin-1"))
    capsys.readouterr()
    assert run_main(CountSimulation(), ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(out / "config.json") in err and "--no-resume" in err


def test_a_full_disk_is_one_line_naming_the_path_and_saying_rerun_resumes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"

    def full(path, array):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(sys.modules[CountSimulation.__module__], "save_npy", full)  # the toy run's output writer
    assert run_main(CountSimulation(), ["--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(out / "final_state.npy") in err and "rerun the same command" in err
    assert "resumes" in err


# --- the small silent ones --------------------------------------------------------------------------------------


def _decay():
    return rollout.Stepper.create(lambda x, p: x * p, jnp.float32(0.5))


@pytest.mark.parametrize(
    "steps, error, message",
    [
        (True, TypeError, "steps must be an integer count, got the boolean True"),
        (np.bool_(True), TypeError, "boolean"),
        (10**15, ValueError, r"steps \(1000000000000000\) is more than one scan runs"),
    ],
)
def test_a_step_count_is_a_plain_count_that_one_scan_can_run(steps, error, message):
    with pytest.raises(error, match=message):
        rollout.trajectory(_decay(), jnp.ones(3), steps)


def test_a_traced_step_count_inside_jit_says_to_make_it_static():
    with pytest.raises(TypeError, match=r"steps must be a Python int known when tracing .*static_argnames='steps'"):
        jax.jit(lambda x, n: rollout.trajectory(_decay(), x, n))(jnp.ones(3), 4)


def test_a_chunk_length_that_disagrees_with_the_advance_is_refused():
    advance = rollout.chunked(_decay(), 5)
    with pytest.raises(ValueError, match=r"steps_per_chunk=3, but advance runs 5 steps per call"):
        run_chunked(advance, jnp.ones(3), n_chunks=2, steps_per_chunk=3, progress=False)
    assert run_chunked(advance, jnp.ones(3), n_chunks=2, steps_per_chunk=5, progress=False).steps == 10


def test_zero_softening_and_non_finite_gru_weights_are_refused():
    pts, src = jnp.zeros((2, 3)), jnp.zeros((1, 3))  # a point on the source: 1/(0 + 0) there
    with pytest.raises(ValueError, match="softening must be > 0, got 0"):
        fields.superpose(pts, src, softening=0)
    weights = gru.init_params(jax.random.key(0), 2, 4)
    xs = jnp.ones((3, 2))
    gru.recurrence(weights, xs)  # finite weights are fine
    for name in ("W_h", "b_i"):
        bad = dict(weights, **{name: weights[name].at[0].set(jnp.nan)})
        with pytest.raises(ValueError, match=rf"weights\['{name}'\] contains NaN or inf"):
            gru.recurrence(bad, xs)


_KILLER = """
import importlib, os, signal, sys

import jax

from ivhl_jax.train.checkpoint import Checkpointer

sim = importlib.import_module("ivhl_jax.sims." + sys.argv.pop(1))  # the simulation module, e.g. 'bec'
where = sys.argv.pop(1)  # 'chunk': SIGKILL while chunk 4 computes; 'checkpoint': right after step 100 is saved


def die():
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


original_chunked, original_save = sim.chunked, Checkpointer.save


def chunked(*args, **kwargs):
    advance, calls = original_chunked(*args, **kwargs), [0]

    def inner(state):
        if isinstance(state, jax.core.Tracer):
            return advance(state)
        calls[0] += 1
        out = advance(state)  # dispatched, not finished: the kill lands while the chunk computes
        if where == "chunk" and calls[0] == 4:
            die()
        return out

    return inner


def save(self, step, *args, **kwargs):
    done = original_save(self, step, *args, **kwargs)
    if where == "checkpoint" and step == 100:
        die()
    return done


sim.chunked, Checkpointer.save = chunked, save
sys.exit(sim.main(sys.argv[1:]))
"""


def _launch(sim: str, out, steps: int, *script: str) -> subprocess.CompletedProcess:
    """``ivhl launch`` (2 processes x 4 emulated devices) of the small run of ``MESH_SIMS[sim]`` on its mesh over
    both; ``script`` (a Python file and its arguments) replaces ``-m ivhl_jax.sims.<sim>``."""
    program = list(script) or ["-m", f"ivhl_jax.sims.{sim}"]
    args = [*MESH_SIMS[sim][1], "--set", f"steps={steps}", "--out", str(out)]
    cmd = launch_command(*program, *args, devices_per_process=4)
    return subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=400)


def _launched_ok(sim: str, out, steps: int) -> None:
    p = _launch(sim, out, steps)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


@pytest.fixture(scope="module")
def launched_straight(tmp_path_factory):
    """``straight(sim)``: an uninterrupted launched run of 200 steps, the answer every interrupted launched run
    of ``sim`` must end at; made once per module."""
    done: dict[str, object] = {}

    def straight(sim: str):
        if sim not in done:
            done[sim] = tmp_path_factory.mktemp(f"launched_{sim}") / "straight"
            _launched_ok(sim, done[sim], 200)
        return done[sim]

    return straight


@pytest.mark.multiprocess
@pytest.mark.slow  # two launched jobs of two processes (and the shared uninterrupted one): about a minute each
@pytest.mark.parametrize("sim", sorted(MESH_SIMS))
def test_a_launched_two_process_run_extends_on_its_mesh_bit_for_bit(tmp_path, launched_straight, sim):
    """A finished launched run given more steps resumes from its checkpoint on the mesh and ends where an
    uninterrupted launched run ends."""
    _launched_ok(sim, tmp_path / "extended", 100)
    _launched_ok(sim, tmp_path / "extended", 200)  # resumes from step 100 on the two processes' mesh
    _same_run(tmp_path / "extended", launched_straight(sim), 100)


@pytest.mark.multiprocess
@pytest.mark.slow  # two launched jobs of two processes: about a minute each
@pytest.mark.parametrize("where", ["chunk", "checkpoint"])
@pytest.mark.parametrize("sim", sorted(MESH_SIMS))
def test_a_launched_two_process_run_killed_resumes_bit_for_bit(tmp_path, launched_straight, sim, where):
    """One process of a launched run SIGKILLed while chunk 4 computes (steps 150-200, the step-100 checkpoint
    the last), or right after it saved step 100: the launcher ends the job, and the same command resumes from step
    100 on the mesh and ends bit for bit where an uninterrupted launched run ends (store records included)."""
    script = tmp_path / "killer.py"
    script.write_text(_KILLER)
    out = tmp_path / "killed"
    p = _launch(sim, out, 200, str(script), sim, where)
    assert p.returncode != 0 and "SIGKILL" in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr[-3000:]
    assert not (out / "final_state.npy").exists()
    _launched_ok(sim, out, 200)
    _same_run(out, launched_straight(sim), 100)
    a, b = (open_run(d).observations for d in (out, launched_straight(sim)))
    assert a.identical(b)


@pytest.mark.slow  # two small CDT runs, compiled twice: about two minutes on two cores
def test_a_damaged_thermalisation_record_is_one_line_naming_it(tmp_path, capsys):
    from ivhl_jax.sims import cdt

    small = ["slices=4", "volume=48", "chains=1", "thermalise_max=4", "engine=jax", "origins=1", "curvature_samples=1"]
    argv = ["--no-progress", "--out", str(tmp_path), *(a for s in small for a in ("--set", s))]
    assert cdt.main([*argv, "--set", "steps=2", "--set", "steps_per_chunk=2"]) == 0
    (tmp_path / "thermalisation.json").write_text("[" * 100_000)
    capsys.readouterr()
    assert cdt.main([*argv, "--set", "steps=4", "--set", "steps_per_chunk=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "thermalisation.json") in err and "--no-resume" in err


class _ReadingCount(CountSimulation):
    """The toy run, reading its records back from the store at the end as the simulations do (``sink.read``)."""

    def run(self, cfg, ctx):
        out = super().run(cfg, ctx)
        ctx.sink.read(jnp.zeros((1, 2)))
        return out


def test_a_damaged_store_chunk_is_one_line_naming_its_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(CountSimulation(), ["--out", str(out)]) == 0
    chunk = out / "run.zarr" / "value" / "c" / "1" / "0"
    chunk.write_bytes(b"\x28\xb5\x2f\xfd not a zstd frame")  # zstd's magic, then garbage
    for read in (lambda: open_run(out), lambda: read_observations(out / "run.zarr")):
        with pytest.raises(StoreError) as e:
            read()
        assert "\n" not in str(e.value) and str(chunk) in str(e.value) and "'value'" in str(e.value)
    with pytest.raises(StoreError, match="chunk file") as e:
        export_npy(out, "value", tmp_path / "value.npy")
    assert str(chunk) in str(e.value)
    capsys.readouterr()
    assert run_main(_ReadingCount(), ["--out", str(out), "--set", "steps=6"]) == 2  # resumes, then reads it back
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(chunk) in err and "--no-resume" in err
