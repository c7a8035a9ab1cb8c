"""Lee–Huang–Yang terms of dipolar condensates and Bose–Bose mixtures (ivhl_jax.physics.condensate.lhy).

References: Lima & Pelster, PRA 84, 041604(R) (2011) (γ_QF, Q₅); Petrov, PRL 115, 155302 (2015) (the mixture's LHY
energy, the reduced droplet equation, the flat-top density n = 1 and the critical number Ñ_c ≈ 18.65).
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate import lhy
from ivhl_jax.physics.condensate.dipolar import Dipolar, DipolarSystem
from ivhl_jax.physics.condensate.mixture import MixtureSystem


# ----------------------------------------------------------------------------------------------- coefficients
@pytest.mark.slow
def test_q5_against_scipy_quadrature_and_its_closed_values():
    """Q₅(ε) = ∫₀¹(1 − ε + 3εu²)^{5/2}du (real part beyond ε = 1) against scipy.integrate.quad (float64, split at the
    root u₀ of the base), to 1e-11; Q₅(0) = 1 and Q₅(1) = 3√3/2 exactly."""
    from scipy.integrate import quad

    eps = np.array([0.0, 0.16, 0.5, 0.9, 0.99, 1.0, 1.01, 1.3, 1.45, 2.0, 4.0])

    def ref(x):
        pts = [math.sqrt((x - 1) / (3 * x))] if x > 1 else None
        return quad(lambda u: max(1 - x + 3 * x * u * u, 0.0) ** 2.5, 0, 1, points=pts, epsabs=0, epsrel=1e-13)[0]

    with jax.enable_x64(True):
        got = np.asarray(lhy.q5(eps))
    np.testing.assert_allclose(got, [ref(x) for x in eps], rtol=1e-11)
    assert got[0] == pytest.approx(1.0, abs=1e-14)
    assert got[5] == pytest.approx(1.5 * math.sqrt(3.0), rel=1e-13)


@pytest.mark.slow
def test_lhy_coefficient_is_the_lima_pelster_gamma_in_trap_units():
    """γ_QF = (32/3) g √(a³/π) Q₅(ε_dd), a = g/4π, i.e. (128√π/3) a^{5/2} Q₅ (¹⁶⁴Dy-like a = 1e-3 a_ho, ε_dd = 1.3);
    lhy=True on DipolarSystem.create computes the same from g and the spec (relative or absolute g_dd)."""
    with jax.enable_x64(True):
        a = 1e-3
        g = 4 * math.pi * a
        want = 128 * math.sqrt(math.pi) / 3 * a**2.5 * float(lhy.q5(1.3))
        assert float(lhy.lhy_coefficient(g, 1.3)) == pytest.approx(want, rel=1e-13)
        grid = C.Grid.uniform((8, 8, 8), 8.0)
        v = np.zeros(grid.shape)
        for spec in (Dipolar.create(eps_dd=1.3), Dipolar.create(g_dd=1.3 * g)):
            s = DipolarSystem.create(grid, v, g, spec, lhy=True)
            assert float(s.gamma_qf) == pytest.approx(want, rel=1e-13)
        # traced and differentiable: dγ/dg = (5/2) γ/g
        d = jax.grad(lambda gg: lhy.lhy_coefficient(gg, 1.3))(g)
        assert float(d) == pytest.approx(2.5 * want / g, rel=1e-10)


@pytest.mark.slow
def test_density_power_is_exact_and_has_finite_derivatives_at_zero():
    with jax.enable_x64(True):
        n = np.array([0.0, 1e-30, 0.3, 2.0])
        np.testing.assert_allclose(np.asarray(lhy.density_power(n, 1.5)), n**1.5, rtol=1e-15)
        np.testing.assert_allclose(np.asarray(lhy.density_power(n, 2.5)), n**2.5, rtol=1e-15)
        for p in (1.5, 2.5):
            d1 = jax.grad(lambda x, p=p: lhy.density_power(x, p))(0.0)
            d2 = jax.grad(jax.grad(lambda x, p=p: lhy.density_power(x, p)))(0.0)
            assert np.isfinite(d1) and np.isfinite(d2) and abs(float(d1)) < 1e-15
    with pytest.raises(ValueError, match="p must be 1.5 or 2.5"):
        lhy.density_power(1.0, 2.0)


# ---------------------------------------------------------------------------------------------- systems, energy
def _dip_system(dtype=np.float64, gamma=None, lhy_on=False, g=1.0, eps=1.2, n=16, layout=None):
    grid = C.Grid.uniform((n, n, n), 10.0)
    x, y, z = np.meshgrid(*grid.coords, indexing="ij")
    v = (0.5 * (x * x + y * y + 4 * z * z)).astype(dtype)
    spec = Dipolar.create(eps_dd=eps, cutoff=4.5)
    return DipolarSystem.create(grid, v, g, spec, gamma_qf=gamma, lhy=lhy_on, layout=layout)


def _blob(grid, comps=None):
    rng = np.random.default_rng(1)
    x, y, z = np.meshgrid(*grid.coords, indexing="ij")
    base = np.exp(-(x * x + y * y + 2 * z * z) / 2) * (1 + 0.1 * (x - 0.3 * y))
    if comps is None:
        return base * np.exp(0.2j * x) + 0.01 * rng.standard_normal(grid.shape)
    return np.stack([base * (1 + 0.2 * c * z) * np.exp(0.1j * (c + 1) * y) for c in range(comps)])


def _numpy_dipolar_energy(psi, s):
    """The functional in float64 NumPy, the dipolar part by the uncut-with-cutoff kernel on the full spectrum."""
    grid = s.grid
    dv = grid.cell_volume
    kk = np.meshgrid(*grid.wavenumbers, indexing="ij")
    k2 = sum(k * k for k in kk)
    n = np.abs(psi) ** 2
    ekin = 0.5 * np.sum(k2 * np.abs(np.fft.fftn(psi)) ** 2) * dv / psi.size
    ax = np.asarray(s.dipolar.axis, np.float64)
    kd = sum(k * a for k, a in zip(kk, ax))
    with np.errstate(invalid="ignore", divide="ignore"):
        shape = np.where(k2 == 0, 0.0, 3 * kd**2 / np.where(k2 == 0, 1, k2) - 1)
    shape = shape * C.dipolar.cutoff_factor(float(s.dipolar.cutoff) * np.sqrt(k2))
    phi = np.fft.ifftn(float(s.g_dd) * shape * np.fft.fftn(n)).real
    return {
        "kinetic": ekin,
        "trap": np.sum(np.asarray(s.potential, np.float64) * n) * dv,
        "interaction": 0.5 * float(s.g) * np.sum(n * n) * dv,
        "dipolar": 0.5 * np.sum(phi * n) * dv,
        "lhy": 0.4 * float(s.gamma_qf) * np.sum(n**2.5) * dv,
    }


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_dipolar_energy_with_lhy_matches_a_numpy_float64_functional(dtype, rtol):
    with jax.enable_x64(dtype == np.float64):
        s = _dip_system(dtype, gamma=0.7)
        psi = _blob(s.grid)
        got = C.energy(jnp.asarray(psi, s.complex_dtype), s)
        want = _numpy_dipolar_energy(psi.astype(np.complex128), s)
        for k, v in want.items():
            assert float(got[k]) == pytest.approx(v, rel=rtol, abs=rtol * abs(want["kinetic"])), k
        assert float(got["total"]) == pytest.approx(sum(want.values()), rel=rtol)
        assert "lhy" not in C.energy(jnp.asarray(psi, s.complex_dtype), _dip_system(dtype))


def _numpy_mixture_lhy(psi, g, dv):
    n = np.abs(psi) ** 2
    return 8 / (15 * math.pi**2) * np.sum((g[0, 0] * n[0] + g[1, 1] * n[1]) ** 2.5) * dv


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_mixture_lhy_energy_matches_petrov_density_in_numpy(dtype, rtol):
    """E_LHY = (8/(15π²)) ∫(g₁₁n₁ + g₂₂n₂)^{5/2} dV (Petrov 2015, ħ = m = 1) against float64 NumPy; the other parts
    are those of the mixture without LHY."""
    with jax.enable_x64(dtype == np.float64):
        grid = C.Grid.uniform((12, 12, 12), 8.0)
        g = np.array([[30.0, -33.0], [-33.0, 40.0]])
        v = C.harmonic(grid, dtype=dtype)
        psi = jnp.asarray(_blob(grid, 2), jnp.complex128 if dtype == np.float64 else jnp.complex64)
        with_lhy = C.energy(psi, MixtureSystem.create(grid, v, g, lhy=True))
        without = C.energy(psi, MixtureSystem.create(grid, v, g))
        want = _numpy_mixture_lhy(np.asarray(psi, np.complex128), g, grid.cell_volume)
        assert float(with_lhy["lhy"]) == pytest.approx(want, rel=rtol)
        assert float(with_lhy["total"]) == pytest.approx(float(without["total"]) + want, rel=rtol)


# ------------------------------------------------------------------------------------------ dynamics, mapping
def _energy_drift(st, psi, steps):
    obs = lambda p, prm: C.energy(p, prm.system)["total"]  # noqa: E731
    final, rec = trajectory(st, st.init(psi), steps, save_every=steps // 4, observe=obs)
    e = np.asarray(rec)
    return final, float(np.max(np.abs(e - e[0])) / abs(e[0]))


@pytest.mark.slow
def test_real_time_with_lhy_conserves_norm_and_energy_float64():
    """The LHY term is a real function of |ψ|², so the Strang step keeps N to round-off and E to the splitting error,
    O(dt²): halving dt (same time span 0.2) divides the largest energy deviation by 4 (3 to 5); the dipolar one is
    below 5e-6 at dt = 1e-3."""
    with jax.enable_x64(True):
        s = _dip_system(gamma=3.0)
        psi = jnp.asarray(_blob(s.grid) * 2.0, jnp.complex128)
        final, drift = _energy_drift(C.strang(s, 1e-3), psi, 200)
        _, coarse = _energy_drift(C.strang(s, 2e-3), psi, 100)
        assert drift < 5e-6 and 3 < coarse / drift < 5, (drift, coarse)
        assert float(C.norm(final, s.grid)) == pytest.approx(float(C.norm(psi, s.grid)), rel=1e-12)
        grid = C.Grid.uniform((12, 12, 12), 8.0)
        mix = MixtureSystem.create(grid, C.harmonic(grid, dtype=np.float64), [[30.0, -33.0], [-33.0, 40.0]], lhy=True)
        psi2 = jnp.asarray(0.5 * _blob(grid, 2), jnp.complex128)
        final2, drift2 = _energy_drift(C.strang(mix, 1e-3), psi2, 200)
        _, coarse2 = _energy_drift(C.strang(mix, 2e-3), psi2, 100)
        assert 3 < coarse2 / drift2 < 5, (drift2, coarse2)  # E_LHY ≫ the rest here: a stiff term, still O(dt²)
        np.testing.assert_allclose(
            np.asarray(C.component_norms(final2, grid)), np.asarray(C.component_norms(psi2, grid)), rtol=1e-12
        )


@pytest.mark.slow
def test_symmetric_mixture_is_petrov_reduced_equation_after_scaling():
    """Petrov's density-locked reduction (module docstring of lhy): a mixture with g₁₁ = g₂₂ and ψ_i = √c_i ψ stays
    locked, and in the scales of :func:`lhy.petrov_units` it is the reduced equation i∂φ/∂t = (−½∇² − 3|φ|² +
    (5/2)|φ|³)φ, run here as a DipolarSystem with g = −3, ε_dd = 0, γ_QF = 5/2. 20 real-time steps of both agree to
    1e-11 (float64)."""
    with jax.enable_x64(True):
        g, g12 = 200.0, -215.0
        u = lhy.petrov_units(g, g, g12)
        assert u["c1"] == pytest.approx(0.5)
        n, side = 16, 24.0
        red_grid = C.Grid.uniform((n,) * 3, side)
        phys_grid = C.Grid.uniform((n,) * 3, side * u["length"])
        red = DipolarSystem.create(red_grid, np.zeros(red_grid.shape), -3.0, Dipolar.create(eps_dd=0.0), gamma_qf=2.5)
        mix = MixtureSystem.create(phys_grid, np.zeros(phys_grid.shape), [[g, g12], [g12, g]], lhy=True)
        x, y, z = np.meshgrid(*red_grid.coords, indexing="ij")
        phi = 0.9 * np.exp(-(x * x + y * y + z * z) / 18) * np.exp(0.3j * x)
        dt = 0.02
        a = trajectory(C.strang(red, dt), jnp.asarray(phi, jnp.complex128), 20, save_every=20)[0]
        psi = np.sqrt(u["density"]) * np.stack([np.sqrt(u["c1"]) * phi, np.sqrt(u["c2"]) * phi])
        b = trajectory(C.strang(mix, dt * u["time"]), jnp.asarray(psi, jnp.complex128), 20, save_every=20)[0]
        back = np.asarray(b) / np.sqrt(u["density"])
        np.testing.assert_allclose(back[0] / np.sqrt(u["c1"]), np.asarray(a), atol=1e-11)
        np.testing.assert_allclose(back[1] / np.sqrt(u["c2"]), np.asarray(a), atol=1e-11)


@pytest.mark.slow
def test_lhy_ground_states_agree_between_the_flow_and_cg():
    """A trapped dipolar condensate past ε_dd = 1 (ε_dd = 1.3, g = 1, γ_QF from lhy=True scaled up to 2 so the term
    matters on a 16³ grid): the imaginary-time flow and the Riemannian CG reach the same energy (flow dt bias
    O(dt): 1e-4 relative at dt = 2e-3) and the CG state is stationary (residual ≤ 1e-8), float64."""
    with jax.enable_x64(True):
        s = _dip_system(gamma=2.0, eps=1.3, g=1.0)
        psi_cg, info_cg = C.ground_state(s, 20.0, method="cg", max_steps=400)
        psi_fl, info_fl = C.ground_state(s, 20.0, dt=2e-3, tol=1e-12, max_steps=20000)
        assert bool(info_cg["converged"]) and float(info_cg["residual"]) < 1e-8
        assert float(info_fl["energy"]) == pytest.approx(float(info_cg["energy"]), rel=1e-4)
        assert float(C.energy(psi_cg, s)["lhy"]) > 0


@pytest.mark.slow
def test_lhy_steps_are_differentiable_in_gamma_qf():
    """d/dγ of the energy after 5 real-time steps by jax.grad equals a central difference (float64)."""
    with jax.enable_x64(True):
        s = _dip_system(gamma=1.0)
        psi = jnp.asarray(_blob(s.grid), jnp.complex128)

        def f(gam):
            st = C.strang(s.replace(gamma_qf=gam), 1e-3)
            out = trajectory(st, psi, 5, save_every=5)[0]
            return C.energy(out, s.replace(gamma_qf=gam))["total"]

        h = 1e-5
        fd = (f(1.0 + h) - f(1.0 - h)) / (2 * h)
        assert float(jax.grad(f)(1.0)) == pytest.approx(float(fd), rel=1e-6)


@pytest.mark.slow
def test_a_step_on_a_slab_layout_equals_the_single_device_step():
    """Dipolar + LHY and mixture + LHY: 10 real-time steps on an 8-device slab layout equal the single-device ones
    (float32, 2e-5 of the peak)."""
    from jax.sharding import PartitionSpec

    from ivhl_jax.core.mesh import device_mesh
    from ivhl_jax.numerics import distributed_fft

    if jax.device_count() < 8:
        pytest.skip("needs 8 (emulated) devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    layout = distributed_fft.fft_layout(device_mesh((8,), ("x",)), PartitionSpec("x"), (16, 16, 16))
    one, split = _dip_system(np.float32, gamma=3.0), _dip_system(np.float32, gamma=3.0, layout=layout)
    psi = _blob(one.grid).astype(np.complex64)
    a = trajectory(C.strang(one, 1e-3), C.strang(one, 1e-3).init(psi), 10, save_every=10)[0]
    st = C.strang(split, 1e-3)
    b = trajectory(st, st.init(psi), 10, save_every=10)[0]
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5 * float(np.max(np.abs(a))))
    grid = C.Grid.uniform((16, 16, 16), 8.0)
    g = [[30.0, -33.0], [-33.0, 40.0]]
    mixes = [MixtureSystem.create(grid, C.harmonic(grid), g, lhy=True, layout=lay) for lay in (None, layout)]
    psi2 = _blob(grid, 2).astype(np.complex64)
    outs = []
    for m in mixes:
        st = C.strang(m, 1e-3)
        outs.append(np.asarray(trajectory(st, st.init(psi2), 10, save_every=10)[0]))
    np.testing.assert_allclose(outs[1], outs[0], atol=2e-5 * float(np.max(np.abs(outs[0]))))


def test_observe_reports_the_lhy_energy():
    s = _dip_system(np.float32, gamma=1.0)
    st = C.strang(s, 1e-3)
    obs = C.observe(st.init(_blob(s.grid).astype(np.complex64)), st.params)
    assert "energy_lhy" in obs and float(obs["energy_lhy"]) > 0


# ----------------------------------------------------------------------------------------------- the HLO guard
def _field_fusions_and_ffts(hlo: str, dims: str, cdt: str) -> tuple[int, int]:
    ffts = len(re.findall(r" fft\(", hlo))
    fusions = len(re.findall(rf"= {cdt}\[{dims}\]\{{[^}}]*\}} fusion\(", hlo))
    return ffts, fusions


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dipolar", "mixture"])
def test_the_lhy_term_adds_no_pass_over_the_field(kind):
    """Speed guard (what a memory-bound GPU step costs): the compiled single-device step with the LHY term runs the
    same FFTs and the same number of field-shaped fusions (passes over ψ) as without it: n^{3/2} fuses into the
    local kick."""
    if kind == "dipolar":
        systems = [_dip_system(np.float32, gamma=gam) for gam in (None, 2.0)]
        dims = "16,16,16"
    else:
        grid = C.Grid.uniform((16, 16, 16), 8.0)
        g = [[30.0, -33.0], [-33.0, 40.0]]
        systems = [MixtureSystem.create(grid, C.harmonic(grid), g, lhy=on) for on in (False, True)]
        dims = "2,16,16,16"
    counts = []
    for s in systems:
        for imaginary in (False, True):
            st = C.strang(s, 1e-3, imaginary=imaginary)
            psi = st.init(np.asarray(_blob(s.grid, 2 if kind == "mixture" else None), np.complex64))
            hlo = jax.jit(st.step_fn).lower(psi, st.params).compile().as_text()
            counts.append(_field_fusions_and_ffts(hlo, dims, "c64"))
    assert counts[2:] == counts[:2], counts  # (with LHY) == (without), real and imaginary time


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_lhy_settings_are_refused_naming_the_argument():
    grid = C.Grid.uniform((8, 8, 8), 8.0)
    v = np.zeros(grid.shape)
    spec = Dipolar.create(eps_dd=1.2)
    with pytest.raises(ValueError, match="not both"):
        DipolarSystem.create(grid, v, 1.0, spec, lhy=True, gamma_qf=1.0)
    with pytest.raises(ValueError, match="lhy=True needs g > 0"):
        DipolarSystem.create(grid, v, -1.0, spec, lhy=True)
    with pytest.raises(ValueError, match="gamma_qf"):
        DipolarSystem.create(grid, v, 1.0, spec, gamma_qf=-1.0)
    with pytest.raises(TypeError, match="lhy must be True or False"):
        DipolarSystem.create(grid, v, 1.0, spec, lhy="yes")
    with pytest.raises(ValueError, match=r"g of shape \(2, 2\) and a 3-D grid"):
        MixtureSystem.create(C.Grid.uniform((8, 8), 8.0), np.zeros((8, 8)), [[1.0, -1.1], [-1.1, 1.0]], lhy=True)
    with pytest.raises(ValueError, match="g11, g22 > 0"):
        MixtureSystem.create(grid, v, [[-1.0, -1.1], [-1.1, 1.0]], lhy=True)
    with pytest.raises(ValueError, match="g12 must be below"):
        lhy.petrov_units(1.0, 1.0, -0.5)
    with pytest.raises(ValueError, match="g11 and g22 must be > 0"):
        lhy.petrov_units(-1.0, 1.0, -2.0)
    with pytest.raises(ValueError, match="eps_dd must be >= 0"):
        lhy.q5(-0.1)
    with pytest.raises(ValueError, match="g must be > 0"):
        lhy.lhy_coefficient(0.0, 1.0)
