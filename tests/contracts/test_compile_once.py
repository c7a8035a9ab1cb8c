"""Compile-once discipline of the stepper API (ivhl_jax.numerics.rollout.trajectory and the family wrappers).

A second call with the same shapes, dtypes and static settings but new *values* (state, dt, couplings)
must not compile anything: counted with ``jax.log_compiles()`` (jax logs one "Compiling ..." record per
XLA compilation on the ``jax`` logger).
"""

from __future__ import annotations

import contextlib
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics import gft as G


def _gp_evolve(psi, system, dt, steps, save_every=1, *, project_norm=None):
    """``steps`` condensate Strang steps from ψ recording ``condensate.observe`` (builder + trajectory)."""
    st = C.strang(system, dt, project_norm=project_norm)
    return trajectory(st, st.init(psi), steps, save_every=save_every, observe=C.observe)


def _gft_evolve(phi, system, dt, steps, save_every=1, *, imaginary=False):
    """``steps`` GFT Strang steps from φ recording ``gft.observe`` (builder + trajectory)."""
    st = G.strang(system, dt, imaginary=imaginary)
    return trajectory(st, st.init(phi), steps, save_every=save_every, observe=G.observe)


class _CompileCounter(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Compiling "):
            self.messages.append(msg)


@contextlib.contextmanager
def count_compiles():
    """Collect the "Compiling ..." log records emitted inside the block (a list of messages)."""
    handler = _CompileCounter()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield handler.messages
    finally:
        logger.removeHandler(handler)


def _sync(tree):
    return jax.block_until_ready(tree)


def _gp_system(shape=(32,), length=12.0, g=2.0):
    grid = C.Grid.uniform(shape, length)
    return C.GPSystem.create(grid, C.harmonic(grid), g)


# --- condensate ----------------------------------------------------------------------------------
def test_condensate_evolve_second_call_compiles_nothing():
    sys_ = _gp_system((16, 16), 8.0)
    psi1 = C.gaussian(sys_.grid)
    psi2 = C.gaussian(sys_.grid, width=1.2, center=(0.3, 0.0))
    with count_compiles() as first:
        _sync(_gp_evolve(psi1, sys_, 0.01, 20, 10))
    assert first, "the counter should see the first compilation"
    with count_compiles() as second:  # new state, new dt, new g: values only
        _sync(_gp_evolve(psi2, sys_.replace(g=3.0), 0.02, 20, 10))
    assert second == [], second
    # project_norm / imaginary are static settings: each compiles once, then never again.
    _sync(_gp_evolve(psi1, sys_, 0.01, 20, 10, project_norm=True))
    with count_compiles() as third:
        _sync(_gp_evolve(psi2, sys_, 0.015, 20, 10, project_norm=True))
    assert third == [], third


def test_condensate_ground_state_second_call_compiles_nothing():
    sys_ = _gp_system((32,), 12.0, g=1.0)
    _sync(C.ground_state(sys_, 1.0, dt=0.02, tol=1e-6, max_steps=400, check_every=50))
    guess = C.gaussian(sys_.grid, width=1.3)
    with count_compiles() as second:  # new dt, norm, tol, g and psi0
        _sync(C.ground_state(sys_.replace(g=2.0), 2.0, dt=0.01, tol=1e-7, max_steps=400, check_every=50, psi0=guess))
    assert second == [], second


def test_condensate_trajectory_of_strang_stepper_compiles_once():
    sys_ = _gp_system((32,), 12.0)
    psi = C.gaussian(sys_.grid)
    psi2 = C.gaussian(sys_.grid, width=1.4)
    _sync(trajectory(C.strang(sys_, 0.01), psi, 10, save_every=5))
    with count_compiles() as second:
        _sync(trajectory(C.strang(sys_, 0.03), psi2, 10, save_every=5))
    assert second == [], second


@pytest.mark.parametrize("omega_rot", [0.0, 0.4])
def test_condensate_host_fft_new_dt_compiles_nothing_and_uses_the_new_factor(omega_rot):
    """fft="ducc" keeps the kinetic factors on the host (spectral.HostFactor: only a traced int32 key crosses per
    step). A new dt must reuse the compiled loop *and* the host copy of the new dt's factor: each run equals the
    fft="xla" run at the same dt, which a stale factor (the first dt's) would not."""
    pytest.importorskip("ducc0")
    from ivhl_jax.numerics.spectral import HostFactor

    grid = C.Grid.uniform((16, 16), 8.0)
    sys_d = C.GPSystem.create(grid, C.harmonic(grid), 5.0, omega_rot, fft="ducc")
    sys_x = sys_d.replace(fft="xla")
    psi = C.gaussian(grid) * jnp.exp(0.4j * grid.mesh()[0])
    ducc_ = {}
    _sync(trajectory(C.strang(sys_d, 0.01), psi, 10, save_every=5))
    for dt in (0.01, 0.03, 0.02):
        st = C.strang(sys_d, dt)
        factors = list(st.params.plan.factors)
        assert all(isinstance(f, HostFactor) for f in factors)
        with count_compiles() as again:
            ducc_[dt] = _sync(trajectory(st, psi, 10, save_every=5))
        assert again == [], (dt, again)
        ref = trajectory(C.strang(sys_x, dt), psi, 10, save_every=5)
        np.testing.assert_allclose(np.asarray(ducc_[dt][0]), np.asarray(ref[0]), atol=2e-6)
    # the three dts gave three different states (so "equals xla" above was a check of the new factor)
    assert float(jnp.max(jnp.abs(ducc_[0.01][0] - ducc_[0.03][0]))) > 1e-2
    # rebuilding at a dt already seen reuses its host copy (same key) instead of registering another

    def keys(dt):
        plan = C.strang(sys_d, dt).params.plan
        return [int(f.key) for f in plan.factors]

    assert keys(0.03) == keys(0.03) != keys(0.02)


# --- GFT ------------------------------------------------------------------------------------------
def test_gft_evolve_real_and_imaginary_second_call_compile_nothing():
    shape = (8, 8)
    phi1 = 0.1 * jnp.ones(shape, jnp.complex64)
    phi2 = 0.2 * jnp.ones(shape, jnp.complex64).at[0, 0].set(0.3j)
    _sync(_gft_evolve(phi1, G.GFTSystem.create(shape, -0.5, 0.1), 0.05, 20, 10))
    _sync(_gft_evolve(phi1, G.GFTSystem.create(shape, -0.5, 0.1), 0.05, 20, 10, imaginary=True))
    with count_compiles() as second:
        _sync(_gft_evolve(phi2, G.GFTSystem.create(shape, -0.3, 0.2), 0.02, 20, 10))
        _sync(_gft_evolve(phi2, G.GFTSystem.create(shape, -0.3, 0.2), 0.03, 20, 10, imaginary=True))
    assert second == [], second


# --- the CDT simulation (ivhl sim cdt) -------------------------------------------------------------
def test_cdt_simulation_second_run_and_resume_compile_nothing(tmp_path):
    """The jitted chunks of ``ivhl sim cdt`` are shared across ``simulate`` calls (sims/cdt.py caches them and
    takes the stepper as an argument): a second run of the same configuration, in this process, compiles
    nothing, nor does resuming a finished run; extending it compiles only the analysis of the longer history,
    never the sweeps."""
    from ivhl_jax.sims import cdt as sim

    sets = {
        "slices": 4,
        "volume": 64,
        "chains": 2,
        "steps": 8,
        "save_every": 2,
        "steps_per_chunk": 4,
        "engine": "jax",
        "r_max": 12,
        "origins": 2,
        "curvature_deltas": 2,
        "curvature_samples": 2,
    }
    cfg = sim.CDTConfig(**sets)
    first = sim.simulate(cfg, str(tmp_path / "a"), progress=False)
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")] + ["--no-progress", "--out", str(tmp_path / "b")]
    with count_compiles() as second:  # a fresh run of the same configuration, through the CLI and its checkpoints
        assert sim.main(args) == 0
    assert second == [], second
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert b["profile_spread"] == first["profile_spread"] and b["accepted_moves"] == first["accepted_moves"]
    with count_compiles() as resumed:  # resuming the finished run restores the state from the checkpoint
        assert sim.main(args) == 0
    assert resumed == [], resumed
    with count_compiles() as extended:  # 8 more steps: the same chunk of 4 steps
        assert sim.main(args + ["--set", "steps=16"]) == 0
    sweeps = [m for m in extended if any(f"jit({name})" in m for name in ("advance", "one", "check_invariants"))]
    assert sweeps == [], sweeps


# --- MERA ----------------------------------------------------------------------------------------
def test_mera_init_and_grow_compile_one_program_each_and_nothing_for_a_new_key():
    """A cold start and a χ step are one compiled program each (run op by op, their ~20 and ~150 small operations
    would each be compiled on first use), and nothing is compiled again for a new key."""
    from ivhl_jax.physics.tensornet import mera as M

    with jax.enable_x64(True):
        cfg = M.MERAConfig(chi=3, chi_mid=2, layers=1)
        keys = [jax.random.key(i) for i in range(11, 15)]  # making a key compiles (seeding) on its own
        with count_compiles() as first:
            m = _sync(M.init_tensors(keys[0], cfg))
            g = _sync(M.grow(m, keys[1], 4, 3, layers=2, refsym=cfg.refsym))
        # a concrete key: the draws are the only compiled part of a start (its polar factors are host SVDs)
        assert [msg.split()[1] for msg in first] == ["jit(_init_draws)", "jit(_grow_tensors)"], first
        with count_compiles() as again:
            m2 = _sync(M.init_tensors(keys[2], cfg))
            _sync(M.grow(m2, keys[3], 4, 3, layers=2, refsym=cfg.refsym))
        assert again == []
        assert g.chi == 4 and len(g.w) == 3
        assert M.isometry_errors(g)["w"] < 1e-12
