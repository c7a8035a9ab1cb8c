"""Mixtures and spin-1 condensates (ivhl_jax.physics.condensate.mixture).

References (none written in the module under test): the conservation of every N_i (mixture) and of N and
M = ∫F_z (spin-1) by the exact flow; the homogeneous miscibility condition g₁₂² < g₁₁g₂₂ and the exact energy
½Σ g_ij N_i N_j / L of the mixed homogeneous state; the spin-1 mean-field phases (c₂ < 0 ferromagnetic
|F| = n, c₂ > 0 polar |F| = 0); an independent float64 NumPy evaluation of the spin-1 energy functional;
Strang's order 2; a directional finite difference for the gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate import Grid, harmonic
from ivhl_jax.physics.condensate import mixture as M

from ...contracts.test_compile_once import count_compiles


def _none(state, params):
    del state, params
    return None


def _run(stepper, psi, steps):
    return trajectory(stepper, stepper.init(psi), steps, save_every=steps, observe=_none)[0]


def _two_blobs(grid, dtype=np.complex128):
    x = grid.coords[0]
    return np.stack([np.exp(-((x - 1) ** 2) / 2) * np.exp(0.7j * x), np.exp(-((x + 1.5) ** 2) / 3)]).astype(dtype)


def _spinor(grid, dtype=np.complex128, kick=0.3):
    """A generic spin-1 state (neither polar nor ferromagnetic, moving) on a 1-D or 2-D grid."""
    mesh = np.meshgrid(*grid.coords, indexing="ij")
    r2 = sum(m * m for m in mesh)
    zeta = np.array([0.6, 0.5 + 0.4j, 0.3])
    zeta = zeta / np.linalg.norm(zeta)
    env = np.exp(-r2 / 2) * np.exp(1j * kick * mesh[0])
    psi = zeta.reshape((3,) + (1,) * grid.ndim) * env[None]
    psi[2] = psi[2] * np.exp(0.4j * mesh[-1])  # a relative phase texture
    return psi.astype(dtype)


# --- mixtures ---------------------------------------------------------------------------------
def _norms_and_energy(s, p):
    return M.component_norms(s, p.system.grid), M.mixture_energy(s, p.system)["total"]


def test_mixture_conserves_each_component_norm_to_round_off():
    """Real time: every N_i is conserved by the exact flow; the scheme keeps it to round-off (float64, 1-D and
    2-D), and the energy stays put to the splitting error."""
    with jax.enable_x64(True):
        for grid in (Grid.uniform(128, 20.0), Grid.uniform((32, 32), 12.0)):
            V = harmonic(grid, dtype=jnp.float64)
            system = M.MixtureSystem.create(grid, V, [[3.0, 1.5], [1.5, 2.0]])
            if grid.ndim == 1:
                psi = _two_blobs(grid)
            else:
                psi = np.stack([_spinor(grid)[0], _spinor(grid)[1]])
            st = C.strang(system, 1e-3)
            p0 = st.init(psi)
            _, (norms, energy) = trajectory(st, p0, 1000, save_every=50, observe=_norms_and_energy)
            n0 = np.asarray(M.component_norms(p0, grid))
            drift = np.max(np.abs(np.asarray(norms) - n0) / n0)
            assert drift < 1e-13, drift  # measured 4e-15 (1-D)
            e0 = float(M.mixture_energy(p0, system)["total"])
            assert np.max(np.abs(np.asarray(energy) - e0)) < 1e-6 * abs(e0)


def test_mixture_of_one_component_is_the_scalar_gp_step():
    """C = 1 with g = [[g]] is the scalar GP equation: the mixture step equals the family's scalar Strang step."""
    from ivhl_jax.physics import condensate as C

    with jax.enable_x64(True):
        grid = Grid.uniform(64, 16.0)
        V = harmonic(grid, dtype=jnp.float64)
        psi = _two_blobs(grid)[0]
        st = C.strang(M.MixtureSystem.create(grid, V, [[4.0]]), 2e-3)
        ours = np.asarray(_run(st, psi[None], 20))[0]
        gp = C.strang(C.GPSystem.create(grid, V, 4.0), 2e-3, project_norm=False)
        ref = np.asarray(_run(gp, psi, 20))
        np.testing.assert_allclose(ours, ref, atol=1e-12)


