"""ivhl_jax.models.gru: the GRU trajectory model (shapes, bounded step, gradients)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.models.gru import TrajectoryGRU


def test_trajectory_gru_shapes_and_grad():
    model = TrajectoryGRU(hidden=8, layers=2)
    p = jnp.zeros((6, 3, 2))
    params = jax.jit(model.init)(jax.random.key(0), p)["params"]
    out = jax.jit(model.apply)({"params": params}, p)
    assert out.shape == (6, 3, 2)
    assert float(jnp.max(jnp.abs(out - p))) <= 0.5 * model.step_scale
    g = jax.jit(jax.grad(lambda q: jnp.sum(model.apply({"params": q}, p + 0.1) ** 2)))(params)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(g))
