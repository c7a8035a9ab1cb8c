"""OPE coefficients and central charge of the scale-invariant MERA (ivhl_jax.physics.tensornet.mera.conformal).

The extraction is checked on cases with exact answers before it is trusted on the Ising chain: the OPE on the
tensor product of two MERAs (whose conformal data obey exact product rules whatever the MERA's accuracy), the ring
Hamiltonian against exact diagonalisation and the free-fermion ring, and the finite-size formula for c on exact
ring energies of the Ising, XX and Potts chains.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import mera as M
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics.tensornet.mera import conformal as C
from ivhl_jax.physics.tensornet.mera.models import blocked_terms


def _velocity(model):
    return model.cft.velocity


def _optimised(model, chi, mid, layers, sweeps, key=0, start=None):
    st = M.evenbly_vidal(model, M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, refsym=True, u_delay=3))
    state = st.init(jax.random.key(key)) if start is None else st.init(jax.random.key(key), mera=start)
    state, _ = trajectory(st, state, sweeps, observe=M.observe)
    return state.mera


def _product_layer(a, b):
    """The scale-invariant layer of the tensor product of two MERAs (legs of a before those of b)."""
    (ua, wa, va), (ub, wb, vb) = a, b
    u = jnp.einsum("abcd,efgh->aebfcgdh", ua, ub)
    u = u.reshape(
        ua.shape[0] * ub.shape[0], ua.shape[1] * ub.shape[1], ua.shape[2] * ub.shape[2], ua.shape[3] * ub.shape[3]
    )
    w = jnp.einsum("abc,def->adbecf", wa, wb).reshape(*(x * y for x, y in zip(wa.shape, wb.shape)))
    v = jnp.einsum("abc,def->adbecf", va, vb).reshape(*(x * y for x, y in zip(va.shape, vb.shape)))
    return u, w, v


def _si_only(layer):
    u, w, v = layer
    chi = w.shape[-1]
    eye = jnp.eye(chi * chi).reshape((chi,) * 4) / chi**2
    return M.MERA(u=(u,), w=(w,), v=(v,), rho_ab=eye, rho_ba=eye, sweeps=jnp.zeros((), jnp.int32))


@pytest.fixture(scope="module")
def ising4():
    """A χ = 4 Ising MERA (two layers) whose one-site and two-site spectra agree (σ 0.125/0.131, ε 0.97/0.93)."""
    with jax.enable_x64(True):
        st = M.evenbly_vidal(M.ising(), M.MERAConfig(chi=4, chi_mid=4, layers=2, refsym=True))
        state, first, _ = M.cold_start(st, jax.random.key(0), M.ising().e0, 50, M.StuckCheck(), limit=1500)
        state, _ = trajectory(st, state, 1500 - first.shape[0], observe=M.observe)
        return state.mera


def _product_channels(ch):
    """𝒮₂ of MERA ⊗ MERA is 𝒮₂ ⊗ 𝒮₂: its eigenvectors are the products of the factor's (exact)."""
    chi, n = ch.chi, len(ch.dims)

    def prod(x):
        x = x.reshape(n, chi, chi, chi, chi)
        return np.einsum("iabcd,jefgh->ijaebfcgdh", x, x).reshape(n * n, -1)

    dims = (ch.dims[:, None] + ch.dims[None, :]).reshape(-1)
    order = np.argsort(dims, kind="stable")
    return C.TwoSiteChannels(dims=dims[order], right=prod(ch.right)[order], left=prod(ch.left)[order], chi=chi * chi)