def _box_mixture_overlap(g12, g11=200.0, g22=100.0):
    grid = Grid.uniform(128, 32.0)
    system = M.MixtureSystem.create(grid, jnp.zeros(grid.shape, jnp.float64), [[g11, g12], [g12, g22]])
    x = grid.coords[0]
    s = 0.5 * (1 + np.tanh(4 * np.cos(2 * np.pi * x / 32)))  # separated start: 1 in the middle, 2 outside
    psi0 = np.stack([np.sqrt(s + 0.05), np.sqrt(1.05 - s)])
    psi, info = C.ground_state(system, 1.0, dt=1e-2, max_steps=60_000, psi0=psi0, method="flow")
    assert bool(info["converged"])
    return float(M.overlap(psi, grid)), float(info["energy"]), psi


def test_miscible_immiscible_transition_at_the_geometric_mean():
    """Homogeneous 1-D box, g₁₁ = 200, g₂₂ = 100: g₁₂² = g₁₁g₂₂ at g₁₂ = 141.4 (the arithmetic mean would be 150).
    Started from separated domains, the imaginary-time ground state mixes completely below the threshold
    (overlap 1, energy the exact ½Σg_ij N_iN_j/L) and stays separated above it (overlap → 0)."""
    with jax.enable_x64(True):
        lam_below, e_below, _ = _box_mixture_overlap(138.0)
        lam_above, _, psi = _box_mixture_overlap(145.0)
        norms = np.asarray(M.component_norms(psi, Grid.uniform(128, 32.0)))
    assert lam_below > 1 - 1e-6, lam_below  # measured 1 − 4e-8
    np.testing.assert_allclose(e_below, 0.5 * (200 + 100 + 2 * 138.0) / 32.0, rtol=1e-8)
    assert lam_above < 0.05, lam_above  # measured 0.0105
    np.testing.assert_allclose(norms, [1.0, 1.0], rtol=1e-12)


def test_trapped_symmetric_mixture_overlap_and_energy_descent():
    """Harmonic trap, g₁₁ = g₂₂ = g = 200: the overlap of the ground state is 1 for g₁₂ < g and small for
    g₁₂ > g; along the imaginary-time flow the energy never increases (float64)."""
    with jax.enable_x64(True):
        grid = Grid.uniform(256, 32.0)
        V = harmonic(grid, dtype=jnp.float64)
        x = grid.coords[0]
        psi0 = np.stack([np.exp(-((x - 2) ** 2) / 8), np.exp(-((x + 2) ** 2) / 8)])
        lams = {}
        for ratio in (0.9, 1.1):
            g = 200.0
            system = M.MixtureSystem.create(grid, V, [[g, ratio * g], [ratio * g, g]])
            psi, info = C.ground_state(system, 1.0, dt=5e-3, max_steps=40_000, psi0=psi0, method="flow")
            assert bool(info["converged"])
            lams[ratio] = float(M.overlap(psi, grid))
        assert lams[0.9] > 1 - 1e-6 and lams[1.1] < 0.01, lams  # measured 1 − 1e-10 and 1.5e-3
        system = M.MixtureSystem.create(grid, V, [[200.0, 180.0], [180.0, 200.0]])
        st = C.strang(system, 5e-3, imaginary=True, norm=[1.0, 0.7])

        def e_of(s, p):
            return M.mixture_energy(s, p.system)["total"]

        p0 = st.step(st.init(psi0))  # the first step brings ψ to the held norms
        _, energies = trajectory(st, p0, 600, observe=e_of)
        e = np.asarray(energies)
        assert np.max(np.diff(e)) <= 1e-12 * abs(e[-1]), np.max(np.diff(e))
        assert e[0] - e[-1] > 1.0  # it did descend
        np.testing.assert_allclose(np.asarray(M.component_norms(p0, grid)), [1.0, 0.7], rtol=1e-12)


# --- spin-1 -----------------------------------------------------------------------------------
def _n_and_m(s, prm):
    return jnp.sum(M.component_norms(s, prm.system.grid)), M.magnetization(s, prm.system.grid)


def test_spin1_conserves_n_and_m_to_round_off():
    """N and M = ∫F_z are conserved (p = 0 and p ≠ 0, q ≠ 0, c₂ of either sign), float64, 1-D and 2-D."""
    with jax.enable_x64(True):
        cases = (
            (Grid.uniform(128, 20.0), 0.0, -2.0),
            (Grid.uniform(128, 20.0), 0.3, 1.5),
            (Grid.uniform((24, 24), 12.0), 0.0, 1.5),
        )
        for grid, p, c2 in cases:
            system = M.Spin1System.create(grid, harmonic(grid, dtype=jnp.float64), 20.0, c2, p=p, q=0.4)
            st = C.strang(system, 1e-3)
            p0 = st.init(_spinor(grid))
            _, (n, m) = trajectory(st, p0, 400, save_every=50, observe=_n_and_m)
            n0 = float(jnp.sum(M.component_norms(p0, grid)))
            m0 = float(M.magnetization(p0, grid))
            assert np.max(np.abs(np.asarray(n) - n0)) < 1e-13 * n0
            assert np.max(np.abs(np.asarray(m) - m0)) < 1e-13 * n0  # measured 1e-15
            assert abs(m0) > 0.05  # a magnetised state: the test can fail


