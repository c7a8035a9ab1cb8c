"""ivhl_jax.core.precision: policy presets and names, dynamic loss scaling, float64 needs x64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax import fields as F
from ivhl_jax import precision
from ivhl_jax.nn import gru
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import gft as G


def test_policies():
    bf16 = precision.get_policy("bf16")
    assert bf16.param_dtype == jnp.float32 and bf16.compute_dtype == jnp.bfloat16 and bf16.output_dtype == jnp.float32
    tree = {"w": jnp.ones(2), "ids": jnp.arange(2), "psi": jnp.ones(2, jnp.complex64)}
    c = bf16.cast_to_compute(tree)
    assert c["w"].dtype == jnp.bfloat16 and c["ids"].dtype == tree["ids"].dtype and c["psi"].dtype == jnp.complex64
    assert precision.get_policy("params=float32,compute=float16,output=float32") == precision.get_policy("fp16")
    assert precision.get_policy("fp16").needs_loss_scaling and not bf16.needs_loss_scaling
    with pytest.raises(ValueError, match="neither a preset"):
        precision.get_policy("fp8")


def test_dynamic_loss_scale_skips_overflowing_fp16_step():
    """An fp16 step whose scaled gradient overflows is skipped, the scale halves, nothing is NaN."""
    import optax

    params = {"w": jnp.array([1.0, -2.0], jnp.float32)}
    opt = optax.sgd(0.1)
    policy = precision.get_policy("fp16")

    def loss_fn(p, x):
        pc = policy.cast_to_compute(p)
        return jnp.sum((pc["w"] * x.astype(jnp.float16)) ** 2)

    @jax.jit
    def train_step(p, opt_state, ls, x):
        grads = jax.grad(lambda q: ls.scale(loss_fn(q, x)))(p)
        grads = ls.unscale(grads)
        finite = precision.all_finite(grads)
        updates, new_opt = opt.update(grads, opt_state, p)
        new_p = optax.apply_updates(p, updates)
        p = precision.select_tree(finite, new_p, p)
        opt_state = precision.select_tree(finite, new_opt, opt_state)
        return p, opt_state, ls.adjust(finite), finite

    ls = precision.DynamicLossScale.create(initial=2.0**15, period=2)
    st = opt.init(params)
    # Large input: loss * 2^15 overflows fp16 (max 65504) -> inf gradient.
    p1, st1, ls1, ok = train_step(params, st, ls, jnp.array([300.0, 300.0]))
    assert not bool(ok)
    np.testing.assert_array_equal(p1["w"], params["w"])
    assert float(ls1.loss_scale) == 2.0**14
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves((p1, st1, ls1)))
    # A small input is finite: the update happens; after `period` finite steps the scale doubles.
    p2, st2, ls2, ok = train_step(p1, st1, ls1, jnp.array([0.01, 0.01]))
    assert bool(ok) and not np.array_equal(p2["w"], p1["w"])
    p3, st3, ls3, ok = train_step(p2, st2, ls2, jnp.array([0.01, 0.01]))
    assert bool(ok) and float(ls3.loss_scale) == 2.0**15


def test_presets_and_unknown_name():
    assert precision.get_policy("f32") == precision.get_policy("fp32")
    f64 = precision.get_policy("f64")
    assert (f64.param_dtype, f64.compute_dtype, f64.output_dtype) == (jnp.float64,) * 3
    for name in precision.PHYSICS_PRESETS:
        precision.get_policy(name)
    with pytest.raises(ValueError, match=r"policy='f17' is neither a preset \['bf16', 'f32', 'f64'"):
        precision.get_policy("f17")
    with pytest.raises(ValueError, match=r"policy='f17'.*pure_bf16"):
        F.superpose(np.zeros((2, 3)), np.ones((1, 3)), policy="f17")
    with pytest.raises(TypeError, match="policy must be a preset name"):
        precision.physics_policy(32, like=())  # type: ignore[arg-type]  # the wrong type on purpose


def test_float64_policy_without_x64_is_an_error_not_a_float32_run():
    pts, src = np.zeros((4, 3), np.float32), np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="policy='f64' asks for float64 but jax_enable_x64 is off"):
        F.superpose(pts, src, policy="f64")
    grid = C.Grid.uniform(32, 8.0)
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        C.strang(C.GPSystem.create(grid, C.harmonic(grid), 1.0), 1e-3, policy="f64")
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        G.strang(G.GFTSystem.create((8, 8)), 0.01, policy="f64")
    p = gru.init_params(jax.random.key(0), 3, 4)
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        gru.cell(p, jnp.zeros((4,)), jnp.zeros((3,)), policy="f64")
    with jax.enable_x64(True):
        assert F.superpose(pts, src, policy="f64").dtype == jnp.complex128


def test_default_policy_is_the_inputs_dtype_everywhere():
    """policy=None is one Policy: every dtype the (canonical, real) floating dtype of the inputs."""
    f32 = precision.get_policy("f32")
    assert precision.default_policy(np.zeros(3, np.float32), 1.0) == f32
    assert precision.default_policy(jnp.zeros(2, jnp.complex64), jax.random.key(0)) == f32  # complex: its real part
    assert precision.default_policy({"w": jnp.zeros(2, jnp.bfloat16)}) == precision.get_policy("pure_bf16")
    assert precision.default_policy() == f32 and precision.default_policy(2.0, [1, 2]) == f32  # no arrays
    assert precision.default_policy(np.zeros(3)) == f32  # float64 NumPy without x64: float32, as jnp.asarray
    assert precision.physics_policy(None, like=(np.zeros(3, np.float32),)) == f32
    with jax.enable_x64(True):
        f64 = precision.get_policy("f64")
        assert precision.default_policy(np.zeros(3)) == f64
        assert precision.default_policy(jnp.zeros(2, jnp.complex128)) == f64
        assert precision.default_policy(np.zeros(3, np.float32), np.zeros(2)) == f64  # promoted
        # a GRU step on float64 inputs with policy=None equals the explicit "f64" policy, bit for bit
        p = gru.init_params(jax.random.key(0), 3, 4, policy="f64")
        h, x = jnp.full((2, 4), 0.1), jnp.ones((2, 3))
        none, explicit = gru.cell(p, h, x), gru.cell(p, h, x, policy="f64")
        assert none.dtype == jnp.float64 and np.array_equal(none, explicit)
    p = gru.init_params(jax.random.key(0), 3, 4)
    none, explicit = (
        gru.cell(p, jnp.zeros((2, 4)), jnp.ones((2, 3))),
        gru.cell(p, jnp.zeros((2, 4)), jnp.ones((2, 3)), policy="f32"),
    )
    assert none.dtype == jnp.float32 and np.array_equal(none, explicit)


def test_physics_kernels_default_policy_is_the_explicit_policy_of_the_inputs_dtype():
    """policy=None and the explicit policy of the inputs' dtype run the same path: same dtype, same bits."""
    rng = np.random.default_rng(0)
    for preset, dt in (("f32", np.float32), ("f64", np.float64)):
        with jax.enable_x64(preset == "f64"):
            pts, src = rng.normal(size=(30, 3)).astype(dt), rng.normal(size=(3, 3)).astype(dt)
            for a, b in (
                (F.superpose(pts, src, wavenumbers=2.0, policy=p) for p in (None, preset)),
                (F.vortex(pts, src[:2], [1, -2], core_size=0.3, policy=p) for p in (None, preset)),
            ):
                assert a.dtype == b.dtype == jnp.result_type(dt, jnp.complex64) and np.array_equal(a, b)
            grid = C.Grid.uniform(32, 8.0)
            system = C.GPSystem.create(grid, jnp.asarray(C.harmonic(grid), dt), 1.0)
            psi = C.gaussian(grid, 1.0, dtype=system.complex_dtype)
            a, b = (trajectory(st := C.strang(system, 1e-3, policy=p), st.init(psi), 5)[0] for p in (None, preset))
            assert a.dtype == b.dtype == system.complex_dtype and np.array_equal(a, b)
            cd = jnp.result_type(dt, jnp.complex64)
            phi = jnp.ones((6, 6), cd) + 0.1 * jnp.asarray(rng.normal(size=(6, 6)), cd)
            gsys = G.GFTSystem.create((6, 6))
            a, b = (trajectory(st := G.strang(gsys, 0.05, policy=p), st.init(phi), 5)[0] for p in (None, preset))
            assert a.dtype == b.dtype == cd and np.array_equal(a, b)
    with pytest.raises(TypeError, match="dtype"):
        G.strang(G.GFTSystem.create((6, 6)), 0.05, dtype=jnp.complex64)  # policy= is the one precision argument
