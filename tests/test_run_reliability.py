"""Run reliability: nested config overrides keep embedded defaults, run folders are locked, checkpoints are
verified on restore (fault injection: flipped bytes, truncation, deleted items, stray step folders, NaN)."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.numerics import rollout
from ivhl_jax.run import runner
from ivhl_jax.run.config import RunDirLockedError, load_config, lock_run_dir, prepare_run_dir, release_run_dir
from ivhl_jax.sims.train_lm import TrainLMConfig, _default_model
from ivhl_jax.train.checkpoint import CHECKSUM_FILE, CheckpointCorruptError, Checkpointer

# A failed Orbax restore can leave its other read coroutines un-awaited ("Exception ignored in ..."): harmless.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# ---------------------------------------------------------------- 1. nested overrides


def test_lm_nested_override_keeps_embedded_model_defaults():
    cfg = load_config(TrainLMConfig, None, ["model.d_model=256"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256)
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.activation, cfg.model.d_ff) == (3, 4, "swiglu", 384)
    assert cfg.steps == TrainLMConfig().steps


def test_lm_nested_toml_table_keeps_embedded_model_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 100\n\n[model]\nd_model = 256\nn_heads = 8\n")
    cfg = load_config(TrainLMConfig, path, ["model.n_layers=2"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256, n_heads=8, n_layers=2)
    assert cfg.steps == 100


@dataclasses.dataclass(frozen=True)
class _Inner:
    a: int = 1
    b: str = "class"


@dataclasses.dataclass(frozen=True)
class _Middle:
    inner: _Inner = dataclasses.field(default_factory=lambda: _Inner(a=5, b="embedded"))
    c: float = 0.5


@dataclasses.dataclass(frozen=True)
class _Outer:
    middle: _Middle = dataclasses.field(default_factory=lambda: _Middle(inner=_Inner(a=7, b="outer"), c=2.0))
    optional: _Inner | None = None


def test_nested_overrides_update_every_level_field_by_field():
    cfg = load_config(_Outer, None, ["middle.inner.a=9"])
    assert cfg.middle == _Middle(inner=_Inner(a=9, b="outer"), c=2.0)
    cfg = load_config(_Outer, None, ["middle.c=3"])
    assert cfg.middle == _Middle(inner=_Inner(a=7, b="outer"), c=3.0)
    # A nested field with no embedded default is built from its class's defaults.
    assert load_config(_Outer, None, ["optional.a=4"]).optional == _Inner(a=4, b="class")
    with pytest.raises(ValueError, match=r"middle\.inner\.zz"):
        load_config(_Outer, None, ["middle.inner.zz=1"])


# ---------------------------------------------------------------- 2. run-folder lock


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 1


def test_run_dir_lock_conflicts_with_another_holder(tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    # flock is per open file description: a second open + flock conflicts even within one process.
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirLockedError, match=r"run.* is in use: another run holds its lock"):
            prepare_run_dir(out, _Cfg(), resume=True)
        fcntl.flock(other, fcntl.LOCK_UN)
    try:
        assert prepare_run_dir(out, _Cfg(), resume=True) == os.path.join(out, "ckpt")
        prepare_run_dir(out, _Cfg(), resume=False)  # the holder itself may prepare the folder again
        with open(out / ".lock", "a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        release_run_dir(out)
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_run_dir_lock_between_processes(tmp_path):
    out = str(tmp_path / "run")
    code = textwrap.dedent(f"""
        import sys
        from ivhl_jax.run.config import lock_run_dir
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


# ---------------------------------------------------------------- 3. checkpoint integrity


def _state(step: int) -> dict:
    x = np.random.default_rng(step).standard_normal(4096).astype(np.float32)
    return {"x": jnp.asarray(x), "key": jax.random.key(step), "n": jnp.int32(step)}


def _save_steps(directory, steps=(10, 20, 30), **kw) -> None:
    with Checkpointer(directory, keep=5, **kw) as ck:
        for s in steps:
            ck.save(s, _state(s), metadata={"step": s})


def _data_files(step_dir) -> list[str]:
    files = []
    for root, _, names in os.walk(os.path.join(step_dir, "state")):
        files += [os.path.join(root, n) for n in names if os.path.basename(root) == "d"]
    return sorted(files, key=os.path.getsize)


def _assert_is_step(restored, step):
    want = _state(step)
    np.testing.assert_array_equal(np.asarray(restored["x"]), np.asarray(want["x"]))
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(want["key"]))
    assert int(restored["n"]) == step


def _flip_bytes(d):
    path = _data_files(d / "30")[-1]  # the largest data file holds the 16 KiB array
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        mid = len(data) // 2
        data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
        f.seek(0)
        f.write(data)


