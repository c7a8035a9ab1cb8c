"""GRU step: equality with flax.nnx.GRUCell, a NumPy float64 reference of both variants, jit/vmap/grad."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ivhl_jax import gru
from ivhl_jax.numerics.rollout import trajectory


def _scan(params, h0, xs, policy=None):
    """(h_T, hs) of the recurrence over ``xs`` from ``h0``: the stepper run for all T inputs."""
    st = gru.recurrence(params, xs, policy=policy)
    final, hs = trajectory(st, st.init(h0), xs.shape[0], observe=gru.observe)
    return final.h, hs


def _np_gru(p, h, x, variant):
    sig = lambda v: 1 / (1 + np.exp(-v))
    H = h.shape[-1]
    gi = x @ p["W_i"] + p["b_i"]
    Wh, bh = p["W_h"], p["b_h"]
    r = sig(gi[..., :H] + h @ Wh[:, :H] + bh[:H])
    z = sig(gi[..., H : 2 * H] + h @ Wh[:, H : 2 * H] + bh[H : 2 * H])
    if variant == "torch":
        n = np.tanh(gi[..., 2 * H :] + r * (h @ Wh[:, 2 * H :] + bh[2 * H :]))
    else:
        n = np.tanh(gi[..., 2 * H :] + (r * h) @ Wh[:, 2 * H :] + bh[2 * H :])
    return (1 - z) * n + z * h


def test_equals_flax_nnx_grucell():
    cell = nnx.GRUCell(5, 7, rngs=nnx.Rngs(0))
    cell.dense_i.bias[...] = jax.random.normal(jax.random.key(3), (21,))  # non-trivial input bias
    params = gru.params_from_nnx(cell)
    x = jax.random.normal(jax.random.key(1), (4, 5))
    h = jax.random.normal(jax.random.key(2), (4, 7))
    want, _ = cell(h, x)
    got = jax.jit(gru.cell)(params, h, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", gru.VARIANTS)
def test_matches_numpy_float64(variant):
    params = jax.jit(gru.init_params, static_argnums=(1, 2))(jax.random.key(0), 3, 4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    h = rng.normal(size=(6, 4)).astype(np.float32)
    got = jax.jit(gru.cell, static_argnames="variant")(params, h, x, variant=variant)
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    np.testing.assert_allclose(
        got, _np_gru(p64, h.astype(np.float64), x.astype(np.float64), variant), rtol=1e-5, atol=1e-6
    )


def test_variants_differ_only_with_recurrent_reset():
    params = jax.jit(gru.init_params, static_argnums=(1, 2))(jax.random.key(0), 3, 4)
    x = jnp.ones((3,))
    h = jnp.linspace(-1, 1, 4)
    f = jax.jit(gru.cell, static_argnames="variant")
    assert float(jnp.max(jnp.abs(f(params, h, x, variant="torch") - f(params, h, x, variant="cho")))) > 1e-4
    h0 = jnp.zeros(4)  # r * h = 0 and h W = 0: both reduce to the same n up to the b_hn placement
    p0 = dict(params, b_h=jnp.zeros(12))
    np.testing.assert_allclose(f(p0, h0, x, variant="torch"), f(p0, h0, x, variant="cho"), rtol=1e-6)


def test_scan_vmap_grad():
    params = jax.jit(gru.init_params, static_argnums=(1, 2))(jax.random.key(0), 2, 8)
    xs = jax.random.normal(jax.random.key(1), (10, 5, 2))
    hT, hs = jax.jit(_scan)(params, jnp.zeros((5, 8)), xs)
    chex.assert_shape(hs, (10, 5, 8))
    one = jax.jit(jax.vmap(lambda x: _scan(params, jnp.zeros(8), x)[0], in_axes=1))(xs)
    np.testing.assert_allclose(one, hT, rtol=1e-5, atol=1e-6)
    g = jax.jit(jax.grad(lambda p: jnp.sum(_scan(p, jnp.zeros((5, 8)), xs)[0] ** 2)))(params)
    chex.assert_tree_all_finite(g)
    assert float(jnp.abs(g["W_h"]).max()) > 0


def test_shape_errors():
    params = gru.init_params(jax.random.key(0), 3, 4)
    with pytest.raises(ValueError, match="W_i"):
        gru.cell(params, jnp.zeros(4), jnp.zeros(5))
    with pytest.raises(ValueError, match="variant"):
        gru.cell(params, jnp.zeros(4), jnp.zeros(3), variant="lstm")


# --- precision policies: error against a float64 run --------------------------------------------------------------
def _rel(a, ref) -> float:
    a, ref = np.asarray(a, np.complex128), np.asarray(ref, np.complex128)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def _gru_run(policy, steps=50):
    p = gru.init_params(jax.random.key(0), 32, 64)
    xs = jax.random.normal(jax.random.key(1), (steps, 16, 32), jnp.float32)
    _, hs = jax.jit(lambda p, xs: _scan(p, jnp.zeros((16, 64), jnp.float32), xs, policy=policy))(p, xs)
    return hs


# policy -> (tolerance, measured) of the norm-wise relative error of all hidden states over 50 steps.
GRU_TOL = {"f32": (1e-5, 1.3e-7), "bf16": (2e-2, 5.6e-3)}


def test_gru_error_per_policy():
    with jax.enable_x64(True):
        ref = _gru_run("f64")
        assert ref.dtype == jnp.float64
    for policy, (tol, _measured) in GRU_TOL.items():
        hs = _gru_run(policy)
        assert hs.dtype == jnp.float32
        assert _rel(hs, ref) <= tol
    np.testing.assert_array_equal(np.asarray(_gru_run(None)), np.asarray(_gru_run("f32")))


def test_gru_recurrence_policy_and_bad_inputs():
    p = gru.init_params(jax.random.key(0), 3, 4)
    xs = jnp.ones((5, 2, 3), jnp.float32)
    st = gru.recurrence(p, xs, policy="bf16")
    final, hs = trajectory(st, st.init(jnp.zeros((2, 4))), 5, observe=gru.observe)
    np.testing.assert_array_equal(np.asarray(final.h), np.asarray(hs[-1]))
    ref = jnp.zeros((2, 4))
    for t in range(5):  # the bf16 cell stepped by hand (its own fusion): within the bf16 tolerance
        ref = gru.cell(p, ref, xs[t], policy="bf16")
    assert final.h.dtype == jnp.float32 and _rel(final.h, ref) <= GRU_TOL["bf16"][0]
    with pytest.raises(TypeError, match="h has dtype complex64.*real dtype bfloat16"):
        gru.cell(p, jnp.zeros((4,), jnp.complex64), jnp.zeros((3,)), policy="bf16")
    with pytest.raises(ValueError, match="policy='bf17' is neither a preset"):
        _scan(p, jnp.zeros((2, 4)), xs, policy="bf17")


def test_recurrence_refuses_more_steps_than_inputs():
    """T inputs are T steps: a longer run (trajectory or a chunk) is a one-line ValueError naming both counts,
    not a silent repeat of the last input."""
    from ivhl_jax.numerics.rollout import chunked

    p = gru.init_params(jax.random.key(0), 3, 4)
    st = gru.recurrence(p, jnp.ones((5, 2, 3), jnp.float32))
    assert st.max_steps == 5
    h0 = st.init(jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"^steps=6 but gru.recurrence's input has 5 steps") as e:
        trajectory(st, h0, 6, observe=gru.observe)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"steps_per_chunk=7 but gru.recurrence's input has 5 steps"):
        chunked(st, 7)
    final, hs = trajectory(st, h0, 5, observe=gru.observe)  # exactly T runs
    assert hs.shape == (5, 2, 4)


def test_init_params_policy_and_key():
    """``init_params`` draws in the policy's param_dtype (float32 by default) and needs its key."""
    p = gru.init_params(jax.random.key(0), 3, 4)
    assert all(v.dtype == jnp.float32 for v in p.values())
    assert gru.init_params(jax.random.key(0), 3, 4, policy="pure_bf16")["W_h"].dtype == jnp.bfloat16
    with pytest.raises(TypeError, match="key"):
        gru.init_params(input_dim=3, hidden_dim=4)  # type: ignore[call-arg]
