"""2+1D CDT moves: invariants after every sweep, each move undone by its inverse, and detailed balance checked
directly (one attempt from A lands on B with probability P(A->B); P(A->B)/P(B->A) must be pi(B)/pi(A))."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivhl_jax.physics.cdt import d3_checks, d3_host, d3_state

from .d3_helpers import C3, T, count, field, first_valid, log_weight, moves, same_as, state


@pytest.mark.parametrize(
    ("couplings", "fix_n3", "reference"),
    [
        ((1.0, 0.6, 0.01, 150.0), False, False),  # volume fixed on N(3,1)
        ((6.0, 0.9, 0.01, 600.0), True, False),  # large k0 (many vertices), volume fixed on N3
        ((0.0, 0.3, 0.01, 150.0), False, True),  # the reference's (2,6)/(6,2) ratios
    ],
)
def test_invariants_after_every_sweep(couplings, fix_n3, reference):
    c3 = 1500
    buf = np.array(d3_state.initial_state(T, c3).buf)
    off = d3_host.field_offsets(c3, T)
    acc = np.zeros(5, np.int64)
    for sweep in range(25):
        d3_host.sweep_chain(buf, off, 2000, *couplings, fix_n3, reference, T, False, 0, np.uint64(100 + sweep))
        d3_checks.check(buf, c3, T)
        acc += field(buf, "accepts", c3)
    assert count(buf, "overflow", c3) == 0
    assert np.all(acc > 0), f"every move must be accepted sometimes, accepts per move {acc}"


def test_each_move_and_its_inverse_restore_the_state():
    buf0 = state(1)
    ref = d3_checks.canonical(buf0, C3, T)
    done = {"26": 0, "62": 0, "44": 0, "23": 0, "32": 0}
    for move, _, b, back in moves(buf0):
        d3_checks.check(b, C3, T)
        assert d3_checks.canonical(b, C3, T) != ref
        d3_checks.check(back, C3, T)
        assert d3_checks.canonical(back, C3, T) == ref, f"{move} then its inverse did not restore the state"
        done[move] += 1
        if move == "26":  # the (6,2) runs as the inverse of each (2,6)
            done["62"] += 1
    assert all(k >= 3 for k in done.values()), f"too few moves exercised: {done}"


def _pair_test(buf_a, buf_b, couplings, reference, trials, seed):
    """The probabilities of A->B and B->A in ``trials`` single attempts each (every proposal that lands on the
    other state counts); returns (p_ab, p_ba, the error of log(p_ab / p_ba))."""
    kw = dict(couplings=couplings, reference=reference)
    n_ab = d3_host.transition_counts(buf_a, same_as(buf_a, buf_b), C3, T, trials, seed=seed, **kw)[:-1].sum()
    n_ba = d3_host.transition_counts(buf_b, same_as(buf_b, buf_a), C3, T, trials, seed=seed + 1, **kw)[:-1].sum()
    assert n_ab > 200 and n_ba > 200, (n_ab, n_ba)
    return n_ab / trials, n_ba / trials, math.sqrt(1 / n_ab + 1 / n_ba)


COUPLINGS = (1.3, 0.55, 0.01, 60.0)


@pytest.mark.parametrize("move", ["26", "44", "23up", "23down"])
def test_detailed_balance_of_each_move_pair(move):
    """For a valid move A -> B: P(A->B)/P(B->A) = exp(log pi(B) - log pi(A)) within 4 sigma (counts of single
    attempts), and each probability equals its proposal probability times min(1, R)."""
    k0, k3, eps, target = COUPLINGS
    buf_a = state(7)
    name, up = move[:2], not move.endswith("down")
    buf_b, _ = first_valid(buf_a, name, up)
    trials = 1_500_000 if name == "23" else 400_000  # the (2,3) is proposed 6 times more rarely
    p_ab, p_ba, rel = _pair_test(buf_a, buf_b, COUPLINGS, False, trials, seed=11)
    dlog = log_weight(buf_b, *COUPLINGS, False) - log_weight(buf_a, *COUPLINGS, False)
    z = (math.log(p_ab / p_ba) - dlog) / rel
    assert abs(z) < 4, f"{move}: log P(A->B)/P(B->A) = {math.log(p_ab / p_ba):.4f}, log pi(B)/pi(A) = {dlog:.4f}"
    # the absolute forward probability: the proposal (module docstring of d3_host) times min(1, R)
    n = count(buf_a, "n31")
    q = {"26": 1 / (6 * n), "44": 2 / (9 * n), "23": 1 / (36 * n)}[name]
    n0 = count(buf_a, "n0")
    r = math.exp(dlog) * ({"26": n / (n0 + 1)}.get(name, 1.0))
    expect = q * min(1.0, r)
    assert abs(p_ab - expect) < 4 * math.sqrt(expect / trials), f"{move}: P(A->B) = {p_ab:.5f}, expected {expect:.5f}"


def test_reference_ratios_balance_their_own_weight_and_not_the_action():
    """The reference's (2,6)/(6,2) ratios n/(n+2), n/(n-2) balance e^{-S} h (d3_host's docstring), and the same
    counts reject e^{-S}: the check sees a ratio wrong by the factor (n+2)/(N0+1)."""
    buf_a = state(7)
    buf_b, _ = first_valid(buf_a, "26")
    p_ab, p_ba, rel = _pair_test(buf_a, buf_b, COUPLINGS, True, 400_000, seed=21)
    measured = math.log(p_ab / p_ba)
    own = log_weight(buf_b, *COUPLINGS, True) - log_weight(buf_a, *COUPLINGS, True)
    action = log_weight(buf_b, *COUPLINGS, False) - log_weight(buf_a, *COUPLINGS, False)
    assert abs(measured - own) < 4 * rel
    assert abs(measured - action) > 8 * rel, "the pair test cannot tell the two ratios apart"


def test_apply_move_bad_input():
    buf = np.array(d3_state.initial_state(T, C3).buf)
    with pytest.raises(ValueError, match="move must be one of"):
        d3_host.apply_move(buf, C3, T, "33", 0)
    with pytest.raises(ValueError, match="contiguous 1-D int32"):
        d3_host.apply_move(buf.astype(np.int64), C3, T, "26", 0)
    with pytest.raises(ValueError, match="engine must be"):
        d3_host.apply_move(buf, C3, T, "26", 0, engine="pallas")


def test_spatial_edge_walk_agrees_with_the_edges_of_the_spatial_triangles():
    """The (4,4)'s check (a walk once around a vertex in its slice) against the edge set read off every (3,1)'s
    base triangle, for every pair of live vertices of one slice, and against the half-star walk ``has_edge``."""
    from numba import njit

    @njit
    def walks(buf, off, pairs, c3):
        S = d3_host.views(buf, off)
        work = d3_host.scratch(c3)
        out = np.zeros((pairs.shape[0], 2), np.bool_)
        for k in range(pairs.shape[0]):
            out[k, 0] = d3_host.spatial_edge(S, pairs[k, 0], pairs[k, 1])
            out[k, 1] = d3_host.has_edge(S, pairs[k, 0], pairs[k, 1], True, work)
        return out

    for seed in (1, 2):
        buf = state(seed, attempts=6000)
        f = d3_state.unpack(buf, C3, T)
        bases = f["tv"][f["ttype"] == d3_state.TYPE_31][:, :3]
        edges = {frozenset((int(x), int(y))) for b in bases for x, y in ((b[0], b[1]), (b[1], b[2]), (b[2], b[0]))}
        live = f["vperm"][: count(buf, "n0")]
        pairs = np.array([(a, b) for a in live for b in live if a != b and f["vtime"][a] == f["vtime"][b]], np.int64)
        got = walks(buf, d3_host.field_offsets(C3, T), pairs, C3)
        want = np.array([frozenset((int(a), int(b))) in edges for a, b in pairs])
        assert 0 < want.sum() < len(want)
        np.testing.assert_array_equal(got[:, 0], want)
        np.testing.assert_array_equal(got[:, 1], want)
