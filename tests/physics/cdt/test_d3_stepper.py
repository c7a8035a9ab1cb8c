"""The 2+1D CDT stepper: init, observe, trajectory, vmap over chains and couplings, volume fixing, bad input."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ivhl_jax import cdt
from ivhl_jax.numerics.rollout import chunked, trajectory
from ivhl_jax.physics.cdt import d3_checks, d3_state

T = 3


def test_initial_state_is_valid_and_minimal():
    for t_n in (3, 4, 7):
        s = d3_state.initial_state(t_n, 40 * t_n)
        d3_checks.check(s.buf, s.tetra_capacity, t_n)
        assert int(s.count("n0")) == 5 * t_n
        assert int(s.count("n3")) == 18 * t_n
        assert int(s.count("n31")) == 6 * t_n
        assert int(s.count("n22")) == 6 * t_n
        np.testing.assert_array_equal(s.field("slices"), np.full(t_n, 6))


def test_init_observe_shapes_and_counts():
    stepper = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=500)
    chain = stepper.init(jax.random.key(0), 4)
    obs = cdt.observe_3d(chain, stepper.params)
    assert obs["slice_volumes"].shape == (4,)
    for name in ("n0", "n31", "n22", "n3", "overflow", "missed_target", "at_target"):
        assert obs[name].shape == ()
    assert obs["attempts"].shape == obs["accepts"].shape == (len(cdt.MOVE_NAMES_3D),)
    assert int(obs["n31"]) == 2 * int(obs["slice_volumes"].sum()) == 48
    assert int(obs["n3"]) == int(obs["n31"]) + int(obs["n22"]) == 72


def test_trajectory_counts_match_the_geometry():
    stepper = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=1000)
    chain = stepper.init(jax.random.key(1), T)
    chain, obs = trajectory(stepper, chain, 6, save_every=2, observe=cdt.observe_3d)
    g = chain.geometry
    d3_checks.check(g.buf, g.tetra_capacity, T)
    assert obs["n3"].shape == (3,) and obs["slice_volumes"].shape == (3, T)
    np.testing.assert_array_equal(obs["n31"], 2 * obs["slice_volumes"].sum(-1))
    np.testing.assert_array_equal(obs["n3"], obs["n31"] + obs["n22"])
    # N0 = N(3,1)/2 + 2T on spherical slices
    np.testing.assert_array_equal(obs["n0"], obs["n31"] // 4 + 2 * T)
    assert int(obs["attempts"][-1].sum()) == 1000


def test_chunked_equals_trajectory():
    stepper = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=500)
    chain = stepper.init(jax.random.key(6), T)
    advance = chunked(stepper, 2, save_every=1, observe=cdt.observe_3d)
    c1, o1 = advance(chain)
    c1, o2 = advance(c1)
    c2, o = trajectory(stepper, chain, 4, save_every=1, observe=cdt.observe_3d)
    np.testing.assert_array_equal(c1.geometry.buf, c2.geometry.buf)
    np.testing.assert_array_equal(np.concatenate([o1["n3"], o2["n3"]]), o["n3"])


def test_vmap_over_chains_equals_single_chains():
    stepper = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=800)
    keys = jax.random.split(jax.random.key(2), 3)
    chains = jax.vmap(lambda k: stepper.init(k, T))(keys)
    final, obs = jax.vmap(lambda c: trajectory(stepper, c, 3, save_every=1, observe=cdt.observe_3d))(chains)
    assert obs["slice_volumes"].shape == (3, 3, T)
    for c in range(3):
        one, o1 = trajectory(stepper, stepper.init(keys[c], T), 3, save_every=1, observe=cdt.observe_3d)
        np.testing.assert_array_equal(final.geometry.buf[c], one.geometry.buf)
        np.testing.assert_array_equal(obs["n3"][c], o1["n3"])
        d3_checks.check(final.geometry.buf[c], final.geometry.tetra_capacity, T)


def test_batch_of_couplings_under_vmap():
    stepper = cdt.metropolis_3d(np.array([0.5, 2.0]), 0.6, target=60, eps=0.02, attempts_per_sweep=800)
    assert np.shape(stepper.params.k0) == (2,)
    chains = jax.vmap(lambda k: stepper.init(k, T))(jax.random.split(jax.random.key(3), 2))
    _, obs = jax.vmap(lambda s, c: trajectory(s, c, 2, save_every=1, observe=cdt.observe_3d))(stepper, chains)
    assert obs["n3"].shape == (2, 2)


@pytest.mark.parametrize("fix", ["n31", "n3"])
def test_stop_at_target_lands_on_the_target(fix):
    target = 60 if fix == "n31" else 200
    stepper = cdt.metropolis_3d(
        1.0, 1.0, target=target, eps=0.05, fix=fix, attempts_per_sweep=2000, stop_at_target=True
    )
    chain, obs = trajectory(stepper, stepper.init(jax.random.key(4), T), 4, save_every=1, observe=cdt.observe_3d)
    assert bool(np.all(obs["at_target"])) and int(obs["missed_target"][-1]) == 0
    now = obs["n3"] if fix == "n3" else obs["n31"] // 2
    np.testing.assert_array_equal(now, target)


def test_bad_input():
    with pytest.raises(ValueError, match="fix must be one of"):
        cdt.metropolis_3d(1.0, 0.6, fix="n0")
    with pytest.raises(ValueError, match="measure must be one of"):
        cdt.metropolis_3d(1.0, 0.6, measure="exact")
    with pytest.raises(ValueError, match="eps > 0"):
        cdt.metropolis_3d(1.0, 0.6, target=100, eps=0.0)
    with pytest.raises(ValueError, match="whole number"):
        cdt.metropolis_3d(1.0, 0.6, target=100.5)
    with pytest.raises(ValueError, match="stop_at_target needs"):
        cdt.metropolis_3d(1.0, 0.6, stop_at_target=True)
    with pytest.raises(ValueError, match="k0"):
        cdt.metropolis_3d(float("nan"), 0.6)
    with pytest.raises(ValueError, match="attempts_per_sweep"):
        cdt.metropolis_3d(1.0, 0.6, attempts_per_sweep=0)
    with pytest.raises(ValueError, match="broadcast"):
        cdt.metropolis_3d(np.zeros(2), np.zeros(3))
    free = cdt.metropolis_3d(1.0, 0.6)
    with pytest.raises(ValueError, match="capacity"):
        free.init(jax.random.key(0), T)
    fixed = cdt.metropolis_3d(1.0, 0.6, target=100)
    with pytest.raises(ValueError, match="n_slices"):
        fixed.init(jax.random.key(0), 2)
    with pytest.raises(ValueError, match="capacity"):
        fixed.init(jax.random.key(0), T, capacity=100)
    with pytest.raises(TypeError):
        fixed.init(0, T)
    with pytest.raises(TypeError, match="Chain3d"):
        cdt.observe_3d(object(), fixed.params)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not match"):
        d3_state.unpack(np.zeros(10, np.int32), 100, T)


def test_overflow_is_flagged_and_the_state_stays_valid():
    stepper = cdt.metropolis_3d(3.0, 0.0, attempts_per_sweep=3000)  # no volume term: the volume grows
    chain = stepper.init(jax.random.key(5), T, capacity=120)
    chain, obs = trajectory(stepper, chain, 2, save_every=1, observe=cdt.observe_3d)
    assert int(obs["overflow"][-1]) == 1
    assert int(obs["n3"][-1]) <= 120
    d3_checks.check(chain.geometry.buf, 120, T)


@pytest.mark.parametrize(
    "name", ["coordination_numbers", "coordination_histogram", "timelike_degrees", "max_timelike_degree", "observe"]
)
def test_the_1plus1_functions_refuse_a_2plus1_chain_in_one_line(name):
    """Every 1+1D measurement given the 2+1D stepper's objects names what it needs instead of failing inside."""
    st = cdt.metropolis_3d(5.0, 1.7, target=100, eps=0.005, attempts_per_sweep=10)
    chain = st.init(jax.random.key(0), 4)
    fn = getattr(cdt, name)
    with pytest.raises(TypeError, match=r"chain must be|state must be"):
        fn(chain, st.params) if name == "observe" else fn(chain.geometry)
