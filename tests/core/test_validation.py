"""ivhl_jax.core.validation: argument checks that name the argument, NaN checks inside jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import validation


def test_check_array_names_argument():
    with pytest.raises(ValueError, match="points must have shape \\(\\*, 3\\)"):
        validation.check_array(np.zeros((4, 2)), "points", shape=(None, 3))
    with pytest.raises(TypeError, match="charges must have a integer dtype"):
        validation.check_array(np.zeros(3), "charges", kind="integer")
    with pytest.raises(ValueError, match="psi contains NaN"):
        validation.check_array(np.array([1.0, np.nan]), "psi", finite=True)
    with pytest.raises(ValueError, match="dt must be > 0"):
        validation.check_scalar(-0.1, "dt", positive=True)
    with pytest.raises(ValueError, match="amplitudes must be a scalar or have shape \\(5,\\)"):
        validation.check_broadcastable(np.ones(4), "amplitudes", 5, "sources")


def test_checked_catches_nan_inside_jit():
    def f(x):
        y = jnp.log(x)
        validation.check_finite_tree({"y": y}, "state")
        return y

    g = validation.checked(f, float_checks=False)
    assert np.isfinite(g(jnp.ones(3))).all()
    with pytest.raises(FloatingPointError, match="state\\['y'\\] became NaN or inf"):
        g(-jnp.ones(3))


def test_check_array_finite_on_constant_inside_jit():
    const = np.array([1.0, 2.0], np.float32)

    @jax.jit
    def f(x):
        return x + validation.check_array(const, "const", finite=True)

    np.testing.assert_array_equal(f(jnp.ones(2)), [2.0, 3.0])


def test_check_couplings_scalars_arrays_and_traced_values():
    # all scalars: Python floats, in the given order
    out = validation.check_couplings({"k0": 1, "eps": np.float32(0.5), "target": 8}, signed=("k0",))
    assert list(out) == ["k0", "eps", "target"] and all(type(v) is float for v in out.values())
    assert out == {"k0": 1.0, "eps": 0.5, "target": 8.0}
    # any array: every coupling a float32 array of the one broadcast shape (own memory, not a broadcast view)
    out = validation.check_couplings({"lam": np.array([0.1, -0.2]), "eps": 0.5}, signed=("lam",))
    assert all(v.dtype == np.float32 and v.shape == (2,) and v.flags.writeable for v in out.values())
    np.testing.assert_array_equal(out["eps"], np.float32([0.5, 0.5]))
    # a negative coupling needs its name in signed; shapes that do not broadcast are named
    with pytest.raises(ValueError, match="lam must be >= 0"):
        validation.check_couplings({"lam": -0.2, "eps": 0.5})
    with pytest.raises(ValueError, match="lam and eps must broadcast to one shape"):
        validation.check_couplings({"lam": np.ones(2), "eps": np.ones(3)}, signed=("lam",))
    # traced (a builder inside jit/vmap): returned as they are
    seen = jax.jit(lambda x: validation.check_couplings({"lam": x, "eps": 0.5})["lam"] * 2)(jnp.float32(1.5))
    assert float(seen) == 3.0
