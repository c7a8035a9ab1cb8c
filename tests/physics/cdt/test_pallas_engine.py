"""The Pallas CDT engine (engine="pallas"), on CPU in Pallas's interpreter: its in-kernel Threefry against the
published known answers and jax.random's, bit-identity with the JAX engine given the same random words, the
in-kernel words equal to the explicit-word path, bad input; volume fixing through the stepper and the
exact-enumeration and detailed-balance tests of test_stepper.py on this engine are slow (each interpreted kernel
takes tens of seconds to compile)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from ivhl_jax import cdt
from ivhl_jax.physics.cdt import moves, pallas_engine
from ivhl_jax.physics.cdt.state import buffer_layout, initial_state, replicate

from . import test_stepper as base
from .helpers import assert_invariants, run_chains

CAP = base.CAP


def test_threefry_matches_known_answers_and_jax_random():
    # Random123's known-answer vectors for Threefry-2x32-20 (key, counter -> output)
    kat = [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for (k0, k1), (x0, x1), want in kat:
        got = pallas_engine.threefry2x32(k0, k1, x0, x1)
        assert (int(got[0]), int(got[1])) == want
    key = jnp.asarray([0xDEADBEEF, 12345], jnp.uint32)
    count = jnp.arange(64, dtype=jnp.uint32)
    ref = np.asarray(threefry_2x32(key, count))  # counters (count[:32], count[32:]) -> the two halves
    y0, y1 = pallas_engine.threefry2x32(key[0], key[1], count[:32], count[32:])
    np.testing.assert_array_equal(np.concatenate([np.asarray(y0), np.asarray(y1)]), ref)


def test_pallas_engine_is_bit_identical_to_jax_engine():
    s = initial_state(3, 4, capacity=CAP)
    lay = buffer_layout(CAP, 3)
    # 5 chains in blocks of 4 (the last block padded), both an unfixed and a volume-fixed action
    for params in (cdt.metropolis(0.8).params, cdt.metropolis(cdt.LN2, eps=0.05, target=30.0).params):
        words = jax.random.bits(jax.random.key(1), (5, 1500, 2), jnp.uint32)
        bufs = jnp.stack([s.buf] * 5)
        out = jax.jit(functools.partial(pallas_engine.attempts, params=params, lay=lay, c0=CAP, block_chains=4))(
            bufs, words
        )
        ref = jax.jit(jax.vmap(functools.partial(moves.attempts, params=params, lay=lay, c0=CAP)))(bufs, words)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
        final = replicate(s, 5).replace(buf=out)
        assert_invariants(final)
        assert np.all(np.asarray(final.accepts) > 0)


def test_in_kernel_words_equal_the_explicit_word_path():
    # a sweep draws attempt i's words as threefry(seed, (i, 0)): the same words through `attempts` give the same bits
    s = replicate(initial_state(3, 4, capacity=CAP), 3)
    lay = buffer_layout(CAP, 3)
    params = cdt.metropolis(0.8, attempts_per_sweep=300, engine="pallas").params
    seeds = jax.random.bits(jax.random.key(7), (3, 2), jnp.uint32)
    swept = jax.jit(lambda b, sd: pallas_engine.sweep(b, moves.SweepRequest(sd, 300, lay, CAP), params))(s.buf, seeds)
    i = jnp.arange(300, dtype=jnp.uint32)
    w0, w1 = pallas_engine.threefry2x32(seeds[:, :1], seeds[:, 1:], i[None], jnp.uint32(0))
    words = jnp.stack([w0, w1], -1)
    explicit = jax.jit(functools.partial(pallas_engine.attempts, params=params, lay=lay, c0=CAP))(s.buf, words)
    np.testing.assert_array_equal(np.asarray(swept), np.asarray(explicit))
    assert not np.array_equal(np.asarray(swept[0]), np.asarray(swept[1]))  # chains get their own streams


@pytest.mark.slow
def test_chains_of_different_volume_make_the_same_fixed_number_of_attempts():
    # a sweep is a fixed count (never a chain's N2): chains of different volume share one launch, each makes
    # exactly n attempts, equal to the explicit-word path; a count < 1 is refused
    lay = buffer_layout(CAP, 3)
    bufs = jnp.stack([initial_state(3, 4, capacity=CAP).buf, initial_state(3, 5, capacity=CAP).buf])
    params = cdt.metropolis(0.8, engine="pallas").params
    seeds = jax.random.bits(jax.random.key(3), (2, 2), jnp.uint32)
    count = 27
    swept = np.asarray(
        jax.jit(lambda b, sd: pallas_engine.sweep(b, moves.SweepRequest(sd, count, lay, CAP), params))(bufs, seeds)
    )
    for c in (0, 1):
        i = jnp.arange(count, dtype=jnp.uint32)
        w0, w1 = pallas_engine.threefry2x32(seeds[c, 0], seeds[c, 1], i, jnp.uint32(0))
        one = pallas_engine.attempts(bufs[c : c + 1], jnp.stack([w0, w1], -1)[None], params, lay, CAP)
        np.testing.assert_array_equal(swept[c], np.asarray(one)[0])
        assert int(np.asarray(one)[0, lay["attempts"][0] : lay["attempts"][0] + 3].sum()) == count
    with pytest.raises(ValueError, match="fixed number of attempts"):
        pallas_engine.sweep(bufs, moves.SweepRequest(seeds, 0, lay, CAP), params)


@pytest.mark.slow
def test_first_hit_sweeps_end_at_the_target_and_the_stepper_runs_it():
    stepper = cdt.metropolis(
        cdt.LN2, eps=0.05, target=40.0, attempts_per_sweep=60, engine="pallas", stop_at_first_hit=True
    )
    params = stepper.params
    assert cdt.max_capacity("pallas") == moves.MAX_VERTEX_CAPACITY
    states = replicate(initial_state(3, 4, capacity=CAP), 4)
    fn = jax.jit(lambda k, st: run_chains(k, st, params, 4, 1))
    final, obs = fn(jax.random.key(2), states)
    assert_invariants(final)
    np.testing.assert_array_equal(np.asarray(obs["n2"]), 40)
    assert int(np.asarray(final.missed_target).sum()) == 0
    # the same key gives the same bits; the stepper's init and one step work on a single chain too
    again = fn(jax.random.key(2), states)[0]
    np.testing.assert_array_equal(np.asarray(final.buf), np.asarray(again.buf))
    chain = stepper.init(jax.random.key(0), 3, 4, CAP)
    assert_invariants(stepper.step(chain).geometry)


def test_bad_input():
    with pytest.raises(ValueError, match="capacity"):
        stepper = cdt.metropolis(1.0, engine="pallas")
        stepper.init(jax.random.key(0), 3, 4, moves.MAX_VERTEX_CAPACITY + 1)
    with pytest.raises(ValueError, match="engine"):
        cdt.metropolis(1.0, engine="triton")
    with pytest.raises(ValueError, match="proposal='lists' needs engine='host'"):
        cdt.metropolis(1.0, engine="pallas", proposal="lists")
    lay = buffer_layout(CAP, 3)
    with pytest.raises(ValueError, match="words"):
        pallas_engine.attempts(
            jnp.zeros((2, lay["size"][0]), jnp.int32),
            jnp.zeros((3, 5, 2), jnp.uint32),
            cdt.metropolis(1.0).params,
            lay,
            CAP,
        )


# --- the statistical validation of test_stepper.py on this engine --------------------------------------------------


@pytest.fixture(scope="module")
def small_runs():
    """test_stepper.py's shared runs (T = 3, lam = 1, 256 chains, 30 sweeps of 100 attempts) on the Pallas engine."""
    params = cdt.metropolis(1.0, attempts_per_sweep=100, engine="pallas").params
    fn = jax.jit(lambda k, s: run_chains(k, s, params, 30, 1))
    states = replicate(initial_state(3, 3, capacity=CAP), 256)
    return fn, states, fn(jax.random.PRNGKey(0), states)


@pytest.mark.slow
def test_chi2_against_exact_enumeration(small_runs):
    base.test_chi2_against_exact_enumeration(small_runs)


@pytest.mark.slow
def test_coordination_distribution_and_joint_law_with_volume(small_runs):
    base.test_coordination_distribution_and_joint_law_with_volume(small_runs)


@pytest.mark.slow
def test_run_chains_deterministic_and_observables(small_runs):
    base.test_run_chains_deterministic_and_observables(small_runs)
