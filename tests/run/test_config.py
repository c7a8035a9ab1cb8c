"""ivhl_jax.run.config: TOML + --set overrides, nested overrides keep embedded defaults, run folders are locked."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

from ivhl_jax import config
from ivhl_jax.run.config import RunDirLockedError, load_config, lock_run_dir, prepare_run_dir, release_run_dir
from ivhl_jax.sims.train_lm import TrainLMConfig, _default_model


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


def test_lm_nested_override_keeps_embedded_model_defaults():
    cfg = load_config(TrainLMConfig, None, ["model.d_model=256"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256)
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.activation, cfg.model.d_ff) == (3, 4, "swiglu", 384)
    assert cfg.steps == TrainLMConfig().steps


def test_lm_nested_toml_table_keeps_embedded_model_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 100\n\n[model]\nd_model = 256\nn_heads = 8\n")
    cfg = load_config(TrainLMConfig, path, ["model.n_layers=2"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256, n_heads=8, n_layers=2)
    assert cfg.steps == 100


@dataclasses.dataclass(frozen=True)
class _Inner:
    a: int = 1
    b: str = "class"


@dataclasses.dataclass(frozen=True)
class _Middle:
    inner: _Inner = dataclasses.field(default_factory=lambda: _Inner(a=5, b="embedded"))
    c: float = 0.5


@dataclasses.dataclass(frozen=True)
class _Outer:
    middle: _Middle = dataclasses.field(default_factory=lambda: _Middle(inner=_Inner(a=7, b="outer"), c=2.0))
    optional: _Inner | None = None


def test_nested_overrides_update_every_level_field_by_field():
    cfg = load_config(_Outer, None, ["middle.inner.a=9"])
    assert cfg.middle == _Middle(inner=_Inner(a=9, b="outer"), c=2.0)
    cfg = load_config(_Outer, None, ["middle.c=3"])
    assert cfg.middle == _Middle(inner=_Inner(a=7, b="outer"), c=3.0)
    # A nested field with no embedded default is built from its class's defaults.
    assert load_config(_Outer, None, ["optional.a=4"]).optional == _Inner(a=4, b="class")
    with pytest.raises(ValueError, match=r"middle\.inner\.zz"):
        load_config(_Outer, None, ["middle.inner.zz=1"])


@dataclasses.dataclass(frozen=True)
class _LockCfg:
    n: int = 1


def test_run_dir_lock_conflicts_with_another_holder(tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    # flock is per open file description: a second open + flock conflicts even within one process.
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirLockedError, match=r"run.* is in use: another run holds its lock"):
            prepare_run_dir(out, _LockCfg(), resume=True)
        fcntl.flock(other, fcntl.LOCK_UN)
    try:
        assert prepare_run_dir(out, _LockCfg(), resume=True) == os.path.join(out, "ckpt")
        prepare_run_dir(out, _LockCfg(), resume=False)  # the holder itself may prepare the folder again
        with open(out / ".lock", "a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        release_run_dir(out)
    with open(out / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_run_dir_lock_between_processes(tmp_path):
    out = str(tmp_path / "run")
    code = textwrap.dedent(f"""
        import sys
        from ivhl_jax.run.config import lock_run_dir
        lock_run_dir({out!r})
        print("locked", flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLockedError, match="another run holds") as info:
            lock_run_dir(out)
        assert out in str(info.value) and f"pid {p.pid}" in str(info.value)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    try:
        lock_run_dir(out)  # the lock died with its process
    finally:
        release_run_dir(out)
