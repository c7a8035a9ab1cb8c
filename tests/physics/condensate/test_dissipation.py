"""Dissipative GP dynamics, i∂ψ/∂t = (1 − iγ)(H − μ)ψ with μ holding the atom number (``GPSystem.create(gamma=γ)``).

Validated against what the equation guarantees: the energy (in the rotating frame) falls monotonically for
γ > 0 while N is held; γ = 0 is the conservative scheme bit for bit; and (slow) a rotating trap started without
vortices forms a lattice whose vortex density matches Feynman's rule n_v = mΩ/(πħ) (Ω/π in trap units).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C


def _energy(psi, params):
    return C.energy(psi, params.system)["total"]


def _rotating(n=48, length=14.0, g=200.0, omega=0.8, gamma=0.05, dtype=jnp.float32):
    grid = C.Grid.uniform((n, n), length)
    return C.GPSystem.create(grid, C.harmonic(grid, dtype=dtype), g, omega, gamma=gamma)


def _start(system, seed=0):
    """A vortex-free Thomas–Fermi-like start with 1 % noise (breaks the rotational symmetry)."""
    x, y = np.meshgrid(*system.grid.coords, indexing="ij")
    r2 = x * x + y * y
    psi = np.sqrt(np.maximum(0.0, 16.0 - r2)) * (1 + 0.01 * np.random.default_rng(seed).standard_normal(r2.shape))
    dtype = jnp.complex64 if system.real_dtype == jnp.float32 else jnp.complex128
    return C.normalize(jnp.asarray(psi, dtype), system.grid, 1.0)


def test_energy_falls_monotonically_and_the_atom_number_is_held():
    system = _rotating()
    st = C.strang(system, 2e-3)
    psi0 = st.init(_start(system))
    psi, e = trajectory(st, psi0, 600, save_every=30, observe=_energy)
    e = np.asarray(e, np.float64)
    assert np.all(np.diff(e) < 0), np.diff(e)
    e0 = float(_energy(psi0, st.params))
    assert e[-1] < e0 - 0.05  # a real descent (1.6 % here), not round-off
    assert abs(float(C.norm(psi, system.grid)) - 1.0) < 1e-5
    # the same run without damping conserves the energy (the conservative scheme's tolerance)
    st0 = C.strang(system.replace(gamma=0.0), 2e-3)
    _, e_cons = trajectory(st0, psi0, 600, save_every=30, observe=_energy)
    assert np.max(np.abs(np.asarray(e_cons, np.float64) / e0 - 1)) < 1e-4


def test_gamma_zero_is_the_conservative_scheme():
    grid = C.Grid.uniform((32, 32), 10.0)
    plain = C.GPSystem.create(grid, C.harmonic(grid), 50.0, 0.5)
    zero = C.GPSystem.create(grid, C.harmonic(grid), 50.0, 0.5, gamma=0.0)
    assert not zero.dissipative
    psi = C.gaussian(grid, center=(0.5, -0.3))
    a = trajectory(C.strang(plain, 2e-3), psi, 50, save_every=50)[0]
    b = trajectory(C.strang(zero, 2e-3), psi, 50, save_every=50)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_damped_factor_is_the_exact_complex_time_exponential():
    """phase_factor_m1 with damping against e^{−i(1 − iγ)θ} − 1 in float64 NumPy (both of its paths)."""
    from ivhl_jax.numerics.splitstep import phase_factor_m1

    theta = np.linspace(-30.0, 30.0, 1001)
    want = np.exp(-1j * (1 - 0.03j) * theta) - 1
    np.testing.assert_allclose(phase_factor_m1(theta, False, np.complex128, damping=0.03), want, atol=1e-14)
    with jax.enable_x64(True):
        got = phase_factor_m1(jnp.asarray(theta), False, jnp.complex128, damping=jnp.float64(0.03))
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-13)


def test_a_new_gamma_compiles_nothing_and_vmap_over_gamma_matches_single_runs():
    from tests.contracts.test_compile_once import count_compiles

    system = _rotating(n=32, length=12.0)
    psi0 = _start(system)

    def final(gm):
        st = C.strang(system.replace(gamma=gm), 2e-3)
        return jax.block_until_ready(trajectory(st, psi0, 20, save_every=20)[0])

    final(0.05)
    with count_compiles() as second:
        single = [np.asarray(final(gm)) for gm in (0.02, 0.1)]
    assert second == [], second
    batched = jax.vmap(lambda gm: trajectory(C.strang(system.replace(gamma=gm), 2e-3), psi0, 20, save_every=20)[0])(
        jnp.asarray([0.02, 0.1], jnp.float32)
    )
    for i in range(2):
        np.testing.assert_allclose(np.asarray(batched[i]), single[i], atol=2e-5)
    assert not np.allclose(single[0], single[1], atol=1e-4)  # γ matters


def test_grad_through_a_damped_trajectory_matches_a_directional_difference():
    with jax.enable_x64(True):
        grid = C.Grid.uniform((24, 24), 10.0)
        base = C.GPSystem.create(grid, C.harmonic(grid, dtype=jnp.float64), 30.0, 0.4, gamma=0.05)
        psi0 = C.gaussian(grid, center=(0.4, -0.2), dtype=jnp.complex128)

        def loss(gm):
            st = C.strang(base.replace(gamma=gm), 1e-2)
            return C.energy(trajectory(st, psi0, 30, save_every=30)[0], st.params.system)["total"]

        g = float(jax.grad(loss)(jnp.float64(0.05)))
        h = 1e-5
        fd = (float(loss(jnp.float64(0.05 + h))) - float(loss(jnp.float64(0.05 - h)))) / (2 * h)
        assert g < 0 and abs(g - fd) < 1e-6 * max(1.0, abs(fd)), (g, fd)
        # the system's gradient has its tree structure and feeds an optax update
        grads = jax.grad(lambda s: C.energy(psi0, s)["total"] + s.gamma)(base)
        assert jax.tree.structure(grads) == jax.tree.structure(base)
        optax.apply_updates(base, jax.tree.map(lambda d: -0.1 * d, grads))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": -0.1}, "gamma must be >= 0"),
        ({"gamma": float("nan")}, "gamma must be finite"),
        ({"gamma": 0.1, "dissipative": False}, "dissipative=False needs gamma=0"),
    ],
)
def test_bad_gamma_is_one_line(kwargs, match):
    grid = C.Grid.uniform((16, 16), 8.0)
    with pytest.raises(ValueError, match=match) as e:
        C.GPSystem.create(grid, C.harmonic(grid), 1.0, **kwargs)
    assert "\n" not in str(e.value)


def test_gamma_with_imaginary_time_or_no_projection_is_refused():
    system = _rotating(n=16, length=8.0)
    with pytest.raises(ValueError, match="already a gradient flow"):
        C.strang(system, 1e-3, imaginary=True)
    with pytest.raises(ValueError, match="project_norm=False"):
        C.strang(system, 1e-3, project_norm=False)


@pytest.mark.slow
def test_rotating_dissipative_condensate_forms_a_lattice_with_feynmans_vortex_density():
    """Ω = 0.8 ω, γ = 0.03, gN = 500, started without vortices (2-D, 128², float32): vortices enter from the edge
    and settle into a lattice. In the bulk (r < 0.6 R, R the Thomas–Fermi radius from ⟨r²⟩ = R²/3) the vortex
    count matches Feynman's rule, N_v = (Ω/π)·π r² = Ω r² (m = ħ = 1), within 15 %. All charges are +1."""
    grid = C.Grid.uniform((128, 128), 24.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 500.0, 0.8, gamma=0.03)
    st = C.strang(system, 2e-3)
    psi = st.init(_start(system))
    psi, _ = trajectory(st, psi, 40000, save_every=40000, observe=_energy)
    x, y = np.meshgrid(*grid.coords, indexing="ij")
    rho = np.abs(np.asarray(psi)) ** 2
    radius = np.sqrt(3 * np.sum(rho * (x * x + y * y)) / np.sum(rho))
    v = C.vortices(psi, grid, max_vortices=128)
    assert int(v.count) <= 128
    pos, charge, mask = (np.asarray(a) for a in (v.positions, v.charges, v.mask))
    pos, charge = pos[mask], charge[mask]
    r0 = 0.6 * radius
    inside = np.sum(pos**2, axis=1) < r0**2
    feynman = 0.8 * r0**2
    assert np.all(charge[inside] == 1)
    assert abs(inside.sum() / feynman - 1) < 0.15, (int(inside.sum()), feynman, radius)


