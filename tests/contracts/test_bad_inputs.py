"""Bad inputs fail early with a ValueError/TypeError that names the argument (and edge-case semantics).

Covers: MERA driver/tensor validation (and the sim CLI), attention's fully masked rows / zero keys /
scale, mesh construction, JSON file modes, CDT chain and key checks.
"""

from __future__ import annotations

import os
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.nn.attention import attention, reference_attention
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import cdt
from ivhl_jax.physics.tensornet import mera as M
from ivhl_jax.run.io import write_json
from ivhl_jax.train import parallel

# ----------------------------------------------------------------------------------------- MERA

_TINY = M.MERAConfig(chi=2, layers=1, u_delay=0)


def test_mera_config_is_checked_when_constructed():
    for bad in (0, -1, 1):
        with pytest.raises(ValueError, match="chi"):
            M.MERAConfig(chi=bad)
    with pytest.raises(TypeError, match="chi"):
        M.MERAConfig(chi=2.5)
    with pytest.raises(ValueError, match=r"chi needs one entry per layer"):
        M.MERAConfig(chi=(4, 6), layers=2)
    with pytest.raises(ValueError, match="scale-invariant layer maps chi to chi"):
        M.MERAConfig(chi=(4, 6), layers=1)


def test_mera_evenbly_vidal_names_a_blocked_pair_or_a_wrong_model():
    # a pair of (2,2,2,2) (or (4,4,4,4)) terms used to run silently: the library blocks the spin term itself
    h2 = jnp.zeros((2, 2, 2, 2))
    with pytest.raises(TypeError, match="model must be a mera model"):
        M.evenbly_vidal((h2, h2), _TINY)
    with pytest.raises(TypeError, match="model"):
        M.evenbly_vidal(h2, _TINY)
    with pytest.raises(ValueError, match=r"chi\[0\]=20 is more than layer 0 can carry"):
        M.evenbly_vidal(M.ising(), M.MERAConfig(chi=(20, 20), layers=1))
    skew = np.kron(np.diag([1.0, -1.0]), np.eye(2)).reshape(2, 2, 2, 2)  # Z ⊗ 1: h(a, b) != h(b, a)
    with pytest.raises(ValueError, match="refsym"):
        M.evenbly_vidal(M.two_site(skew), _TINY)
    with jax.enable_x64(True):  # the MERA computes in float64 (refused in one line without x64)
        M.evenbly_vidal(M.two_site(skew), M.MERAConfig(chi=2, layers=1, refsym=False))


def test_mera_two_site_term_is_validated():
    with pytest.raises(ValueError, match=r"term must have shape \(d, d, d, d\)"):
        M.two_site(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="term must be Hermitian"):
        M.two_site(np.arange(16.0).reshape(2, 2, 2, 2))
    bad = np.zeros((2, 2, 2, 2))
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="term contains NaN"):
        M.two_site(bad)
    with pytest.raises(ValueError, match="term must be real"):
        M.two_site(1j * np.eye(4).reshape(2, 2, 2, 2))


@pytest.mark.parametrize("n", [0, -5])
def test_mera_sim_cli_rejects_nonpositive_steps_per_chunk(n, tmp_path, capsys):
    from ivhl_jax.sims import mera as sim

    # used to raise ZeroDivisionError (n % steps_per_chunk)
    with pytest.raises(ValueError, match="steps_per_chunk"):
        sim.MERASimConfig(chis=(4,), steps=(2,), layers=(1,), steps_per_chunk=n).validate()
    rc = sim.main(["--set", f"steps_per_chunk={n}", "--out", str(tmp_path / "m"), "--no-progress"])
    assert rc == 2
    assert "steps_per_chunk" in capsys.readouterr().err


def test_mera_ascend_rejects_wrongly_shaped_h():
    mera = M.init_tensors(jax.random.key(0), _TINY)
    layer = mera.layer(0)  # fine sites d = 4
    h = M.models.ising_two_site_hamiltonian()
    M.ascend(h, layer)  # correct shape works
    with pytest.raises(ValueError, match=r"h\[0\].*\(4, 4, 4, 4\)"):
        M.ascend((jnp.zeros((2, 2, 2, 2)), h[1]), layer)
    with pytest.raises(ValueError, match=r"h\[1\]"):
        M.ascend((h[0], jnp.zeros((4, 4, 4))), layer)
    with pytest.raises(TypeError, match="h must be the pair"):
        M.ascend(h[0], layer)
    with pytest.raises(ValueError, match=r"rho\[0\]"):
        M.descend((jnp.zeros((4, 4, 4, 4)),) * 2, layer)  # coarse sites have chi = 2