def _truncate(d):
    path = _data_files(d / "30")[-1]
    os.truncate(path, os.path.getsize(path) // 2)


def _delete_item(d):
    shutil.rmtree(d / "30" / "state")


def _delete_metadata(d):
    os.remove(d / "30" / "_CHECKPOINT_METADATA")


@pytest.mark.parametrize("damage", [_flip_bytes, _truncate, _delete_item, _delete_metadata])
def test_damaged_latest_checkpoint_falls_back_to_previous(tmp_path, capfd, damage):
    d = tmp_path / "ck"
    _save_steps(d)
    assert os.path.isfile(d / "30" / CHECKSUM_FILE)
    damage(d)
    with Checkpointer(d, keep=5) as ck:
        step, restored, meta = ck.restore(_state(0))
    assert step == 20 and meta == {"step": 20}
    _assert_is_step(restored, 20)
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "skipping bad checkpoint" in line]
    assert len(warnings) == 1 and "step 30" in warnings[0] and str(d) in warnings[0]


def test_flipped_bytes_caught_by_checksum_when_a_named_step_is_restored(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d)
    _flip_bytes(d)
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError, match="step 30"):
        ck.restore(_state(0), step=30)


def test_stray_empty_step_folder_is_skipped(tmp_path, capfd):
    d = tmp_path / "ck"
    _save_steps(d)
    os.makedirs(d / "40")
    with Checkpointer(d, keep=5) as ck:
        step, restored, _ = ck.restore(_state(0))
        assert step == 30 and ck.latest_step() == 30
    _assert_is_step(restored, 30)
    assert "step 40" in capfd.readouterr().err


def test_nothing_good_raises_one_clear_error(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d, steps=(10, 20))
    for s in ("10", "20"):
        shutil.rmtree(d / s / "state")
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError) as info:
        ck.restore(_state(0))
    msg = str(info.value)
    assert f"no usable checkpoint in {d}" in msg and "step 20" in msg and "step 10" in msg


def test_non_finite_state_is_rejected(tmp_path):
    d = tmp_path / "ck"
    bad = {"x": jnp.full(8, jnp.nan, jnp.float32)}
    with Checkpointer(d) as ck:
        ck.save(1, {"x": jnp.ones(8, jnp.float32)})
        ck.save(2, bad)
        step, restored, _ = ck.restore(bad)
        assert step == 1
        np.testing.assert_array_equal(np.asarray(restored["x"]), np.ones(8, np.float32))
        with pytest.raises(CheckpointCorruptError, match="non-finite"):
            ck.restore(bad, step=2)


def test_async_save_writes_checksums(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d, async_save=True)
    for s in (10, 20, 30):
        assert os.path.isfile(d / str(s) / CHECKSUM_FILE)
    _flip_bytes(d)
    with Checkpointer(d, keep=5) as ck:
        step, restored, _ = ck.restore(_state(0))
    assert step == 20
    _assert_is_step(restored, 20)


def _noisy_step(s, p):
    key, sub = jax.random.split(s["key"])
    return {"key": key, "x": p["decay"] * s["x"] + 0.1 * jax.random.normal(sub, s["x"].shape)}


def test_run_chunked_resumes_bit_exact_from_previous_good_checkpoint(tmp_path, capfd):
    params = {"decay": 0.97}
    adv = jax.jit(lambda s: rollout.rollout(_noisy_step, s, params, 10, save_every=5,
                                            observe=lambda s, p: jnp.mean(s["x"] ** 2)))
    s0 = {"key": jax.random.key(0), "x": jnp.ones(4096, jnp.float32)}
    straight = runner.run_chunked(adv, s0, n_chunks=6, steps_per_chunk=10, progress=False)
    d = tmp_path / "ck"
    with Checkpointer(d, save_every=10, keep=5) as ck:
        runner.run_chunked(adv, s0, n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False)
    path = _data_files(d / "40")[-1]
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x00" * 64)
    with Checkpointer(d, save_every=10, keep=5) as ck:
        resumed = runner.run_chunked(adv, s0, n_chunks=6, steps_per_chunk=10, checkpointer=ck, progress=False)
        assert ck.latest_step() == 60 and 40 in ck.all_steps()  # the bad step was moved aside and rewritten
    assert resumed.resumed_from == 30
    assert "step 40" in capfd.readouterr().err
    np.testing.assert_array_equal(resumed.state["x"], straight.state["x"])
    np.testing.assert_array_equal(resumed.history, straight.history)
    n40 = 4 * (straight.history.shape[0] // 6)
    with Checkpointer(d, save_every=10, keep=5) as ck:  # the rewritten step 40 is good
        _, again, _ = ck.restore({"state": s0, "history": straight.history[:n40]}, step=40)
    np.testing.assert_array_equal(again["history"], straight.history[:n40])
