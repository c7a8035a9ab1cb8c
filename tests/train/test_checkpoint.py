"""ivhl_jax.train.checkpoint: dtypes and keys round-trip, restore onto another mesh or fewer devices, and
integrity under fault injection (flipped bytes, truncation, deleted items, stray step folders, NaN)."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax import checkpoint, parallel, rollout, runner, training
from ivhl_jax.train.checkpoint import CHECKSUM_FILE, CheckpointCorruptError, Checkpointer

ON_CPU = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the suite emulates 8 CPU devices; an accelerator has as many as it has"
)

# A failed Orbax read abandons the step's other reads mid-flight ("Exception ignored in <coroutine ...>", "Event loop
# is closed"); the Checkpointer checks a step's files before Orbax reads them, so no test here may see one.
ORBAX_UNRAISABLE = pytest.mark.filterwarnings(
    "error::pytest.PytestUnraisableExceptionWarning", "error::pytest.PytestUnhandledThreadExceptionWarning"
)


@ON_CPU
def test_checkpoint_dtypes_and_restore_onto_other_mesh(tmp_path):
    mesh8 = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    mesh4 = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    state = {
        "f32": jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(mesh8, P("x"))),
        "bf16": jnp.linspace(0, 1, 8, dtype=jnp.bfloat16),
        "c64": (jnp.arange(4) + 1j * jnp.arange(4)).astype(jnp.complex64),
        "key": jax.random.key(7),
    }
    with checkpoint.Checkpointer(tmp_path, keep=2) as ck:
        for s in (1, 2, 3):
            ck.save(s, state)
        assert ck.all_steps() == [2, 3]
        _, same, meta = ck.restore(state)
        assert meta is None
        for k in ("f32", "bf16", "c64"):
            assert same[k].dtype == state[k].dtype
            np.testing.assert_array_equal(np.asarray(same[k]), np.asarray(state[k]))
        np.testing.assert_array_equal(jax.random.key_data(same["key"]), jax.random.key_data(state["key"]))
        target = {
            "f32": NamedSharding(mesh4, P("x")),
            "bf16": NamedSharding(mesh4, P()),
            "c64": NamedSharding(mesh4, P()),
            "key": NamedSharding(mesh4, P()),
        }
        _, moved, _ = ck.restore(state, sharding=target)
        assert moved["f32"].sharding.mesh.shape == {"x": 4}
        np.testing.assert_array_equal(np.asarray(moved["f32"]), np.asarray(state["f32"]))
        with pytest.raises(FileNotFoundError, match="no checkpoint for step 9"):
            ck.restore(state, step=9)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")
def test_checkpoint_restores_on_fewer_devices(tmp_path):
    """Saved FSDP-sharded over 8 devices; restored over 4 devices and on a single device, bit-exactly."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(64, 24)), jnp.float32), "b": jnp.zeros(24, jnp.bfloat16)}
    opt = training.make_optimizer(learning_rate=1e-3)
    state = training.init_train_state(params, opt, key=jax.random.key(5))
    state = state.replace(
        opt_state=jax.tree_util.tree_map(lambda x: x + 1 if x.dtype != jnp.int32 else x, state.opt_state)
    )
    mesh8 = parallel.make_mesh({"fsdp": 8})
    s8 = parallel.shard_tree(state, parallel.state_shardings(state, mesh8, min_size=1))
    assert s8.params["w"].sharding.spec == P("fsdp", None)
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(7, s8, metadata={"devices": 8})
    for devices in (jax.devices()[:4], jax.devices()[4:5]):
        mesh = parallel.make_mesh({"fsdp": -1}, devices=devices)
        step, back, meta = Checkpointer(tmp_path / "ck").restore(
            state, sharding=parallel.state_shardings(state, mesh, min_size=1)
        )
        assert step == 7 and meta == {"devices": 8}
        assert back.params["w"].sharding.device_set == set(devices)
        for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(state), strict=True):
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


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
        data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
        f.seek(0)
        f.write(data)


def _truncate(d):
    path = _data_files(d / "30")[-1]
    os.truncate(path, os.path.getsize(path) // 2)


def _delete_item(d):
    shutil.rmtree(d / "30" / "state")


def _delete_metadata(d):
    os.remove(d / "30" / "_CHECKPOINT_METADATA")


@ORBAX_UNRAISABLE
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
    warnings = [line for line in err.splitlines() if "skipped bad checkpoint" in line]
    assert len(warnings) == 1 and "step 30" in warnings[0] and str(d) in warnings[0]


@ORBAX_UNRAISABLE
def test_flipped_bytes_caught_by_checksum_when_a_named_step_is_restored(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d)
    _flip_bytes(d)
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError, match="step 30"):
        ck.restore(_state(0), step=30)


