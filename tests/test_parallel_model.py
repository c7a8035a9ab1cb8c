"""Tensor (Megatron) and pipeline (GPipe) parallelism equal to the single-device model, values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ivhl_jax import parallel

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")

E, H, D, F, T = 16, 4, 4, 32, 6


def block_params(key):
    ks = jax.random.split(key, 6)
    s = 1 / np.sqrt(E)
    return {
        "wq": jax.random.normal(ks[0], (E, H, D)) * s, "wk": jax.random.normal(ks[1], (E, H, D)) * s,
        "wv": jax.random.normal(ks[2], (E, H, D)) * s, "wo": jax.random.normal(ks[3], (H, D, E)) * s,
        "w_in": jax.random.normal(ks[4], (E, F)) * s, "b_in": jnp.full((F,), 0.1),
        "w_out": jax.random.normal(ks[5], (F, E)) / np.sqrt(F), "b_out": jnp.full((E,), -0.1),
    }


def rms(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def block_plain(p, x):
    """Reference pre-norm block written with plain jnp (no sharding anywhere)."""
    q = jnp.einsum("bte,ehd->bthd", rms(x), p["wq"])
    k = jnp.einsum("bte,ehd->bthd", rms(x), p["wk"])
    v = jnp.einsum("bte,ehd->bthd", rms(x), p["wv"])
    h = x + jnp.einsum("bthd,hde->bte", parallel.attention_core(q, k, v), p["wo"])
    return h + jax.nn.gelu(rms(h) @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def block_tp(p, x):
    """The same block on one tensor shard (inside shard_map)."""
    h = x + parallel.tp_attention(rms(x), p["wq"], p["wk"], p["wv"], p["wo"])
    return h + parallel.tp_mlp(rms(h), p["w_in"], p["b_in"], p["w_out"], p["b_out"])


def two_layer(params, x, block):
    for p in params:
        x = block(p, x)
    return x


def test_tensor_parallel_equals_single_device():
    mesh = parallel.make_mesh({"data": 4, "tensor": 2})
    params = [block_params(jax.random.key(i)) for i in range(2)]
    x = jax.random.normal(jax.random.key(9), (8, T, E))
    specs = [{k: parallel.logical_to_spec(parallel.TP_BLOCK_NAMES[k], mesh) for k in params[0]}] * 2
    assert specs[0]["w_in"] == P(None, "tensor") and specs[0]["w_out"] == P("tensor", None)  # column / row
    assert specs[0]["wq"] == P(None, "tensor", None) and specs[0]["wo"] == P("tensor", None, None)
    tp = jax.shard_map(lambda ps, xx: two_layer(ps, xx, block_tp), mesh=mesh, in_specs=(specs, P("data")),
                       out_specs=P("data"))

    def loss(fn, ps):
        out = fn(ps, x)
        return jnp.mean(jnp.sin(out)), out

    # one program per side: the output, the loss and the gradients together
    (ref_val, ref_out), ref_grad = jax.jit(jax.value_and_grad(
        lambda ps: loss(lambda a, b: two_layer(a, b, block_plain), ps), has_aux=True))(params)
    (val, out), grad = jax.jit(jax.value_and_grad(lambda ps: loss(tp, ps), has_aux=True))(params)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(ref_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def mlp_stage(p, h):
    return jnp.tanh(h @ p["w"] + p["b"])


def check_pipeline(spec, m, stage_fn, make_stage, x_shape):
    mesh = parallel.make_mesh(spec)
    s = mesh.shape["pipeline"]
    stages = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *[make_stage(jax.random.key(i)) for i in range(s)])
    x = jax.random.normal(jax.random.key(3), x_shape)

    def sequential(st, xx):
        return jax.lax.scan(lambda h, p: (stage_fn(p, h), None), xx, st)[0]

    def piped(st, xx):
        return parallel.pipeline_apply(stage_fn, st, xx, mesh, n_microbatches=m)

    def loss(fn, st):
        out = fn(st, x)
        return jnp.mean(out ** 2), out

    (ref_val, ref_out), ref_grad = jax.jit(jax.value_and_grad(lambda st: loss(sequential, st), has_aux=True))(stages)
    (val, out), grad = jax.jit(jax.value_and_grad(lambda st: loss(piped, st), has_aux=True))(stages)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(ref_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def test_pipeline_equals_single_device():
    def make_stage(key):
        return {"w": jax.random.normal(key, (E, E)) / np.sqrt(E), "b": jnp.full((E,), 0.1)}

    check_pipeline({"pipeline": 4, "data": 2}, 4, mlp_stage, make_stage, (16, E))


@pytest.mark.slow
@pytest.mark.parametrize("spec,m", [({"pipeline": 4, "data": 2}, 4), ({"pipeline": 8}, 2)])
def test_pipeline_transformer_blocks_equal_single_device(spec, m):
    check_pipeline(spec, m, block_plain, block_params, (4 * m, T, E))


def test_bubble_fraction_and_errors():
    assert parallel.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert parallel.bubble_fraction(4, 28) == pytest.approx(3 / 31)
    assert parallel.bubble_fraction(1, 3) == 0.0
    assert parallel.bubble_fraction(4, 4, repeats=2) == pytest.approx(3 / 11)  # MaxText's formula
    mesh = parallel.make_mesh({"pipeline": 4, "data": 2})
    st = {"w": jnp.zeros((3, 2))}
    with pytest.raises(ValueError, match="leading axis of 4 stages"):
        parallel.pipeline_apply(lambda p, h: h, st, jnp.zeros((8, 2)), mesh, n_microbatches=2)
    with pytest.raises(ValueError, match="not divisible by n_microbatches"):
        parallel.pipeline_apply(lambda p, h: h, {"w": jnp.zeros((4, 2))}, jnp.zeros((6, 2)), mesh, n_microbatches=4)
