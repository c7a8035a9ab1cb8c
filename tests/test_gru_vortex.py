"""Vortex-trajectory data from wave fields and the GRU trajectory model."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.models.gru import TrajectoryGRU
from ivhl_jax.run.config import load_config
from ivhl_jax.sims import train_vortex_gru as tv


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


def test_trajectory_gru_shapes_and_grad():
    model = TrajectoryGRU(hidden=8, layers=2)
    p = jnp.zeros((6, 3, 2))
    params = jax.jit(model.init)(jax.random.key(0), p)["params"]
    out = jax.jit(model.apply)({"params": params}, p)
    assert out.shape == (6, 3, 2)
    assert float(jnp.max(jnp.abs(out - p))) <= 0.5 * model.step_scale
    g = jax.jit(jax.grad(lambda q: jnp.sum(model.apply({"params": q}, p + 0.1) ** 2)))(params)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(g))


@pytest.mark.slow
def test_training_beats_persistence(tmp_path):
    cfg = load_config(tv.VortexGRUConfig, None, ["n_train=64", "n_test=16", "grid=24", "hidden=32",
                                                 "steps=400", "chunk=200"])
    s = tv.train(cfg, str(tmp_path / "run"), progress=False)
    assert s["gru_test_rmse"] < s["persistence_rmse"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 400