def test_spin1_float32_keeps_n_and_m_without_a_rounding_bias():
    """float32, 3000 steps: the spin-mixing update is added to ψ in one rounding (two roundings in a row biased the
    norm upwards by ~6e-8 per step: 1.8e-4 here); measured 1.8e-6 for N and 1e-6 for M over 10⁴ steps."""
    grid = Grid.uniform(128, 20.0)
    system = M.Spin1System.create(grid, harmonic(grid), 20.0, -2.0, q=0.4)
    st = C.strang(system, 1e-3)
    p0 = st.init(_spinor(grid, np.complex64))
    _, (n, m) = trajectory(st, p0, 3000, save_every=500, observe=_n_and_m)
    n0 = float(jnp.sum(M.component_norms(p0, grid)))
    m0 = float(M.magnetization(p0, grid))
    assert np.max(np.abs(np.asarray(n) - n0)) < 1e-5 * n0
    assert np.max(np.abs(np.asarray(m) - m0)) < 1e-5 * n0


def test_spin1_step_is_second_order():
    """The exact spin-mixing exponential keeps the whole step at Strang's order 2 (error vs dt = 1e-4)."""
    with jax.enable_x64(True):
        grid = Grid.uniform(128, 20.0)
        system = M.Spin1System.create(grid, harmonic(grid, dtype=jnp.float64), 10.0, -3.0, p=0.2, q=0.5)
        psi = _spinor(grid)

        def run(dt):
            return np.asarray(_run(C.strang(system, dt), psi, int(round(0.25 / dt))))

        ref = run(1e-4)
        errs = np.array([np.max(np.abs(run(dt) - ref)) for dt in (5e-3, 2.5e-3, 1.25e-3)])
        orders = np.log2(errs[:-1] / errs[1:])
        assert np.all(np.abs(orders - 2) < 0.1), orders  # measured 2.00


def test_spin1_polar_vs_ferromagnetic_by_the_sign_of_c2():
    """M free, p = q = 0: c₂ < 0 → |∫F| = N (ferromagnetic); c₂ > 0 → ∫F = 0 and |F| = 0 pointwise (polar)."""
    with jax.enable_x64(True):
        grid = Grid.uniform(256, 32.0)
        V = harmonic(grid, dtype=jnp.float64)
        out = {}
        for c2 in (-5.0, 5.0):
            system = M.Spin1System.create(grid, V, 100.0, c2)
            psi, info = C.ground_state(system, 1.0, dt=5e-3, max_steps=20_000, method="flow")
            assert bool(info["converged"])
            f = [np.asarray(c) for c in M.spin_density(psi)]
            total = np.array([c.sum() * grid.cell_volume for c in f])
            local = np.sqrt(sum(c * c for c in f)).sum() * grid.cell_volume
            out[c2] = (np.linalg.norm(total), local)
            np.testing.assert_allclose(float(jnp.sum(M.component_norms(psi, grid))), 1.0, rtol=1e-12)
        assert out[-5.0][0] > 1 - 1e-6, out  # measured 1 − 1.3e-9
        assert out[5.0][0] < 1e-3 and out[5.0][1] < 1e-3, out  # measured 3.7e-5


def test_spin1_ground_state_holds_the_requested_magnetization():
    with jax.enable_x64(True):
        grid = Grid.uniform(128, 24.0)
        system = M.Spin1System.create(grid, harmonic(grid, dtype=jnp.float64), 50.0, 2.0, q=0.1)
        psi, info = C.ground_state(system, 2.0, dt=5e-3, max_steps=3000, magnetization=0.5, method="flow")
        assert bool(info["finite"])
        np.testing.assert_allclose(float(M.magnetization(psi, grid)), 0.5, rtol=1e-10)
        np.testing.assert_allclose(float(jnp.sum(M.component_norms(psi, grid))), 2.0, rtol=1e-12)


