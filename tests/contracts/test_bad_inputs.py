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
from ivhl_jax.physics import cdt
from ivhl_jax.physics import mera as M
from ivhl_jax.run.io import write_json
from ivhl_jax.train import parallel

# ----------------------------------------------------------------------------------------- MERA

_TINY = M.MERAConfig(chi=2, layers=1, u_delay=0)


@pytest.mark.parametrize("n", [0, -1])
def test_mera_optimize_rejects_nonpositive_steps_per_chunk(n):
    # used to loop forever (chunk = min(0, steps) never advances)
    with pytest.raises(ValueError, match="steps_per_chunk"):
        M.optimize(_TINY, 3, steps_per_chunk=n)
    with pytest.raises(ValueError, match="steps_per_chunk"):
        M.make_advance(M.ising_two_site_hamiltonian(), n)


def test_mera_optimize_rejects_non_integer_steps_per_chunk():
    with pytest.raises(TypeError, match="steps_per_chunk"):
        M.optimize(_TINY, 3, steps_per_chunk=1.5)


def test_mera_old_keyword_names_the_new_one():  # issue 12: one vocabulary (one step = one sweep)
    with pytest.raises(TypeError, match="renamed to 'steps_per_chunk'"):
        M.optimize(_TINY, 3, sweeps_per_chunk=2)


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
    mera = M.init_mera(jax.random.key(0), _TINY)
    layer = mera.layer(0)  # fine sites d = 4
    h = M.ising_two_site_hamiltonian()
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
    mera = M.init_mera(jax.random.key(0), M.MERAConfig(chi=4, layers=1))
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
        M.init_mera(jax.random.key(0), _TINY, d=d)


def test_mera_rejects_negative_power_iters():
    with pytest.raises(ValueError, match="power_iters"):
        M.MERAConfig(chi=2, power_iters=-1).validate()
    with pytest.raises(ValueError, match="power_iters"):
        M.optimize(M.MERAConfig(chi=2, layers=1, power_iters=-1), 2)
    mera = M.init_mera(jax.random.key(0), _TINY)
    with pytest.raises(ValueError, match="power_iters"):
        M.sweep(mera, M.ising_two_site_hamiltonian(), power_iters=-1)
    with pytest.raises(ValueError, match="power_iters"):
        M.make_advance(M.ising_two_site_hamiltonian(), 1, power_iters=-1)
    with pytest.raises(ValueError, match="iters"):
        M.fixed_point_density(mera.layer(1), iters=-1)


@pytest.mark.parametrize("num", [0, -1])
def test_mera_scaling_dimensions_rejects_bad_num(num):
    mera = M.init_mera(jax.random.key(0), _TINY)
    with pytest.raises(ValueError, match="num must be >= 1"):
        M.scaling_dimensions(mera, num=num)
    assert M.scaling_dimensions(mera, num=2).shape == (2,)


# ------------------------------------------------------------------------------------ attention

_CPU_IMPLS = [("xla", {}), ("chunked", {"block_k": 4}), ("pallas", {"interpret": True, "block_q": 4, "block_k": 4}),
              ("auto", {})]


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
    return cdt.initial_state(4, 4, 64), cdt.make_params(0.8, attempts_per_sweep=5)


def test_cdt_run_chains_rejects_unreplicated_state(cdt_setup):
    state, params = cdt_setup
    # used to raise IndexError (tuple index out of range)
    with pytest.raises(ValueError, match=r"states must be a batch of chains.*cdt\.replicate"):
        cdt.run_chains(jax.random.key(0), state, params, 1)
    with pytest.raises(ValueError, match=r"state must be a single chain.*run_chains"):
        cdt.run(jax.random.key(0), cdt.replicate(state, 2), params, 1)
    with pytest.raises(TypeError, match="states must be a CDTState"):
        cdt.run_chains(jax.random.key(0), {"n0": 1}, params, 1)


@pytest.mark.parametrize("bad", [0, 7, np.zeros(3, np.uint32), np.zeros(2, np.float32)])
def test_cdt_rejects_non_key(cdt_setup, bad):
    state, params = cdt_setup
    with pytest.raises(TypeError, match=r"^key must be a PRNG key.*jax\.random\.key\(seed\)"):
        cdt.run(bad, state, params, 1)
    with pytest.raises(TypeError, match=r"^key must be a PRNG key"):
        cdt.run_chains(bad, cdt.replicate(state, 2), params, 1)


def test_cdt_accepts_typed_and_legacy_keys(cdt_setup):
    state, params = cdt_setup
    for key in (jax.random.key(1), jax.random.PRNGKey(1)):
        final, obs = cdt.run(key, state, params, 2)
        assert obs["n2"].shape == (2,)
        final, obs = cdt.run_chains(key, cdt.replicate(state, 2), params, 2)
        assert obs["n2"].shape == (2, 2)
    with pytest.raises(ValueError, match="key must be a single PRNG key"):
        cdt.run(jax.random.split(jax.random.key(1), 2), state, params, 1)