@ORBAX_UNRAISABLE
def test_stray_empty_step_folder_is_skipped(tmp_path, capfd):
    d = tmp_path / "ck"
    _save_steps(d)
    os.makedirs(d / "40")
    with Checkpointer(d, keep=5) as ck:
        step, restored, _ = ck.restore(_state(0))
        assert step == 30 and ck.latest_step() == 30
    _assert_is_step(restored, 30)
    assert "step 40" in capfd.readouterr().err


@ORBAX_UNRAISABLE
def test_nothing_good_raises_one_clear_error(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d, steps=(10, 20))
    for s in ("10", "20"):
        shutil.rmtree(d / s / "state")
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError) as info:
        ck.restore(_state(0))
    msg = str(info.value)
    assert f"no usable checkpoint in {d}" in msg and "step 20" in msg and "step 10" in msg


@ORBAX_UNRAISABLE
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


@ORBAX_UNRAISABLE
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


@ORBAX_UNRAISABLE
@ORBAX_UNRAISABLE
def test_run_chunked_resumes_bit_exact_from_previous_good_checkpoint(tmp_path, capfd):
    params = {"decay": 0.97}
    adv = jax.jit(
        lambda s: rollout.rollout(_noisy_step, s, params, 10, save_every=5, observe=lambda s, p: jnp.mean(s["x"] ** 2))
    )
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


@ORBAX_UNRAISABLE
@pytest.mark.parametrize("named", [False, True])
def test_a_template_of_another_shape_is_a_value_error_and_marks_nothing_bad(tmp_path, named):
    d = tmp_path / "ck"
    _save_steps(d, steps=(10, 20))
    wrong = dict(_state(0), x=jnp.zeros(100, jnp.float32))
    with Checkpointer(d, keep=5) as ck:
        with pytest.raises(ValueError, match=r"leaf \['x'\] has shape \(100,\).*holds shape \(4096,\)"):
            ck.restore(wrong, step=20 if named else None)
        assert ck.latest_step() == 20 and ck.all_steps() == [10, 20]
        step, restored, _ = ck.restore(_state(0))  # the right template restores the newest step
    assert step == 20
    _assert_is_step(restored, 20)
    assert not os.path.exists(str(d) + ".bad")


def test_a_checkpoint_directory_that_is_a_file_is_refused_at_construction(tmp_path):
    f = tmp_path / "hostname"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        Checkpointer(f)
    with pytest.raises(ValueError, match="which is a file"):
        Checkpointer(f / "ckpt")
    with pytest.raises(TypeError, match="directory"):
        Checkpointer("")


@ORBAX_UNRAISABLE
def test_nothing_good_is_one_error_without_a_warning_per_step(tmp_path, capfd):
    d = tmp_path / "ck"
    _save_steps(d, steps=(10, 20, 30))
    for s in ("10", "20", "30"):
        shutil.rmtree(d / s / "state")
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError):
        ck.restore(_state(0))
    assert "WARNING" not in capfd.readouterr().err


def test_importing_the_checkpoint_module_does_not_import_orbax():
    import subprocess
    import sys

    code = "import sys, ivhl_jax.train.checkpoint; print('orbax.checkpoint' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.stdout.strip() == "False"


def _json_metadata(step_dir) -> str:
    return os.path.join(step_dir, "state", "array_metadatas", "process_0")


@ORBAX_UNRAISABLE
@pytest.mark.parametrize("recorded", [True, False])
def test_damaged_metadata_is_refused_before_orbax_reads_the_step(tmp_path, capfd, recorded):
    """A truncated metadata file: one short error naming the file and --no-resume, and none of Orbax's abandoned
    reads ("Exception ignored", "Event loop is closed"), with the file sizes recorded at save or (an older
    checkpoint) without them."""
    import gc

    d = tmp_path / "ck"
    _save_steps(d, steps=(10, 20))
    for s in ("10", "20"):
        if not recorded:
            path = d / s / CHECKSUM_FILE
            sums = json.loads(path.read_text())
            sums.pop(checkpoint.FILES_KEY, None)  # as written before file sizes were recorded
            path.write_text(json.dumps(sums))
        os.truncate(_json_metadata(d / s), 10)
    with Checkpointer(d, keep=5) as ck, pytest.raises(CheckpointCorruptError) as info:
        ck.restore(_state(0))
    gc.collect()
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 600, msg
    assert f"no usable checkpoint in {d}" in msg and "--no-resume" in msg and "array_metadatas" in msg, msg
    assert ("truncated" if recorded else "not readable JSON") in msg, msg
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Event loop is closed" not in err and "Traceback" not in err, err
