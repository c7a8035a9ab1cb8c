"""Sharded simulations and checkpoints across device counts on 8 emulated devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ivhl_jax import parallel, training
from ivhl_jax.train.checkpoint import Checkpointer

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")


def test_wave_field_grid_split_across_devices():
    fields = pytest.importorskip("ivhl_jax.physics.fields")
    mesh = parallel.make_mesh({"data": -1})
    pts = fields.grid_points((30, 25), -2.0, 2.0, z=0.3)  # 750 points: not a multiple of 8 (padding path)
    src = jax.random.uniform(jax.random.key(0), (40, 3), minval=-1.0, maxval=1.0)
    amp = jnp.linspace(0.5, 1.5, 40)

    def field(p, s, a):
        return fields.superpose(p, s, amplitudes=a, wavenumbers=3.0, t=0.2)

    full = jax.jit(field)(pts, src, amp)
    split = jax.jit(lambda p, s, a: parallel.sharded_map(field, p, s, a, mesh=mesh))(pts, src, amp)
    assert split.shape == full.shape == (750,)
    np.testing.assert_allclose(np.asarray(split), np.asarray(full), rtol=1e-6, atol=1e-6)
    # differentiable through the split: d/dA of the total intensity
    g_full = jax.grad(lambda a: jnp.sum(jnp.abs(field(pts, src, a)) ** 2))(amp)
    g_split = jax.jit(jax.grad(lambda a: jnp.sum(jnp.abs(parallel.sharded_map(field, pts, src, a, mesh=mesh)) ** 2)))(
        amp)
    np.testing.assert_allclose(g_split, g_full, rtol=1e-4)


def test_sharded_grid_placement():
    mesh = parallel.make_mesh({"data": 4, "tensor": 2})
    grid = jnp.arange(16 * 6 * 4, dtype=jnp.float32).reshape(16, 6, 4)
    g = parallel.sharded_grid(grid, mesh)
    assert g.sharding.spec == P(("data", "tensor"), None, None)
    assert g.addressable_shards[0].data.shape == (2, 6, 4)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(grid))
    with pytest.raises(ValueError, match="not divisible"):
        parallel.sharded_grid(grid, mesh, dim=1)


def test_checkpoint_restores_on_fewer_devices(tmp_path):
    """Saved FSDP-sharded over 8 devices; restored over 4 devices and on a single device, bit-exactly."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(64, 24)), jnp.float32), "b": jnp.zeros(24, jnp.bfloat16)}
    opt = training.make_optimizer(learning_rate=1e-3)
    state = training.init_train_state(params, opt, key=jax.random.key(5))
    state = state.replace(opt_state=jax.tree_util.tree_map(lambda x: x + 1 if x.dtype != jnp.int32 else x,
                                                           state.opt_state))
    mesh8 = parallel.make_mesh({"fsdp": 8})
    s8 = parallel.shard_tree(state, parallel.state_shardings(state, mesh8, min_size=1))
    assert s8.params["w"].sharding.spec == P("fsdp", None)
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(7, s8, metadata={"devices": 8})
    for devices in (jax.devices()[:4], jax.devices()[4:5]):
        mesh = parallel.make_mesh({"fsdp": -1}, devices=devices)
        step, back, meta = Checkpointer(tmp_path / "ck").restore(
            state, sharding=parallel.state_shardings(state, mesh, min_size=1))
        assert step == 7 and meta == {"devices": 8}
        assert back.params["w"].sharding.device_set == set(devices)
        for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(state), strict=True):
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _gp_case():
    C = pytest.importorskip("ivhl_jax.physics.condensate")
    grid = C.Grid.uniform((16, 16, 16), 10.0)
    system = C.GPSystem(grid, C.harmonic(grid, 1.0), 5.0, 0.0)
    psi = C.imprint_vortices(C.gaussian(grid), grid, jnp.array([[0.5, 0.0, 0.0]]), jnp.array([1]))
    f = jax.jit(lambda p: C.evolve(p, system, 0.01, 5, 5)[0])
    return f, psi, f(jax.device_put(psi, jax.devices()[0]))


@pytest.mark.slow
def test_gross_pitaevskii_3d_split_over_a_2d_mesh_equals_single_device():
    """3-D GP split-step with x split over both axes of a (data 4, tensor 2) mesh: sharded 3-D FFTs."""
    from jax.sharding import NamedSharding

    f, psi, single = _gp_case()
    mesh = parallel.make_mesh({"data": 4, "tensor": 2})
    split = parallel.shard_tree(psi, NamedSharding(mesh, P(("data", "tensor"), None, None)))
    assert split.addressable_shards[0].data.shape == (2, 16, 16)
    np.testing.assert_allclose(np.asarray(f(split)), np.asarray(single), atol=2e-6)


@pytest.mark.slow
@pytest.mark.xfail(jax.devices()[0].platform == "cpu", strict=True, raises=jax.errors.JaxRuntimeError,
                   reason="XLA:CPU FFT thunk RET_CHECK (IsMonotonicWithDim0Major) when a 3-D FFT input is split "
                          "along two dimensions (pencil decomposition); measured with jax 0.10.2")
def test_gross_pitaevskii_3d_pencil_split_equals_single_device():
    from jax.sharding import NamedSharding

    f, psi, single = _gp_case()
    mesh = parallel.make_mesh({"data": 4, "tensor": 2})
    split = parallel.shard_tree(psi, NamedSharding(mesh, P("data", "tensor", None)))
    np.testing.assert_allclose(np.asarray(f(split)), np.asarray(single), atol=2e-6)
