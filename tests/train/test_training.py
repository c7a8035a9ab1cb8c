"""ivhl_jax.train.training: the shared train step (policies, loss scaling, accumulation)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import data, training


def _regression():
    x = jax.random.normal(jax.random.key(0), (256, 8))
    return x, x @ jnp.arange(8.0)


def _loss_fn(p, batch, key, extra):
    x, y = batch
    # Compute in the policy's dtype: with f32 data the fp16 weights would be upcast, and XLA:GPU keeps
    # such f16 round trips in f32 (excess precision), so the fp16 overflow below would never happen.
    pred = x.astype(p["w"].dtype) @ p["w"]
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2), ({}, extra)


@pytest.mark.parametrize("policy", ["fp32", "bf16", "fp16"])
def test_train_step_converges_and_keeps_fp32_master_weights(policy):
    x, y = _regression()
    b = data.Batcher(256, 32, seed=1)
    opt = training.make_optimizer(learning_rate=0.05, warmup_steps=5, total_steps=300)
    st = training.init_train_state({"w": jnp.zeros(8)}, opt, key=jax.random.key(0), policy=policy)
    step = training.make_train_step(_loss_fn, opt, policy)
    st, m = jax.jit(lambda s: jax.lax.scan(lambda c, i: step(c, b.batch((x, y), i)), s, jnp.arange(300)))(st)
    assert st.params["w"].dtype == jnp.float32
    assert float(m["loss"][-1]) < 0.02 * float(m["loss"][0])
    assert np.isfinite(np.asarray(st.params["w"])).all()
    if policy == "fp16":
        # The initial scale 2^15 overflows on the first steps: those updates are skipped, the scale drops.
        assert int(m["skipped"][:20].sum()) >= 1 and float(m["loss_scale"][-1]) < 2.0**15
    else:
        assert int(m["skipped"].sum()) == 0


def test_non_finite_gradient_skips_the_whole_update_under_jit_and_vmap():
    """A NaN gradient leaves params and every optimizer leaf (Adam's count and moments) as they were; under vmap
    (where the update's cond becomes a select) each member of the ensemble decides on its own gradient."""
    x, y = _regression()
    opt = training.make_optimizer(name="adamw", learning_rate=0.01)
    st = training.init_train_state({"w": jnp.ones(8)}, opt, key=jax.random.key(0))
    step = jax.jit(training.make_train_step(_loss_fn, opt))
    st, _ = step(st, (x[:32], y[:32]))  # moments and count away from their initial values
    bad = (x[:32].at[3, 2].set(jnp.nan), y[:32])
    skipped, m = step(st, bad)
    assert int(m["skipped"]) == 1
    jax.tree_util.tree_map(
        np.testing.assert_array_equal, (skipped.params, skipped.opt_state), (st.params, st.opt_state)
    )
    taken, m = step(st, (x[32:64], y[32:64]))
    assert int(m["skipped"]) == 0 and not np.array_equal(taken.params["w"], st.params["w"])

    pair = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), st)
    batches = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), bad, (x[32:64], y[32:64]))
    both, m = jax.jit(jax.vmap(training.make_train_step(_loss_fn, opt)))(pair, batches)
    np.testing.assert_array_equal(m["skipped"], [1, 0])
    np.testing.assert_array_equal(both.params["w"][0], st.params["w"])
    np.testing.assert_allclose(both.params["w"][1], taken.params["w"], rtol=1e-6)


def test_gradient_accumulation_equals_big_batch():
    x, y = _regression()
    opt1 = training.make_optimizer(name="adam", learning_rate=0.01, clip_norm=None)
    opt4 = training.make_optimizer(name="adam", learning_rate=0.01, clip_norm=None, accumulate=4)
    s1 = training.init_train_state({"w": jnp.zeros(8)}, opt1, key=jax.random.key(0))
    s4 = training.init_train_state({"w": jnp.zeros(8)}, opt4, key=jax.random.key(0))
    step1, step4 = training.make_train_step(_loss_fn, opt1), training.make_train_step(_loss_fn, opt4)
    s1, _ = step1(s1, (x[:128], y[:128]))
    for i in range(4):
        s4, _ = step4(s4, (x[32 * i : 32 * (i + 1)], y[32 * i : 32 * (i + 1)]))
    np.testing.assert_allclose(s4.params["w"], s1.params["w"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("warmup, want", [(0, [0.01, 0.01]), (1, [0.0, 0.01]), (2, [0.0, 0.005])])
def test_a_run_as_short_as_its_warm_up_gets_a_schedule(warmup, want):
    # total_steps = max(warmup, 1) leaves no step to decay over (optax refuses decay_steps=0): the warm-up alone
    total = max(warmup, 1)
    opt = training.make_optimizer(
        name="adam", learning_rate=0.01, warmup_steps=warmup, total_steps=total, clip_norm=None
    )
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    lrs = []
    for _ in range(2):
        updates, state = opt.update({"w": jnp.ones(3)}, state, params)
        lrs.append(-float(updates["w"][0]))
    np.testing.assert_allclose(lrs, want, rtol=1e-4, atol=1e-7)