def test_mera_grow_rejects_smaller_chi():
    mera = M.init_tensors(jax.random.key(0), M.MERAConfig(chi=4, layers=1))
    with pytest.raises(ValueError, match=r"chi=3 .*current bond dimension 4.*chi >= 4"):
        M.grow(mera, jax.random.key(1), 3)
    with pytest.raises(ValueError, match="chi_mid"):
        M.grow(mera, jax.random.key(1), 6, chi_mid=2)
    with pytest.raises(TypeError, match="chi"):
        M.grow(mera, jax.random.key(1), 4.5)
    assert M.grow(mera, jax.random.key(1), 4).chi == 4  # same chi is allowed (a no-op up to mix)


@pytest.mark.parametrize("d", [0, -2])
def test_mera_init_rejects_bad_d(d):
    with pytest.raises(ValueError, match="d must be >= 1"):
        M.init_tensors(jax.random.key(0), _TINY, d=d)


def test_mera_rejects_negative_power_iters():
    with pytest.raises(ValueError, match="power_iters"):
        M.MERAConfig(chi=2, power_iters=-1)
    mera = M.init_tensors(jax.random.key(0), _TINY)
    with pytest.raises(ValueError, match="power_iters"):
        M.sweep.sweep(mera, M.models.ising_two_site_hamiltonian(), power_iters=-1)
    with pytest.raises(ValueError, match="iters"):
        M.superoperators.fixed_point_density(mera.layer(1), iters=-1)


@pytest.mark.parametrize("num", [0, -1])
def test_mera_scaling_dimensions_rejects_bad_num(num):
    mera = M.init_tensors(jax.random.key(0), _TINY)
    with pytest.raises(ValueError, match="num must be >= 1"):
        M.scaling_dimensions(mera, num=num)
    with jax.enable_x64(True):
        assert M.scaling_dimensions(mera, num=2).shape == (2,)


# ------------------------------------------------------------------------------------ attention

_CPU_IMPLS = [
    ("xla", {}),
    ("chunked", {"block_k": 4}),
    ("pallas", {"interpret": True, "block_q": 4, "block_k": 4}),
    ("auto", {}),
]


def _qkv(B=2, T=7, N=2, H=4, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(3), 3)
    return tuple(jax.random.normal(k, (B, T, N, H), dtype) for k in ks)


@pytest.mark.parametrize("impl,kw", _CPU_IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_fully_masked_row_is_zero_in_every_implementation(impl, kw, causal):
    q, k, v = _qkv()
    B, T, N, _ = q.shape
    mask = np.ones((B, N, T, T), bool)
    mask[0, :, 2, :] = False  # query row 2 of batch 0 attends to nothing
    mask[1, 1, 5, :] = False  # query row 5 of batch 1, head 1
    mask = jnp.asarray(mask)
    out = attention(q, k, v, mask=mask, causal=causal, implementation=impl, **kw)
    np.testing.assert_array_equal(np.asarray(out[0, 2]), 0.0)
    np.testing.assert_array_equal(np.asarray(out[1, 5, 1]), 0.0)
    assert np.all(np.abs(np.asarray(out[1, 5, 0])) > 0)  # the other head of that row is not masked
    ref = reference_attention(q, k, v, mask=mask, causal=causal)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5)

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, mask=mask, causal=causal, implementation=impl, **kw) ** 2)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(grads[0][0, 2]), 0.0)  # nothing flows through a masked row


@pytest.mark.parametrize("impl,kw", _CPU_IMPLS)
def test_attention_all_keys_masked_key_padding_mask(impl, kw):
    q, k, v = _qkv(B=2, T=5)
    valid = jnp.asarray([[True] * 5, [False] * 5])  # batch 1 has no valid key at all
    out = attention(q, k, v, mask=valid[:, None, None, :], implementation=impl, **kw)
    np.testing.assert_array_equal(np.asarray(out[1]), 0.0)
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("impl", ["xla", "chunked", "pallas", "auto"])
def test_attention_rejects_zero_keys(impl):
    q, _, _ = _qkv()
    k = jnp.zeros((2, 0, 2, 4), jnp.float32)
    with pytest.raises(ValueError, match=r"^k must have at least one key"):
        attention(q, k, k, implementation=impl)
    with pytest.raises(ValueError, match=r"^k must"):
        reference_attention(q, k, k)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
@pytest.mark.parametrize("impl", ["xla", "chunked", "pallas"])
def test_attention_rejects_bad_scale(scale, impl):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^scale must"):
        attention(q, k, v, scale=scale, implementation=impl)
    with pytest.raises(ValueError, match=r"^scale must"):
        reference_attention(q, k, v, scale=scale)


# ------------------------------------------------------------------------------------- parallel


def test_make_mesh_rejects_empty_devices():
    with pytest.raises(ValueError, match="devices must be a non-empty"):
        parallel.make_mesh({"data": -1}, devices=[])
    with pytest.raises(ValueError, match="devices"):
        parallel.make_mesh(devices=())


