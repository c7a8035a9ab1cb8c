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
