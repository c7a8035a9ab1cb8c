"""The host engine beyond 2^16 vertex slots: an exact index draw, invariants on a universe whose live vertex ids
exceed 2^16, and a one-line error beyond what the engine addresses."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

from ivhl_jax import cdt
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics.cdt import host as cdt_host
from ivhl_jax.physics.cdt.state import initial_state

from .helpers import host_invariant_failures

needs_numba = pytest.mark.skipif(not cdt_host.available(), reason="needs numba")


@needs_numba
def test_wide_index_draw_is_exact_and_uniform():
    from ivhl_jax.physics.cdt import host_kernels as hk

    rng = np.random.default_rng(0)
    for n in (3, 65537, 1_000_003, (1 << 31) - 1):
        for z in rng.integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 200, np.uint64):
            assert int(hk.mulhi64(np.uint64(z), np.uint64(n))) == (int(z) * n) >> 64
    state = np.array([12345], np.uint64)
    n = 1_000_003
    draws = np.array([hk.draw_index(state, n) for _ in range(60_000)])
    assert draws.min() >= 0 and draws.max() < n
    counts = np.bincount(draws % 50, minlength=50)  # n is not a multiple of 50: bins differ by < 1e-4 relative
    assert stats.chisquare(counts).pvalue > 1e-4


@needs_numba
def test_capacity_beyond_the_engines_draw_is_one_line():
    host = cdt.metropolis(cdt.LN2 + 0.1, engine="host")
    with pytest.raises(ValueError, match=r"capacity=134217729 .*host engine.*134217728") as e:
        host.init(jax.random.key(0), 3, 3, (1 << 27) + 1)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"capacity=65537 .*jax engine.*or engine='host'"):
        cdt.metropolis(cdt.LN2 + 0.1).init(jax.random.key(0), 3, 3, (1 << 16) + 1)


def test_host_invariant_check_sees_corruption():
    s = initial_state(3, 4, 48)
    assert host_invariant_failures(s) == []
    assert "neighbours" in host_invariant_failures(s.with_fields(tl=s.tl.at[0].set(5)))
    assert "gluing" in host_invariant_failures(s.with_fields(apex=s.apex.at[0].set(1)))
    assert "slices" in host_invariant_failures(s.with_fields(vright=s.vright.at[0].set(2)))


@pytest.mark.slow  # the host kernel's first compile on a cold numba cache takes tens of seconds
@needs_numba
@pytest.mark.parametrize("proposal", ["uniform", "lists"])
def test_host_engine_beyond_two_to_the_16_vertex_slots(proposal):
    T, L, cap = 8, 8400, 80_000  # N0 = 67200 > 2^16 live vertices, 80000 slots
    n2 = 2 * T * L
    kw = dict(attempts_per_sweep=200_000, engine="host", proposal=proposal, stop_at_first_hit=True)
    st = cdt.metropolis(cdt.LN2, eps=1e-4, target=n2, **kw)
    chain = st.init(jax.random.key(1), T, L, cap)
    chain, obs = trajectory(st, chain, 3, observe=cdt.observe)
    g = chain.geometry
    assert host_invariant_failures(g) == []
    assert not bool(g.overflow) and int(g.missed_target) == 0
    np.testing.assert_array_equal(np.asarray(obs["n2"]), n2)  # first-hit sweeps end at the target
    assert np.all(np.asarray(g.accepts) > 0)
    live_ids = np.nonzero(np.asarray(g.vpos) < int(g.n0))[0]
    assert live_ids.max() >= T * L > (1 << 16)  # inserted vertices took slots beyond the starting ones


@pytest.mark.slow  # the host kernel compiles on a cold numba cache
@needs_numba
def test_large_universe_benchmark_runs_small(capsys):
    from ivhl_jax.bench import ops_cdt

    doc = ops_cdt.large_universe(n_slices=4, volume=512, thermal=5, measure=60, seed=1)
    assert not doc["overflow"] and doc["measured_sweeps"] == 60
    assert abs(doc["mean_n2"] - 512) < 100
    assert all(np.isfinite(v[0]) and v[0] > 0 for v in doc["tau_int_sweeps"].values())
    assert "measure: 60/60 sweeps" in capsys.readouterr().out  # progress lines