def _numpy_spin1_energy(psi, x_axes, length, V, c0, c2, p, q):
    """Independent float64 reference: gradients by NumPy FFT derivative per axis, F from the explicit matrices."""
    d = len(x_axes)
    dv = np.prod([L / n for L, n in zip(length, psi.shape[1:])])
    ekin = 0.0
    for a in range(d):
        n = psi.shape[1 + a]
        k = 2 * np.pi * np.fft.fftfreq(n, length[a] / n)
        shape = [1] * (d + 1)
        shape[1 + a] = n
        dpsi = np.fft.ifft(1j * k.reshape(shape) * np.fft.fft(psi, axis=1 + a), axis=1 + a)
        ekin += 0.5 * np.sum(np.abs(dpsi) ** 2) * dv
    fx = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]) / np.sqrt(2)
    fy = np.array([[0, -1j, 0], [1j, 0, -1j], [0, 1j, 0]]) / np.sqrt(2)
    fz = np.diag([1.0, 0.0, -1.0])
    F = [np.real(np.einsum("i...,ij,j...->...", psi.conj(), f, psi)) for f in (fx, fy, fz)]
    dens = np.sum(np.abs(psi) ** 2, axis=0)
    m = np.array([1.0, 0.0, -1.0]).reshape((3,) + (1,) * d)
    zeeman = np.sum((-p * m + q * m * m) * np.abs(psi) ** 2) * dv
    return (
        ekin
        + np.sum(V * dens) * dv
        + zeeman
        + 0.5 * c0 * np.sum(dens**2) * dv
        + 0.5 * c2 * np.sum(sum(f * f for f in F)) * dv
    )


def test_spin1_energy_matches_an_independent_numpy_reference():
    with jax.enable_x64(True):
        grid = Grid.uniform((24, 20), (10.0, 8.0))
        V = np.asarray(harmonic(grid, (1.0, 1.3), dtype=jnp.float64))
        rng = np.random.default_rng(3)
        psi = _spinor(grid) * (1 + 0.1 * (rng.normal(size=(3, 24, 20)) + 1j * rng.normal(size=(3, 24, 20))))
        args = dict(c0=7.0, c2=-1.3, p=0.25, q=0.6)
        ours = float(
            M.spin1_energy(psi, M.Spin1System.create(grid, V, args["c0"], args["c2"], p=args["p"], q=args["q"]))[
                "total"
            ]
        )
        ref = _numpy_spin1_energy(psi, grid.coords, grid.length, V, **args)
        np.testing.assert_allclose(ours, ref, rtol=1e-13)


# --- jit once, vmap, grad ----------------------------------------------------------------------
def test_mixture_and_spin1_new_values_compile_nothing():
    grid = Grid.uniform(64, 16.0)
    V = harmonic(grid)
    psi2 = _two_blobs(grid, np.complex64)
    psi3 = _spinor(grid, np.complex64)
    jax.block_until_ready(_run(C.strang(M.MixtureSystem.create(grid, V, [[1.0, 0.5], [0.5, 1.0]]), 1e-3), psi2, 10))
    jax.block_until_ready(_run(C.strang(M.Spin1System.create(grid, V, 5.0, -1.0), 1e-3), psi3, 10))
    V2 = V * 1.1
    with count_compiles() as again:
        s2 = M.MixtureSystem.create(grid, V2, [[2.0, 0.3], [0.3, 1.5]])
        jax.block_until_ready(_run(C.strang(s2, 2e-3), 0.9 * psi2, 10))
        s3 = M.Spin1System.create(grid, V, 6.0, 0.7, p=0.1, q=0.2)
        jax.block_until_ready(_run(C.strang(s3, 2e-3), 0.9 * psi3, 10))
    assert again == [], again


def test_vmap_over_the_interspecies_coupling_and_c2():
    grid = Grid.uniform(64, 16.0)
    V = harmonic(grid)
    psi2 = _two_blobs(grid, np.complex64)
    st = C.strang(M.MixtureSystem.create(grid, V, [[1.0, 0.0], [0.0, 1.0]]), 1e-3)

    def final(g12):
        g = jnp.array([[1.0, 0.0], [0.0, 1.0]]) + g12 * jnp.array([[0.0, 1.0], [1.0, 0.0]])
        s = st.replace(params=st.params.replace(system=st.params.system.replace(g=g)))
        return _run(s, psi2, 20)

    g12s = jnp.array([0.0, 0.5, 1.5])
    batched = jax.vmap(final)(g12s)
    for i, g12 in enumerate(g12s):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(final(g12)), atol=2e-6)
    assert not np.allclose(np.asarray(batched[0]), np.asarray(batched[2]), atol=1e-4)

    psi3 = _spinor(grid, np.complex64)
    st1 = C.strang(M.Spin1System.create(grid, V, 5.0, 0.0), 1e-3)

    def final1(c2):
        s = st1.replace(params=st1.params.replace(system=st1.params.system.replace(c2=c2)))
        return _run(s, psi3, 20)

    c2s = jnp.array([-2.0, 2.0])
    b1 = jax.vmap(final1)(c2s)
    np.testing.assert_allclose(np.asarray(b1[1]), np.asarray(final1(c2s[1])), atol=2e-6)


