"""ivhl_jax.train.parallel on 8 emulated CPU devices: mesh, logical rules, DP / FSDP / TP / PP equal to one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ivhl_jax import parallel, training

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")


# ----- a small MLP with logical names -----------------------------------------------------------

def mlp_params(key, d_in=16, d_hidden=64, d_out=8):
    k1, k2 = jax.random.split(key)
    params = {
        "dense1": {"kernel": jax.random.normal(k1, (d_in, d_hidden)) / np.sqrt(d_in), "bias": jnp.zeros(d_hidden)},
        "dense2": {"kernel": jax.random.normal(k2, (d_hidden, d_out)) / np.sqrt(d_hidden), "bias": jnp.zeros(d_out)},
    }
    names = {"dense1": {"kernel": ("embed", "mlp"), "bias": ("mlp",)},
             "dense2": {"kernel": ("mlp", "embed"), "bias": ("embed",)}}
    return params, names


def mlp_loss(params, batch, key, extra):
    h = jax.nn.gelu(batch["x"] @ params["dense1"]["kernel"] + params["dense1"]["bias"])
    y = h @ params["dense2"]["kernel"] + params["dense2"]["bias"]
    loss = jnp.mean((y - batch["y"]) ** 2)
    return loss, ({"mse": loss}, extra)


def make_data(n=64, d_in=16, d_out=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in)).astype(np.float32)
    w = rng.normal(size=(d_in, d_out)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def run_steps(step, state, batch, n):
    losses = []
    for _ in range(n):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    return state, np.array(losses)


@pytest.fixture(scope="module")
def reference():
    params, names = mlp_params(jax.random.key(0))
    opt = training.make_optimizer(learning_rate=1e-2)
    batch = make_data()
    state = training.init_train_state(params, opt, key=jax.random.key(1))
    dev0 = jax.devices()[0]
    state1 = jax.device_put(state, dev0)
    step = jax.jit(training.make_train_step(mlp_loss, opt))
    final, losses = run_steps(step, state1, jax.device_put(batch, dev0), 3)
    return dict(params=params, names=names, opt=opt, batch=batch, state=state, final=final, losses=losses)


# ----- mesh and rules ----------------------------------------------------------------------------

def test_make_mesh_from_spec():
    mesh = parallel.make_mesh({"data": -1, "fsdp": 1, "tensor": 2, "pipeline": 1})
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2, "pipeline": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert dict(parallel.make_mesh().shape) == {"data": 8}
    assert dict(parallel.make_mesh({"data": 2}, devices=jax.devices()[:2]).shape) == {"data": 2}
    with pytest.raises(ValueError, match="at most one axis"):
        parallel.make_mesh({"data": -1, "tensor": -1})
    with pytest.raises(ValueError, match="needs 6 devices"):
        parallel.make_mesh({"data": 3, "tensor": 2})
    with pytest.raises(ValueError, match="does not divide"):
        parallel.make_mesh({"data": -1, "tensor": 3})


def test_logical_rules():
    mesh = parallel.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    assert parallel.logical_to_spec(("embed", "mlp"), mesh) == P("fsdp", "tensor")
    assert parallel.logical_to_spec(("mlp", "embed"), mesh) == P("tensor", "fsdp")
    assert parallel.logical_to_spec(("embed", "heads", "kv"), mesh) == P("fsdp", "tensor", None)
    assert parallel.logical_to_spec(("batch", "length", "embed"), mesh) == P("fsdp", None, None)  # fsdp used once
    # size-1 mesh axes vanish; indivisible dims stay replicated
    mesh_dp = parallel.make_mesh({"data": 8, "tensor": 1})
    assert parallel.logical_to_spec(("embed", "mlp"), mesh_dp) == P(None, None)
    assert parallel.logical_to_spec(("batch", "embed"), mesh_dp) == P("data", None)
    assert parallel.logical_to_spec(("embed", "mlp"), mesh, shape=(6, 8)) == P(None, "tensor")
    # unnamed leaves fall back to FSDP on their largest divisible dimension
    sh = parallel.param_shardings({"w": jnp.zeros((12, 128)), "b": jnp.zeros(3)}, mesh)
    assert sh["w"].spec == P(None, "fsdp") and sh["b"].spec == P()
    with pytest.raises(ValueError, match="do not match"):
        parallel.param_shardings({"w": jnp.zeros((4, 4))}, mesh, {"w": ("embed",)})


def test_flax_boxes_carry_names():
    import flax.linen as nn

    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            k = self.param("kernel", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                           (x.shape[-1], 32))
            return x @ k

    variables = Tiny().init(jax.random.key(0), jnp.zeros((2, 16)))
    mesh = parallel.make_mesh({"fsdp": 4, "tensor": 2})
    sh = parallel.param_shardings(variables["params"], mesh)
    assert sh["kernel"].spec == P("fsdp", "tensor")
    placed = parallel.shard_tree(parallel.unbox(variables["params"]), sh)
    assert placed["kernel"].sharding.spec == P("fsdp", "tensor")


# ----- data parallel / FSDP / TP by sharding ---------------------------------------------------------

@pytest.mark.parametrize("spec", [{"data": 8}, {"fsdp": 8},
                                  pytest.param({"data": 2, "fsdp": 4}, marks=pytest.mark.slow),
                                  {"data": 2, "fsdp": 2, "tensor": 2}])
def test_sharded_training_equals_single_device(reference, spec):
    mesh = parallel.make_mesh(spec)
    ref = reference
    shardings = parallel.state_shardings(ref["state"], mesh, {"dense1": ref["names"]["dense1"],
                                                              "dense2": ref["names"]["dense2"]}, min_size=1)
    state = parallel.shard_tree(ref["state"], shardings)
    batch = parallel.shard_batch(ref["batch"], mesh)
    bsh = jax.tree_util.tree_map(lambda x: x.sharding, batch)
    step = parallel.jit_train_step(training.make_train_step(mlp_loss, ref["opt"]), shardings, bsh, mesh)
    final, losses = run_steps(step, state, batch, 3)
    np.testing.assert_allclose(losses, ref["losses"], rtol=2e-6, atol=1e-7)
    for a, b in zip(jax.tree_util.tree_leaves(final.params), jax.tree_util.tree_leaves(ref["final"].params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the parameters really are split as the mesh says (and Adam moments like them)
    k = final.params["dense1"]["kernel"]
    if mesh.shape.get("fsdp", 1) > 1:
        assert "fsdp" in k.sharding.spec
        assert k.addressable_shards[0].data.size < k.size
        mu = final.opt_state[1][0].mu["dense1"]["kernel"]
        assert mu.sharding.spec == k.sharding.spec
    else:
        assert "fsdp" not in k.sharding.spec
    if mesh.shape.get("tensor", 1) > 1:
        assert k.sharding.spec[1] == "tensor"