@pytest.mark.slow
def test_ope_extraction_is_exact_on_a_product_of_two_meras(ising4):
    """For MERA ⊗ MERA the CFT is the product: C_{σ₁ σ₂ (σ₁σ₂)} = 1 exactly, and C of σσε equals the single
    MERA's own value, whatever the MERA's accuracy; the product's σ and ε come as exact doublets, so the
    multiplet (real-basis) bookkeeping is exercised too. The product's one-site operators come from its own
    χ = 16 layer; its two-site channels are the products of the factor's."""
    with jax.enable_x64(True):
        single = ising4
        ops = C.one_site_operators(single, 4)
        d_sigma, d_eps = float(ops.dims[1]), float(ops.dims[2])
        ch1 = C.two_site_channels(single, 8)
        c_single, _ = C.ope(single, (d_sigma, 1), (d_sigma, 1), (d_eps, 1), channels=ch1)
        top = single.layer(single.num_layers - 1)
        prod = _si_only(_product_layer(top, top))
        ch = _product_channels(ch1)
        # σ⊗1 and 1⊗σ (a doublet) fuse to σ⊗σ with C = 1 for each order: ‖C‖ = √2
        norm, used = C.ope(prod, (d_sigma, 2), (d_sigma, 2), (2 * d_sigma, 1), channels=ch)
        assert np.allclose(used["a"], d_sigma, atol=1e-9) and np.isclose(used["c"][0], 2 * d_sigma, atol=1e-9)
        np.testing.assert_allclose(norm / math.sqrt(2.0), 1.0, atol=1e-8)
        # σ_i σ_i → ε_i with the single MERA's coefficient, for each factor i: ‖C‖ = √2 C_single
        norm, _ = C.ope(prod, (d_sigma, 2), (d_sigma, 2), (d_eps, 2), channels=ch)
        np.testing.assert_allclose(norm / math.sqrt(2.0), c_single, rtol=1e-7)
    assert abs(c_single - 0.5) < 0.1  # a rough χ = 4 MERA, but σσε is there


def test_two_site_channels_are_left_and_right_eigenvectors():
    """R_n and L_n of a random layer: 𝒮₂ R = λ R and 𝒮₂ᵀ L = λ L for the real, simple eigenvalues (checked
    against a dense eigen-decomposition), and the projection of R_n onto the channels is the unit vector n."""
    from ivhl_jax.physics.tensornet.mera.scaling import two_site_map

    with jax.enable_x64(True):
        cfg = M.MERAConfig(chi=3, chi_mid=3, layers=1)
        layer = tuple(jnp.asarray(x, jnp.float64) for x in M.init_tensors(jax.random.key(3), cfg, d=4).layer(1))
        ch = C.two_site_channels(_si_only(layer), 8)
        f = jax.jit(lambda x: two_site_map(x.reshape((3,) * 4), *layer).reshape(-1))
        mat = np.stack([np.asarray(f(jnp.asarray(e))) for e in np.eye(81)], axis=1)
    vals = np.linalg.eigvals(mat)
    vals = vals[np.argsort(-np.abs(vals))][:8]
    simple = [i for i in range(8) if abs(vals[i].imag) < 1e-12 and np.sum(np.abs(vals - vals[i]) < 1e-8) == 1]
    assert 0 in simple and len(simple) >= 2
    for i in simple:
        lam = vals[i].real
        np.testing.assert_allclose(mat @ ch.right[i], lam * ch.right[i], atol=1e-10)
        np.testing.assert_allclose(mat.T @ ch.left[i], lam * ch.left[i], atol=1e-10)
    coef = ch.coefficients(np.array(simple), ch.right[simple].reshape(len(simple), 3, 3, 3, 3))
    np.testing.assert_allclose(coef, np.eye(len(simple)), atol=1e-9)


def test_ring_hamiltonian_at_level_zero_is_the_chain_on_a_ring():
    """Level 0: four blocked sites are a ring of 8 spins; its ground state is the exact one (Ising: free fermions
    in the antiperiodic sector, E₀ = −2 Σ_n |sin(π(2n+1)/2L)|; Potts and XX: dense diagonalisation of the ring
    built here from the spin term)."""
    with jax.enable_x64(True):
        e_ising = C.ring_energies(blocked_terms(M.ising(), jnp.float64), 4)[0]
        exact = -2.0 * sum(abs(math.sin(math.pi * (2 * n + 1) / 16)) for n in range(8))
        np.testing.assert_allclose(e_ising, exact, rtol=1e-12)
        for model in (M.xx(), M.potts()):
            ring = C.ring_energies(blocked_terms(model, jnp.float64), 4, k=2)
            np.testing.assert_allclose(ring, _ring_by_kron(np.asarray(model.term), 8), rtol=1e-10)