def test_grad_through_a_trajectory_matches_a_directional_difference():
    """d/dg₁₂ of ⟨x⟩₁ after 20 steps (float64, central difference)."""
    with jax.enable_x64(True):
        grid = Grid.uniform(64, 16.0)
        V = harmonic(grid, dtype=jnp.float64)
        x = jnp.asarray(grid.coords[0])
        psi2 = _two_blobs(grid)
        st = C.strang(M.MixtureSystem.create(grid, V, [[3.0, 1.0], [1.0, 2.0]]), 5e-3)

        def loss(g12):
            g = jnp.array([[3.0, 0.0], [0.0, 2.0]]) + g12 * jnp.array([[0.0, 1.0], [1.0, 0.0]])
            s = st.replace(params=st.params.replace(system=st.params.system.replace(g=g)))
            out = _run(s, psi2, 20)
            return jnp.sum(x * jnp.abs(out[0]) ** 2) * grid.cell_volume

        g0, h = 1.0, 1e-5
        fd = (loss(g0 + h) - loss(g0 - h)) / (2 * h)
        ad = jax.grad(loss)(g0)
        assert abs(float(fd)) > 1e-4
        np.testing.assert_allclose(float(ad), float(fd), rtol=1e-6)


@pytest.mark.slow
def test_spin1_grad_through_a_trajectory_matches_a_directional_difference():
    """d/dc₂ of N₀ = ∫|ψ₀|² after 20 steps (float64, central difference), and a finite gradient through a polar
    state (slow: the spin-1 gradient program takes ~15 s to compile on 2 cores)."""
    with jax.enable_x64(True):
        grid = Grid.uniform(64, 16.0)
        V = harmonic(grid, dtype=jnp.float64)
        h = 1e-5
        psi3 = _spinor(grid)
        st1 = C.strang(M.Spin1System.create(grid, V, 5.0, -1.0, q=0.3), 5e-3)

        def loss1(c2, psi):
            s = st1.replace(params=st1.params.replace(system=st1.params.system.replace(c2=c2)))
            out = _run(s, psi, 20)
            return jnp.sum(jnp.abs(out[1]) ** 2) * grid.cell_volume

        fd1 = (loss1(-1.0 + h, psi3) - loss1(-1.0 - h, psi3)) / (2 * h)
        grad1 = jax.jit(jax.grad(loss1))
        ad1 = grad1(-1.0, psi3)
        assert abs(float(fd1)) > 1e-5
        np.testing.assert_allclose(float(ad1), float(fd1), rtol=1e-6)
        # F = 0 everywhere (pure m = 0, polar): the spin-mixing coefficients are smooth in |F|², so the gradient
        # stays finite there (a closed form in |F| would give 0·∞).
        polar = np.zeros_like(psi3)
        polar[1] = np.exp(-(grid.coords[0] ** 2) / 2)
        assert np.isfinite(float(grad1(1.0, polar)))


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, exc, match",
    [
        (lambda g, V: M.MixtureSystem.create(g, V, [[1.0, 0.5], [0.4, 1.0]]), ValueError, "g must be symmetric"),
        (lambda g, V: M.MixtureSystem.create(g, V, [[1.0, 0.5, 0.1], [0.5, 1.0, 0.1]]), ValueError, r"square \(C, C\)"),
        (lambda g, V: M.MixtureSystem.create(g, V, [1.0, 0.5]), ValueError, "g must be 2-dimensional"),
        (lambda g, V: M.MixtureSystem.create(g, V, [[1.0, np.nan], [np.nan, 1.0]]), ValueError, "NaN"),
        (lambda g, V: M.MixtureSystem.create(g, V, [[1j, 0], [0, 1]]), TypeError, "g must be real"),
        (
            lambda g, V: M.MixtureSystem.create(g, np.zeros((3, 32)), [[1.0, 0.5], [0.5, 1.0]]),
            ValueError,
            "potential must have shape",
        ),
        (lambda g, V: M.MixtureSystem.create("grid", V, [[1.0]]), TypeError, "grid must be a Grid"),
        (lambda g, V: M.MixtureSystem.create(g, V, [[1.0]], layout="x"), TypeError, "layout must be an FFTLayout"),
        (lambda g, V: M.Spin1System.create(g, V, 1.0, 1.0, layout=(8,)), TypeError, "layout must be an FFTLayout"),
        (lambda g, V: M.Spin1System.create(g, V, 1.0, float("nan")), ValueError, "c2 must be finite"),
        (lambda g, V: M.Spin1System.create(g, V, 1.0, 1.0, q="x"), TypeError, "q must be a real number"),
        (lambda g, V: M.Spin1System.create(g, np.zeros((3, 32)), 1.0, 1.0), ValueError, "potential must have shape"),
        (
            lambda g, V: C.strang(M.Spin1System.create(g, V, 1, 1), 1e-3, magnetization=0.1),
            ValueError,
            "held by imaginary-time",
        ),
        (
            lambda g, V: C.strang(M.Spin1System.create(g, V, 1, 1), 1e-3, imaginary=True, magnetization=0.1),
            ValueError,
            "needs norm",
        ),
        (
            lambda g, V: C.strang(M.Spin1System.create(g, V, 1, 1), 1e-3, imaginary=True, norm=1.0, magnetization=1.0),
            ValueError,
            r"\|M\| < N",
        ),
        (
            lambda g, V: C.strang(M.Spin1System.create(g, V, 1, 1), 1e-3, imaginary=1),
            TypeError,
            "imaginary must be a bool",
        ),
        (lambda g, V: C.strang(M.MixtureSystem.create(g, V, [[1.0]]), 10.0), ValueError, "dt=10.0 is unstable"),
        (lambda g, V: C.strang(M.MixtureSystem.create(g, V, [[1.0]]), -1e-3), ValueError, "dt must be > 0"),
        (
            lambda g, V: C.strang(M.MixtureSystem.create(g, V, np.eye(2)), 1e-3, imaginary=True, norm=[1.0, -1.0]),
            ValueError,
            "norm must be > 0",
        ),
        (
            lambda g, V: C.strang(M.MixtureSystem.create(g, V, np.eye(2)), 1e-3).init(np.zeros((3, 32))),
            ValueError,
            r"psi must have shape \(2, 32\)",
        ),
        (
            lambda g, V: C.strang({"potential": V}, 1e-3),
            TypeError,
            "system must be a GPSystem, MixtureSystem, Spin1System or DipolarSystem, got dict",
        ),
        (
            lambda g, V: C.ground_state(M.MixtureSystem.create(g, V, np.eye(2)), psi0=np.zeros((2, 32)), method="flow"),
            ValueError,
            "zero everywhere",
        ),
        (lambda g, V: M.overlap(np.zeros((2, 32)), g, 0, 2), ValueError, "j must be a component index"),
        (
            lambda g, V: C.strang(M.MixtureSystem.create(g, V, [[5e3, 0.0], [0.0, 1.0]]), 5e-3).init(
                3 * np.stack([np.exp(-(g.coords[0] ** 2))] * 2)
            ),
            ValueError,
            "local phase per step",
        ),
        (
            lambda g, V: C.strang(M.Spin1System.create(g, V, 5e3, 1.0), 5e-3).init(
                3 * np.stack([np.exp(-(g.coords[0] ** 2))] * 3)
            ),
            ValueError,
            "local phase per step",
        ),
    ],
)
def test_bad_input_is_one_line(build, exc, match):
    grid = Grid.uniform(32, 10.0)
    with pytest.raises(exc, match=match) as err:
        build(grid, harmonic(grid))
    assert "\n" not in str(err.value)


