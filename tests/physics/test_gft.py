"""GFT condensate (ivhl_jax.physics.gft): V is the conserved energy of its own dynamics; symmetry breaking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import gft as G
from ivhl_jax.numerics.rollout import trajectory


def _step(phi, system, dt, **kw):
    """One step through the one door: build the stepper, validate the field, step."""
    st = G.strang(system, dt, **kw)
    return st.step(st.init(phi))


def _evolve(phi, system, dt, steps, save_every=1, *, imaginary=False, policy=None):
    """``steps`` Strang steps from φ recording ``gft.observe``: the builder and ``trajectory``."""
    st = G.strang(system, dt, imaginary=imaginary, policy=policy)
    return trajectory(st, st.init(phi), steps, save_every=save_every, observe=G.observe)


def _noise(shape, scale=0.1, seed=0, dtype=jnp.complex64):
    kr, ki = jax.random.split(jax.random.key(seed))
    return (scale * jax.lax.complex(jax.random.normal(kr, shape), jax.random.normal(ki, shape))).astype(dtype)


def test_potential_matches_numpy_reference():
    phi = np.asarray(_noise((5, 6, 7), 0.7))
    m2, lam = -0.5, 0.3
    ref = 0.0
    for a in range(3):
        ref += np.sum(np.abs(np.roll(phi, -1, axis=a) - phi) ** 2)
    ref += m2 * np.sum(np.abs(phi) ** 2) + 0.5 * lam * np.sum(np.abs(phi) ** 4)
    assert abs(float(jax.jit(G.potential)(jnp.asarray(phi), m2, lam)) - ref) < 1e-4 * abs(ref)


@pytest.mark.parametrize("rank", [1, 2, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_rhs_is_functional_derivative_of_potential(rank):
    # For real V(φ), jax.grad returns 2 ∂V/∂φ̄ conjugated: δV/δφ* = conj(grad)/2.
    shape = (6,) * rank
    phi = _noise(shape, 0.5, seed=rank)
    grad = jax.jit(jax.grad(lambda p: G.potential(p, -0.7, 0.4)))(phi)
    rhs = jax.jit(lambda p: G.rhs(p, -0.7, 0.4))(phi)
    np.testing.assert_allclose(np.asarray(jnp.conj(grad) / 2), np.asarray(rhs), atol=2e-5)


@pytest.mark.parametrize(
    "rank",
    [
        1,
        pytest.param(2, marks=pytest.mark.slow),
        pytest.param(3, marks=pytest.mark.slow),
        pytest.param(4, marks=pytest.mark.slow),
    ],
)
def test_potential_is_conserved_energy_and_charge_exact(rank):
    shape = {1: (64,), 2: (16, 16), 3: (8, 8, 8), 4: (6, 6, 6, 6)}[rank]
    with jax.enable_x64(True):
        sys_ = G.GFTSystem.create(shape, mass_sq=-0.5, lam=0.2)
        phi0 = _noise(shape, 0.6, seed=rank, dtype=jnp.complex128)
        v0 = float(G.potential(phi0, -0.5, 0.2))
        drifts = []
        for dt in (0.04, 0.02, 0.01):
            n = int(round(2.0 / dt))
            phi, obs = jax.jit(lambda p, dt=dt, n=n: _evolve(p, sys_, dt, n, n // 5, policy="f64"))(phi0)
            drifts.append(np.max(np.abs(np.asarray(obs["energy"]) - v0)))
            np.testing.assert_allclose(np.asarray(obs["charge"]), float(G.charge(phi0)), rtol=1e-12)
        # V is the Hamiltonian of the evolution: its drift is the O(dt²) Strang error → 0.
        slopes = np.diff(np.log(drifts)) / np.diff(np.log([0.04, 0.02, 0.01]))
        assert np.all(np.abs(slopes - 2) < 0.3), (drifts, slopes)
        assert drifts[-1] < 1e-3 * abs(v0)
        assert float(jnp.max(jnp.abs(phi - phi0))) > 0.1  # non-trivial dynamics


def test_symmetry_breaking_relaxes_to_broken_vacuum():
    shape = (12, 12, 12)
    m2, lam = -0.5, 0.1
    sys_ = G.GFTSystem.create(shape, m2, lam)
    phi0 = _noise(shape, 0.05) + 0.05
    phi, obs = trajectory(G.strang(sys_, 0.05, imaginary=True), phi0, 2000, save_every=100, observe=G.observe)
    rho_v, e_v = G.vacuum(m2, lam)
    e = np.asarray(obs["energy"])
    assert np.all(np.diff(e) <= 1e-3 * abs(e_v) * np.prod(shape))  # gradient flow: V decreases
    np.testing.assert_allclose(np.asarray(jnp.abs(phi) ** 2), rho_v, rtol=1e-3)
    assert abs(e[-1] / (e_v * np.prod(shape)) - 1) < 1e-4
    assert abs(float(obs["order"][-1]) - np.sqrt(rho_v)) < 1e-3  # ⟨φ⟩ ≠ 0: U(1) broken


def test_symmetric_phase_stays_at_zero_and_tachyonic_growth_when_broken():
    shape = (16, 16)
    phi0 = _noise(shape, 1e-3)
    run = jax.jit(lambda p, m2: _evolve(p, G.GFTSystem.create(shape, m2, 0.1), 0.05, 400, 100, imaginary=True)[1])
    obs_sym, obs_brk = run(phi0, 0.5), run(phi0, -0.5)
    assert float(obs_sym["mean_abs2"][-1]) < 1e-8
    assert float(obs_brk["mean_abs2"][-1]) > 1.0


def test_vmap_over_couplings_and_batch_axes():
    shape = (8, 8)
    phi0 = _noise(shape, 0.3)
    m2s = jnp.array([-1.0, -0.5, 0.5])

    def run(m2):
        return _evolve(phi0, G.GFTSystem.create(shape, m2, 0.2), 0.02, 50, 50)[1]["energy"][-1]

    batched = jax.jit(jax.vmap(run))(m2s)
    np.testing.assert_allclose(np.asarray(batched), [float(jax.jit(run)(m)) for m in m2s], rtol=1e-5)
    # leading batch axis of fields (not coupled to the lattice)
    two = jnp.stack([phi0, jnp.zeros_like(phi0)])
    out = _step(two, G.GFTSystem.create(shape, -0.5, 0.2), 0.05)
    assert float(jnp.max(jnp.abs(out[1]))) == 0.0


def test_inputs_validated():
    with pytest.raises(ValueError, match="rank 1..4"):
        G.GFTSystem.create((4,) * 5)
    sys_ = G.GFTSystem.create((8, 8))
    with pytest.raises(ValueError, match="lattice shape"):
        _step(jnp.zeros((8, 7), jnp.complex64), sys_, 0.1)
    with pytest.raises(ValueError, match="dt must be > 0"):
        _step(jnp.zeros((8, 8), jnp.complex64), sys_, 0.0)
    with pytest.raises(ValueError, match="NaN"):
        _step(jnp.full((8, 8), jnp.nan, jnp.complex64), sys_, 0.1)


# --- precision policies: error against a float64 run --------------------------------------------------------------
def _rel(a, ref) -> float:
    a, ref = np.asarray(a, np.complex128), np.asarray(ref, np.complex128)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def _gft_run(policy, steps=400):
    shape = (12, 12, 12)
    system = G.GFTSystem.create(shape, -0.5, 0.1)
    rng = np.random.default_rng(0)
    phi0 = 0.3 * (rng.normal(size=shape) + 1j * rng.normal(size=shape)) + 0.5
    phi, obs = _evolve(jnp.asarray(phi0), system, 0.02, steps, steps // 4, policy=policy)
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
    system = G.GFTSystem.create((8, 8))
    with pytest.raises(ValueError, match=r"policy='bf16'.*GFT split-step.*complex64/complex128"):
        G.strang(system, 0.01, policy="bf16")
    with pytest.raises(ValueError, match=r"policy='bf16'"):
        _step(jnp.ones((8, 8), jnp.complex64), system, 0.01, policy="bf16")
    with pytest.raises(TypeError, match="dtype"):
        G.strang(system, 0.01, dtype=jnp.complex64)  # policy= is the one precision argument


def test_gft_builder_checks_dt_holds_it_once_and_observe_fits_trajectory():
    sys_ = G.GFTSystem.create((8, 8), -0.5, 0.1)  # max ε_k = 8: dt <= π/8
    with pytest.raises(ValueError, match=r"dt=1.0 is unstable.*use dt <= 0.393"):
        G.strang(sys_, 1.0)
    with pytest.raises(ValueError, match=r"the mass decay per step.*use dt <= "):
        G.strang(G.GFTSystem.create((8, 8), -100.0, 0.1), 0.1, imaginary=True)
    st1, st2 = G.strang(sys_, 0.05), G.strang(sys_, 0.1)
    # dt is no field of the params or the plan: only the factor and the half-step time derived from it are
    for target in (st1.params, st1.params.plan):
        with pytest.raises(TypeError, match="dt"):
            target.replace(dt=0.1)
    assert not any("'dt'" in jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(st1.params))
    with pytest.raises(ValueError, match="lattice"):
        st1.replace(params=st1.params.replace(system=G.GFTSystem.create((8, 6)))).step(jnp.zeros((8, 6), jnp.complex64))
    phi = st1.init(_noise((8, 8), 0.3))
    a = trajectory(st1.replace(params=st2.params), phi, 10, observe=G.observe)
    b = trajectory(st2, phi, 10, observe=G.observe)
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
    assert set(b[1]) == {"energy", "charge", "order", "mean_abs2"} and b[1]["energy"].shape == (10,)
    with pytest.raises(ValueError, match=r"too large.*use dt <= "):
        G.strang(G.GFTSystem.create((8, 8), -0.5, 1e4), 0.3).init(jnp.full((8, 8), 3.0 + 0j, jnp.complex64))


# --- the merged multi-step path (local half-steps of neighbouring steps merged) ----------------------------------
def _loop_body_passes(hlo: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(FFTs, fusions with a field-shaped complex output) of the loop body running the FFTs. The real-time loop is
    compiled twice, as the two branches of the local-phase range check: both must count the same."""
    import re

    dims = ",".join(map(str, shape))
    bodies = [
        c
        for c in re.split(r"\n(?=\S.*\{\n)", hlo)
        if re.match(r"^%\S+ \(\S+: \(s32\[\]", c) and re.search(rf"c64\[{dims}\]\{{[^}}]*\}} fft\(", c)
    ]
    assert len(bodies) == 2, f"expected two loop bodies running the FFTs (fast and full range), found {len(bodies)}"
    counts = {
        (
            len(re.findall(rf"= c64\[{dims}\]\{{[^}}]*\}} fft\(", b)),
            len(re.findall(rf"= c64\[{dims}\]\{{[^}}]*\}} fusion\(", b)),
        )
        for b in bodies
    }
    assert len(counts) == 1, counts
    return counts.pop()


