"""Shared infrastructure: packaging, validation, precision/loss scaling, checkpoints, rollout, config, CLI."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax import checkpoint, config, precision, rollout, runner, validation

ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu",
                            reason="the suite emulates 8 CPU devices; an accelerator has as many as it has")


@ON_CPU
def test_eight_devices_emulated():
    assert jax.device_count() == 8


@pytest.mark.parametrize("name", ["ivhl_jax.models", "ivhl_jax.sims", "ivhl_jax.bench", "ivhl_jax.bench.harness"])
def test_namespaced_subpackages_import(name):
    assert importlib.import_module(name) is not None


def test_no_bare_top_level_packages_installed():
    # From outside the repo, `models`/`sims`/`bench` must not be importable as bare names.
    code = "import importlib.util as u; print([n for n in ('models','sims','bench') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- validation
def test_check_array_names_argument():
    with pytest.raises(ValueError, match="points must have shape \\(\\*, 3\\)"):
        validation.check_array(np.zeros((4, 2)), "points", shape=(None, 3))
    with pytest.raises(TypeError, match="charges must have a integer dtype"):
        validation.check_array(np.zeros(3), "charges", kind="integer")
    with pytest.raises(ValueError, match="psi contains NaN"):
        validation.check_array(np.array([1.0, np.nan]), "psi", finite=True)
    with pytest.raises(ValueError, match="dt must be > 0"):
        validation.check_scalar(-0.1, "dt", positive=True)
    with pytest.raises(ValueError, match="amplitudes must be a scalar or have shape \\(5,\\)"):
        validation.check_broadcastable(np.ones(4), "amplitudes", 5, "sources")


def test_checked_catches_nan_inside_jit():
    def f(x):
        y = jnp.log(x)
        validation.check_finite_tree({"y": y}, "state")
        return y

    g = validation.checked(f, float_checks=False)
    assert np.isfinite(g(jnp.ones(3))).all()
    with pytest.raises(FloatingPointError, match="state\\['y'\\] became NaN or inf"):
        g(-jnp.ones(3))


# ---------------------------------------------------------------- precision
def test_policies():
    bf16 = precision.get_policy("bf16")
    assert bf16.param_dtype == jnp.float32 and bf16.compute_dtype == jnp.bfloat16 and bf16.output_dtype == jnp.float32
    tree = {"w": jnp.ones(2), "ids": jnp.arange(2), "psi": jnp.ones(2, jnp.complex64)}
    c = bf16.cast_to_compute(tree)
    assert c["w"].dtype == jnp.bfloat16 and c["ids"].dtype == tree["ids"].dtype and c["psi"].dtype == jnp.complex64
    assert precision.get_policy("params=float32,compute=float16,output=float32") == precision.get_policy("fp16")
    assert precision.get_policy("fp16").needs_loss_scaling and not bf16.needs_loss_scaling
    with pytest.raises(ValueError, match="neither a preset"):
        precision.get_policy("fp8")


def test_dynamic_loss_scale_skips_overflowing_fp16_step():
    """An fp16 step whose scaled gradient overflows is skipped, the scale halves, nothing is NaN."""
    import optax

    params = {"w": jnp.array([1.0, -2.0], jnp.float32)}
    opt = optax.sgd(0.1)
    policy = precision.get_policy("fp16")

    def loss_fn(p, x):
        pc = policy.cast_to_compute(p)
        return jnp.sum((pc["w"] * x.astype(jnp.float16)) ** 2)

    @jax.jit
    def train_step(p, opt_state, ls, x):
        grads = jax.grad(lambda q: ls.scale(loss_fn(q, x)))(p)
        grads = ls.unscale(grads)
        finite = precision.all_finite(grads)
        updates, new_opt = opt.update(grads, opt_state, p)
        new_p = optax.apply_updates(p, updates)
        p = precision.select_tree(finite, new_p, p)
        opt_state = precision.select_tree(finite, new_opt, opt_state)
        return p, opt_state, ls.adjust(finite), finite

    ls = precision.DynamicLossScale.create(initial=2.0**15, period=2)
    st = opt.init(params)
    # Large input: loss * 2^15 overflows fp16 (max 65504) -> inf gradient.
    p1, st1, ls1, ok = train_step(params, st, ls, jnp.array([300.0, 300.0]))
    assert not bool(ok)
    np.testing.assert_array_equal(p1["w"], params["w"])
    assert float(ls1.loss_scale) == 2.0**14
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves((p1, st1, ls1)))
    # A small input is finite: the update happens; after `period` finite steps the scale doubles.
    p2, st2, ls2, ok = train_step(p1, st1, ls1, jnp.array([0.01, 0.01]))
    assert bool(ok) and not np.array_equal(p2["w"], p1["w"])
    p3, st3, ls3, ok = train_step(p2, st2, ls2, jnp.array([0.01, 0.01]))
    assert bool(ok) and float(ls3.loss_scale) == 2.0**15


# ---------------------------------------------------------------- randomness, rollout, runner, checkpoint
def _noisy_step(state, params):
    key, sub = jax.random.split(state["key"])
    x = state["x"] * params["decay"] + 0.1 * jax.random.normal(sub, state["x"].shape)
    return {"key": key, "x": x}


def test_same_key_bit_identical():
    s0 = {"key": jax.random.key(42), "x": jnp.zeros(16)}
    f = jax.jit(lambda s: rollout.rollout(_noisy_step, s, {"decay": 0.9}, 50)[0]["x"])
    np.testing.assert_array_equal(f(s0), f(s0))
    s1 = {"key": jax.random.key(43), "x": jnp.zeros(16)}
    assert not np.array_equal(f(s0), f(s1))


def test_rollout_matches_manual_loop_and_remat_grad():
    step = lambda s, p: s + p * jnp.sin(s)
    s0 = jnp.linspace(0, 1, 5)
    final, obs = rollout.rollout(step, s0, 0.1, 12, save_every=4, observe=lambda s, p: s.sum())
    ref = s0
    sums = []
    for i in range(12):
        ref = step(ref, 0.1)
        if (i + 1) % 4 == 0:
            sums.append(ref.sum())
    np.testing.assert_allclose(final, ref, rtol=1e-6)
    np.testing.assert_allclose(obs, np.array(sums), rtol=1e-6)
    g1 = jax.grad(lambda p: rollout.rollout(step, s0, p, 12, save_every=4)[0].sum())(0.1)
    g2 = jax.grad(lambda p: rollout.rollout(step, s0, p, 12, save_every=4, remat=True)[0].sum())(0.1)
    np.testing.assert_allclose(g1, g2, rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of save_every"):
        rollout.rollout(step, s0, 0.1, 10, save_every=4)


def test_checkpoint_resume_bit_exact(tmp_path):
    """2K steps straight == K steps, checkpoint, restore in a new manager, K more."""
    params = {"decay": 0.97}
    adv = jax.jit(lambda s: rollout.rollout(_noisy_step, s, params, 10, save_every=5,
                                            observe=lambda s, p: jnp.mean(s["x"] ** 2)))
    s0 = {"key": jax.random.key(0), "x": jnp.ones(32, jnp.float32)}
    straight = runner.run_chunked(adv, s0, n_chunks=8, steps_per_chunk=10, progress=False)
    with checkpoint.Checkpointer(tmp_path / "ck", save_every=20) as ck:
        first = runner.run_chunked(adv, s0, n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False,
                                   metadata={"cursor": 7})
        assert ck.latest_step() == 40 and first.resumed_from is None
    with checkpoint.Checkpointer(tmp_path / "ck", save_every=20) as ck:
        resumed = runner.run_chunked(adv, s0, n_chunks=8, steps_per_chunk=10, checkpointer=ck, progress=False)
    assert resumed.resumed_from == 40 and resumed.metadata == {"cursor": 7}
    np.testing.assert_array_equal(resumed.state["x"], straight.state["x"])
    np.testing.assert_array_equal(jax.random.key_data(resumed.state["key"]), jax.random.key_data(straight.state["key"]))
    np.testing.assert_array_equal(resumed.history, straight.history)


@ON_CPU
def test_checkpoint_dtypes_and_restore_onto_other_mesh(tmp_path):
    mesh8 = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    mesh4 = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    state = {
        "f32": jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(mesh8, P("x"))),
        "bf16": jnp.linspace(0, 1, 8, dtype=jnp.bfloat16),
        "c64": (jnp.arange(4) + 1j * jnp.arange(4)).astype(jnp.complex64),
        "key": jax.random.key(7),
    }
    with checkpoint.Checkpointer(tmp_path, keep=2) as ck:
        for s in (1, 2, 3):
            ck.save(s, state)
        assert ck.all_steps() == [2, 3]
        _, same, meta = ck.restore(state)
        assert meta is None
        for k in ("f32", "bf16", "c64"):
            assert same[k].dtype == state[k].dtype
            np.testing.assert_array_equal(np.asarray(same[k]), np.asarray(state[k]))
        np.testing.assert_array_equal(jax.random.key_data(same["key"]), jax.random.key_data(state["key"]))
        target = {"f32": NamedSharding(mesh4, P("x")), "bf16": NamedSharding(mesh4, P()),
                  "c64": NamedSharding(mesh4, P()), "key": NamedSharding(mesh4, P())}
        _, moved, _ = ck.restore(state, sharding=target)
        assert moved["f32"].sharding.mesh.shape == {"x": 4}
        np.testing.assert_array_equal(np.asarray(moved["f32"]), np.asarray(state["f32"]))
        with pytest.raises(FileNotFoundError, match="no checkpoint for step 9"):
            ck.restore(state, step=9)


# ---------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 4
    dt: float = 0.1
    grid: tuple[int, int] = (8, 8)
    name: str = "a"

    def validate(self):
        if self.dt <= 0:
            raise ValueError(f"dt must be > 0, got {self.dt}")


def test_config_loading(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('n = 7\ngrid = [16, 32]\n')
    cfg = config.load_config(_Cfg, f, ["dt=0.5", "name=xyz"])
    assert cfg == _Cfg(n=7, dt=0.5, grid=(16, 32), name="xyz")
    with pytest.raises(ValueError, match="unknown config key\\(s\\) \\['nn'\\]"):
        config.load_config(_Cfg, None, ["nn=3"])
    with pytest.raises(TypeError, match="config key 'n' must be an integer"):
        config.load_config(_Cfg, None, ["n=1.5"])
    with pytest.raises(ValueError, match="dt must be > 0"):
        config.load_config(_Cfg, None, ["dt=-1"])


# ---------------------------------------------------------------- device + CLI
@ON_CPU
def test_device_report_and_cli_info(capsys):
    from ivhl_jax import cli, device

    rep = device.device_report()
    assert rep["device_count"] == 8 and rep["versions"]["jax"] == jax.__version__
    assert "no-op" in device.configure(gpu_autotune_level=2)["gpu_autotune_level"]
    assert cli.main(["info"]) == 0
    assert "platform" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2


def test_compilation_cache_writes_entries(tmp_path):
    code = (
        "import jax, jax.numpy as jnp, os, sys\n"
        "from ivhl_jax.run.device import enable_compilation_cache\n"
        f"d = enable_compilation_cache({str(tmp_path)!r}, min_compile_time_s=0)\n"
        "jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()\n"
        "print(len(os.listdir(d)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) >= 1


def test_check_array_finite_on_constant_inside_jit():
    const = np.array([1.0, 2.0], np.float32)

    @jax.jit
    def f(x):
        return x + validation.check_array(const, "const", finite=True)

    np.testing.assert_array_equal(f(jnp.ones(2)), [2.0, 3.0])