def test_a_ground_state_search_that_breaks_down_names_dt_in_one_line():
    """e^{−dt·V/2} underflows everywhere (V ≥ 100, dt = 20): the shared front end's one-line error names dt."""
    grid = Grid.uniform(32, 10.0)
    V = harmonic(grid) + 100.0
    for search in (
        lambda: C.ground_state(
            M.MixtureSystem.create(grid, V, np.eye(2)), dt=20.0, max_steps=2, check_every=1, method="flow"
        ),
        lambda: C.ground_state(
            M.Spin1System.create(grid, V, 1.0, 1.0), dt=20.0, max_steps=2, check_every=1, method="flow"
        ),
    ):
        with pytest.raises(ValueError) as err:
            search()
        assert str(err.value) == (
            "dt=20.0 is too large for this imaginary-time solve: the iteration broke down (NaN/inf); use a smaller dt"
        )


# --- the stepper contract and precision policies -------------------------------------------------
def _steppers():
    grid = Grid.uniform(32, 10.0)
    V = harmonic(grid)
    mix = C.strang(M.MixtureSystem.create(grid, V, [[2.0, 1.0], [1.0, 1.5]]), 1e-3)
    spin = C.strang(M.Spin1System.create(grid, V, 5.0, -1.0, p=0.1, q=0.2), 1e-3)
    return [(mix, _two_blobs(grid, np.complex64)), (spin, _spinor(grid, np.complex64))]


