"""The 2+1D CDT JAX engine (``engine="jax"``): invariants after every sweep of vmapped chains, every move (and
its inverse) the host engine's move, detailed balance measured directly, the law against the host engine (with a
negative control), the stepper plumbing, and no host callback in its compiled step."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import cdt
from ivhl_jax.numerics.rollout import chunked, trajectory
from ivhl_jax.physics.cdt import d3_checks, d3_host, d3_jax, d3_profile, d3_state

from .d3_helpers import C3, T, count, field, first_valid, inverse, log_weight, move_info, same_as, state

#: The JAX engine behind the host engine's move door (the helpers' ``apply`` signature).
apply_jax = functools.partial(d3_host.apply_move, engine="jax")


@functools.cache
def _vmapped_sweep(c3: int, t_n: int, n: int, fix_n3: bool, reference: bool):
    """jit(vmap(one sweep)) over (buffers, keys) with traced couplings (4,) shared by the chains."""

    def one(buf, key, cp):
        return d3_jax.sweep(buf, key, tuple(cp), d3_state.SweepPlan(n, c3, t_n, fix_n3=fix_n3, reference=reference))

    return jax.jit(jax.vmap(one, in_axes=(0, 0, None)))


def _run_invariants(couplings, fix_n3, reference, chains=4, sweeps=8, attempts=1500, c3=1500):
    bufs = jnp.tile(d3_state.initial_state(T, c3).buf, (chains, 1))
    keys = jax.random.split(jax.random.key(5), chains)
    run = _vmapped_sweep(c3, T, attempts, fix_n3, reference)
    acc = np.zeros(5, np.int64)
    for s in range(sweeps):
        bufs = run(bufs, jax.vmap(lambda k, s=s: jax.random.fold_in(k, s))(keys), jnp.asarray(couplings, jnp.float32))
        host = np.asarray(bufs)
        for c in range(chains):
            d3_checks.check(host[c], c3, T, manifold=s % 3 == 2)
            acc += d3_state.unpack(host[c], c3, T)["accepts"]
            assert d3_state.unpack(host[c], c3, T)["counts"][d3_state.COUNTS.index("overflow")] == 0
    assert np.all(acc > 0), f"every move must be accepted sometimes, accepts per move {acc}"
    return host


def test_invariants_after_every_sweep_of_vmapped_chains():
    """fix="n31" (the host test's first coupling set): 4 chains, every sweep checked, every move accepted."""
    host = _run_invariants((1.0, 0.6, 0.01, 150.0), False, False)
    assert len({d3_checks.canonical(h, 1500, T) for h in host}) == 4, "the chains must differ (their own keys)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("couplings", "fix_n3", "reference"),
    [
        ((6.0, 0.9, 0.01, 600.0), True, False),  # large k0 (many vertices), volume fixed on N3
        ((0.0, 0.3, 0.01, 150.0), False, True),  # the reference's (2,6)/(6,2) ratios
    ],
)
def test_invariants_other_coupling_sets(couplings, fix_n3, reference):
    _run_invariants(couplings, fix_n3, reference)


def _proposals(buf):
    """Every proposal of one attempt on ``buf``: (move, slot, face or base vertex, orientation)."""
    l31 = field(buf, "l31")[: count(buf, "n31")].tolist()
    verts = field(buf, "vperm")[: count(buf, "n0")].tolist()
    props = [("62", v, 0, True) for v in verts] + [("26", t, 0, True) for t in l31]
    props += [(m, t, i, u) for t in l31 for i in range(3) for m, u in (("44", True), ("23", True), ("23", False))]
    return props + [("32", t, i, u) for t in l31 for i in range(3) for u in (True, False)]


