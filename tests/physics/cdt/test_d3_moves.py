"""2+1D CDT moves: invariants after every sweep, each move undone by its inverse, and detailed balance checked
directly (one attempt from A lands on B with probability P(A->B); P(A->B)/P(B->A) must be pi(B)/pi(A))."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivhl_jax.physics.cdt import d3_checks, d3_host, d3_state

T = 3
C3 = 240


def _state(seed: int, attempts: int = 3000, couplings=(1.0, 0.6, 0.02, 40.0), c3: int = C3) -> np.ndarray:
    """A small thermalised state of T = 3 slices: the minimal start, then ``attempts`` attempts."""
    buf = np.array(d3_state.initial_state(T, c3).buf)
    d3_host.sweep_chain(
        buf, d3_host.field_offsets(c3, T), attempts, *couplings, False, False, T, False, 0, np.uint64(seed)
    )
    d3_checks.check(buf, c3, T)
    return buf


def _field(buf: np.ndarray, name: str, c3: int = C3) -> np.ndarray:
    return d3_state.unpack(buf, c3, T)[name]


def _count(buf: np.ndarray, name: str, c3: int = C3) -> int:
    return int(_field(buf, "counts", c3)[d3_state.COUNTS.index(name)])


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
        acc += _field(buf, "accepts", c3)
    assert _count(buf, "overflow", c3) == 0
    assert np.all(acc > 0), f"every move must be accepted sometimes, accepts per move {acc}"


def _inverse(buf_after: np.ndarray, move: str, info: dict) -> tuple[str, int, int, bool]:
    """The move that undoes ``move`` (described by ``info``) on the state ``buf_after``."""
    tv, ttype = _field(buf_after, "tv"), _field(buf_after, "ttype")
    l31 = _field(buf_after, "l31")[: _count(buf_after, "n31")]
    if move == "26":
        return "62", int(_field(buf_after, "vperm")[_count(buf_after, "n0") - 1]), 0, True
    if move == "62":
        raise AssertionError("the (6,2) is undone by a (2,6) on the (3,1) with the restored base")
    if move == "44":
        a, b = info["new_edge"]
        for t in l31:
            base = tv[t, :3].tolist()
            if a in base and b in base:
                other = [i for i in range(3) if base[i] not in (a, b)][0]
                return "44", int(t), other, True
    if move in ("23", "32"):
        up, base, v0 = info["up"], info["base"], info["v0"]
        for t in l31:
            if not up:
                break
            if sorted(tv[t, :3].tolist()) == base:
                return ("32" if move == "23" else "23"), int(t), tv[t, :3].tolist().index(v0), True
        t = info["t"]  # down: the (3,1) above the changed (1,3) is untouched
        u = int(_field(buf_after, "tn")[t, 3])
        assert ttype[u] == d3_state.TYPE_13
        return ("32" if move == "23" else "23"), t, tv[u, 1:].tolist().index(v0), False
    raise AssertionError(move)


def _info(buf: np.ndarray, move: str, t: int, i: int, up: bool) -> dict:
    """What :func:`_inverse` needs to know about ``move`` (slot ``t``, index ``i``) before it is done."""
    tv, tn = _field(buf, "tv"), _field(buf, "tn")
    info: dict = {"t": t, "up": up}
    if move == "44":
        p, q = int(tv[t, (i + 1) % 3]), int(tv[t, (i + 2) % 3])
        other = [w for w in tv[int(tn[t, i]), :3].tolist() if w not in (p, q)]
        info["new_edge"] = (int(tv[t, i]), other[0] if other else -1)
    if move in ("23", "32"):
        tri = tv[t, :3] if up else tv[tn[t, 3], 1:]
        info["base"] = sorted(tv[t, :3].tolist())
        info["v0"] = int(tri[i])
    return info


def _moves(buf: np.ndarray):
    """Every valid (move, slot, i, up) on ``buf`` with its result B and the inverse's result A' from B."""
    l31 = _field(buf, "l31")[: _count(buf, "n31")]
    for t in l31.tolist():
        for i in range(3):
            for move, up in (("26", True), ("44", True), ("23", True), ("23", False), ("32", True), ("32", False)):
                if move == "26" and i:
                    continue
                b = buf.copy()
                info = _info(buf, move, t, i, up)
                if not d3_host.apply_move(b, C3, T, move, t, i, up):
                    continue
                inv, a, j, inv_up = _inverse(b, move, info)
                back = b.copy()
                assert d3_host.apply_move(back, C3, T, inv, a, j, inv_up), f"the inverse of {move} was refused"
                yield move, up, b, back


def test_each_move_and_its_inverse_restore_the_state():
    buf0 = _state(1)
    ref = d3_checks.canonical(buf0, C3, T)
    done = {"26": 0, "62": 0, "44": 0, "23": 0, "32": 0}
    for move, _, b, back in _moves(buf0):
        d3_checks.check(b, C3, T)
        assert d3_checks.canonical(b, C3, T) != ref
        d3_checks.check(back, C3, T)
        assert d3_checks.canonical(back, C3, T) == ref, f"{move} then its inverse did not restore the state"
        done[move] += 1
        if move == "26":  # the (6,2) runs as the inverse of each (2,6)
            done["62"] += 1
    assert all(k >= 3 for k in done.values()), f"too few moves exercised: {done}"


def _first_valid(buf: np.ndarray, move: str, up: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The result B of the first valid ``move`` on ``buf`` and the result of its inverse on B (A up to slots)."""
    for m, u, b, back in _moves(buf):
        if m == move and u == up:
            return b, back
    raise AssertionError(f"no valid {move} on the test state")