@pytest.mark.parametrize("which", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["mixture", "spin1"])
def test_params_gradient_feeds_an_optax_update_and_tree_map_stays_on_device(which):
    import optax

    stepper, psi = _steppers()[which]
    psi = stepper.init(psi)

    def loss(params):
        out = _run(stepper.replace(params=params), psi, 3)
        return jnp.sum(jnp.abs(out[0]) ** 2 * jnp.arange(out.shape[-1]))

    grads = jax.grad(loss)(stepper.params)
    assert jax.tree.structure(grads) == jax.tree.structure(stepper.params)
    opt = optax.sgd(1e-3)
    updates, _ = opt.update(grads, opt.init(stepper.params))
    new = optax.apply_updates(stepper.params, updates)
    assert jax.tree.structure(new) == jax.tree.structure(stepper.params)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(grads))
    with jax.transfer_guard("disallow"):
        jax.tree.map(lambda x: x, stepper)


def test_policies_set_the_state_dtype():
    grid = Grid.uniform(32, 10.0)
    system = M.Spin1System.create(grid, harmonic(grid), 5.0, -1.0)
    psi = _spinor(grid, np.complex64)
    assert C.strang(system, 1e-3, policy="f32").init(psi).dtype == jnp.complex64
    with jax.enable_x64(True):
        st = C.strang(system, 1e-3, policy="f64")
        assert st.init(psi).dtype == jnp.complex128 and st.params.system.c2.dtype == jnp.float64
        mix = M.MixtureSystem.create(grid, harmonic(grid), np.eye(2))
        assert C.strang(mix, 1e-3, policy="f64").init(psi[:2]).dtype == jnp.complex128
        # a float32 system keeps complex64 with x64 on (no float64 constant may promote the state)
        for st32 in (
            C.strang(system, 1e-3),
            C.strang(system, 1e-3, imaginary=True, norm=1.0, magnetization=0.1),
        ):
            assert trajectory(st32, st32.init(psi), 2)[0].dtype == jnp.complex64
        assert trajectory(C.strang(mix, 1e-3), psi[:2].copy(), 2)[0].dtype == jnp.complex64
    with pytest.raises(ValueError, match="complex64/complex128") as err:
        C.strang(system, 1e-3, policy="bf16")
    assert "\n" not in str(err.value)


def _mesh8():
    from ivhl_jax.core.mesh import device_mesh

    if jax.device_count() < 8:
        pytest.skip("needs 8 (emulated) devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return device_mesh((8,), ("x",))


def _slab_pairs(grid, dtype=jnp.float32):
    """(single-device, slab-layout) spin-1 and mixture systems on ``grid`` (the layout splits x over 8 devices)."""
    from jax.sharding import PartitionSpec

    from ivhl_jax.numerics import distributed_fft

    layout = distributed_fft.fft_layout(_mesh8(), PartitionSpec("x"), grid.shape)
    V, g = harmonic(grid, dtype=dtype), [[2.0, 1.0], [1.0, 2.0]]
    spin = [M.Spin1System.create(grid, V, 20.0, -1.0, q=0.2, layout=lay) for lay in (None, layout)]
    mix = [M.MixtureSystem.create(grid, V, g, layout=lay) for lay in (None, layout)]
    return layout, [tuple(spin), tuple(mix)]


def test_grid_axes_sharded_over_devices_give_the_single_device_result():
    """ψ of shape (C, nx, ny) on a slab layout along x (the engine's distributed FFT, one transform pair over all
    components): the same steps as one device, ψ kept in its blocks (float32 real time to its round-off, float64
    imaginary time to 1e-13); energies of a sharded ψ equal the single-device ones."""
    from jax.sharding import NamedSharding, PartitionSpec

    grid = Grid.uniform((32, 32), 10.0)
    layout, pairs = _slab_pairs(grid)
    psi3 = _spinor(grid, np.complex64)
    for single, split in pairs:
        psi = psi3[: 3 if isinstance(single, M.Spin1System) else 2]
        assert split.potential.sharding.is_equivalent_to(layout.sharding(split.potential.ndim), split.potential.ndim)
        ref = _run(C.strang(single, 1e-3), psi, 10)
        out = _run(C.strang(split, 1e-3), psi, 10)
        assert out.sharding.is_equivalent_to(layout.sharding(3), 3)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-6)
    with jax.enable_x64(True):
        _, pairs64 = _slab_pairs(grid, jnp.float64)
        for single, split in pairs64:
            psi = _spinor(grid)[: 3 if isinstance(single, M.Spin1System) else 2]
            ref = _run(C.strang(single, 1e-3, imaginary=True), psi, 10)
            out = _run(C.strang(split, 1e-3, imaginary=True), psi, 10)
            np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-13)
    e = jax.jit(lambda p: M.spin1_energy(p, pairs[0][0])["total"])
    np.testing.assert_allclose(
        float(e(jax.device_put(psi3, NamedSharding(layout.mesh, PartitionSpec(None, "x"))))), float(e(psi3)), rtol=1e-5
    )