@pytest.mark.parametrize("size", [2.5, "2", None, True])
def test_mesh_spec_rejects_non_integer_sizes(size):
    with pytest.raises(TypeError, match=r"axis 'tensor'.*positive integers \(or -1"):
        parallel.make_mesh({"data": -1, "tensor": size}, devices=jax.devices()[:1])
    with pytest.raises(TypeError, match=r"axis 'tensor'"):
        parallel.mesh_shape({"tensor": size}, 2)


def test_mesh_spec_integer_like_sizes_still_work():
    n = len(jax.devices())
    assert parallel.mesh_shape({"data": np.int64(-1), "tensor": np.int32(1)}, n) == {"data": n, "tensor": 1}


# ------------------------------------------------------------------------------------------- io


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_write_json_mode_follows_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = write_json(tmp_path / "sub" / "r.json", {"a": 1})
        with open(tmp_path / "plain.txt", "w") as f:  # what an ordinary open() gives, e.g. savefig
            f.write("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o666 & ~umask
    assert mode == stat.S_IMODE(os.stat(tmp_path / "plain.txt").st_mode)
    assert not [p for p in os.listdir(tmp_path / "sub") if p.endswith(".tmp")]


# ------------------------------------------------------------------------------------------ cdt


@pytest.fixture(scope="module")
def cdt_setup():
    return cdt.metropolis(0.8, attempts_per_sweep=5)


@pytest.mark.parametrize("bad", [0, 7, np.zeros(3, np.uint32), np.zeros(2, np.float32)])
def test_cdt_init_rejects_non_key(cdt_setup, bad):
    with pytest.raises(TypeError, match=r"^key must be a PRNG key.*jax\.random\.key\(seed\)"):
        cdt_setup.init(bad, 4, 4, 64)


def test_cdt_init_accepts_typed_and_legacy_keys(cdt_setup):
    for key in (jax.random.key(1), jax.random.PRNGKey(1)):
        chain, obs = trajectory(cdt_setup, cdt_setup.init(key, 4, 4, 64), 2, observe=cdt.observe)
        assert obs["n2"].shape == (2,)
    with pytest.raises(ValueError, match="key must be a single PRNG key"):
        cdt_setup.init(jax.random.split(jax.random.key(1), 2), 4, 4, 64)


def test_cdt_builder_validates_settings_and_observe_names_its_argument(cdt_setup):
    # the builder is the one door: it checks every setting
    with pytest.raises(ValueError, match="lam=0.5 <= ln 2"):
        cdt.metropolis(0.5)
    with pytest.raises(ValueError, match="eps"):
        cdt.metropolis(1.0, eps=-1.0, target=64.0)
    with pytest.raises(ValueError, match="even target"):
        cdt.metropolis(1.0, eps=0.1, target=65.0)
    with pytest.raises(ValueError, match="proposal='lists' needs engine='host'"):
        cdt.metropolis(1.0, proposal="lists")
    with pytest.raises(ValueError, match=r"capacity=70000 .*jax engine.*65536"):
        cdt_setup.init(jax.random.key(0), 4, 4, 70000)
    chain = cdt_setup.init(jax.random.key(0), 4, 4, 64)
    with pytest.raises(TypeError, match="chain must be a cdt.Chain.*chain.geometry"):
        cdt.observe(chain.geometry, cdt_setup.params)


# ------------------------------------------------------------------------- trajectory's start state


def _decay(state, params):
    return {"x": state["x"] * params, "key": state["key"]}


def test_trajectory_refuses_a_non_finite_start_naming_the_leaf():
    from ivhl_jax.numerics.rollout import Stepper, trajectory

    stepper = Stepper.create(_decay, jnp.float32(0.5))
    good = {"x": jnp.ones((4, 4), jnp.complex64), "key": jax.random.key(0)}
    bad = {"x": good["x"].at[1, 2].set(jnp.nan), "key": good["key"]}
    with pytest.raises(ValueError, match=r"state\['x'\] holds NaN or inf at the start.*initial state"):
        trajectory(stepper, bad, 10)
    final, _ = trajectory(stepper, good, 10)
    np.testing.assert_allclose(np.asarray(final["x"]).real, 0.5**10)
    # under a trace the values are unknown: nothing is checked (and nothing fails)
    jitted = jax.jit(lambda s: trajectory(stepper, s, 3)[0]["x"])
    assert bool(jnp.isnan(jitted(bad)).any())
    vmapped = jax.vmap(lambda x: trajectory(stepper, {"x": x, "key": good["key"]}, 3)[0]["x"])
    assert vmapped(jnp.stack([good["x"], bad["x"]])).shape == (2, 4, 4)
