"""``sims._common``: the records a training run streams come back as its history, with the program's ``advance``
traced once (by ``run_chunked``), not again to shape what the store hands back; a shared config key shows its one
meaning."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.run.config import option
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims._common import SHARED_KEYS, TrainingRun, shared_key, train_in_chunks


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


def test_shared_key_shows_its_one_meaning_and_refuses_another_name():
    (field,) = dataclasses.fields(dataclasses.make_dataclass("C", [("clip_norm", float, shared_key("clip_norm", 2.0))]))
    assert field.default == 2.0 and field.metadata["help"] == SHARED_KEYS["clip_norm"]
    with pytest.raises(ValueError, match=r"name must be one of the shared keys \['steps', .*got 'step'"):
        shared_key("step", 10)
