"""Types that are checked: mypy is clean on the library, and the jaxtyping shape annotations hold at runtime."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from ivhl_jax.nn import gru
from ivhl_jax.numerics import spectral
from ivhl_jax.physics import fields

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_clean(monkeypatch):
    """`mypy` (configured in pyproject.toml, run by `make lint`) reports no errors on ivhl_jax."""
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # `files` in [tool.mypy] is relative to the repository root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, stdout + stderr
    assert "Success: no issues found" in stdout


def test_py_typed_marker_ships():
    import importlib.resources

    assert importlib.resources.files("ivhl_jax").joinpath("py.typed").is_file()


def _checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def test_superpose_shapes_checked_at_runtime():
    superpose = _checked(fields.superpose)
    pts = jnp.zeros((5, 3))
    src = jnp.ones((2, 3))
    out = superpose(pts, src)
    assert out.shape == (5,)
    with pytest.raises(TypeCheckError):
        superpose(pts, jnp.ones((2, 2)))  # D of the sources differs from D of the points
    with pytest.raises(TypeCheckError):
        superpose(jnp.zeros((5,)), src)  # points must be (N, D)


def test_intensity_and_phase_shapes_checked_at_runtime():
    psi = jnp.ones((4, 2), jnp.complex64)
    assert _checked(fields.intensity)(psi).shape == (4, 2)
    assert _checked(fields.phase)(psi).shape == (4, 2)


def test_gru_step_shapes_checked_at_runtime():
    import jax

    step = _checked(gru.gru_step)
    params = gru.init_gru_params(jax.random.key(0), 3, 4)
    h, x = jnp.zeros((2, 4)), jnp.ones((2, 3))
    assert step(params, h, x).shape == (2, 4)
    with pytest.raises(TypeCheckError):
        step(params, h, jnp.ones((5, 3)))  # batch of x differs from batch of h
    with pytest.raises(TypeCheckError):
        step(params, h.astype(jnp.int32), x)  # h must be floating
    h_t, hs = _checked(gru.gru_scan)(params, h, jnp.ones((6, 2, 3)))
    assert h_t.shape == (2, 4) and hs.shape == (6, 2, 4)


def test_spectral_multiply_shapes_checked_at_runtime():
    mul = _checked(spectral.spectral_multiply)
    psi = jnp.ones((8, 8), jnp.complex64)
    out = mul(psi, jnp.zeros((8, 8), jnp.complex64), (0, 1))
    assert out.shape == (8, 8)
    with pytest.raises(TypeCheckError):
        mul(psi.real, jnp.zeros((8, 8), jnp.complex64), (0, 1))  # psi must be complex
