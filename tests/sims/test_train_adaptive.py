"""Training of the adaptive model: jitted chunks, checkpoint resume bit-exact, CLI outputs, accuracy (slow)."""

from __future__ import annotations

import json
import os

import chex
import jax
import numpy as np
import pytest

from ivhl_jax.run.config import load_config
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.sims import train_adaptive as ta
from ivhl_jax.sims._common import TrainingRun
from ivhl_jax.train.checkpoint import Checkpointer

TINY = [
    "steps=20",
    "steps_per_chunk=10",
    "batch_size=16",
    "model.num_nodes=8",
    "model.hidden_dim=8",
    "model.inner_steps=1",
]


@pytest.mark.slow  # ~30 s; chunked resume is covered fast in tests/run/test_runner.py and the sim tests
def test_train_chunks_resume_bit_exactly(tmp_path):
    cfg = load_config(ta.TrainAdaptiveConfig, None, TINY + ["preset=reference"])
    data = ta.load_dataset(cfg)
    _, mcfg, carry, state, advance, _ = ta.build(cfg, data)
    assert carry and mcfg.scheduler == "shared" and mcfg.input_dim == 64
    full = run_chunked(advance, state, n_chunks=2, steps_per_chunk=10, progress=False)
    with Checkpointer(tmp_path / "ckpt") as ck:
        first = run_chunked(advance, state, n_chunks=1, steps_per_chunk=10, checkpointer=ck, progress=False)
    assert int(first.state.step) == 10
    with Checkpointer(tmp_path / "ckpt") as ck:
        resumed = run_chunked(advance, state, n_chunks=2, steps_per_chunk=10, checkpointer=ck, progress=False)
    assert resumed.resumed_from == 10
    chex.assert_trees_all_equal(jax.random.key_data(full.state.key), jax.random.key_data(resumed.state.key))
    chex.assert_trees_all_equal(full.state.replace(key=None), resumed.state.replace(key=None))
    chex.assert_trees_all_equal(full.history, resumed.history)
    assert int(full.state.step) == 20  # the data cursor
    assert np.all(np.isfinite(np.asarray(full.history["loss"])))


@pytest.mark.slow  # ~100 s on the loaded 2-core host (one compile of the training chunk)
def test_cli_writes_summary_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--no-progress"] + [a for s in TINY for a in ("--set", s)]
    assert ta.main(argv) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 20 and 0.0 <= s["test_accuracy"] <= 1.0
    assert s["n_test"] == 359 and s["n_train"] == 1438
    assert abs(sum(s["phase_ratios_last100"].values()) - 1.0) < 1e-5
    for f in ("metrics.json", "training.png", "energy.png"):
        assert os.path.exists(out / f)
    assert "test accuracy" in capsys.readouterr().out


def test_config_errors_are_named():
    with pytest.raises(ValueError, match="dataset"):
        load_config(ta.TrainAdaptiveConfig, None, ["dataset=mnist"])


@pytest.mark.slow
def test_improved_model_reaches_97_percent_on_digits(tmp_path):
    accs = []
    for seed in (0, 1, 2):
        cfg = load_config(ta.TrainAdaptiveConfig, None, ["steps=1500", "steps_per_chunk=500", f"seed={seed}"])
        run = TrainingRun(str(tmp_path / f"run{seed}"), progress=False, plots=False)
        accs.append(ta.train(cfg, run)["test_accuracy"])
    # The goal (>= 97 %) is asserted on the median of three seeds, not on one lucky random stream: measured
    # over seeds 0-5, 0.967-0.975 (347-350 of 359 test digits), median 0.972.
    assert float(np.median(accs)) >= 0.97, accs


# --- plots --------------------------------------------------------------------------------------------------------
def test_adaptive_plots(tmp_path, is_png, loss_history):
    from ivhl_jax.nn import adaptive
    from ivhl_jax.sims import train_adaptive as ta

    hist = loss_history()
    n = len(hist["loss"])
    hist.update(
        accuracy=np.linspace(0.1, 0.9, n),
        test_accuracy=np.array([0.3, 0.6, 0.8]),
        mean_energy=np.linspace(1, 0.5, n),
        mean_anxiety=np.linspace(0.2, 0.1, n),
    )
    for p in adaptive.PHASES:
        hist[f"{p}_ratio"] = np.full(n, 1.0 / len(adaptive.PHASES))
    paths = ta._plots(str(tmp_path), hist, 20)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["training.png", "energy.png"]
    assert all(is_png(p) for p in paths)
