"""ivhl_jax.physics.tensornet.tn: cached-path contraction and entanglement entropies (checked against NumPy float64)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivhl_jax import tn


def _np_entropy(psi: np.ndarray, sites, alpha: float = 1.0) -> float:
    n = psi.ndim
    rest = [i for i in range(n) if i not in sites]
    d_a = int(np.prod([psi.shape[i] for i in sites]))
    mat = np.transpose(psi, list(sites) + rest).reshape(d_a, -1)
    rho = mat @ mat.conj().T
    p = np.clip(np.linalg.eigvalsh(rho / np.trace(rho)), 0, None)
    p = p[p > 1e-14]
    if alpha == 1.0:
        return float(-np.sum(p * np.log(p)))
    return float(np.log(np.sum(p**alpha)) / (1 - alpha))


def test_contract_matches_numpy_and_caches():
    rng = np.random.default_rng(0)
    a, b, c, d = (rng.normal(size=s).astype(np.float32) for s in [(3, 4, 5), (5, 6), (6, 3, 7), (7, 4)])
    spec = "abc,cd,dae,eb->"
    want = np.einsum(spec, a, b, c, d)
    tn._cached_path.cache_clear()
    got = tn.contract(spec, a, b, c, d)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    got2 = jax.jit(lambda *t: tn.contract(spec, *t))(a, b, c, d)
    np.testing.assert_allclose(got2, want, rtol=1e-4)
    info = tn._cached_path.cache_info()
    assert info.misses == 1 and info.hits >= 1, info
    path, flops = tn.contraction_path(spec, a.shape, b.shape, c.shape, d.shape)
    assert len(path) == 3 and flops > 0


def test_contract_grad_and_vmap():
    rng = np.random.default_rng(1)
    a, b, c = (jnp.asarray(rng.normal(size=s)) for s in [(4, 5), (5, 6), (6, 4)])
    f = lambda a: tn.contract("ij,jk,ki->", a, b, c)
    # d tr(ABC)/dA = (BC)^T
    np.testing.assert_allclose(jax.grad(f)(a), (b @ c).T, rtol=1e-5)
    batch = jnp.stack([a, 2 * a])
    out = jax.vmap(f)(batch)
    np.testing.assert_allclose(out, [f(a), 2 * f(a)], rtol=1e-5)


def test_contract_bad_input():
    with pytest.raises(ValueError, match="operands"):
        tn.contract("ij,jk->ik", np.ones((2, 2)))
    with pytest.raises(TypeError, match="subscripts"):
        tn.contract(3, np.ones(2))


def test_entropy_known_states():
    bell = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    assert float(tn.entanglement_entropy(bell, [0], base=2)) == pytest.approx(1.0, abs=1e-6)
    assert float(tn.entanglement_entropy(bell, [0])) == pytest.approx(math.log(2), abs=1e-6)
    prod = jnp.einsum("i,j->ij", jnp.array([0.6, 0.8]), jnp.array([1.0, 0.0]))
    assert float(tn.entanglement_entropy(prod, [1])) == pytest.approx(0.0, abs=1e-7)
    # GHZ on 3 qubits: any single-site or two-site cut has 1 bit; unnormalised input is fine.
    ghz = jnp.zeros((2, 2, 2)).at[0, 0, 0].set(3.0).at[1, 1, 1].set(3.0)
    for sub in ([0], [1], [0, 2], [2, 1]):
        assert float(tn.entanglement_entropy(ghz, sub, base=2)) == pytest.approx(1.0, abs=1e-6)
    # Renyi of a maximally entangled state equals log d for every alpha.
    d = 3
    maxent = jnp.eye(d) / math.sqrt(d)
    for alpha in (0.5, 2.0, 3.0, math.inf):
        assert float(tn.renyi(maxent, [0], alpha)) == pytest.approx(math.log(d), abs=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 5), st.integers(0, 10_000), st.data())
def test_entropy_random_bipartitions_vs_numpy(n, seed, data):
    rng = np.random.default_rng(seed)
    dims = tuple(int(x) for x in rng.integers(2, 4, size=n))
    psi = rng.normal(size=dims) + 1j * rng.normal(size=dims)
    sub = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1, unique=True))
    with jax.enable_x64(True):
        got = float(tn.entanglement_entropy(jnp.asarray(psi), sub))
        got2 = float(tn.renyi(jnp.asarray(psi), sub, 2.0))
    assert got == pytest.approx(_np_entropy(psi, sub), abs=1e-9)
    assert got2 == pytest.approx(_np_entropy(psi, sub, 2.0), abs=1e-9)
    # Complementary subsystems have equal entropy (pure state).
    comp = [i for i in range(n) if i not in sub]
    with jax.enable_x64(True):
        assert float(tn.entanglement_entropy(jnp.asarray(psi), comp)) == pytest.approx(got, abs=1e-9)


def test_entropy_batch_flat_and_vmap_jit_grad():
    rng = np.random.default_rng(3)
    psis = rng.normal(size=(5, 16)).astype(np.float32)
    batched = tn.entanglement_entropy(psis, [1, 3], dims=(2, 2, 2, 2))
    assert batched.shape == (5,)
    single = [tn.entanglement_entropy(p.reshape(2, 2, 2, 2), [1, 3]) for p in psis]
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)
    vm = jax.vmap(lambda p: tn.entanglement_entropy(p, [1, 3], dims=(2, 2, 2, 2)))(psis)
    np.testing.assert_allclose(vm, single, rtol=1e-5, atol=1e-6)
    jt = jax.jit(lambda p: tn.entanglement_entropy(p, [1, 3], dims=(2, 2, 2, 2)))(psis)
    np.testing.assert_allclose(jt, single, rtol=1e-5, atol=1e-6)
    # Gradient is finite even for a product state (zero Schmidt values).
    prod = jnp.zeros((2, 2)).at[0, 0].set(1.0)
    g = jax.grad(lambda p: tn.entanglement_entropy(p, [0]))(prod)
    assert bool(jnp.all(jnp.isfinite(g)))
    g2 = jax.grad(lambda p: tn.renyi(p, [0], 2.0))(prod)
    assert bool(jnp.all(jnp.isfinite(g2)))


def test_entropy_of_a_product_state_is_plus_zero_with_the_gradient_of_the_sum():
    """A product state's entropies are +0.0 (printed 0.0, never -0.0), eager and jitted, and the gradient is the
    one of the raw formula: only the value is corrected."""
    prod = jnp.zeros((2, 2)).at[0, 0].set(1.0)
    calls = {
        "von Neumann": lambda p: tn.entanglement_entropy(p, [0]),
        "Renyi 2": lambda p: tn.renyi(p, [0], 2.0),
        "Renyi 3 bits": lambda p: tn.renyi(p, [0], 3.0, base=2),
        "min-entropy": lambda p: tn.renyi(p, [0], math.inf),
    }
    for name, f in calls.items():
        for value in (f(prod), jax.jit(f)(prod)):
            assert float(value) == 0.0 and math.copysign(1.0, float(value)) > 0, (name, float(value))
            assert f"{float(value):.3f}" == "0.000", name

    def raw_renyi2(p):  # the formula without the correction: log(sum p^2) / (1 - 2)
        q = tn.schmidt_probabilities(p, [0])
        return jnp.log(jnp.sum(q**2)) / (1.0 - 2.0)

    state = jnp.array([[0.8, 0.1], [0.3, 0.5]])
    for s in (state, prod):
        np.testing.assert_array_equal(jax.grad(calls["Renyi 2"])(s), jax.grad(raw_renyi2)(s))


def test_entropy_bad_input():
    psi = np.ones((2, 2))
    with pytest.raises(ValueError, match="out of range"):
        tn.entanglement_entropy(psi, [2])
    with pytest.raises(TypeError, match="list of site indices"):
        tn.entanglement_entropy(psi, 1)
    with pytest.raises(ValueError, match="dims"):
        tn.entanglement_entropy(np.ones(6), [0], dims=(2, 2))
    with pytest.raises(ValueError, match="repeated"):
        tn.entanglement_entropy(psi, [0, 0])


def test_entropy_of_a_small_region_of_a_large_state():
    """A Bell pair between the first and last of 25 qubits (the rest |0>): S(first) = log 2, computed from the
    2 x 2^24 matrix's small triangular factor (a direct SVD of the wide matrix would ask for petabytes)."""
    psi = jnp.zeros((2,) * 25, jnp.float32)
    psi = psi.at[(0,) * 25].set(2**-0.5).at[(1,) + (0,) * 23 + (1,)].set(2**-0.5)
    np.testing.assert_allclose(float(tn.entanglement_entropy(psi, [0])), np.log(2), rtol=1e-6)
    np.testing.assert_allclose(float(tn.entanglement_entropy(psi, [3, 7])), 0.0, atol=1e-6)


def test_rectangular_schmidt_path_matches_numpy_and_differentiates():
    rng = np.random.default_rng(3)
    psi = rng.normal(size=(2,) * 10)
    for sub in ([0], [2, 5], [0, 1, 2, 3, 4, 5, 6, 7]):
        m = np.moveaxis(psi, sub, list(range(len(sub)))).reshape(2 ** len(sub), -1)
        sv = np.linalg.svd(m, compute_uv=False)
        p = sv**2 / np.sum(sv**2)
        np.testing.assert_allclose(float(tn.entanglement_entropy(psi, sub)), -np.sum(p * np.log(p)), rtol=1e-5)
    f = lambda x: tn.entanglement_entropy(x, [0, 1])  # noqa: E731
    x = jnp.asarray(psi, jnp.float32)
    v = jnp.asarray(rng.normal(size=psi.shape), jnp.float32)
    g = float(jnp.vdot(jax.grad(f)(x), v))
    fd = float((f(x + 1e-3 * v) - f(x - 1e-3 * v)) / 2e-3)
    np.testing.assert_allclose(g, fd, rtol=2e-2, atol=1e-4)