def test_gpu_check_quick_runs_on_cpu():
    """bench.ops_condensate_terms.gpu_check (the gp_terms section of bench/gpu_checks.py) in its CPU-sized form:
    every term runs through condensate.strang and holds what it conserves."""
    from ivhl_jax.bench import ops_condensate_terms

    doc = ops_condensate_terms.gpu_check(quick=True)
    res = doc["results"]
    assert not any("error" in r for r in res.values()), res
    assert res["damped"]["energy_monotone"] and res["damped"]["norm_error"] < 1e-5
    assert res["mixture"]["max_component_norm_drift"] < 1e-5
    assert res["spin1"]["norm_drift"] < 1e-5 and res["spin1"]["magnetization_drift"] < 1e-5
    assert res["dipolar"]["norm_drift"] < 1e-5
    assert all(r["f32_vs_f64"] < 1e-4 for r in res.values())
    assert len(doc["summary"]) == 6


def test_a_damped_rotating_run_on_a_distributed_fft_equals_one_device():
    """The damped factors placed on a slab layout over 8 devices (the distributed FFT): the same field as one
    device, to float32 round-off."""
    from jax.sharding import PartitionSpec as P

    from ivhl_jax.core.mesh import device_mesh
    from ivhl_jax.numerics import distributed_fft

    if jax.device_count() < 8:
        pytest.skip("needs 8 (emulated) devices")
    single = _rotating(n=32, length=12.0)
    layout = distributed_fft.fft_layout(device_mesh((8,), ("x",)), P("x"), (32, 32))
    sharded = C.GPSystem.create(single.grid, single.potential, single.g, single.omega_rot, layout=layout, gamma=0.05)
    psi0 = _start(single)
    a = trajectory(C.strang(single, 2e-3), psi0, 40, save_every=40)[0]
    st = C.strang(sharded, 2e-3)
    b = trajectory(st, st.init(psi0), 40, save_every=40)[0]
    assert len(b.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)
