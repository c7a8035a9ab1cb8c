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


def _dense_chain(term, n, periodic=True):
    d = term.shape[0]
    h = np.zeros((d**n, d**n))
    mat = term.reshape(d * d, d * d)
    bonds = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if periodic and n > 2 else [])
    for i, j in bonds:
        # <out| h_ij ⊗ 1 |in> as one einsum with identities on the other sites (independent of tensordot)
        op, eye = mat.reshape(d, d, d, d), np.eye(d)
        subs_out, subs_in = list("ABCDEFGHIJKLMNOP"[:n]), list("abcdefghijklmnop"[:n])
        ops = [op]
        spec = [subs_out[i] + subs_out[j] + subs_in[i] + subs_in[j]]
        for k in range(n):
            if k not in (i, j):
                ops.append(eye)
                spec.append(subs_out[k] + subs_in[k])
        full = np.einsum(",".join(spec) + "->" + "".join(subs_out) + "".join(subs_in), *ops)
        h += full.reshape(d**n, d**n)
    return h


@pytest.mark.parametrize("d,n,periodic", [(2, 5, True), (3, 4, True), (3, 4, False)])
def test_chain_apply_matches_dense(d, n, periodic):
    rng = np.random.default_rng(d + n)
    t = rng.normal(size=(d * d, d * d))
    term = (t + t.T).reshape(d, d, d, d)
    psi = rng.normal(size=(d,) * n)
    with jax.enable_x64(True):
        got = np.asarray(exact.chain_apply(jnp.asarray(psi), jnp.asarray(term), periodic)).reshape(-1)
    np.testing.assert_allclose(got, _dense_chain(term, n, periodic) @ psi.reshape(-1), atol=1e-12)
    with pytest.raises(ValueError, match="psi"):
        exact.chain_apply(np.ones((d + 1,) * n), term)
    with pytest.raises(ValueError, match="term"):
        exact.chain_apply(psi, np.ones((d, d, d)))


def test_chain_ground_state_of_the_ising_term_is_free_fermions():
    from ivhl_jax import mera

    with jax.enable_x64(True):
        e, psi = exact.chain_ground_state(mera.ising().term, 10)
    assert float(e) == pytest.approx(exact.tfi_finite_ground_energy(10), abs=1e-9)
    assert psi.shape == (2,) * 10


@pytest.mark.slow
def test_potts_energy_density_from_ed_extrapolation_matches_the_closed_form():
    """The critical 3-state Potts chain, H = −Σ (σσ† + h.c.) − Σ (τ + τ†): periodic chains of N = 8..11 sites by
    Lanczos, E₀(N)/N fitted by e₀ + a/N² + b/N⁴ (the CFT finite-size form, c = 4/5): e₀ = −2.4359905, within 1e-6 of
    the closed form −(4/3 + 2√3/π) = −2.4359911 that the MERA's model quotes."""
    from ivhl_jax import mera

    ns = np.arange(8, 12)
    with jax.enable_x64(True):
        es = np.array([float(exact.chain_ground_state(mera.potts().term, int(n), num_iter=100)[0]) / n for n in ns])
    a = np.stack([np.ones(len(ns)), ns**-2.0, ns**-4.0], 1)
    e_inf = np.linalg.lstsq(a, es, rcond=None)[0][0]
    print(f"Potts ED: E0(N)/N = {es.tolist()} -> e0 = {e_inf:.8f} (closed form {mera.E0_CRITICAL_POTTS:.8f})")
    assert abs(e_inf - mera.E0_CRITICAL_POTTS) < 1e-5
    assert np.all(es < mera.E0_CRITICAL_POTTS)  # periodic finite chains lie below e0 (Casimir term −πcv/6N²)