def test_each_move_is_the_host_move_and_its_inverse_restores_the_state():
    """Every proposal on a thermalised state: the JAX engine does it exactly when the host engine does (the same
    manifold conditions), makes the host's triangulation, keeps every invariant, and the inverse move (JAX
    engine) restores the state."""
    buf0 = state(1)
    ref = d3_checks.canonical(buf0, C3, T)
    done = dict.fromkeys(cdt.MOVE_NAMES_3D, 0)
    refused = 0
    for move, a, i, up in _proposals(buf0):
        h, b = buf0.copy(), buf0.copy()
        dh = d3_host.apply_move(h, C3, T, move, a, i, up)
        assert apply_jax(b, C3, T, move, a, i, up) == dh, f"{move} on {a}, {i}, up={up}"
        if not dh:
            refused += 1
            continue
        d3_checks.check(b, C3, T, manifold=False)
        assert d3_checks.canonical(b, C3, T) == d3_checks.canonical(h, C3, T), f"{move}: not the host's move"
        done[move] += 1
        if move == "62":
            continue  # undone by a (2,6) on the restored base: the (2,6)'s inverse below runs the (6,2)
        inv, x, j, inv_up = inverse(b, move, move_info(buf0, move, a, i, up))
        assert apply_jax(b, C3, T, inv, x, j, inv_up), f"the inverse of {move} was refused"
        assert d3_checks.canonical(b, C3, T) == ref, f"{move} then its inverse did not restore the state"
        done["62"] += inv == "62"
    d3_checks.check(b, C3, T)
    assert all(k >= 3 for k in done.values()) and refused > 10, (done, refused)


@functools.cache
def _outcomes(c3: int, t_n: int, batch: int):
    """jit: how many of ``batch`` single attempts (words from ``key``) from ``buf`` land exactly on each target
    (move counters ignored); the last entry counts every other outcome."""
    lay = d3_state.layout(c3, t_n)
    keep = np.ones(lay["size"][0], bool)
    keep[lay["attempts"][0] : lay["accepts"][0] + lay["accepts"][1]] = False

    def run(buf, targets, key, cp):
        bits = jax.random.bits(key, (batch, 4), jnp.uint32)
        out = jax.vmap(lambda w: d3_jax.attempt(buf, w, tuple(cp), c3, t_n, fix_n3=False, reference=False))(bits)
        hit = jnp.all((out[:, None, :] == targets[None]) | ~keep, -1)  # (batch, targets)
        return jnp.concatenate([hit.sum(0), (~hit.any(1)).sum()[None]])

    return jax.jit(run)


