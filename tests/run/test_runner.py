"""ivhl_jax.run.runner: chunked runs resume bit-exactly from a checkpoint; a terminal is never silent during a
long phase (the first chunk's compile is announced before and after it; phase lines)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax import checkpoint, rollout, runner


def _noisy_step(state, params):
    key, sub = jax.random.split(state["key"])
    x = state["x"] * params["decay"] + 0.1 * jax.random.normal(sub, state["x"].shape)
    return {"key": key, "x": x}


def test_checkpoint_resume_bit_exact(tmp_path):
    """2K steps straight == K steps, checkpoint, restore in a new manager, K more."""
    params = {"decay": 0.97}
    adv = jax.jit(
        lambda s: rollout.rollout(_noisy_step, s, params, 10, save_every=5, observe=lambda s, p: jnp.mean(s["x"] ** 2))
    )
    s0 = {"key": jax.random.key(0), "x": jnp.ones(32, jnp.float32)}
    straight = runner.run_chunked(adv, s0, n_chunks=8, steps_per_chunk=10, progress=False)
    with checkpoint.Checkpointer(tmp_path / "ck", save_every=20) as ck:
        first = runner.run_chunked(
            adv, s0, n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False, metadata={"cursor": 7}
        )
        assert ck.latest_step() == 40 and first.resumed_from is None
    with checkpoint.Checkpointer(tmp_path / "ck", save_every=20) as ck:
        resumed = runner.run_chunked(adv, s0, n_chunks=8, steps_per_chunk=10, checkpointer=ck, progress=False)
    assert resumed.resumed_from == 40 and resumed.metadata == {"cursor": 7}
    np.testing.assert_array_equal(resumed.state["x"], straight.state["x"])
    np.testing.assert_array_equal(jax.random.key_data(resumed.state["key"]), jax.random.key_data(straight.state["key"]))
    np.testing.assert_array_equal(resumed.history, straight.history)


def test_run_chunked_announces_the_compile_before_and_after(capsys):
    advance = jax.jit(lambda s: (s + 1.0, s[None]))
    res = runner.run_chunked(advance, jnp.zeros(3), n_chunks=4, steps_per_chunk=1, description="demo")
    assert res.steps == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "compiling demo ..."  # printed before the compile starts
    assert err[1].startswith("compiling demo: done in ") and err[1].endswith(" s")
    assert any(line.startswith("demo: 4/4 steps") for line in err[2:])
    runner.run_chunked(advance, jnp.zeros(3), n_chunks=2, steps_per_chunk=1, progress=False)
    assert capsys.readouterr().err == ""  # --no-progress stays quiet


def test_phase_lines():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), runner.phase("loading data", detail="2 files") as note:
        note("1/2 files")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "loading data (2 files) ..."
    assert lines[1].startswith("loading data: 1/2 files (") and lines[2].startswith("loading data: done in")


def test_restore_chunked_restores_a_streamed_and_a_non_streamed_run_alike(tmp_path):
    """The same run, once with its records streamed to a store (the checkpoint holds the state alone) and once
    without (the checkpoint holds the history too), restores to the same state at the same step: read from the
    checkpoint (streamed=None) and as the runner asks (streamed given); the non-streamed history equals the
    records the store holds. No checkpoint: None."""
    from ivhl_jax.run.store import RunStore

    params = {"decay": 0.97}
    adv = jax.jit(
        lambda s: rollout.rollout(_noisy_step, s, params, 10, save_every=5, observe=lambda s, p: jnp.mean(s["x"] ** 2))
    )
    s0 = {"key": jax.random.key(0), "x": jnp.ones(32, jnp.float32)}
    _, obs = jax.eval_shape(adv, s0)
    restored = {}
    for streamed in (False, True):
        folder = tmp_path / f"streamed_{streamed}"
        with checkpoint.Checkpointer(folder / "ckpt", save_every=20) as ck:
            assert runner.restore_chunked(ck, s0, obs, steps_per_chunk=10) is None
            store = RunStore(folder / "run.zarr", config={"n": 1}) if streamed else None
            runner.run_chunked(adv, s0, n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False, sink=store)
            if store is not None:
                store.close()
        with checkpoint.Checkpointer(folder / "ckpt", save_every=20) as ck:
            found = runner.restore_chunked(ck, s0, obs, steps_per_chunk=10)
            asked = runner.restore_chunked(ck, s0, obs, steps_per_chunk=10, n_chunks=4, streamed=streamed)
        for got in (found, asked):
            assert got.step == 40 and got.done == 4
            assert (got.history is None) == streamed
            np.testing.assert_array_equal(got.state["x"], found.state["x"])
        restored[streamed] = found
    plain, streamed_run = restored[False], restored[True]
    np.testing.assert_array_equal(plain.state["x"], streamed_run.state["x"])
    keys = (jax.random.key_data(r.state["key"]) for r in (plain, streamed_run))
    np.testing.assert_array_equal(*keys)
    assert plain.history.shape == (8,)  # 4 chunks of 2 records
    import xarray as xr

    stored = xr.open_zarr(tmp_path / "streamed_True" / "run.zarr")
    (name,) = (v for v in stored.data_vars if stored[v].dims == ("time",))
    np.testing.assert_array_equal(plain.history, stored[name].values)
