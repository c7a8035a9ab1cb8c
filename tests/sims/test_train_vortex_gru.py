"""`ivhl train vortex_gru`: vortex-trajectory data from wave fields, baselines, training, and its plots."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.run.config import load_config
from ivhl_jax.sims import train_vortex_gru as tv
from ivhl_jax.sims._common import TrainingRun


def test_detection_from_the_field_is_sub_grid_accurate():
    centres = jnp.array([[0.0, 0.0], [0.123, -0.271], [-0.4, 0.33], [0.31, 0.05]])
    got = jax.jit(jax.vmap(lambda c: tv.detect(c, 32)))(centres)
    h = 2.0 / 31
    err = np.linalg.norm(np.asarray(got) - np.asarray(centres), axis=-1)
    assert np.all(err < 0.25 * h), err  # well inside one plaquette (nearest-plaquette would be ~h/2)


def test_fourier_paths_are_bounded_and_periodic_smooth():
    c = np.asarray(jax.jit(tv.fourier_paths, static_argnums=(1, 2, 3))(jax.random.key(0), 5, 40, 3))
    assert c.shape == (5, 40, 2)
    np.testing.assert_allclose(np.max(np.linalg.norm(c, axis=-1), axis=1), 0.5, rtol=1e-5)
    b = tv.baselines(c)
    assert b["constant_velocity_rmse"] < b["persistence_rmse"]


@pytest.mark.slow
def test_training_beats_persistence(tmp_path):
    cfg = load_config(
        tv.VortexGRUConfig,
        None,
        ["n_train=64", "n_test=16", "grid=24", "hidden=32", "steps=400", "steps_per_chunk=200"],
    )
    s = tv.train(cfg, TrainingRun(str(tmp_path / "run"), progress=False))
    assert s["gru_test_rmse"] < s["persistence_rmse"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 400


# --- plots --------------------------------------------------------------------------------------------------------
def test_vortex_gru_plots(tmp_path, is_png, loss_history):
    from ivhl_jax.sims import train_vortex_gru as tv

    hist = loss_history()
    hist["test_rmse"] = np.array([0.05, 0.03, 0.02])
    paths = np.linspace(-0.4, 0.4, 3 * 12 * 2).reshape(3, 12, 2)
    data = {"true_test": paths, "test": paths + 0.01}
    plot, curve = tv.write_plots(
        str(tmp_path), hist, data, paths[:, 1:] + 0.02, {"constant_velocity_rmse": 0.025, "persistence_rmse": 0.06}, 20
    )
    assert is_png(plot) and is_png(curve) and curve.endswith("loss_curve.png")


@pytest.mark.slow  # two tiny training runs: 70 s on the loaded 2-core host (GRU compile)
def test_vortex_gru_run_writes_its_pictures(tmp_path, capsys, is_png):
    from ivhl_jax.sims import train_vortex_gru as tv

    out = tmp_path / "run"
    sets = [
        "n_train=8",
        "n_test=4",
        "length=12",
        "grid=16",
        "hidden=8",
        "layers=1",
        "steps=4",
        "steps_per_chunk=2",
        "batch_size=4",
    ]
    assert tv.main(["--out", str(out), "--no-progress"] + [a for s in sets for a in ("--set", s)]) == 0
    assert is_png(out / "vortex_gru.png") and is_png(out / "loss_curve.png")
    printed = capsys.readouterr().out
    assert "loss_curve" in printed and "vortex_gru.png" in printed
    assert (
        tv.main(
            ["--out", str(tmp_path / "np"), "--no-progress", "--no-plots"] + [a for s in sets for a in ("--set", s)]
        )
        == 0
    )
    assert not (tmp_path / "np" / "loss_curve.png").exists()