def _no_obs(phi, params):
    return None


def test_hlo_of_a_10_step_trajectory_and_of_the_merged_run_count_ffts_and_field_passes():
    """Guard of the GFT step's memory traffic: in the compiled CPU HLO of a 10-step trajectory (one observation) and
    of the stepper's run_fn a step is 2 FFTs and 2 elementwise passes over the field (kinetic factor; the merged
    local step of two neighbours)."""
    shape = (16, 16, 16)
    st = G.strang(G.GFTSystem.create(shape, -0.5, 0.1), 0.05)
    phi = st.init(_noise(shape, 0.3))
    traj = jax.jit(lambda p: trajectory(st, p, 10, save_every=10, observe=_no_obs)[0]).lower(phi).compile()
    assert _loop_body_passes(traj.as_text(), shape) == (2, 2)
    run = jax.jit(lambda p, prm: st.run_fn(p, prm, 10)).lower(phi, st.params).compile()
    assert _loop_body_passes(run.as_text(), shape) == (2, 2)


def test_merged_run_equals_the_step_by_step_scheme_float64():
    """100 steps with merged local half-steps equal 100 single Strang steps to round-off (float64)."""
    with jax.enable_x64(True):
        st = G.strang(G.GFTSystem.create((16, 16), -0.5, 0.2), 0.05, policy="f64")
        phi = st.init(_noise((16, 16), 0.6, dtype=jnp.complex128))
        merged = jax.jit(lambda p, prm: st.run_fn(p, prm, 100))(phi, st.params)
        ref = jax.jit(lambda p: jax.lax.fori_loop(0, 100, lambda _, q: st.step(q), p))(phi)
        assert float(jnp.max(jnp.abs(merged - ref))) < 1e-10
        assert float(jnp.max(jnp.abs(ref - phi))) > 1e-2  # non-trivial dynamics
