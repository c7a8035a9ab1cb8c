"""ivhl_jax.physics.exact: matrix-free TFI exact diagonalisation vs dense NumPy, free fermions and CFT entanglement."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import exact, tn


@pytest.mark.parametrize("periodic", [True, False])
def test_apply_matches_dense(periodic):
    n = 6
    rng = np.random.default_rng(0)
    psi = rng.normal(size=(2,) * n)
    h = exact.tfi_dense(n, J=0.7, g=1.3, periodic=periodic)
    with jax.enable_x64(True):
        got = np.asarray(exact.tfi_apply(jnp.asarray(psi), 0.7, 1.3, periodic)).reshape(-1)
    np.testing.assert_allclose(got, h @ psi.reshape(-1), atol=1e-12)


@pytest.mark.parametrize("n,g", [(6, 1.0), (8, 0.5), (12, 1.0)])
def test_ground_energy_vs_dense_and_free_fermions(n, g):
    with jax.enable_x64(True):
        e0, psi = exact.tfi_ground_state(n, g=g)
        e0 = float(e0)
        # residual ‖Hψ − Eψ‖ certifies the eigenpair independently of the reference energies
        res = float(jnp.linalg.norm(exact.tfi_apply(psi, 1.0, g) - e0 * psi))
    assert res < 1e-6
    assert e0 == pytest.approx(exact.tfi_finite_ground_energy(n, g=g), abs=1e-9)
    if n <= 8:
        assert e0 == pytest.approx(np.linalg.eigvalsh(exact.tfi_dense(n, g=g))[0], abs=1e-9)


def test_infinite_chain_energy_density():
    assert exact.tfi_energy_density(1.0) == pytest.approx(-4 / math.pi, abs=1e-12)
    # large-size periodic chains approach e0 with the CFT 1/L² correction −πc v/(6L²), c=1/2, v=2
    L = 400
    e_l = exact.tfi_finite_ground_energy(L) / L
    assert e_l - exact.tfi_energy_density(1.0) == pytest.approx(-math.pi * 0.5 * 2 / (6 * L * L), rel=1e-3)
    # g → 0: classical Ising, e0 = −J
    assert exact.tfi_energy_density(0.0) == pytest.approx(-1.0, abs=1e-12)


def _fit_central_charge(n: int) -> float:
    with jax.enable_x64(True):
        _, psi = exact.tfi_ground_state(n)
        ells = np.arange(2, n // 2 + 1)
        s = np.array([float(tn.entanglement_entropy(psi, list(range(int(ell))))) for ell in ells])
    x = np.log(n / np.pi * np.sin(np.pi * ells / n))
    slope = np.polyfit(x, s, 1)[0]
    return 3.0 * slope


def test_entropy_scaling_central_charge_small():
    c = _fit_central_charge(12)
    assert c == pytest.approx(0.5, abs=0.03)


@pytest.mark.slow
def test_entropy_scaling_central_charge_16_sites():
    c = _fit_central_charge(16)
    assert c == pytest.approx(0.5, abs=0.02)


def test_entropy_vs_free_fermion_limit_and_product():
    # g → ∞: product state along +Z (zero entanglement); g = 0 (ordered, open chain): the Lanczos ground
    # state is a cat state with one ebit.
    with jax.enable_x64(True):
        _, psi = exact.tfi_ground_state(8, g=50.0)
        assert float(tn.entanglement_entropy(psi, [0, 1, 2, 3])) < 1e-3


def test_bad_input():
    with pytest.raises(ValueError, match="n="):
        exact.tfi_ground_state(40)
    with pytest.raises(ValueError):
        exact.tfi_ground_state(1)
