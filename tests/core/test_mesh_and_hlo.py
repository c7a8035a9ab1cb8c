"""Device meshes, array placement (ivhl_jax.core.mesh) and the collectives of compiled programs (ivhl_jax.core.hlo):
one home each, used by the distributed FFT and the training parallelism alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax.core import backend
from ivhl_jax.core.hlo import collectives
from ivhl_jax.core.mesh import device_mesh, place
from ivhl_jax.numerics import distributed_fft as D
from ivhl_jax.train import parallel


def _eight():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.devices()


# ------------------------------------------------------------------------------------------------------ meshes
def test_every_mesh_comes_from_device_mesh():
    devs = _eight()
    mesh = device_mesh((4, 2), ("x", "y"))
    assert dict(mesh.shape) == {"x": 4, "y": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    # the training spec and the FFT's mesh setting build the same mesh from the same devices
    assert parallel.make_mesh({"x": 4, "y": 2}).devices.tolist() == mesh.devices.tolist()
    assert D.parse_mesh("4x2", 3).mesh.devices.tolist() == mesh.devices.tolist()
    # a subset keeps its order
    sub = device_mesh((2, 2), ("a", "b"), devs[4:])
    assert [d.id for d in sub.devices.flat] == [d.id for d in devs[4:]]


@pytest.mark.parametrize(
    "shape,names,match",
    [
        ((3,), ("x",), "needs 3 devices"),
        ((8,), ("x", "y"), "names"),
        ((4, 2), ("x", "x"), "names"),
        ((0,), ("x",), "shape"),
    ],
)
def test_device_mesh_refuses_bad_settings_in_one_line(shape, names, match):
    _eight()
    with pytest.raises(ValueError, match=match) as err:
        device_mesh(shape, names)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------------- placement
def test_place_always_returns_new_buffers():
    devs = _eight()
    sharding = NamedSharding(device_mesh((8,), ("x",)), P("x"))
    host = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    a = place(host, sharding)
    host[0, 0] = -1.0  # the NumPy value is not aliased
    assert float(a[0, 0]) == 0.0 and a.sharding.is_equivalent_to(sharding, 2)
    # an array already on the sharding: a copy, so donating the result leaves the caller's array alive
    b = place(a, sharding)
    assert b is not a
    assert {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}.isdisjoint(
        s.data.unsafe_buffer_pointer() for s in b.addressable_shards
    )
    jax.jit(lambda x: x + 1, donate_argnums=0)(b)
    np.testing.assert_array_equal(np.asarray(a), np.arange(64.0).reshape(8, 8))
    # a single-device array resharded: no shard shares the caller's buffer either
    one = jax.device_put(jnp.ones((8, 8)), devs[0])
    for target in (sharding, NamedSharding(sharding.mesh, P())):  # split, and replicated (a shard stays on devs[0])
        c = place(one, target)
        assert one.unsafe_buffer_pointer() not in {s.data.unsafe_buffer_pointer() for s in c.addressable_shards}
        jax.jit(lambda x: x * 2, donate_argnums=0)(c)
        assert not one.is_deleted()


def test_place_keeps_key_arrays_and_constrains_tracers():
    _eight()
    sharding = NamedSharding(device_mesh((8,), ("x",)), P())
    key = place(jax.random.key(3), sharding)
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(3)))
    out = jax.jit(lambda x: place(x * 2, sharding))(jnp.ones(8))
    assert out.sharding.is_equivalent_to(sharding, 1)


def test_fft_layout_and_training_placement_share_one_behaviour():
    _eight()
    layout = D.fft_layout(device_mesh((8,), ("x",)), P("x"), (16, 8))
    x = layout.place(np.ones((16, 8), np.complex64))
    again = layout.place(x)  # already placed: still a new array (a donating chunk cannot delete the caller's field)
    assert again is not x
    jax.jit(lambda y: y * 2, donate_argnums=0)(again)
    assert not x.is_deleted()
    tree = parallel.shard_tree({"w": x}, layout.sharding())
    assert tree["w"] is not x


# --------------------------------------------------------------------------------------------------------- HLO
def test_collectives_of_async_and_tuple_instructions():
    text = "\n".join(
        [
            "  %ag = (f32[8]{0}, f32[64]{0}) all-gather-start(f32[8]{0} %p), dimensions={0}",
            "  %agd = f32[64]{0} all-gather-done((f32[8]{0}, f32[64]{0}) %ag)",
            "  %cp = (bf16[4,4]{1,0:T(8,128)}, bf16[4,4]{1,0}, u32[], u32[]) collective-permute-start(bf16[4,4] %q)",
            "  %cpd = bf16[4,4]{1,0} collective-permute-done(%cp)",
            "  ROOT %a2a = (c64[2,8]{1,0}, c64[2,8]{1,0}) all-to-all(c64[2,8]{1,0} %x, c64[2,8]{1,0} %y)",
            "  ar.1 = f64[3]{0} all-reduce(f64[3]{0} p.2), replica_groups={}, to_apply=%add",
            "  %f = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%all-reduce.fused",
        ]
    )
    assert collectives(text) == [
        ("all-gather", 256),
        ("collective-permute", 32),
        ("all-to-all", 256),
        ("all-reduce", 24),
    ]
    acc = parallel.collective_bytes(text, 4)
    assert acc["by_op"] == {"all-gather": 256, "collective-permute": 32, "all-to-all": 256, "all-reduce": 24}
    assert acc["count"] == {"all-gather": 1, "collective-permute": 1, "all-to-all": 1, "all-reduce": 1}


def test_collectives_of_a_compiled_program():
    _eight()
    mesh = device_mesh((8,), ("x",))
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    compiled = f.lower(jnp.ones((8, 16), jnp.float32)).compile()
    assert collectives(compiled) == [("all-reduce", 16 * 4)]
    assert parallel.collective_bytes(compiled, 8)["wire_total"] == pytest.approx(2 * 7 / 8 * 64)


# ----------------------------------------------------------------------------------------- platform, core count
def test_core_counts_and_platform_come_from_backend():
    assert (
        1
        <= backend.host_cores()
        == len(backend.host_core_ids())
        <= max(backend.machine_cores(), len(backend.host_core_ids()))
    )
    assert backend.platform_before_start() in (backend.platform(), "gpu", "tpu")  # a plugin may be installed
    jax.devices()
    assert backend.started()
