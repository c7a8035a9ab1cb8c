"""Test helpers for the CDT package: structural invariants of a triangulation and many-chain runs.

``check_invariants`` is O(capacity^2) (it follows every slice and strip around its cycle): a check for
tests on small states, not for production runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax import cdt
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics.cdt.state import UP, CDTState, live_triangles, live_vertices


def run_chains(key, states: CDTState, params: cdt.MetropolisParams, steps: int, save_every: int = 1):
    """``steps`` sweeps of a batch of chains (leading axis of ``states``), keys split per chain: the stepper's
    ``trajectory`` under ``jax.vmap``, with ``params`` (a ``cdt.metropolis(...).params``, possibly traced) in the
    stepper. Returns ``(final geometries, observations (chains, measurements, ...))``."""
    stepper = cdt.metropolis(1.0).replace(params=params)
    chains = cdt.Chain(key=jax.random.split(key, states.n0.shape[0]), geometry=states)
    final, obs = jax.vmap(lambda c: trajectory(stepper, c, steps, save_every=save_every, observe=cdt.observe))(chains)
    return final.geometry, obs


def check_invariants(state: CDTState) -> dict[str, jax.Array]:
    """Structural checks of one (unbatched) state, jit/vmap-able; name -> bool scalar, all True when valid.

    * ``bags``: vperm/vpos are inverse permutations; 0 <= n0 <= C0.
    * ``neighbours``: tl/tr of live triangles are live, ``tr[tl[t]] = tl[tr[t]] = t``, same strip.
    * ``gluing``: a triangle and its right neighbour share their timelike link (same bottom and top
      vertex); base and apex vertices are live and on the right slices.
    * ``slices``: following ``vright`` closes every slice into one circle of exactly ``lengths[t] >= 3``
      vertices; every strip closes (under ``tr``) into one cycle of ``l_t + l_{t+1}`` triangles.
    * ``euler``: N0 = sum l_t (so N2 = 2 N0 and chi = N0 - 3 N2 / 2 + N2 = 0 on the torus).
    """
    s = state
    c2, c0, T = 2 * s.vertex_capacity, s.vertex_capacity, s.n_slices
    ids2, ids0 = jnp.arange(c2), jnp.arange(c0)
    at, av = live_triangles(s), live_vertices(s)
    n0 = s.n0
    ok = {}
    ok["bags"] = jnp.all(s.vpos[jnp.clip(s.vperm, 0, c0 - 1)] == ids0) & (n0 >= 0) & (n0 <= c0)

    def live_all(cond):
        return jnp.all(jnp.where(at, cond, True))

    tl, tr = jnp.clip(s.tl, 0, c2 - 1), jnp.clip(s.tr, 0, c2 - 1)
    ttime = s.ttime
    up = s.ttype == UP
    ok["neighbours"] = (
        live_all(at[tl] & at[tr])
        & live_all((s.tr[tl] == ids2) & (s.tl[tr] == ids2))
        & live_all((ttime[tl] == ttime) & (ttime[tr] == ttime))
    )
    vl, vr, vc = (jnp.clip(s.tv[:, k], 0, c0 - 1) for k in range(3))
    bot_l, top_l = jnp.where(up, vl, vc), jnp.where(up, vc, vl)
    bot_r, top_r = jnp.where(up, vr, vc), jnp.where(up, vc, vr)
    base_t = jnp.where(up, ttime, (ttime + 1) % T)
    apex_t = jnp.where(up, (ttime + 1) % T, ttime)
    ok["gluing"] = (
        live_all((bot_r == bot_l[tr]) & (top_r == top_l[tr]))
        & live_all(av[vl] & av[vr] & av[vc] & (s.tv >= 0).all(1) & (s.tv < c0).all(1))
        & live_all((s.vtime[vl] == base_t) & (s.vtime[vr] == base_t) & (s.vtime[vc] == apex_t))
    )
    right = jnp.where(av, jnp.clip(s.vright, 0, c0 - 1), ids0)
    nxt = jnp.where(at, tr, ids2)

    # cycle length of v under `right` (and of t under `tr`): first k >= 1 with f^k(x) = x (capped)
    def cycles(f, ids, n):
        def body(k, carry):
            cur, cyc = carry
            cur = f[cur]
            return cur, jnp.where((cyc == 0) & (cur == ids), k, cyc)

        return jax.lax.fori_loop(1, n + 1, body, (ids, jnp.zeros(n, jnp.int32)))[1]

    vt = jnp.clip(s.vtime, 0, T - 1)
    counts = jnp.zeros(T, jnp.int32).at[jnp.where(av, vt, T)].add(1, mode="drop")
    strip_len = s.lengths + jnp.roll(s.lengths, -1)
    tt = jnp.clip(ttime, 0, T - 1)
    ok["slices"] = (
        jnp.all(jnp.where(av, s.vtime[right] == s.vtime, True))
        & jnp.all(jnp.where(av, cycles(right, ids0, c0) == s.lengths[vt], True))
        & live_all(cycles(nxt, ids2, c2) == strip_len[tt])
        & jnp.all(counts == s.lengths)
        & jnp.all(s.lengths >= 3)
    )
    ok["euler"] = n0 == s.lengths.sum()
    return ok


_check_jit = jax.jit(check_invariants)
_check_vmap_jit = jax.jit(jax.vmap(check_invariants))


def assert_invariants(state: CDTState) -> None:
    """Raise ``AssertionError`` naming every failed structural check (works on batched states too)."""
    res = (_check_jit if state.n0.ndim == 0 else _check_vmap_jit)(state)
    bad = [k for k, v in res.items() if not bool(np.all(np.asarray(v)))]
    if bad:
        raise AssertionError(f"CDT invariants violated: {bad}")
    if bool(np.any(np.asarray(state.overflow))):
        raise AssertionError("CDT capacity overflow: an insertion was rejected for lack of slots; raise capacity")


def host_invariant_failures(state: CDTState) -> list[str]:
    """The checks of :func:`check_invariants` in NumPy, O(capacity) (each slice and strip is walked once), for
    states too large for the O(capacity^2) traced check; returns the names of the failed checks."""
    s = jax.device_get(state)
    n0, c0, T = int(s.n0), s.vertex_capacity, s.n_slices
    vperm, vpos = np.asarray(s.vperm), np.asarray(s.vpos)
    tl, tr, apex = np.asarray(s.tl), np.asarray(s.tr), np.asarray(s.apex)
    vright, vtime, lengths = np.asarray(s.vright), np.asarray(s.vtime), np.asarray(s.lengths)
    bad = []
    ids0, ids2 = np.arange(c0), np.arange(2 * c0)
    if not (np.array_equal(vpos[vperm], ids0) and 0 <= n0 <= c0):
        return ["bags"]
    live = vpos < n0
    lt = np.repeat(live, 2)
    t_live = ids2[lt]
    up = (ids2 & 1) == UP
    ttime = np.where(up, np.repeat(vtime, 2), (np.repeat(vtime, 2) - 1) % T)
    if not (
        lt[tl[t_live]].all()
        and lt[tr[t_live]].all()
        and (tr[tl[t_live]] == t_live).all()
        and (tl[tr[t_live]] == t_live).all()
        and (ttime[tl[t_live]] == ttime[t_live]).all()
    ):
        bad.append("neighbours")
    vl, vr, vc = t_live // 2, vright[t_live // 2], apex[t_live]
    u = up[t_live]
    bot_r, top_r = np.where(u, vr, vc), np.where(u, vc, vr)
    nb = tr[t_live]
    nb_u = up[nb]
    nb_l, nb_c = nb // 2, apex[nb]
    base_t = np.where(u, ttime[t_live], (ttime[t_live] + 1) % T)
    apex_t = np.where(u, (ttime[t_live] + 1) % T, ttime[t_live])
    if not (
        (bot_r == np.where(nb_u, nb_l, nb_c)).all()
        and (top_r == np.where(nb_u, nb_c, nb_l)).all()
        and live[vl].all()
        and live[vr].all()
        and live[vc].all()
        and (vtime[vl] == base_t).all()
        and (vtime[vr] == base_t).all()
        and (vtime[vc] == apex_t).all()
    ):
        bad.append("gluing")
    ok_slices = bool((lengths >= 3).all()) and np.array_equal(np.bincount(vtime[live], minlength=T), lengths)
    seen = np.zeros(c0, bool)
    for v in ids0[live]:  # walk each slice once from its first unseen vertex
        if seen[v] or not ok_slices:
            continue
        cur, k = v, 0
        while True:
            seen[cur] = True
            cur, k = vright[cur], k + 1
            if cur == v or k > lengths[vtime[v]] or vtime[cur] != vtime[v]:
                break
        ok_slices = cur == v and k == lengths[vtime[v]]
    seen2 = np.zeros(2 * c0, bool)
    for t in t_live:  # and each strip from its first unseen triangle
        if seen2[t] or not ok_slices:
            continue
        cur, k = t, 0
        want = lengths[ttime[t]] + lengths[(ttime[t] + 1) % T]
        while True:
            seen2[cur] = True
            cur, k = tr[cur], k + 1
            if cur == t or k > want:
                break
        ok_slices = cur == t and k == want
    if not ok_slices:
        bad.append("slices")
    if n0 != lengths.sum():
        bad.append("euler")
    return bad