def test_ground_states_on_a_slab_layout_equal_one_device():
    """The shared imaginary-time front end places the guess on the layout: the same ground state, energy and step
    count as one device (float64)."""
    grid = Grid.uniform((32, 32), 10.0)
    with jax.enable_x64(True):
        _, (spin, mix) = _slab_pairs(grid, jnp.float64)
        for single, split in (mix, spin):
            ref, ref_info = C.ground_state(single, 1.0, dt=5e-3, max_steps=100, check_every=50, method="flow")
            out, info = C.ground_state(split, 1.0, dt=5e-3, max_steps=100, check_every=50, method="flow")
            assert len(out.sharding.device_set) == 8
            np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-13)
            np.testing.assert_allclose(float(info["energy"]), float(ref_info["energy"]), rtol=1e-12)
            assert int(info["steps"]) == int(ref_info["steps"])


def test_a_sharded_step_moves_only_shards_and_one_device_runs_one_transform_pair_per_component():
    """The compiled step on a slab layout communicates by all-to-all of one shard each (the distributed FFT, one
    batched transform pair over the components) and scalar reductions, never an all-gather of the field; on one
    device a step is one FFT pair per component, no more."""
    import re

    from ivhl_jax.core.hlo import collectives

    grid = Grid.uniform((32, 32), 10.0)
    _, pairs = _slab_pairs(grid)
    psi3 = _spinor(grid, np.complex64)
    for single, split in pairs:
        n_comp = 3 if isinstance(single, M.Spin1System) else 2
        for imaginary in (False, True):
            st = C.strang(split, 1e-3, imaginary=imaginary)
            p = st.init(psi3[:n_comp])
            kinds = collectives(jax.jit(st.step_fn).lower(p, st.params).compile())
            shard = p.addressable_shards[0].data.nbytes
            assert [k for k in kinds if k[0] != "all-reduce"] == [("all-to-all", shard)] * 2, kinds
            assert all(nbytes <= 64 for k, nbytes in kinds if k == "all-reduce"), kinds  # scalars (norms, max|θ|)
            st1 = C.strang(single, 1e-3, imaginary=imaginary)
            p1 = st1.init(psi3[:n_comp])
            hlo = jax.jit(st1.step_fn).lower(p1, st1.params).compile().as_text()
            ffts = re.findall(r"= (c64\[[\d,]+\])\{[^}]*\} fft\(", hlo)
            assert ffts == ["c64[32,32]"] * (2 * n_comp), ffts


@pytest.mark.parametrize("which", ["mixture", "spin1"])
def test_a_psi_sharded_over_a_mesh_on_a_system_without_layout_is_refused_naming_layout(which):
    """As the scalar GP: without a layout the kinetic FFT is the single-device one, so a ψ sharded along its grid
    axes is refused at init, at an eager step and at the drivers' door, with the setting that fixes it."""
    from jax.sharding import NamedSharding, PartitionSpec

    from ivhl_jax.numerics.rollout import chunked

    grid = Grid.uniform((32, 32), 10.0)
    _, pairs = _slab_pairs(grid)
    single = pairs[0 if which == "spin1" else 1][0]
    n_comp = 3 if which == "spin1" else 2
    st = C.strang(single, 1e-3)
    sharded = jax.device_put(
        jnp.asarray(_spinor(grid, np.complex64)[:n_comp]), NamedSharding(_mesh8(), PartitionSpec(None, "x"))
    )
    refused = r"psi is sharded over a mesh as P\('x', None\) but the system has no layout"
    for call in (st.init, st.step, lambda p: trajectory(st, p, 2), lambda p: chunked(st, 2)(p)):
        with pytest.raises(ValueError, match=refused) as err:
            call(sharded)
        assert "layout=distributed_fft.fft_layout" in str(err.value) and "\n" not in str(err.value)
    # split over the components only (no grid axis sharded): accepted
    st.init(jax.device_put(jnp.asarray(_spinor(grid, np.complex64)[:n_comp]), NamedSharding(_mesh8(), PartitionSpec())))
