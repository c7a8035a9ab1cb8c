"""Defaults are validated like everything else: the field, GP and GFT builders with their DEFAULT settings, and
every code example of docs/guide/fields.md and docs/guide/condensates.md, against an exact answer (a float64
NumPy formula, a conservation law, an analytic ground-state energy)."""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax import fields as F
from ivhl_jax import gft as G
from ivhl_jax.numerics.rollout import trajectory

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _python_blocks(doc: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "guide" / doc).read_text(), flags=re.S)


def _bash_lines(doc: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "guide" / doc).read_text(), flags=re.S)
    lines = [ln.split("#")[0].rstrip() for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    return [ln.strip() for ln in lines if ln.strip()]


def superpose64(points, sources, t, *, amplitudes=1.0, wavenumbers=1.0, phases=0.0, softening=0.1, theta=None):
    """ψ = Σ_j A_j e^{i(k_j r − ω_j t + φ_j)}/(r + ε) in float64 NumPy (ω = k); ``theta`` replaces φ − ωt."""
    p, s = np.asarray(points, np.float64), np.asarray(sources, np.float64)
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    a, k, ph = (np.broadcast_to(np.asarray(v, np.float64), (s.shape[0],)) for v in (amplitudes, wavenumbers, phases))
    th = ph - k * t if theta is None else np.asarray(theta, np.float64)
    return (a * np.exp(1j * (k * r + th)) / (r + softening)).sum(1), (np.abs(a) / (r + softening)).sum(1)


# --------------------------------------------------------------------------------------------------- fields
@pytest.mark.parametrize("t", [0.37, 1e4, 1e8])
def test_superpose_defaults_match_float64_numpy_at_any_time(t):
    rng = np.random.default_rng(0)
    pts = rng.uniform(-2, 2, (300, 3)).astype(np.float32)
    src = np.asarray(F.helix_sources(40))
    psi = np.asarray(F.superpose(pts, src, t=t))
    # The kernel forms θ = φ − ωt in float32 (t = 1e8 is exact in float32, 1e4 too): the reference uses that θ.
    theta = np.float32(0.0) - np.float32(1.0) * np.float32(t)
    ref, scale = superpose64(pts, src, t, theta=np.full(40, theta))
    assert np.max(np.abs(psi - ref) / scale) <= 1e-5
    # the analytic bound |ψ| ≤ Σ_j |A_j|/(r_j + ε) holds at every point
    assert np.all(np.abs(psi) <= scale * (1 + 1e-5))


def test_wave_evolution_defaults_match_float64_numpy():
    rng = np.random.default_rng(1)
    pts = rng.uniform(-2, 2, (200, 3)).astype(np.float32)
    src = np.asarray(F.helix_sources(16))
    st = F.superposition(pts, src, amplitudes=1.0, wavenumbers=3.0, phases=0.0, dt=0.25)
    state, obs = trajectory(st, st.init(), 8, observe=F.observe)
    frames = []
    for i in range(8):
        ref, scale = superpose64(pts, src, 0.25 * (i + 1), wavenumbers=3.0, softening=1e-3)
        frames.append(np.abs(ref) ** 2)
        np.testing.assert_allclose(float(obs["t"][i]), 0.25 * (i + 1), rtol=1e-6)
    frames = np.asarray(frames)
    np.testing.assert_allclose(np.asarray(obs["max_intensity"]), frames.max(1), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(obs["mean_intensity"]), frames.mean(1), rtol=1e-4)
    # per point, |ψ| is within 1e-5·Σ|A|/(r + ε) of the reference, so |ψ|² within 2e-5·(Σ|A|/(r + ε))² per frame
    tol = 2e-5 * scale**2
    assert np.all(np.abs(np.asarray(state.intensity_sum) - frames.sum(0)) <= 8 * tol)
    assert np.all(np.abs(np.asarray(state.intensity_peak) - frames.max(0)) <= tol)
    assert np.max(np.abs(np.asarray(state.field) - ref) / scale) <= 1e-5


def test_fields_guide_example_runs_and_checks_out():
    (block,) = _python_blocks("fields.md")
    ns: dict = {}
    exec(compile(block, "docs/guide/fields.md", "exec"), ns)  # noqa: S102 - the guide's own example
    src, pts, charges, hist = ns["src"], ns["pts"], ns["charges"], ns["hist"]
    assert src.shape == (64, 3) and pts.shape == (16384, 3) and charges.shape == (127, 127)
    plain = F.superpose(pts, src, wavenumbers=4 * jnp.pi, softening=0.05)
    ref, scale = superpose64(pts, src, 0.0, wavenumbers=4 * np.pi, softening=0.05)
    assert np.max(np.abs(np.asarray(plain) - ref) / scale) <= 1e-5  # the guide's "≤ 1e-5 relative"
    # The imprint adds exactly +2 to the winding of a loop around (0.5, 0.3) (windings of a product add).
    x = np.linspace(-2, 2, 128)
    box = (
        slice(np.searchsorted(x, 0.2), np.searchsorted(x, 0.8)),
        slice(np.searchsorted(x, 0.0), np.searchsorted(x, 0.6)),
    )
    base = np.asarray(F.vortex_map(plain.reshape(128, 128)))
    assert int(np.asarray(charges)[box].sum()) - int(base[box].sum()) == 2
    assert float(hist[-1]) >= 0.99  # the phase-conjugation optimum I/I_max = 1


# --------------------------------------------------------------------------------------------------- GP
def _kicked_1d():
    grid = C.Grid.uniform(128, 16.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 5.0)
    psi0 = C.gaussian(grid, 1.0) * jnp.exp(0.7j * jnp.asarray(grid.coords[0], jnp.float32))
    return system, psi0


def test_gp_strang_default_conserves_norm_and_energy():
    system, psi0 = _kicked_1d()
    e0 = float(C.energy(psi0, system)["total"])
    st = C.strang(system, 2e-3)
    _, obs = trajectory(st, st.init(psi0), 10_000, save_every=100, observe=C.observe)
    # Exact flow: N and E constant. Default float32: measured |ΔN| 3e-6, |ΔE|/E 8e-5 over these 10⁴ steps
    # (the raw scheme: ΔN = −6.9e-4, following the complex64 FFT round-off).
    assert np.max(np.abs(np.asarray(obs["norm"]) - 1.0)) <= 1e-5
    assert np.max(np.abs(np.asarray(obs["energy_total"]) / e0 - 1.0)) <= 2e-4
    # step by step (save_every=1 takes the single-step path): the norm is kept there too
    _, obs1 = trajectory(st, st.init(psi0), 500, observe=C.observe)
    assert np.max(np.abs(np.asarray(obs1["norm"]) - 1.0)) <= 1e-5


@pytest.mark.parametrize("d", [1, 2, 3])
def test_gp_ground_state_defaults_give_the_harmonic_energy(d):
    # Linear condensate (g = 0) in the isotropic trap: E₀ = ħω·d/2. Start off-centre and too wide.
    n = {1: 128, 2: 64, 3: 32}[d]
    grid = C.Grid.uniform((n,) * d, 16.0 if d < 3 else 12.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 0.0)
    psi, info = C.ground_state(system, psi0=C.gaussian(grid, 1.0, width=1.6, center=(0.5,) * d))
    assert bool(info["converged"])  # the float32 default tol is reachable (measured: 800 steps)
    assert abs(float(info["energy"]) - d / 2) <= 2e-6 * d  # measured ≤ 1.2e-7
    assert abs(float(C.norm(psi, grid)) - 1.0) <= 1e-6


def test_gp_ground_state_defaults_converge_for_an_interacting_cloud():
    # An interacting 2-D cloud in float32, default dt and tolerance (4e-7: a few ulps of E).
    grid = C.Grid.uniform((64, 64), 12.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 300.0)
    _, info = C.ground_state(system, max_steps=5000)
    assert bool(info["converged"]) and int(info["steps"]) < 5000
    tf_mu = C.thomas_fermi_mu(300.0, 1.0, dim=2)  # μ approaches the Thomas–Fermi value from above as gN grows
    assert tf_mu < float(info["mu"]) < 1.1 * tf_mu


# --------------------------------------------------------------------------------------------------- GFT
def test_gft_strang_default_conserves_charge_and_energy():
    system = G.GFTSystem.create((16, 16, 16), -0.5, 0.1)
    k1, k2 = jax.random.split(jax.random.key(1))
    phi0 = 0.5 * jax.lax.complex(jax.random.normal(k1, (16,) * 3), jax.random.normal(k2, (16,) * 3))
    st = G.strang(system, 0.01)
    _, obs = trajectory(st, st.init(phi0), 200, save_every=20, observe=G.observe)
    q0, v0 = float(G.charge(phi0)), float(G.potential(phi0, -0.5, 0.1))
    # Q = Σ|φ|² is conserved exactly by the scheme, V up to O(dt²): in float32 both follow the FFT round-off
    # (measured 3.3e-5 over these 200 steps).
    assert np.max(np.abs(np.asarray(obs["charge"]) / q0 - 1)) <= 1e-4
    assert np.max(np.abs(np.asarray(obs["energy"]) / v0 - 1)) <= 1e-4
    with jax.enable_x64(True):
        st64 = G.strang(system, 0.01, policy="f64")
        phi64 = phi0.astype(jnp.complex128)
        _, obs64 = trajectory(st64, st64.init(phi64), 200, save_every=20, observe=G.observe)
        q64 = float(G.charge(phi64))
        assert np.max(np.abs(np.asarray(obs64["charge"]) / q64 - 1)) <= 1e-12  # exact up to round-off


# --------------------------------------------------------------------------------------------------- guides
def test_condensates_guide_bash_commands_are_valid_configurations():
    from ivhl_jax.run.config import load_config
    from ivhl_jax.sims import bec, gft

    checked = set()
    for line in _bash_lines("condensates.md"):
        for command, sim in (("ivhl sim bec", bec), ("ivhl sim gft", gft)):
            if line.startswith(command + " "):
                words = shlex.split(line)
                sets = [w for a, w in zip(words, words[1:]) if a == "--set"]
                load_config(sim.SIMULATION.config_type, None, sets)  # validated
                checked.add(command)
    assert checked == {"ivhl sim bec", "ivhl sim gft"}


@pytest.mark.slow
def test_condensates_guide_python_example_converges_and_conserves():
    (block,) = [b for b in _python_blocks("condensates.md") if "omega_rot=0.8" in b]  # the page's first example
    ns: dict = {}
    exec(compile(block, "docs/guide/condensates.md", "exec"), ns)  # noqa: S102 - the guide's own example
    info, obs, psi, system = ns["info"], ns["obs"], ns["psi"], ns["sys"]
    assert bool(info["converged"])  # within ground_state's default step budget and tolerance
    assert np.max(np.abs(np.asarray(obs["norm"]) - 1.0)) <= 1e-5
    e = np.asarray(obs["energy_total"])
    assert np.max(np.abs(e / e[0] - 1)) <= 1e-4  # E in the rotating frame is conserved
    assert int(np.abs(np.asarray(C.vortex_charges(psi, system.grid))).sum()) >= 4  # a lattice, not a single vortex


@pytest.mark.slow
def test_condensates_guide_first_command_converges(tmp_path, capsys):
    from ivhl_jax.sims import bec

    line = next(ln for ln in _bash_lines("condensates.md") if ln.startswith("ivhl sim bec"))
    args = shlex.split(line)[3:] + ["--no-progress", "--out", str(tmp_path)]
    assert bec.main(args) == 0
    assert "did not converge" not in capsys.readouterr().err
    doc = json.loads((tmp_path / "observables.json").read_text())
    assert doc["ground_state"]["converged"]
    assert max(abs(n - 1.0) for n in doc["observables"]["norm"]) <= 1e-5
