"""``sims._common.train_in_chunks``: the records a training run streams come back as its history, with the
program's ``advance`` traced once (by ``run_chunked``), not again to shape what the store hands back."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.run.config import option
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims._common import TrainingRun, train_in_chunks


@dataclasses.dataclass(frozen=True)
class _Counting:
    steps: int = option(6, "steps to run")
    steps_per_chunk: int = option(2, "steps per chunk")


def test_streamed_history_read_back_with_one_trace(tmp_path, monkeypatch):
    traces = []

    def advance(s):
        traces.append(1)  # a trace (jit, eval_shape) runs this body; a cached compiled call does not
        steps = s + jnp.arange(1, 3, dtype=jnp.float32)
        return s + 2, {"loss": steps, "sum": {"twice": 2 * steps}}

    shapes = []
    eval_shape = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: shapes.append(1) or eval_shape(*a, **k))
    sink = RunStore(tmp_path / "run.zarr", config={"steps": 6})
    run = TrainingRun(str(tmp_path), progress=False, plots=False, sink=sink)
    res = train_in_chunks(_Counting(), run, jax.jit(advance), jnp.float32(0), "count", units={"loss": "1"})
    sink.close()
    np.testing.assert_array_equal(res.history["loss"], np.arange(1, 7, dtype=np.float32))
    np.testing.assert_array_equal(res.history["sum"]["twice"], 2 * np.arange(1, 7, dtype=np.float32))
    assert res.history["loss"].dtype == np.float32 and float(res.state) == 6
    assert len(shapes) == 1, f"advance's records were shaped {len(shapes)} times (run_chunked's one is enough)"
    assert len(traces) == 1, f"advance was traced {len(traces)} times"
