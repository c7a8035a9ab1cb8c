"""Precision policies of the physics kernels: measured error per kernel and policy, bad policies.

Every kernel (wave fields and vortices, the GP and GFT split-step solvers, the adaptive-node
dynamics, the GRU) takes ``policy=`` (a :class:`ivhl_jax.core.precision.Policy` or a preset name).
Each test measures the error of one kernel under each policy against an independent float64
reference and asserts it below a stated tolerance (about 3-10x the measured value, which is quoted
next to it; the table is in docs/guide/precision.md):

* fields: the direct float64 NumPy double sum (and a NumPy formula for the vortex product);
* GP: the exact bright soliton and the harmonic ground-state energy 1/2;
* GFT: a float64 run, and exact conservation of the charge Σ|φ|²;
* adaptive nodes and GRU: a float64 run of the same weights, inputs and random keys.

float64 runs use ``with jax.enable_x64(True):`` (a context manager: nothing leaks to other files).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax import fields as F
from ivhl_jax.core import precision
from ivhl_jax.nn import adaptive as A
from ivhl_jax.nn import gru
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import gft as G


def _rel(a, ref) -> float:
    a, ref = np.asarray(a, np.complex128), np.asarray(ref, np.complex128)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


# ------------------------------------------------------------------------------------- presets


def test_presets_and_unknown_name():
    assert precision.get_policy("f32") == precision.get_policy("fp32")
    f64 = precision.get_policy("f64")
    assert (f64.param_dtype, f64.compute_dtype, f64.output_dtype) == (jnp.float64,) * 3
    for name in precision.PHYSICS_PRESETS:
        precision.get_policy(name)
    with pytest.raises(ValueError, match=r"policy='f17' is neither a preset \['bf16', 'f32', 'f64'"):
        precision.get_policy("f17")
    with pytest.raises(ValueError, match=r"policy='f17'.*pure_bf16"):
        F.superpose(np.zeros((2, 3)), np.ones((1, 3)), policy="f17")
    with pytest.raises(TypeError, match="policy must be a preset name"):
        precision.physics_policy(32)  # type: ignore[arg-type]  # the wrong type on purpose


def test_float64_policy_without_x64_is_an_error_not_a_float32_run():
    pts, src = np.zeros((4, 3), np.float32), np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="policy='f64' asks for float64 but jax_enable_x64 is off"):
        F.superpose(pts, src, policy="f64")
    grid = C.Grid.uniform(32, 8.0)
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        C.strang(C.GPSystem(grid, C.harmonic(grid), 1.0), 1e-3, policy="f64")
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        G.strang(G.GFTSystem((8, 8)), 0.01, policy="f64")
    p = gru.init_gru_params(jax.random.key(0), 3, 4)
    with pytest.raises(ValueError, match="policy='f64'.*enable_x64"):
        gru.gru_step(p, jnp.zeros((4,)), jnp.zeros((3,)), policy="f64")
    with jax.enable_x64(True):
        assert F.superpose(pts, src, policy="f64").dtype == jnp.complex128


# ------------------------------------------------------------------------------------- fields


def _numpy_superpose(p, s, a, k, w, ph, t, eps):
    """Independent float64 reference: the direct double sum, and Σ|A_j|/(r + ε) per point."""
    p, s, a, k, w, ph = (np.asarray(x, np.float64) for x in (p, s, a, k, w, ph))
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r - w * t + ph)) / (r + eps)).sum(1), (np.abs(a) / (r + eps)).sum(1)


def _field_problem(seed=0, n=777, m=53, kmax=8.0, bf16_exact=False):
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, 3)).astype(np.float32)
    s = (0.6 * rng.normal(size=(m, 3))).astype(np.float32)
    a = rng.uniform(-2, 2, m).astype(np.float32)
    k = rng.uniform(0.5, kmax, m).astype(np.float32)
    w = rng.uniform(0, 5, m).astype(np.float32)
    ph = rng.uniform(-np.pi, np.pi, m).astype(np.float32)
    out = [p, s, a, k, w, ph]
    if bf16_exact:  # inputs exactly representable in bf16: only the kernel's own rounding is measured
        out = [np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in out]
    return out


# policy -> (tolerance, measured) of the norm-wise relative error against the float64 sum.
FIELD_TOL = {"f64": (1e-12, 6.8e-16), "f32": (1e-5, 3.4e-7), "bf16": (1e-5, 3.4e-7), "pure_bf16": (5e-2, 1.6e-2)}


@pytest.mark.parametrize("policy", list(FIELD_TOL))
def test_superpose_error_per_policy(policy):
    p, s, a, k, w, ph = _field_problem()
    t, eps = 0.37, 0.05
    ref, scale = _numpy_superpose(p, s, a, k, w, ph, t, eps)
    kw = dict(amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=t, softening=eps)
    if policy == "f64":
        with jax.enable_x64(True):
            psi = F.superpose(p, s, **kw, policy=policy)
        assert psi.dtype == jnp.complex128
    else:
        psi = F.superpose(p, s, **kw, policy=policy)
        assert psi.dtype == jnp.complex64
    tol, _measured = FIELD_TOL[policy]
    assert _rel(psi, ref) <= tol
    assert np.max(np.abs(np.asarray(psi, np.complex128) - ref) / scale) <= tol
    if policy in ("f32", "bf16"):
        # Default (policy=None) is the float32 path bit for bit; "bf16" compute is raised to float32
        # for the phase, so it gives the same numbers.
        np.testing.assert_array_equal(np.asarray(psi), np.asarray(F.superpose(p, s, **kw)))


@pytest.mark.parametrize("kmax", [8.0, 50.0])
def test_superpose_bf16_storage_keeps_phase_in_float32(kmax):
    """bf16 storage + float32 phase: only the bf16 rounding of Re ψ, Im ψ remains (≤ 2⁻⁸; measured
    1.6e-3 for k ≤ 8 and k ≤ 50), while bf16 arithmetic loses the phase (measured 2.0e-2 and 0.11)."""
    p, s, a, k, w, ph = _field_problem(kmax=kmax, bf16_exact=True)
    ref, _ = _numpy_superpose(p, s, a, k, w, ph, 0.0, 0.05)
    psi = F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, softening=0.05, policy="pure_bf16")
    assert _rel(psi, ref) <= 4e-3
    # The rejected design, for the record: the same sum evaluated in bf16 arithmetic.
    b = lambda x: jnp.asarray(x, jnp.bfloat16)
    d = b(p)[:, None] - b(s)[None]
    r = jnp.sqrt(jnp.sum(d * d, -1))
    th = b(k) * r + b(ph)
    amp = b(a) / (r + b(0.05))
    naive = (jnp.sum(amp * jnp.cos(th), 1).astype(jnp.float32)
             + 1j * jnp.sum(amp * jnp.sin(th), 1).astype(jnp.float32))
    assert _rel(naive, ref) >= 5 * _rel(psi, ref)


def _numpy_vortex_2d(p, c, q, xi):
    p, c = np.asarray(p, np.float64), np.asarray(c, np.float64)
    u = p[:, None, 0] - c[None, :, 0]
    w = p[:, None, 1] - c[None, :, 1]
    z = (u + 1j * np.sign(q) * w) / np.sqrt(u * u + w * w + xi * xi)
    return np.prod(z ** np.abs(q), axis=1)


# policy -> (tolerance, measured) of the max abs error of χ (|χ| ≤ 1) against float64 NumPy. bf16 storage
# moves a point by up to 2⁻⁹|x| ≈ 4e-3, and near a core of size ξ = 0.2 the factor of charge q turns
# by |q|·δx/ξ, up to ~0.06 rad here: hence the 0.1.
VORTEX_TOL = {"f64": (1e-12, 1.2e-15), "f32": (1e-5, 6.2e-7), "bf16": (1e-5, 6.2e-7), "pure_bf16": (1e-1, 3.1e-2)}


@pytest.mark.parametrize("policy", list(VORTEX_TOL))
def test_vortex_error_per_policy(policy):
    pts = np.asarray(F.grid_points((41, 41), -2.0, 2.0))
    ctr = np.array([[0.3, -0.2], [-0.9, 0.7], [1.1, 1.0]], np.float32)
    q = np.array([1, -2, 3])
    ref = _numpy_vortex_2d(pts, ctr, q, 0.2)
    if policy == "f64":
        with jax.enable_x64(True):
            chi = F.vortex(pts, ctr, q, core_size=0.2, policy=policy)
    else:
        chi = F.vortex(pts, ctr, q, core_size=0.2, policy=policy)
    err = float(np.max(np.abs(np.asarray(chi, np.complex128) - ref)))
    assert err <= VORTEX_TOL[policy][0], err


def test_wave_evolution_stepper_under_policies():
    rng = np.random.default_rng(3)
    pts, src = rng.normal(size=(300, 3)), 0.5 * rng.normal(size=(8, 3))
    kw = dict(amplitudes=1.0, wavenumbers=3.0, phases=0.0, dt=0.1, softening=0.05)

    def run(policy):
        st = F.evolution(F.wave_params(pts, src, **kw, policy=policy))
        final, _ = trajectory(st, st.init(), 5)
        return final

    base = run(None)
    f32 = run("f32")
    np.testing.assert_array_equal(np.asarray(f32.field), np.asarray(base.field))
    lo = run("pure_bf16")
    assert lo.field.dtype == jnp.complex64 and lo.intensity_sum.dtype == jnp.float32  # no complex bf16
    assert _rel(lo.field, base.field) <= 5e-2  # bf16 positions and outputs (measured 6.2e-3)


# ------------------------------------------------------------------------------------- GP


def _soliton_error(policy, steps=2000, dt=1e-3):
    grid = C.Grid.uniform(1024, 80.0)
    g, n, v = -1.0, 4.0, 1.5
    system = C.GPSystem(grid, np.zeros(grid.shape, np.float32), g)
    psi0 = C.bright_soliton(grid, n, g, position=-15.0, velocity=v, dtype=jnp.complex64)
    psi, _ = C.evolve(psi0, system, dt, steps, steps, policy=policy)
    # Exact density of the soliton, float64 NumPy: (n²a/4) sech²(a n (x − x₀ − v t)/2), a = −g.
    x, length = grid.coords[0], grid.length[0]
    xr = (x + 15.0 - v * steps * dt + length / 2) % length - length / 2
    rho_ex = (n * n * -g / 4) / np.cosh(-g * n * xr / 2) ** 2
    rho = np.abs(np.asarray(psi, np.complex128)) ** 2
    return psi.dtype, float(np.max(np.abs(rho - rho_ex)) / rho_ex.max())


def test_gp_bright_soliton_error_per_policy():
    # Max density error relative to the peak after 2000 steps (t = 2) against the exact soliton.
    dtype, err32 = _soliton_error("f32")
    assert dtype == jnp.complex64 and err32 <= 1e-3  # measured 3.1e-4 (complex64 FFT round-off)
    with jax.enable_x64(True):
        dtype, err64 = _soliton_error("f64")
    assert dtype == jnp.complex128 and err64 <= 2e-5  # measured 5.4e-6: the scheme's O(dt²) error


def _ground_energy_error(policy):
    grid = C.Grid.uniform(64, 12.0)
    system = C.GPSystem(grid, C.harmonic(grid), 0.0)
    psi, _ = C.ground_state(system, 1.0, dt=0.05, tol=1e-12, max_steps=20000, policy=policy)
    psi, info = C.ground_state(system, 1.0, dt=0.002, tol=1e-13, max_steps=40000, psi0=psi, policy=policy)
    return psi.dtype, abs(float(info["energy"]) - 0.5) / 0.5


def test_gp_ground_state_energy_per_policy():
    dtype, err32 = _ground_energy_error("f32")
    assert dtype == jnp.complex64 and err32 <= 1e-6  # measured 1.2e-7 (one float32 ulp of E)
    with jax.enable_x64(True):
        dtype, err64 = _ground_energy_error("f64")
    assert dtype == jnp.complex128 and err64 <= 1e-10  # measured 2.6e-13


def test_gp_policy_none_is_unchanged_and_f32_matches_it():
    grid = C.Grid.uniform(128, 16.0)
    system = C.GPSystem(grid, C.harmonic(grid), 5.0)
    psi0 = C.gaussian(grid)
    a, _ = C.evolve(psi0, system, 1e-3, 20, 20)
    b, _ = C.evolve(psi0, system, 1e-3, 20, 20, policy="f32")
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_gp_bad_policies_name_the_argument():
    grid = C.Grid.uniform(32, 8.0)
    system = C.GPSystem(grid, C.harmonic(grid), 1.0)
    psi0 = C.gaussian(grid)
    with pytest.raises(ValueError, match=r"policy='bf16'.*complex64/complex128.*compute_dtype=bfloat16"):
        C.strang(system, 1e-3, policy="bf16")
    with pytest.raises(ValueError, match=r"policy='pure_bf16'.*param_dtype=bfloat16"):
        C.evolve(psi0, system, 1e-3, 2, policy="pure_bf16")
    with pytest.raises(ValueError, match="policy.compute_dtype must be a real floating dtype"):
        C.ground_state(system, policy=precision.Policy(compute_dtype=jnp.complex64))
    with pytest.raises(ValueError, match="policy='f17' is neither a preset"):
        C.step(psi0, system, 1e-3, policy="f17")


# ------------------------------------------------------------------------------------- GFT


def _gft_run(policy, steps=400):
    shape = (12, 12, 12)
    system = G.GFTSystem(shape, -0.5, 0.1)
    rng = np.random.default_rng(0)
    phi0 = 0.3 * (rng.normal(size=shape) + 1j * rng.normal(size=shape)) + 0.5
    phi, obs = G.gft_evolve(jnp.asarray(phi0), system, 0.02, steps, steps // 4, policy=policy)
    q0 = float(np.sum(np.abs(phi0) ** 2))  # the initial charge, float64 NumPy
    return phi, np.asarray(obs["charge"], np.float64) / q0, np.asarray(obs["energy"], np.float64)


def test_gft_error_per_policy_and_charge_conservation():
    phi32, q32, e32 = _gft_run("f32")
    with jax.enable_x64(True):
        phi64, q64, e64 = _gft_run("f64")
    assert phi32.dtype == jnp.complex64 and phi64.dtype == jnp.complex128
    assert _rel(phi32, phi64) <= 1e-4  # measured 1.7e-5 after 400 steps
    assert np.max(np.abs(q64 - 1)) <= 1e-10  # measured 1e-13: the charge is conserved exactly
    assert np.max(np.abs(q32 - 1)) <= 1e-4  # measured 1.7e-5 (complex64 round-off)
    assert np.max(np.abs(e32 - e64)) / abs(e64[0]) <= 3e-4  # measured 5.2e-5


def test_gft_bad_policies_name_the_argument():
    system = G.GFTSystem((8, 8))
    with pytest.raises(ValueError, match=r"policy='bf16'.*GFT split-step.*complex64/complex128"):
        G.strang(system, 0.01, policy="bf16")
    with pytest.raises(ValueError, match=r"policy='bf16'"):
        G.gft_step(jnp.ones((8, 8), jnp.complex64), system, 0.01, policy="bf16")
    with pytest.raises(TypeError, match="dtype must be complex"):
        G.strang(system, 0.01, dtype=jnp.float32)


# ------------------------------------------------------------------------------------- adaptive


def _adaptive_run(policy, *, stochastic, improved, steps=20):
    make = A.AdaptiveConfig.improved if improved else A.AdaptiveConfig
    cfg = make(num_nodes=32, hidden_dim=16, input_dim=64, output_dim=10, stochastic=stochastic)
    w = A.init_params(jax.random.key(0), cfg)
    xs = jax.random.normal(jax.random.key(1), (steps, 8, 64), jnp.float32)
    state, out = jax.jit(lambda w, s, xs: A.apply_sequence(w, s, xs, jax.random.key(2), cfg, policy=policy))(
        w, A.init_state(cfg, 8), xs)
    return state, out


# (improved, policy) -> tolerances (measured) for logits (norm-wise relative), h (relative), E (max abs, 0..50).
ADAPTIVE_TOL = {
    (False, "f32"): (1e-5, 1e-5, 1e-4),    # measured 7.9e-8, 7.4e-8, 1.8e-6
    (False, "bf16"): (2e-2, 1e-2, 1.5),    # measured 4.1e-3, 1.0e-3, 0.33
    (True, "f32"): (1e-4, 1e-4, 1e-3),     # measured 1.5e-6, 5.0e-6, 9.1e-6
    (True, "bf16"): (6e-2, 8e-2, 4.0),     # measured 1.7e-2, 2.3e-2, 1.3
}


# The improved preset (per-node inputs, K = 2) is slow-marked: three more compiles, ~20 s on a loaded host.
@pytest.mark.parametrize("improved", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["seed", "improved"])
def test_adaptive_deterministic_error_per_policy(improved):
    with jax.enable_x64(True):
        ref_state, ref_out = _adaptive_run("f64", stochastic=False, improved=improved)
    for policy in ("f32", "bf16"):
        state, out = _adaptive_run(policy, stochastic=False, improved=improved)
        assert state.h.dtype == jnp.float32 and out["logits"].dtype == jnp.float32
        tl, th, te = ADAPTIVE_TOL[(improved, policy)]
        assert _rel(out["logits"], ref_out["logits"]) <= tl
        assert _rel(state.h, ref_state.h) <= th
        assert float(np.max(np.abs(np.asarray(state.energy, np.float64) - np.asarray(ref_state.energy)))) <= te


@pytest.mark.slow  # ~4 s quiet, ~14 s on a loaded 2-core host (three compiles of the stochastic scan)
def test_adaptive_stochastic_phases_agree_with_float64_run():
    # The phase draw compares a float32 uniform with cumulative masses: a rounding difference flips a
    # draw now and then and the trajectories part; what must agree are the phase statistics.
    with jax.enable_x64(True):
        _, ref = _adaptive_run("f64", stochastic=True, improved=False)
    for policy, agree_min in (("f32", 0.95), ("bf16", 0.9)):  # measured agreement 0.987 and 0.971
        _, out = _adaptive_run(policy, stochastic=True, improved=False)
        assert float(np.mean(np.asarray(out["phase"]) == np.asarray(ref["phase"]))) >= agree_min
        frac = np.asarray(out["phase_fractions"]).mean(0)  # averaged over the 20 steps
        frac_ref = np.asarray(ref["phase_fractions"]).mean(0)
        assert np.max(np.abs(frac - frac_ref)) <= 0.02


def test_adaptive_stepper_policy_and_bad_inputs():
    cfg = A.AdaptiveConfig(num_nodes=4, hidden_dim=3, input_dim=5, output_dim=2)
    w = A.init_params(jax.random.key(0), cfg)
    x = jnp.ones((2, 5), jnp.float32)
    st = A.dynamics(w, x, cfg, policy="bf16")
    final, _ = trajectory(st, st.init(jax.random.key(1)), 3)
    assert final.nodes.h.dtype == jnp.float32 and final.outputs["logits"].dtype == jnp.float32
    with pytest.raises(TypeError, match=r"x is complex \(complex64\).*real dtype bfloat16"):
        A.step(w, A.init_state(cfg, 2), x.astype(jnp.complex64), jax.random.key(0), cfg, policy="bf16")
    with pytest.raises(ValueError, match="policy='half' is neither a preset"):
        A.dynamics(w, x, cfg, policy="half")


# ------------------------------------------------------------------------------------- GRU


def _gru_run(policy, steps=50):
    p = gru.init_gru_params(jax.random.key(0), 32, 64)
    xs = jax.random.normal(jax.random.key(1), (steps, 16, 32), jnp.float32)
    _, hs = jax.jit(lambda p, xs: gru.gru_scan(p, jnp.zeros((16, 64), jnp.float32), xs, policy=policy))(p, xs)
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
    p = gru.init_gru_params(jax.random.key(0), 3, 4)
    xs = jnp.ones((5, 2, 3), jnp.float32)
    st = gru.recurrence(p, xs, policy="bf16")
    final, hs = trajectory(st, st.init(jnp.zeros((2, 4))), 5, observe=gru.observe_hidden)
    ref, _ = gru.gru_scan(p, jnp.zeros((2, 4)), xs, policy="bf16")
    np.testing.assert_array_equal(np.asarray(final.h), np.asarray(ref))
    with pytest.raises(TypeError, match="h has dtype complex64.*real dtype bfloat16"):
        gru.gru_step(p, jnp.zeros((4,), jnp.complex64), jnp.zeros((3,)), policy="bf16")
    with pytest.raises(ValueError, match="policy='bf17' is neither a preset"):
        gru.gru_scan(p, jnp.zeros((2, 4)), xs, policy="bf17")
