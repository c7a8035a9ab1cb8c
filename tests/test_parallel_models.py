"""Data parallel, FSDP and tensor parallel training of the real models equal to one device (8 emulated devices)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ivhl_jax import parallel, training

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")


def single_vs_sharded(loss_fn, params, batch, spec, logical=None, steps=2, extra=None, rtol=2e-5):
    opt = training.make_optimizer(learning_rate=3e-3)
    state = training.init_train_state(params, opt, key=jax.random.key(1), extra=extra)
    step_fn = training.make_train_step(loss_fn, opt)
    dev = jax.devices()[0]
    ref = jax.device_put(state, dev)
    ref_step = jax.jit(step_fn)
    ref_losses = []
    for _ in range(steps):
        ref, m = ref_step(ref, jax.device_put(batch, dev))
        ref_losses.append(float(m["loss"]))
    mesh = parallel.make_mesh(spec)
    sh = parallel.state_shardings(state, mesh, logical)
    gstate = parallel.shard_tree(state, sh)
    gbatch = parallel.shard_batch(batch, mesh)
    step = parallel.jit_train_step(step_fn, sh, jax.tree_util.tree_map(lambda a: a.sharding, gbatch), mesh)
    losses = []
    for _ in range(steps):
        gstate, m = step(gstate, gbatch)
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    # Adam divides by sqrt(v): for an entry whose gradient is ~round-off (an embedding row of a token
    # that barely occurs) a relative round-off difference moves it by a fraction of lr, so the
    # absolute tolerance is stated in units of the learning rate (3e-3): 2 % of lr per step.
    for a, b in zip(jax.tree_util.tree_leaves(gstate.params), jax.tree_util.tree_leaves(ref.params), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5,
                                   atol=0.02 * 3e-3 * steps)
    return gstate


@pytest.mark.slow
@pytest.mark.parametrize("spec", [{"fsdp": 8}, {"data": 2, "fsdp": 2, "tensor": 2}])
def test_transformer_sharded_equals_single_device(spec):
    tr = pytest.importorskip("ivhl_jax.models.transformer")
    cfg = tr.TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16).validate()
    params = tr.init_params(cfg, jax.random.key(0))
    logical = tr.param_logical_axes(cfg)
    tokens = jax.random.randint(jax.random.key(2), (16, 9), 0, cfg.vocab_size)
    g = single_vs_sharded(tr.lm_loss_fn(cfg), params, tokens, spec, logical)
    names = jax.tree_util.tree_leaves(logical, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    specs = [x.sharding.spec for x in jax.tree_util.tree_leaves(g.params)]
    for nm, sp in zip(names, specs, strict=True):  # every named dimension landed on its mesh axis
        for logical_name, mesh_axis in zip(nm, sp, strict=False):
            if logical_name == "embed":
                assert mesh_axis == "fsdp"
            if logical_name in ("mlp", "heads", "vocab"):
                assert mesh_axis == ("tensor" if spec.get("tensor", 1) > 1 else None)


@pytest.mark.slow
def test_transformer_data_parallel_equals_single_device():
    tr = pytest.importorskip("ivhl_jax.models.transformer")
    cfg = tr.TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16).validate()
    tokens = jax.random.randint(jax.random.key(2), (16, 9), 0, cfg.vocab_size)
    single_vs_sharded(tr.lm_loss_fn(cfg), tr.init_params(cfg, jax.random.key(0)), tokens, {"data": 8},
                      tr.param_logical_axes(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("spec", [{"data": 8}, {"fsdp": 8}])
def test_adaptive_model_sharded_equals_single_device(spec):
    am = pytest.importorskip("ivhl_jax.models.adaptive")
    ad = pytest.importorskip("ivhl_jax.nn.adaptive")
    cfg = ad.AdaptiveConfig(num_nodes=16, hidden_dim=8, input_dim=32, output_dim=4)
    model = am.AdaptiveModel(cfg)
    params = model.init_variables(jax.random.key(0))["params"]
    x = jax.random.normal(jax.random.key(3), (16, 32))
    y = jax.random.randint(jax.random.key(4), (16,), 0, 4)
    loss = am.make_classification_loss(model, carry_state=False)
    single_vs_sharded(loss, params, (x, y), spec, extra=ad.init_state(cfg, 16))