def _pair_test_jax(buf_a, buf_b, couplings, trials, seed):
    """P(A->B), P(B->A) and the error of log(P(A->B)/P(B->A)) from ``trials`` single JAX-engine attempts each."""
    batch = 2048
    run = _outcomes(C3, T, batch)
    cp = jnp.asarray(couplings, jnp.float32)

    def hits(a, b, s):
        targets = jnp.asarray(same_as(a, b, apply_jax))
        keys = jax.random.split(jax.random.key(s), trials // batch)
        return sum(int(run(jnp.asarray(a), targets, k, cp)[:-1].sum()) for k in keys)

    n_ab, n_ba = hits(buf_a, buf_b, seed), hits(buf_b, buf_a, seed + 1)
    n = (trials // batch) * batch
    assert n_ab > 200 and n_ba > 200, (n_ab, n_ba)
    return n_ab / n, n_ba / n, math.sqrt(1 / n_ab + 1 / n_ba), n


COUPLINGS = (1.3, 0.55, 0.01, 60.0)


@pytest.mark.slow
@pytest.mark.parametrize("move", ["26", "44", "23up", "23down"])
def test_detailed_balance_of_each_move_pair(move):
    """As the host test: P(A->B)/P(B->A) = pi(B)/pi(A) within 4 sigma, and P(A->B) = q min(1, R)."""
    buf_a = state(7)
    name, up = move[:2], not move.endswith("down")
    buf_b, _ = first_valid(buf_a, name, up, apply_jax)
    trials = {"26": 150_000, "44": 150_000, "23": 1_000_000}[name]
    p_ab, p_ba, rel, n = _pair_test_jax(buf_a, buf_b, COUPLINGS, trials, seed=11)
    dlog = log_weight(buf_b, *COUPLINGS, False) - log_weight(buf_a, *COUPLINGS, False)
    z = (math.log(p_ab / p_ba) - dlog) / rel
    assert abs(z) < 4, f"{move}: log P(A->B)/P(B->A) = {math.log(p_ab / p_ba):.4f}, log pi(B)/pi(A) = {dlog:.4f}"
    n31, n0 = count(buf_a, "n31"), count(buf_a, "n0")
    q = {"26": 1 / (6 * n31), "44": 2 / (9 * n31), "23": 1 / (36 * n31)}[name]
    expect = q * min(1.0, math.exp(dlog) * ({"26": n31 / (n0 + 1)}.get(name, 1.0)))
    assert abs(p_ab - expect) < 4 * math.sqrt(expect / n), f"{move}: P(A->B) = {p_ab:.5f}, expected {expect:.5f}"


def _series(engine: str, k0: float, chains: int, sweeps: int, key: int) -> dict[str, np.ndarray]:
    """(chains * kept sweeps,) series of n0, n22, n31 of ``chains`` chains at the law test's couplings (T = 4,
    target N(3,1) = 150), the first quarter of the sweeps dropped (thermalisation)."""
    st = cdt.metropolis_3d(k0, 0.6, target=150, eps=0.01, attempts_per_sweep=2000, engine=engine)
    keys = jax.random.split(jax.random.key(key), chains)
    ch = jax.vmap(lambda k: st.init(k, 4))(keys)
    _, obs = jax.vmap(lambda c: trajectory(st, c, sweeps, save_every=1, observe=cdt.observe_3d))(ch)
    cut = sweeps // 4
    return {k: np.asarray(obs[k])[:, cut:].astype(np.float64) for k in ("n0", "n22", "n31")}


def _law(s: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """<N22>/<N31> and <N0> with autocorrelation-corrected errors, the chains' series joined end to end (one series
    long enough for the autocorrelation time; the joins are a few of its ~10^3 measurements)."""
    flat = {k: v.reshape(-1) for k, v in s.items()}
    r, e, _ = d3_profile.ratio_with_error(flat["n22"], flat["n31"])
    n0, e0, _ = d3_profile.ratio_with_error(flat["n0"], np.ones_like(flat["n0"]))
    return {"n22/n31": (r, e), "n0": (n0, e0)}


@pytest.mark.slow
def test_law_agrees_with_the_host_engine_and_a_shifted_k0_is_rejected():
    """<N22>/<N31> and <N0> of the JAX engine vs the host engine (T = 4, target N(3,1) = 150) within 4 combined
    errors; the negative control: the JAX engine at k0 + 1.5 differs from the host at k0 by more than 4 errors (a
    larger k0 favours vertices: the volume term holds N(3,1), so <N0> = <N(3,1)>/2 + 2T rises)."""
    host = _law(_series("host", 1.0, 8, 160, 1))
    ours = _law(_series("jax", 1.0, 8, 160, 2))
    z = d3_profile.z_scores(ours, host)
    assert all(abs(x) < 4 for x in z.values()), (z, ours, host)
    shifted = _law(_series("jax", 2.5, 8, 160, 3))
    z_bad = d3_profile.z_scores(shifted, host)
    assert max(abs(x) for x in z_bad.values()) > 4, (z_bad, shifted, host)


def test_stepper_engine_jax_trajectory_and_chunked():
    st = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=300, engine="jax")
    assert st.params.engine == "jax"
    chain = st.init(jax.random.key(4), T)
    c1, o = trajectory(st, chain, 4, save_every=1, observe=cdt.observe_3d)
    d3_checks.check(c1.geometry.buf, c1.geometry.tetra_capacity, T)
    np.testing.assert_array_equal(o["n3"], o["n31"] + o["n22"])
    np.testing.assert_array_equal(o["n0"], o["n31"] // 4 + 2 * T)
    assert int(o["attempts"][-1].sum()) == 300
    advance = chunked(st, 2, save_every=1, observe=cdt.observe_3d)
    c2, o1 = advance(chain)
    c2, o2 = advance(c2)
    np.testing.assert_array_equal(c2.geometry.buf, c1.geometry.buf)
    np.testing.assert_array_equal(np.concatenate([o1["n3"], o2["n3"]]), o["n3"])


@pytest.mark.slow
@pytest.mark.parametrize("fix", ["n31", "n3"])
def test_stop_at_target_lands_on_the_target(fix):
    target = 60 if fix == "n31" else 200
    st = cdt.metropolis_3d(
        1.0, 1.0, target=target, eps=0.05, fix=fix, attempts_per_sweep=300, stop_at_target=True, engine="jax"
    )
    chain, o = trajectory(st, st.init(jax.random.key(4), T), 4, save_every=1, observe=cdt.observe_3d)
    d3_checks.check(chain.geometry.buf, chain.geometry.tetra_capacity, T)
    assert bool(np.all(o["at_target"])) and int(o["missed_target"][-1]) == 0
    np.testing.assert_array_equal(o["n3"] if fix == "n3" else o["n31"] // 2, target)
    assert int(o["attempts"][-1].sum()) >= 300


def test_overflow_is_flagged_and_the_state_stays_valid():
    st = cdt.metropolis_3d(3.0, 0.0, attempts_per_sweep=1500, engine="jax")  # no volume term: the volume grows
    chain, o = trajectory(st, st.init(jax.random.key(5), T, capacity=120), 2, save_every=1, observe=cdt.observe_3d)
    assert int(o["overflow"][-1]) == 1
    assert int(o["n3"][-1]) <= 120
    d3_checks.check(chain.geometry.buf, 120, T)


def test_index_draw_is_exact_floor_for_large_counts():
    """floor(word n / 2^32) in 32-bit limbs against Python integers, up to n = 2^31 - 1 (large (3,1) bags)."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, 4000, dtype=np.uint64)
    ns = np.concatenate([rng.integers(1, 2**31, 3000), rng.integers(1, 2**16, 1000)])
    got = np.asarray(jax.jit(d3_jax._mulhi)(jnp.asarray(words, jnp.uint32), jnp.asarray(ns, jnp.int32)))
    want = [(int(w) * int(n)) >> 32 for w, n in zip(words, ns, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_engine_is_validated_and_defaults_to_host():
    assert cdt.metropolis_3d(1.0, 0.6).params.engine == "host"
    with pytest.raises(ValueError, match="engine must be one of"):
        cdt.metropolis_3d(1.0, 0.6, engine="pallas")
    with pytest.raises(ValueError, match="scalar couplings"):
        couplings = (np.zeros(2), 0.0, 0.0, 0.0)
        d3_jax.sweep(jnp.zeros(10, jnp.int32), jax.random.key(0), couplings, d3_state.SweepPlan(1, 100, T))
    buf = np.array(d3_state.initial_state(T, C3).buf)
    with pytest.raises(ValueError, match="move must be one of"):
        apply_jax(buf, C3, T, "33", 0)
    with pytest.raises(ValueError, match="move must be one of"):
        d3_jax.proposal_words(buf, C3, T, "33", 0)
    with pytest.raises(ValueError, match="force=False"):
        apply_jax(buf, C3, T, "26", 0, force=False)
    with pytest.raises(ValueError, match="words must be four uint32"):
        d3_jax.apply_words(buf, np.zeros(3, np.uint32), C3, T)


def test_compiled_step_has_no_host_callback():
    """The JAX engine's sweep lowers to XLA alone (it can run on a GPU without the host); the host engine's step
    lowers to a callback, so the check can fail."""

    def lowered(engine):
        st = cdt.metropolis_3d(1.0, 0.6, target=60, eps=0.02, attempts_per_sweep=100, engine=engine)
        chain = st.init(jax.random.key(0), T)
        return jax.jit(st.step).lower(chain).as_text()

    assert "callback" in lowered("host")
    text = lowered("jax")
    assert "callback" not in text and "custom_call" not in text


@pytest.mark.slow  # thermalisation with the host engine, two compiles
def test_gpu_check_section_runs_quick():
    """The cdt3 section of bench.gpu_checks in its CPU-sized form (so it cannot rot between GPU runs)."""
    from ivhl_jax.bench import ops_cdt3_jax

    doc = ops_cdt3_jax.gpu_check(quick=True, chains=(2,))
    assert doc["no_host_callback"] is True
    (row,) = doc["rows"]
    assert row["chains"] == 2 and row["attempts_per_call"] == 2 * ops_cdt3_jax.QUICK.attempts
    assert 0 < row["acceptance"] < 1 and not row["overflow"] and row["attempts_per_s_aggregate"] > 0
    assert doc["host_one_chain"]["engine"] == "host" and doc["summary"]
