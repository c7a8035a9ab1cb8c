"""The distributed (slab / pencil) FFT multiplier on 8 emulated devices: equals the single-device NumPy
transform, communicates only by all-to-all of shards (no all-gather), keeps per-device temporaries within
3 shards, is differentiable, and refuses layouts it cannot use with one-line errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ivhl_jax.core.hlo import collectives
from ivhl_jax.numerics import distributed_fft as D

N = 16
SHAPE = (N, N, N)
LAYOUTS = [
    ((8,), P("x")),
    ((4, 2), P("x", "y")),
    ((2, 4), P("x", "y")),
    ((8,), P(None, None, "x")),
    ((4, 2), P(None, "x", "y")),
]
IDS = ["slab8", "pencil4x2", "pencil2x4", "slab8-last", "pencil4x2-yz"]


def _mesh(shape):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    names = ("x", "y")[: len(shape)]
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _field(shape=SHAPE, seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return np.asarray(jax.random.normal(k1, shape) + 1j * jax.random.normal(k2, shape), np.complex64)


def _factor(shape=SHAPE):
    theta = np.asarray(jax.random.uniform(jax.random.key(7), shape), np.float64)
    return (np.exp(-1j * theta) - 1).astype(np.complex64)


def _reference(x, m, axes=None):
    xk = np.fft.fftn(x.astype(np.complex128), axes=axes)
    return np.fft.ifftn(xk * (1 + m.astype(np.complex128)), axes=axes)


@pytest.mark.parametrize("mesh_shape,spec", LAYOUTS, ids=IDS)
def test_multiplier_equals_numpy_and_keeps_the_layout(mesh_shape, spec):
    layout = D.fft_layout(_mesh(mesh_shape), spec, SHAPE)
    x, m = _field(), _factor()
    xs, ms = layout.place(x), layout.place_factor(m, SHAPE)
    assert xs.addressable_shards[0].data.size == x.size // 8
    assert ms.addressable_shards[0].data.size == m.size // 8  # the factor is held in blocks, never whole
    out = jax.jit(lambda a, b: D.spectral_multiply(a, b, layout))(xs, ms)
    ref = _reference(x, m)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    assert out.sharding.is_equivalent_to(layout.sharding(), 3)
    xk, kspec = D.fftn(xs, layout)
    np.testing.assert_allclose(np.asarray(xk), np.fft.fftn(x), rtol=0, atol=1e-6 * np.abs(np.fft.fftn(x)).max())
    assert kspec == layout.k_spec(SHAPE)
    np.testing.assert_allclose(np.asarray(D.ifftn(xk, layout)), x, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,spec", LAYOUTS[:3], ids=IDS[:3])
def test_compiled_multiplier_moves_only_shards(mesh_shape, spec):
    layout = D.fft_layout(_mesh(mesh_shape), spec, SHAPE)
    xs, ms = layout.place(_field()), layout.place_factor(_factor(), SHAPE)
    compiled = jax.jit(lambda a, b: D.spectral_multiply(a, b, layout)).lower(xs, ms).compile()
    kinds = collectives(compiled.as_text())
    n_transposes = 2 * sum(1 for e in spec if e is not None)
    shard = xs.addressable_shards[0].data.nbytes
    assert kinds == [("all-to-all", shard)] * n_transposes  # one shard each; no all-gather, nothing else
    assert compiled.memory_analysis().temp_size_in_bytes <= 3 * shard


@pytest.mark.parametrize("mesh_shape,spec", LAYOUTS[:2], ids=IDS[:2])
def test_gradient_through_the_sharded_multiplier(mesh_shape, spec):
    layout = D.fft_layout(_mesh(mesh_shape), spec, SHAPE)
    x, m = _field(), _factor()
    w = jnp.arange(N, dtype=jnp.float32)[:, None, None]

    def loss(a, b, mult):
        return jnp.sum(w * jnp.abs(mult(a, b)) ** 2)

    single = jax.grad(loss, argnums=(0, 1))(
        jnp.asarray(x), jnp.asarray(m), lambda a, b: jnp.fft.ifftn(jnp.fft.fftn(a) * (1 + b))
    )
    split = jax.jit(jax.grad(lambda a, b: loss(a, b, lambda p, f: D.spectral_multiply(p, f, layout)), argnums=(0, 1)))(
        layout.place(x), layout.place_factor(m, SHAPE)
    )
    for s, r in zip(split, single):
        np.testing.assert_allclose(np.asarray(s), np.asarray(r), rtol=0, atol=2e-6 * np.abs(np.asarray(r)).max())


def test_partial_axes_batch_axes_and_vmap():
    """A transform over some grid axes (the rotating GP's ADI factors), a broadcast factor, a batch axis."""
    layout = D.fft_layout(_mesh((4, 2)), P("x", "y"), SHAPE)
    x = _field()
    m0 = _factor((N, N, 1))  # broadcast along z, like the rotating-frame A factor
    for axes in [(0,), (1, 2), (0, 1)]:
        out = jax.jit(lambda a, b, ax=axes: D.spectral_multiply(a, b, layout, ax))(
            layout.place(x), layout.place_factor(m0, SHAPE, axes)
        )
        ref = _reference(x, m0, axes)
        np.testing.assert_allclose(np.asarray(out), ref, atol=1e-6 * np.abs(ref).max())
    xb = np.stack([_field(seed=1), _field(seed=2)])
    m = _factor()
    ms = layout.place_factor(m, SHAPE)
    batched = jax.jit(jax.vmap(lambda a: D.spectral_multiply(a, ms, layout)))(xb)
    leading = jax.jit(lambda a: D.spectral_multiply(a, ms, layout))(layout.place(xb))  # a batch axis in front
    for i in range(2):
        ref = _reference(xb[i], m)
        np.testing.assert_allclose(np.asarray(batched[i]), ref, atol=1e-6 * np.abs(ref).max())
        np.testing.assert_allclose(np.asarray(leading[i]), ref, atol=1e-6 * np.abs(ref).max())


def test_two_dimensional_slab():
    layout = D.fft_layout(_mesh((8,)), P("x"), (N, 24))
    x, m = _field((N, 24)), _factor((N, 24))
    out = jax.jit(lambda a, b: D.spectral_multiply(a, b, layout))(layout.place(x), layout.place_factor(m, (N, 24)))
    ref = _reference(x, m)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-6 * np.abs(ref).max())