def _ring_by_kron(term, n):
    """The two lowest levels of Σ_i h(i, i+1 mod n) built from single-site operators (scipy sparse)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import eigsh

    d = term.shape[0]

    def at(i, a):
        return sp.kron(sp.kron(sp.identity(d**i), sp.csr_matrix(a)), sp.identity(d ** (n - 1 - i)), format="csr")

    units = [[np.outer(np.eye(d)[p], np.eye(d)[q]) for q in range(d)] for p in range(d)]
    big = sp.csr_matrix((d**n, d**n))
    for i in range(n):
        j = (i + 1) % n
        for a2, b2, a, b in zip(*np.nonzero(term)):
            big = big + term[a2, b2, a, b] * (at(i, units[a2][a]) @ at(j, units[b2][b]))
    return np.sort(eigsh(big, k=2, which="SA", tol=1e-12, return_eigenvectors=False))


def test_central_charge_formula_on_exact_ring_energies():
    """The finite-size formula and the velocities, checked where the ring energies are exact: free-fermion Ising
    and XX rings (L = 64, 128; the XX formula checked against exact diagonalisation at L = 8) and the Potts ring
    by exact diagonalisation (L = 8, with the exact e∞)."""

    def ising_e0(n):
        return -2.0 * sum(abs(math.sin(math.pi * (2 * k + 1) / (2 * n))) for k in range(n))

    def xx_e0(n):  # n = 0 mod 4: n/2 fermions (even), antiperiodic momenta; fill every −cos k < 0
        k = 2 * np.pi * (np.arange(n) + 0.5) / n
        return float(np.sum(np.minimum(-np.cos(k), 0.0)))

    c = C.central_charge_from_energies(ising_e0(64), ising_e0(128), 64, _velocity(M.ising()))
    assert abs(c - 0.5) < 1e-4
    c_xx = C.central_charge_from_energies(xx_e0(64), xx_e0(128), 64, _velocity(M.xx()))
    assert abs(c_xx - 1.0) < 1e-3, c_xx
    with jax.enable_x64(True):
        np.testing.assert_allclose(C.ring_energies(blocked_terms(M.xx(), jnp.float64), 4)[0], xx_e0(8), rtol=1e-12)
        e_potts = C.ring_energies(blocked_terms(M.potts(), jnp.float64), 4)[0]
    # one ring and the exact e∞: c = 6L(L e∞ − E₀)/(π v)
    c_potts = 6 * 8 * (8 * M.E0_CRITICAL_POTTS - e_potts) / (math.pi * _velocity(M.potts()))
    assert abs(c_potts - 0.8) < 2e-2, c_potts


@pytest.mark.slow
def test_ising_chi8_ope_and_central_charge():
    """χ = 8 Ising (ladder 6 → 8): C_σσε within 1e-2 of 1/2 and c within 5e-3 of 1/2."""
    with jax.enable_x64(True):
        m = _optimised(M.ising(), 6, 4, 1, 1500)
        m = _optimised(M.ising(), 8, 6, 2, 1200, start=M.grow(m, jax.random.key(1), 8, 6, layers=2, refsym=True))
        ope = C.ope_coefficients(m, "ising")["C_σσε"]
        c = C.central_charge(m, M.ising(), levels=(2, 3))
    print(ope, c["pairs"])
    assert abs(ope["error"]) < 1e-2
    assert abs(c["c"] - 0.5) < 5e-3


def test_bad_input_is_named():
    with jax.enable_x64(True):
        m = _si_only(
            _product_layer(
                *(
                    [
                        tuple(
                            jnp.asarray(x, jnp.float64)
                            for x in M.init_tensors(jax.random.key(0), M.MERAConfig(chi=2, layers=1), d=4).layer(1)
                        )
                    ]
                    * 2
                )
            )
        )
        with pytest.raises(ValueError, match="cft must be one of"):
            C.ope_coefficients(m, "tricritical")
        with pytest.raises(ValueError, match="velocity is needed"):
            C.central_charge(m, M.two_site(np.asarray(M.ising().term)))
        with pytest.raises(ValueError, match="levels must be"):
            C.central_charge(m, M.ising(), levels=(1, 3))
        with pytest.raises(TypeError, match="a must be"):
            C.ope(m, 0.125, (0.125, 1), (1.0, 1))
    with pytest.raises(ValueError, match="sites must be even"):
        C.ring_energies(blocked_terms(M.ising()), 5)
    with pytest.raises(TypeError, match="h must be the pair"):
        C.ring_energies(np.zeros((4, 4, 4, 4)))
    with pytest.raises(ValueError, match="h must be two terms"):
        C.ring_energies((np.zeros((4, 4, 4, 4)), np.zeros((2, 2, 2, 2))))
    with jax.enable_x64(True), pytest.raises(ValueError, match="num_channels"):
        C.ope_coefficients(m, "ising", num_channels=1)
    with pytest.raises(RuntimeError, match="enable_x64"):
        C.one_site_operators(m)
