"""The stepper protocol (ivhl_jax.numerics.rollout): a family contract over the steppers, and compile-once.

For every stepper: ``trajectory`` under jit and vmap (over states), the same key gives the same bits,
chunked driving equals one trajectory, and a second call with new values compiles nothing.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ivhl_jax
from ivhl_jax import cdt, fields
from ivhl_jax.numerics.rollout import Stepper, chunked, identity_observe, trajectory


class _CompileCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "Compiling" in msg or "compiling" in msg:
            self.messages.append(msg)


def count_compiles(fn, *args, **kwargs):
    """(result, number of XLA compilations logged while running ``fn``)."""
    handler = _CompileCounter()
    logger = logging.getLogger("jax")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles(True):
            out = fn(*args, **kwargs)
            jax.block_until_ready(out)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return out, len(handler.messages)


def _cdt_case(seed=0, lam=0.8):
    st = cdt.metropolis(lam, attempts_per_sweep=50)
    return st, st.init(jax.random.key(seed), 4, 5, 200), cdt.observe


def _wave_case(seed=0, dt=0.05):
    rng = np.random.default_rng(seed)
    pts = rng.uniform(-1, 1, (24, 3)).astype(np.float32)
    src = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    st = fields.superposition(pts, src, amplitudes=1.0, wavenumbers=rng.uniform(5, 7, 5), phases=0.0, dt=dt)
    return st, st.init(), fields.observe


def _leaves(tree):
    """Leaves as NumPy arrays (typed PRNG keys through their key data)."""
    return [
        np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in jax.tree.leaves(tree)
    ]


def _gp_case(seed=0, dt=2e-3):
    from ivhl_jax import condensate as C

    grid = C.Grid.uniform(32, 12.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 20.0)
    st = C.strang(system, dt)
    psi = C.gaussian(grid, 1.0, 1.0, center=[0.3 * seed]).astype(jnp.complex64)
    return st, st.init(psi), C.observe


def _gft_case(seed=0, dt=1e-2):
    from ivhl_jax import gft as G

    st = G.strang(G.GFTSystem.create((6, 6), -0.5, 0.1), dt)
    kr, ki = jax.random.split(jax.random.key(seed))
    phi = 0.5 * jax.lax.complex(jax.random.normal(kr, (6, 6)), jax.random.normal(ki, (6, 6)))
    return st, st.init(phi), G.observe


def _mera_case(seed=0):
    from ivhl_jax import mera as M

    # float32 on request (the contracts here are about the stepper, not its precision; float64 needs x64), from the
    # unsymmetric start (the chain's term without its parity): the symmetric start's exactly degenerate blocks make
    # float32 vmap and pmap differ by round-off amplified to ~1e-5 within 4 sweeps
    model = M.two_site(np.asarray(M.ising().term))
    st = M.evenbly_vidal(model, M.MERAConfig(chi=3, chi_mid=2, layers=1, u_delay=1), policy="f32")
    return st, st.init(jax.random.key(seed)), M.observe


def _adaptive_case(seed=0):
    from ivhl_jax import adaptive

    cfg = adaptive.AdaptiveConfig(num_nodes=6, hidden_dim=4, input_dim=5, output_dim=3)
    w = adaptive.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (2, 5))
    st = adaptive.dynamics(w, x, cfg)
    return st, st.init(jax.random.key(seed)), adaptive.observe


def _gru_case(seed=0):
    from ivhl_jax import gru

    w = gru.init_params(jax.random.key(0), 3, 5)
    xs = jax.random.normal(jax.random.key(1), (12, 2, 3))
    st = gru.recurrence(w, xs)
    return st, st.init(0.1 * jax.random.normal(jax.random.key(seed), (2, 5))), gru.observe


# Every family's builder, with a small case and the family's own ``observe``: the contract below runs on each.
CASES = {
    "cdt.metropolis": _cdt_case,
    "fields.superposition": _wave_case,
    "condensate.strang": _gp_case,
    "gft.strang": _gft_case,
    "mera.evenbly_vidal": _mera_case,
    "adaptive.dynamics": _adaptive_case,
    "gru.recurrence": _gru_case,
}
# The families whose trajectory is differentiable in its (floating or complex) initial state.
DIFFERENTIABLE = {"fields.superposition", "condensate.strang", "gft.strang", "gru.recurrence"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_second_call_with_new_values_compiles_nothing(name):
    st, s0, obs = CASES[name]()
    trajectory(st, s0, 4, save_every=2, observe=obs)  # warm
    st2, s1, _ = CASES[name](seed=1)
    _, n = count_compiles(trajectory, st2, s1, 4, save_every=2, observe=obs)
    assert n == 0, f"{name}: second call compiled {n} programs"


def test_compile_counter_sees_a_real_compile():
    # the counter must be able to fail: a new shape compiles
    st, s0, obs = _wave_case()
    trajectory(st, s0, 4, save_every=2, observe=obs)
    _, n = count_compiles(trajectory, st, s0, 6, save_every=2, observe=obs)
    assert n >= 1


def test_cdt_chains_by_vmap_compile_once_with_the_family_observe():
    """Many chains are the one door under vmap: ``trajectory`` of ``cdt.metropolis`` with ``cdt.observe``;
    new couplings and new keys compile nothing, and each vmapped chain equals its own single run."""
    st = cdt.metropolis(0.8, attempts_per_sweep=50)
    chains = jax.vmap(lambda k: st.init(k, 4, 5, 200))(jax.random.split(jax.random.key(3), 3))

    def many(stepper, chains):
        return jax.vmap(lambda c: trajectory(stepper, c, 4, save_every=2, observe=cdt.observe))(chains)

    run = jax.jit(many)
    final, obs = run(st, chains)
    assert obs["lengths"].shape == (3, 2, 4)
    st2 = cdt.metropolis(0.9, attempts_per_sweep=50)
    chains2 = jax.vmap(lambda k: st.init(k, 4, 5, 200))(jax.random.split(jax.random.key(4), 3))
    _, n = count_compiles(run, st2, chains2)
    assert n == 0
    one = jax.tree_util.tree_map(lambda x: x[1], chains)
    final1, obs1 = trajectory(st, one, 4, save_every=2, observe=cdt.observe)
    for a, b in zip(_leaves((final1, obs1)), _leaves(jax.tree_util.tree_map(lambda x: x[1], (final, obs)))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_key_same_bits_and_jit(name):
    st, s0, obs = CASES[name]()
    a = trajectory(st, s0, 4, observe=obs)
    again = trajectory(st, s0, 4, observe=obs)
    for x, y in zip(_leaves(a), _leaves(again)):
        np.testing.assert_array_equal(x, y)
    # inside a caller's jit the loop is inlined and re-fused: equal to float32 round-off
    b = jax.jit(lambda s: trajectory(st, s, 4, observe=obs))(s0)
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_over_states_equals_one_by_one(name):
    st, s0, obs = CASES[name]()
    _, s1, _ = CASES[name](seed=1)
    if name == "fields.superposition":  # same params, two different start times
        s1 = st.init(0.3)
    batch = jax.tree.map(lambda x, y: jnp.stack([x, y]), s0, s1)
    fb, ob = jax.vmap(lambda s: trajectory(st, s, 4, save_every=2, observe=obs))(batch)
    for i, s in enumerate((s0, s1)):
        f, o = trajectory(st, s, 4, save_every=2, observe=obs)
        for x, y in zip(_leaves((f, o)), _leaves(jax.tree.map(lambda z, i=i: z[i], (fb, ob)))):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunked_equals_one_trajectory(name):
    st, s0, obs = CASES[name]()
    f, o = trajectory(st, s0, 8, save_every=2, observe=obs)
    adv = chunked(st, 4, save_every=2, observe=obs)
    s, chunks = s0, []
    for _ in range(2):
        s, c = adv(s)
        chunks.append(c)
    o2 = jax.tree.map(lambda *xs: jnp.concatenate(xs), *chunks)
    for x, y in zip(_leaves((f, o)), _leaves((s, o2))):
        np.testing.assert_array_equal(x, y)


def test_wave_evolution_matches_float64_numpy_field():
    st, s0, _ = _wave_case(dt=0.1)
    p = st.params
    f, _ = trajectory(st, s0, 3)
    t = 0.3  # the state after 3 steps holds the frame at 3 dt
    r = np.linalg.norm(np.asarray(p.points, np.float64)[:, None] - np.asarray(p.sources, np.float64)[None], axis=-1)
    k = np.asarray(p.wavenumbers, np.float64)
    ref = np.sum(np.exp(1j * (k * r - k * t)) / (r + float(p.softening)), axis=1)
    np.testing.assert_allclose(np.asarray(f.field), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    np.testing.assert_allclose(float(f.t), 0.3, rtol=1e-6)


def test_grad_through_the_wave_trajectory_matches_finite_differences():
    st, s0, _ = _wave_case()

    def loss(dt):
        p = st.params.replace(dt=dt)
        f, _ = trajectory(
            Stepper.create(st.step_fn, p, init_fn=st.init_fn), s0, 4, save_every=4, observe=identity_observe
        )
        return jnp.sum(f.intensity_sum)

    g = jax.grad(loss)(jnp.float32(0.05))
    h = 1e-3
    fd = (loss(jnp.float32(0.05 + h)) - loss(jnp.float32(0.05 - h))) / (2 * h)
    np.testing.assert_allclose(float(g), float(fd), rtol=2e-2)


def test_bad_stepper_arguments_are_named():
    st, s0, _ = _wave_case()
    with pytest.raises(TypeError, match="stepper"):
        trajectory(lambda s: s, s0, 2)
    with pytest.raises(ValueError, match="save_every"):
        trajectory(st, s0, 5, save_every=2)
    with pytest.raises(TypeError, match="observe"):
        trajectory(st, s0, 2, observe=3)
    with pytest.raises(TypeError, match="lam"):
        cdt.metropolis({"lam": 1.0})
    with pytest.raises(TypeError, match="points"):
        fields.superposition({"dt": 1.0}, None, amplitudes=1.0, wavenumbers=1.0, phases=0.0, dt=1.0)
    assert ivhl_jax.trajectory is trajectory


def test_mera_stepper_equals_sweeps_by_hand_and_compiles_once():
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera.sweep import sweep

    cfg = M.MERAConfig(chi=4, layers=1, u_delay=2)
    with jax.enable_x64(True):
        st = M.evenbly_vidal(M.ising(), cfg)
        s0 = st.init(jax.random.key(1))
        final, energies = trajectory(st, s0, 6, observe=M.observe)
        one = jax.jit(lambda m, h: sweep(m, h, cfg.power_iters, cfg.u_delay, cfg.refsym, cfg.si_scales))
        m, e_ref = s0.mera, []
        for _ in range(6):
            m, e = one(m, st.params.h)
            e_ref.append(float(e))
        np.testing.assert_allclose(np.asarray(energies), e_ref, rtol=1e-12, atol=1e-14)
        # energies decrease towards the exact critical Ising value -4/pi from above after the first sweeps
        assert float(energies[-1]) > -4 / np.pi - 1e-9 and float(energies[-1]) < float(energies[1])
        s1 = st.init(jax.random.key(2))
        _, n = count_compiles(trajectory, st, s1, 6, observe=M.observe)
        assert n == 0
        with pytest.raises(TypeError, match="model"):
            M.evenbly_vidal(M.models.ising_two_site_hamiltonian(), cfg)


def test_gru_recurrence_equals_steps_by_hand():
    from ivhl_jax import gru

    w = gru.init_params(jax.random.key(0), 3, 5)
    xs = jax.random.normal(jax.random.key(1), (7, 2, 3))
    h0 = jnp.zeros((2, 5))
    st = gru.recurrence(w, xs)
    final, obs = trajectory(st, st.init(h0), 7, observe=gru.observe)
    h, hs = h0, []
    for t in range(7):
        h = gru.cell(w, h, xs[t])
        hs.append(h)
    np.testing.assert_allclose(np.asarray(obs), np.stack(hs), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(final.h), np.asarray(h), rtol=1e-6, atol=1e-6)
    assert st.max_steps == 7  # the input's length: trajectory refuses an 8th step
    _, n = count_compiles(trajectory, gru.recurrence(w, xs + 1.0), st.init(h0), 7, observe=gru.observe)
    assert n == 0
    with pytest.raises(ValueError, match="h0"):
        st.init(jnp.zeros((3, 5)))
    with pytest.raises(ValueError, match="W_h"):
        gru.recurrence({**w, "W_h": jnp.zeros((5, 10))}, xs)


def test_adaptive_dynamics_stepper_follows_step_and_compiles_once():
    from ivhl_jax import adaptive

    cfg = adaptive.AdaptiveConfig(num_nodes=6, hidden_dim=4, input_dim=5, output_dim=3)
    w = adaptive.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (2, 5))
    st = adaptive.dynamics(w, x, cfg)
    s0 = st.init(jax.random.key(2))
    final, obs = trajectory(st, s0, 3, observe=adaptive.observe)
    # the same three steps by hand with the same key stream
    nodes, key = adaptive.init_state(cfg, 2), jax.random.key(2)
    for _ in range(3):
        key, sub = jax.random.split(key)
        nodes, out = adaptive.step(w, nodes, x, sub, cfg)
    np.testing.assert_allclose(np.asarray(obs["logits"][-1]), np.asarray(out["logits"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(obs["phase"][-1]), np.asarray(out["phase"]))
    np.testing.assert_allclose(np.asarray(obs["phase_fractions"]).sum(-1), 1.0, rtol=1e-6)
    # apply_sequence runs the same trajectory (K = inner_steps) per input from a given node state
    cfg3 = adaptive.AdaptiveConfig(num_nodes=6, hidden_dim=4, input_dim=5, output_dim=3, inner_steps=3)
    k1 = jax.random.split(jax.random.key(9), 1)[0]
    final3, _ = trajectory(adaptive.dynamics(w, x, cfg3), st.init(k1, adaptive.init_state(cfg, 2)), 3)
    nodes3, out3 = adaptive.apply_sequence(w, x[None], cfg3, jax.random.key(9), adaptive.init_state(cfg, 2))
    np.testing.assert_allclose(
        np.asarray(out3["logits"][0]), np.asarray(final3.outputs["logits"]), rtol=1e-6, atol=1e-7
    )
    _, n = count_compiles(
        trajectory, adaptive.dynamics(w, x + 1.0, cfg), st.init(jax.random.key(3)), 3, observe=adaptive.observe
    )
    assert n == 0
    with pytest.raises(ValueError, match="x"):
        adaptive.dynamics(w, jnp.zeros((2, 4)), cfg)
    with pytest.raises(ValueError, match="W_out"):
        adaptive.dynamics({**w, "W_out": jnp.zeros((7, 3))}, x, cfg)
    with pytest.raises(ValueError, match="nodes.h"):
        st.init(jax.random.key(0), adaptive.init_state(cfg, 3))
    with pytest.raises(TypeError, match="key"):
        st.init(3)


@pytest.mark.parametrize("name", sorted(CASES))
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(name, tmp_path):
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.train.checkpoint import Checkpointer

    st, s0, obs = CASES[name]()
    adv = chunked(st, 2, save_every=1, observe=obs)
    straight = run_chunked(adv, s0, n_chunks=4, steps_per_chunk=2, progress=False)
    with Checkpointer(str(tmp_path / "ck"), save_every=2) as ck:
        run_chunked(adv, s0, n_chunks=2, steps_per_chunk=2, checkpointer=ck, progress=False)  # "interrupted"
    with Checkpointer(str(tmp_path / "ck"), save_every=2) as ck:
        resumed = run_chunked(adv, s0, n_chunks=4, steps_per_chunk=2, checkpointer=ck, progress=False)
    assert resumed.resumed_from == 4
    for x, y in zip(_leaves((straight.state, straight.history)), _leaves((resumed.state, resumed.history))):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pmap_over_8_devices_equals_vmap(name):
    """pmap is a thin compatibility path (the library is built on jit + sharding): same numbers as vmap."""
    n = jax.local_device_count()
    if n < 2:
        pytest.skip("needs several devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    st, _, obs = CASES[name]()
    states = [CASES[name](seed=i)[1] for i in range(n)]
    if name == "fields.superposition":
        states = [st.init(0.1 * i) for i in range(n)]
    batch = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    run = lambda s: trajectory(st, s, 4, save_every=2, observe=obs)
    by_vmap = jax.vmap(run)(batch)
    by_pmap = jax.pmap(run)(batch)
    for x, y in zip(_leaves(by_vmap), _leaves(by_pmap)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)


def _inexact_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]


@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_grad_through_a_trajectory_matches_a_directional_difference(name):
    """d/dε of a scalar of the final state along a random direction of the start state: jvp == grad·v == FD."""
    st, s0, obs = CASES[name]()
    leaves, treedef = jax.tree.flatten(s0)
    idx = [i for i, x in enumerate(leaves) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    assert idx, f"{name}: no floating leaf to differentiate"
    keys = jax.random.split(jax.random.key(7), len(idx))
    direction = {}
    for k, i in zip(keys, idx):
        x = jnp.asarray(leaves[i])
        v = jax.random.normal(k, x.shape, jnp.float32)
        direction[i] = (v * (1 + 1j) if jnp.iscomplexobj(x) else v).astype(x.dtype)

    def start(eps):
        out = list(leaves)
        for i, v in direction.items():
            out[i] = (jnp.asarray(leaves[i]) + (eps * v).astype(v.dtype)).astype(jnp.asarray(leaves[i]).dtype)
        return jax.tree.unflatten(treedef, out)

    def scalar(eps):
        final, o = trajectory(st, start(eps), 4, save_every=2, observe=obs)
        return sum(jnp.sum(jnp.abs(x).astype(jnp.float32) ** 2) for x in _inexact_leaves((final, o)))

    g = jax.grad(scalar)(jnp.float32(0.0))
    assert np.isfinite(float(g))
    h = 1e-2
    fd = (scalar(jnp.float32(h)) - scalar(jnp.float32(-h))) / (2 * h)
    np.testing.assert_allclose(float(g), float(fd), rtol=3e-2, atol=1e-3 * (1 + abs(float(fd))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_donating_chunk_writes_in_place_and_equals_the_plain_one(name):
    """chunked(..., donate=True): the same numbers, and the state passed in is consumed (its buffers reused)."""
    st, s0, obs = CASES[name]()
    plain = chunked(st, 4, save_every=2, observe=obs)
    donating = chunked(st, 4, save_every=2, observe=obs, donate=True)
    expected = plain(s0)
    start = jax.tree.map(jnp.copy, s0)
    got = donating(start)
    for x, y in zip(_leaves(expected), _leaves(got)):
        np.testing.assert_array_equal(x, y)
    largest = max(jax.tree.leaves(start), key=lambda x: x.size)
    assert largest.is_deleted(), f"{name}: the largest state leaf was not donated"