def test_bad_layouts_are_one_line_errors():
    mesh = _mesh((4, 2))
    with pytest.raises(ValueError, match=r"axis 0 has 18 points, not divisible by the 4 devices of mesh axis 'x'"):
        D.fft_layout(mesh, P("x", "y"), (18, 16, 16))
    with pytest.raises(ValueError, match=r"needs an unsharded axis divisible by 2.*mesh="):
        D.fft_layout(mesh, P("x", "y"), (16, 16, 15))
    with pytest.raises(ValueError, match="every transformed axis is sharded"):
        D.fft_layout(mesh, P("x", "y"), (16, 16))
    with pytest.raises(ValueError, match="lacks; use one of"):
        D.fft_layout(mesh, P("z"), SHAPE)
    with pytest.raises(ValueError, match="twice"):
        D.fft_layout(mesh, P("x", "x"), SHAPE)
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        D.fft_layout("4x2", P("x"), SHAPE)
    layout = D.fft_layout(mesh, P("x", "y"), SHAPE)
    other = jax.device_put(_field(), jax.sharding.NamedSharding(mesh, P(None, "x")))
    with pytest.raises(ValueError, match=r"psi is sharded as P\(None, 'x'\).*device_put psi with layout.sharding\(\)"):
        layout.place(other)
    with pytest.raises(ValueError, match="broadcast to psi's shape"):
        D.spectral_multiply(layout.place(_field()), np.ones((N, N, 2), np.complex64), layout)
    for msg in (str(e) for e in _errors(mesh)):
        assert "\n" not in msg


def _errors(mesh):
    out = []
    for args in [(P("x", "y"), (18, 16, 16)), (P("x", "y"), (16, 16)), (P("x", "y"), (16, 16, 15))]:
        try:
            D.fft_layout(mesh, *args)
        except ValueError as e:
            out.append(e)
    assert len(out) == 3
    return out


