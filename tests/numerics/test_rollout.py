"""ivhl_jax.numerics.rollout: same key, same bits; rollout against a manual loop; remat gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import rollout


def _noisy_step(state, params):
    key, sub = jax.random.split(state["key"])
    x = state["x"] * params["decay"] + 0.1 * jax.random.normal(sub, state["x"].shape)
    return {"key": key, "x": x}


def test_same_key_bit_identical():
    s0 = {"key": jax.random.key(42), "x": jnp.zeros(16)}
    f = jax.jit(lambda s: rollout.rollout(_noisy_step, s, {"decay": 0.9}, 50)[0]["x"])
    np.testing.assert_array_equal(f(s0), f(s0))
    s1 = {"key": jax.random.key(43), "x": jnp.zeros(16)}
    assert not np.array_equal(f(s0), f(s1))


def test_rollout_matches_manual_loop_and_remat_grad():
    step = lambda s, p: s + p * jnp.sin(s)
    s0 = jnp.linspace(0, 1, 5)
    final, obs = rollout.rollout(step, s0, 0.1, 12, save_every=4, observe=lambda s, p: s.sum())
    ref = s0
    sums = []
    for i in range(12):
        ref = step(ref, 0.1)
        if (i + 1) % 4 == 0:
            sums.append(ref.sum())
    np.testing.assert_allclose(final, ref, rtol=1e-6)
    np.testing.assert_allclose(obs, np.array(sums), rtol=1e-6)
    g1 = jax.grad(lambda p: rollout.rollout(step, s0, p, 12, save_every=4)[0].sum())(0.1)
    g2 = jax.grad(lambda p: rollout.rollout(step, s0, p, 12, save_every=4, remat=True)[0].sum())(0.1)
    np.testing.assert_allclose(g1, g2, rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of save_every"):
        rollout.rollout(step, s0, 0.1, 10, save_every=4)