def _log_weight(buf: np.ndarray, k0: float, k3: float, eps: float, target: float, reference: bool) -> float:
    """log pi of the state: -S (N_fix = N(3,1)), plus log h for the reference's (2,6)/(6,2) ratios
    (h(N0) = prod_{m <= N0} m / (2 m - 4T), up to a constant)."""
    n0, n3, n31 = (_count(buf, k) for k in ("n0", "n3", "n31"))
    s = -k0 * n0 + k3 * n3 + eps * (n31 - target) ** 2
    log_h = sum(math.log(m / (2 * m - 4 * T)) for m in range(2 * T + 1, n0 + 1)) if reference else 0.0
    return -s + log_h


def _same_as(buf: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Every buffer one proposal can make from ``buf`` (each (move, slot, index, orientation), the (6,2) on each
    vertex) that is the triangulation ``goal`` (up to slots): the attempt's outcomes that land on ``goal``."""
    want = d3_checks.canonical(goal, C3, T)
    l31 = _field(buf, "l31")[: _count(buf, "n31")].tolist()
    verts = _field(buf, "vperm")[: _count(buf, "n0")].tolist()
    props = [("62", v, 0, True) for v in verts] + [("26", t, 0, True) for t in l31]
    props += [
        (m, t, i, up)
        for t in l31
        for i in range(3)
        for m, up in (("44", True), *((x, u) for x in ("23", "32") for u in (True, False)))
    ]
    out = []
    for move, a, i, up in props:
        b = buf.copy()
        if d3_host.apply_move(b, C3, T, move, a, i, up) and d3_checks.canonical(b, C3, T) == want:
            out.append(b)
    assert out, "no proposal makes the goal"
    return np.stack(out)


def _pair_test(buf_a, buf_b, couplings, reference, trials, seed):
    """The probabilities of A->B and B->A in ``trials`` single attempts each (every proposal that lands on the
    other state counts); returns (p_ab, p_ba, the error of log(p_ab / p_ba))."""
    kw = dict(couplings=couplings, reference=reference)
    n_ab = d3_host.transition_counts(buf_a, _same_as(buf_a, buf_b), C3, T, trials, seed=seed, **kw)[:-1].sum()
    n_ba = d3_host.transition_counts(buf_b, _same_as(buf_b, buf_a), C3, T, trials, seed=seed + 1, **kw)[:-1].sum()
    assert n_ab > 200 and n_ba > 200, (n_ab, n_ba)
    return n_ab / trials, n_ba / trials, math.sqrt(1 / n_ab + 1 / n_ba)


COUPLINGS = (1.3, 0.55, 0.01, 60.0)


@pytest.mark.parametrize("move", ["26", "44", "23up", "23down"])
def test_detailed_balance_of_each_move_pair(move):
    """For a valid move A -> B: P(A->B)/P(B->A) = exp(log pi(B) - log pi(A)) within 4 sigma (counts of single
    attempts), and each probability equals its proposal probability times min(1, R)."""
    k0, k3, eps, target = COUPLINGS
    buf_a = _state(7)
    name, up = move[:2], not move.endswith("down")
    buf_b, _ = _first_valid(buf_a, name, up)
    trials = 1_500_000 if name == "23" else 400_000  # the (2,3) is proposed 6 times more rarely
    p_ab, p_ba, rel = _pair_test(buf_a, buf_b, COUPLINGS, False, trials, seed=11)
    dlog = _log_weight(buf_b, *COUPLINGS, False) - _log_weight(buf_a, *COUPLINGS, False)
    z = (math.log(p_ab / p_ba) - dlog) / rel
    assert abs(z) < 4, f"{move}: log P(A->B)/P(B->A) = {math.log(p_ab / p_ba):.4f}, log pi(B)/pi(A) = {dlog:.4f}"
    # the absolute forward probability: the proposal (module docstring of d3_host) times min(1, R)
    n = _count(buf_a, "n31")
    q = {"26": 1 / (6 * n), "44": 2 / (9 * n), "23": 1 / (36 * n)}[name]
    n0 = _count(buf_a, "n0")
    r = math.exp(dlog) * ({"26": n / (n0 + 1)}.get(name, 1.0))
    expect = q * min(1.0, r)
    assert abs(p_ab - expect) < 4 * math.sqrt(expect / trials), f"{move}: P(A->B) = {p_ab:.5f}, expected {expect:.5f}"


def test_reference_ratios_balance_their_own_weight_and_not_the_action():
    """The reference's (2,6)/(6,2) ratios n/(n+2), n/(n-2) balance e^{-S} h (d3_host's docstring), and the same
    counts reject e^{-S}: the check sees a ratio wrong by the factor (n+2)/(N0+1)."""
    buf_a = _state(7)
    buf_b, _ = _first_valid(buf_a, "26")
    p_ab, p_ba, rel = _pair_test(buf_a, buf_b, COUPLINGS, True, 400_000, seed=21)
    measured = math.log(p_ab / p_ba)
    own = _log_weight(buf_b, *COUPLINGS, True) - _log_weight(buf_a, *COUPLINGS, True)
    action = _log_weight(buf_b, *COUPLINGS, False) - _log_weight(buf_a, *COUPLINGS, False)
    assert abs(measured - own) < 4 * rel
    assert abs(measured - action) > 8 * rel, "the pair test cannot tell the two ratios apart"


def test_apply_move_bad_input():
    buf = np.array(d3_state.initial_state(T, C3).buf)
    with pytest.raises(ValueError, match="move must be one of"):
        d3_host.apply_move(buf, C3, T, "33", 0)
    with pytest.raises(ValueError, match="contiguous 1-D int32"):
        d3_host.apply_move(buf.astype(np.int64), C3, T, "26", 0)


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
        buf = _state(seed, attempts=6000)
        f = d3_state.unpack(buf, C3, T)
        bases = f["tv"][f["ttype"] == d3_state.TYPE_31][:, :3]
        edges = {frozenset((int(x), int(y))) for b in bases for x, y in ((b[0], b[1]), (b[1], b[2]), (b[2], b[0]))}
        live = f["vperm"][: _count(buf, "n0")]
        pairs = np.array([(a, b) for a in live for b in live if a != b and f["vtime"][a] == f["vtime"][b]], np.int64)
        got = walks(buf, d3_host.field_offsets(C3, T), pairs, C3)
        want = np.array([frozenset((int(a), int(b))) in edges for a, b in pairs])
        assert 0 < want.sum() < len(want)
        np.testing.assert_array_equal(got[:, 0], want)
        np.testing.assert_array_equal(got[:, 1], want)