def test_parse_mesh():
    _mesh((8,))
    slab = D.parse_mesh("8", 3)
    assert slab.spec == ("x", None, None) and slab.mesh.shape == {"x": 8}
    pencil = D.parse_mesh("4x2", 3)
    assert pencil.spec == ("x", "y", None) and dict(pencil.mesh.shape) == {"x": 4, "y": 2}
    assert D.parse_mesh("1", 3) is None
    with pytest.raises(ValueError, match="mesh='3x2': .*needs 6 devices but devices has 8"):
        D.parse_mesh("3x2", 3)
    with pytest.raises(ValueError, match="one unsharded axis"):
        D.parse_mesh("4x2", 2)
    with pytest.raises(ValueError, match="not of the form"):
        D.parse_mesh("four", 3)


# --- the split-step solvers on a sharded field ----------------------------------------------------------------
GP_LAYOUTS = [("8", "slab8"), ("4x2", "pencil4x2"), ("2x4", "pencil2x4")]


def _gp(layout, omega=0.0, n=16):
    C = pytest.importorskip("ivhl_jax.physics.condensate")
    grid = C.Grid.uniform((n, n, n), 10.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 5.0, omega, layout=layout)
    psi = C.imprint_vortices(C.gaussian(grid), grid, jnp.array([[0.5, 0.0]]), jnp.array([1]))
    return C, system, psi


def _run(stepper, psi, steps=10):
    from ivhl_jax.numerics.rollout import trajectory

    return jax.jit(lambda st, p: trajectory(st, p, steps)[0])(stepper, psi)


def _only_shards_move(kinds, shard, per_fft_pair):
    """The field moves only in all-to-alls of one shard: ``per_fft_pair`` per step in each branch of the step's
    phase-range conditional (the program holds both, one runs); every other collective is a scalar all-reduce
    (the norm and the phase bound)."""
    field = [k for k in kinds if k[1] > 64]
    assert set(field) == {("all-to-all", shard)} and len(field) in (per_fft_pair, 2 * per_fft_pair), kinds
    assert all(kind == "all-reduce" and nbytes <= 8 for kind, nbytes in kinds if nbytes <= 64), kinds


def _close(a, b, rel=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=0, atol=rel * np.abs(b).max())


@pytest.mark.parametrize("mesh,name", GP_LAYOUTS, ids=[n for _, n in GP_LAYOUTS])
def test_gp_step_sharded_equals_single_device_and_moves_only_shards(mesh, name):
    _mesh((8,))
    layout = D.parse_mesh(mesh, 3)
    C, system, psi = _gp(layout)
    _, plain, _ = _gp(None)
    stepper, ref_stepper = C.strang(system, 1e-2), C.strang(plain, 1e-2)
    psi_s = stepper.init(psi)
    assert psi_s.sharding.is_equivalent_to(layout.sharding(), 3)  # init lays ψ out as the system says
    out = _run(stepper, psi_s)
    assert out.sharding.is_equivalent_to(layout.sharding(), 3)  # the layout is kept between steps
    _close(out, _run(ref_stepper, ref_stepper.init(jax.device_put(psi, jax.devices()[0]))))
    # the kinetic factor and V are held in blocks, never whole
    kin = stepper.params.plan.factors[0]
    assert kin.addressable_shards[0].data.size == kin.size // 8
    assert stepper.params.system.potential.addressable_shards[0].data.size == psi.size // 8
    compiled = jax.jit(lambda st, p: st.step(p)).lower(stepper, psi_s).compile()
    shard = psi_s.addressable_shards[0].data.nbytes
    kinds = collectives(compiled.as_text())
    _only_shards_move(kinds, shard, 2 if mesh == "8" else 4)  # no all-gather of the field
    assert compiled.memory_analysis().temp_size_in_bytes <= 3 * shard
    # the compiled multi-step loop (trajectory's own path) likewise moves only shards
    from ivhl_jax.numerics.rollout import trajectory

    loop = jax.jit(lambda st, p: trajectory(st, p, 4)[0]).lower(stepper, psi_s).compile()
    kinds = collectives(loop.as_text())
    assert {k for k in kinds if k[1] > 64} == {("all-to-all", shard)}, kinds
    assert all(kind == "all-reduce" and nbytes <= 8 for kind, nbytes in kinds if nbytes <= 64), kinds
    assert loop.memory_analysis().temp_size_in_bytes <= 3 * shard


