"""Observations streamed to disk (ivhl_jax.run.sink.ObservationSink through run_chunked): the file equals the
in-memory trajectory, memory stays flat whatever the number of saves, and a run killed with SIGKILL then resumed
gives the same records as an uninterrupted one (none lost, none twice)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.numerics.rollout import Stepper, chunked
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.run.sink import ObservationSink


def _noisy(state, params):
    key, sub = jax.random.split(state["key"])
    return {"key": key, "x": params * state["x"] + jax.random.normal(sub, state["x"].shape)}


def _observe(state, params):
    return {"x": state["x"], "norm": jnp.sum(state["x"] ** 2)}


def _start():
    return {"key": jax.random.key(0), "x": jnp.zeros(256, jnp.float32)}


def test_ten_thousand_saves_stream_to_disk_equal_in_memory_and_keep_memory_flat(tmp_path):
    advance = chunked(Stepper(_noisy, jnp.float32(0.9)), 100, save_every=1, observe=_observe)
    in_memory = run_chunked(advance, _start(), n_chunks=100, steps_per_chunk=100, progress=False)
    assert in_memory.history["x"].shape == (10_000, 256)
    del in_memory  # keep its 10 MB history out of the live arrays counted below
    held = sum(a.nbytes for a in jax.live_arrays())
    sink = ObservationSink(tmp_path / "obs")
    streamed = run_chunked(advance, _start(), n_chunks=100, steps_per_chunk=100, progress=False, sink=sink)
    grown = sum(a.nbytes for a in jax.live_arrays()) - held
    assert streamed.history["x"].shape == (0, 256)  # nothing kept in memory ...
    assert grown < 1_000_000, grown  # ... while the records take 10 MB
    assert sink.records() == 10_000
    again = run_chunked(advance, _start(), n_chunks=100, steps_per_chunk=100, progress=False)
    on_disk = sink.read(again.history)
    np.testing.assert_array_equal(on_disk["x"], np.asarray(again.history["x"]))
    np.testing.assert_array_equal(on_disk["norm"], np.asarray(again.history["norm"]))


_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import jax, jax.numpy as jnp
    sys.path.insert(0, {here!r})
    from test_sink import _noisy, _observe, _start
    from ivhl_jax.numerics.rollout import Stepper, chunked
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.run.sink import ObservationSink
    from ivhl_jax.train.checkpoint import Checkpointer

    out, kill_at = sys.argv[1], int(sys.argv[2])
    inner = chunked(Stepper(_noisy, jnp.float32(0.9)), 10, save_every=2, observe=_observe)
    calls = [0]

    def advance(state):
        if not isinstance(state["x"], jax.core.Tracer):
            calls[0] += 1
            if calls[0] == kill_at:  # chunks 0 .. kill_at - 2 are on disk, the last one past the checkpoint
                os.kill(os.getpid(), signal.SIGKILL)
        return inner(state)

    with Checkpointer(os.path.join(out, "ckpt"), save_every=20) as ck:
        run_chunked(advance, _start(), n_chunks=8, steps_per_chunk=10, checkpointer=ck, progress=False,
                    sink=ObservationSink(os.path.join(out, "obs")))
""")


@pytest.mark.slow  # three fresh processes: about 20 s
@pytest.mark.parametrize("kill_at", [4, 6])
def test_sigkill_then_resume_gives_the_records_of_an_uninterrupted_run(tmp_path, kill_at):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT.format(here=os.path.dirname(__file__)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = [sys.executable, str(script)]
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    p = subprocess.run([*run, killed, str(kill_at)], env=env, capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    obs = ObservationSink(os.path.join(killed, "obs"))
    assert obs.records() == 5 * (kill_at - 1)  # one chunk past the newest checkpoint (every 2 chunks)
    for out in (killed, straight):
        p = subprocess.run([*run, out, "0"], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    a, b = ObservationSink(os.path.join(killed, "obs")), ObservationSink(os.path.join(straight, "obs"))
    assert a.records() == b.records() == 40
    assert sorted(os.listdir(a.directory)) == sorted(os.listdir(b.directory))
    for x, y in zip(a.read(), b.read(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_sink_bad_inputs(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        ObservationSink(f)
    sink = ObservationSink(tmp_path / "obs")
    with pytest.raises(ValueError, match="same leading record axis"):
        sink.append(0, {"a": np.zeros(3), "b": np.zeros(4)})
    sink.append(0, {"a": np.zeros(3)})
    with pytest.raises(ValueError, match="checkpoint expects 5"):
        sink.truncate(5)
    sink.append(5, {"a": np.zeros(3)})
    with pytest.raises(ValueError, match="starts at record 5"):
        sink.records()
    with pytest.raises(TypeError, match="sink must be"):
        run_chunked(lambda s: (s, s[None]), jnp.zeros(1), n_chunks=1, steps_per_chunk=1, progress=False,
                    sink=str(tmp_path))
