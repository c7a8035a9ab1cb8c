"""Shared helpers of the 2+1D CDT move tests (host and JAX engines): a small thermalised state, every valid move
with its inverse, the proposals that land on a goal state, the stationary weight. ``apply`` arguments take a
move applier with :func:`ivhl_jax.physics.cdt.d3_host.apply_move`'s signature ``(buf, C3, T, move, a, i, up)``
(in place; returns whether the move was done)."""

from __future__ import annotations

import math

import numpy as np

from ivhl_jax.physics.cdt import d3_checks, d3_host, d3_state

T = 3
C3 = 240


def state(seed: int, attempts: int = 3000, couplings=(1.0, 0.6, 0.02, 40.0), c3: int = C3) -> np.ndarray:
    """A small thermalised state of T = 3 slices: the minimal start, then ``attempts`` attempts."""
    buf = np.array(d3_state.initial_state(T, c3).buf)
    d3_host.sweep_chain(
        buf, d3_host.field_offsets(c3, T), attempts, *couplings, False, False, T, False, 0, np.uint64(seed)
    )
    d3_checks.check(buf, c3, T)
    return buf


def field(buf: np.ndarray, name: str, c3: int = C3) -> np.ndarray:
    return d3_state.unpack(buf, c3, T)[name]


def count(buf: np.ndarray, name: str, c3: int = C3) -> int:
    return int(field(buf, "counts", c3)[d3_state.COUNTS.index(name)])


def inverse(buf_after: np.ndarray, move: str, info: dict) -> tuple[str, int, int, bool]:
    """The move that undoes ``move`` (described by ``info``) on the state ``buf_after``."""
    tv, ttype = field(buf_after, "tv"), field(buf_after, "ttype")
    l31 = field(buf_after, "l31")[: count(buf_after, "n31")]
    if move == "26":
        return "62", int(field(buf_after, "vperm")[count(buf_after, "n0") - 1]), 0, True
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
        u = int(field(buf_after, "tn")[t, 3])
        assert ttype[u] == d3_state.TYPE_13
        return ("32" if move == "23" else "23"), t, tv[u, 1:].tolist().index(v0), False
    raise AssertionError(move)


def move_info(buf: np.ndarray, move: str, t: int, i: int, up: bool) -> dict:
    """What :func:`inverse` needs to know about ``move`` (slot ``t``, index ``i``) before it is done."""
    tv, tn = field(buf, "tv"), field(buf, "tn")
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


def moves(buf: np.ndarray, apply=d3_host.apply_move):
    """Every valid (move, slot, i, up) on ``buf`` with its result B and the inverse's result A' from B."""
    l31 = field(buf, "l31")[: count(buf, "n31")]
    for t in l31.tolist():
        for i in range(3):
            for move, up in (("26", True), ("44", True), ("23", True), ("23", False), ("32", True), ("32", False)):
                if move == "26" and i:
                    continue
                b = buf.copy()
                info = move_info(buf, move, t, i, up)
                if not apply(b, C3, T, move, t, i, up):
                    continue
                inv, a, j, inv_up = inverse(b, move, info)
                back = b.copy()
                assert apply(back, C3, T, inv, a, j, inv_up), f"the inverse of {move} was refused"
                yield move, up, b, back


def first_valid(buf: np.ndarray, move: str, up: bool = True, apply=d3_host.apply_move) -> tuple[np.ndarray, np.ndarray]:
    """The result B of the first valid ``move`` on ``buf`` and the result of its inverse on B (A up to slots)."""
    for m, u, b, back in moves(buf, apply):
        if m == move and u == up:
            return b, back
    raise AssertionError(f"no valid {move} on the test state")


def log_weight(buf: np.ndarray, k0: float, k3: float, eps: float, target: float, reference: bool) -> float:
    """log pi of the state: -S (N_fix = N(3,1)), plus log h for the reference's (2,6)/(6,2) ratios
    (h(N0) = prod_{m <= N0} m / (2 m - 4T), up to a constant)."""
    n0, n3, n31 = (count(buf, k) for k in ("n0", "n3", "n31"))
    s = -k0 * n0 + k3 * n3 + eps * (n31 - target) ** 2
    log_h = sum(math.log(m / (2 * m - 4 * T)) for m in range(2 * T + 1, n0 + 1)) if reference else 0.0
    return -s + log_h


def same_as(buf: np.ndarray, goal: np.ndarray, apply=d3_host.apply_move) -> np.ndarray:
    """Every buffer one proposal can make from ``buf`` (each (move, slot, index, orientation), the (6,2) on each
    vertex) that is the triangulation ``goal`` (up to slots): the attempt's outcomes that land on ``goal``."""
    want = d3_checks.canonical(goal, C3, T)
    l31 = field(buf, "l31")[: count(buf, "n31")].tolist()
    verts = field(buf, "vperm")[: count(buf, "n0")].tolist()
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
        if apply(b, C3, T, move, a, i, up) and d3_checks.canonical(b, C3, T) == want:
            out.append(b)
    assert out, "no proposal makes the goal"
    return np.stack(out)