@pytest.mark.parametrize("mesh", ["8", "4x2"], ids=["slab8", "pencil4x2"])
def test_gp_grad_through_a_sharded_trajectory_equals_single_device(mesh):
    _mesh((8,))
    layout = D.parse_mesh(mesh, 3)
    C, system, psi = _gp(layout)
    _, plain, _ = _gp(None)
    w = jnp.asarray(np.linspace(0.0, 1.0, 16), jnp.float32)[:, None, None]

    def loss(g, p, system):  # the real part: its g-derivative (through the phase) is not a small cancellation
        from ivhl_jax.numerics.rollout import trajectory

        st = C.strang(system.replace(g=g), 1e-2)
        return jnp.sum(w * trajectory(st, p, 5)[0].real)

    g_s = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.float32(5.0), C.strang(system, 1e-2).init(psi), system)
    g_1 = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.float32(5.0), psi, plain)
    _close(g_s[0], g_1[0], 1e-5)
    _close(g_s[1], g_1[1], 1e-5)


@pytest.mark.parametrize("mesh", ["8", "4x2"], ids=["slab8", "pencil4x2"])
def test_gp_rotating_and_imaginary_time_sharded(mesh):
    _mesh((8,))
    layout = D.parse_mesh(mesh, 3)
    C, system, psi = _gp(layout, omega=0.5)
    _, plain, _ = _gp(None, omega=0.5)
    for kw in ({}, {"imaginary": True}):
        st, ref = C.strang(system, 1e-2, **kw), C.strang(plain, 1e-2, **kw)
        _close(_run(st, st.init(psi)), _run(ref, ref.init(psi)))


def test_gp_bad_layouts_are_one_line_errors():
    mesh = _mesh((4, 2))
    C = pytest.importorskip("ivhl_jax.physics.condensate")
    grid = C.Grid.uniform((18, 16, 16), 10.0)
    pencil = D.fft_layout(mesh, P("x", "y"))
    with pytest.raises(ValueError, match=r"layout: .*axis 0 has 18 points, not divisible by the 4 devices"):
        C.GPSystem.create(grid, C.harmonic(grid), 1.0, layout=pencil)
    grid = C.Grid.uniform((16, 16), 10.0)
    with pytest.raises(ValueError, match="layout: .*every transformed axis is sharded"):
        C.GPSystem.create(grid, C.harmonic(grid), 1.0, layout=pencil)
    with pytest.raises(TypeError, match="layout must be an FFTLayout"):
        C.GPSystem.create(grid, C.harmonic(grid), 1.0, layout="4x2")
    _, system, psi = _gp(pencil)
    st = C.strang(system, 1e-2)
    wrong = jax.device_put(psi, jax.sharding.NamedSharding(mesh, P(None, "x", "y")))
    with pytest.raises(ValueError, match=r"psi is sharded as P\(None, 'x', 'y'\) but the FFT layout is"):
        st.init(wrong)


def test_gft_kinetic_step_sharded_equals_single_device():
    _mesh((8,))
    G = pytest.importorskip("ivhl_jax.physics.gft")
    layout = D.parse_mesh("4x2", 3)
    phi = jnp.asarray(0.3 * _field((16, 16, 16), seed=3))
    ref = G.strang(G.GFTSystem.create((16, 16, 16), -0.5, 0.1), 0.05)
    st = G.strang(G.GFTSystem.create((16, 16, 16), -0.5, 0.1, layout=layout), 0.05)
    phi_s = st.init(phi)
    assert phi_s.sharding.is_equivalent_to(layout.sharding(), 3)
    out = _run(st, phi_s)
    assert out.sharding.is_equivalent_to(layout.sharding(), 3)
    _close(out, _run(ref, ref.init(phi)))
    kinds = collectives(jax.jit(lambda s, p: s.step(p)).lower(st, phi_s).compile().as_text())
    _only_shards_move(kinds, phi_s.addressable_shards[0].data.nbytes, 4)
