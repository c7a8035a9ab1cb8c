"""The shared simulation driver (ivhl_jax.run.driver): help lists every key, config errors are one line with
exit status 2, Ctrl-C leaves the checkpoints and says how to resume, and the rerun resumes."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from ivhl_jax.run.driver import RunContext, Simulation, describe_config, run_main
from ivhl_jax.run.runner import run_chunked


@dataclasses.dataclass(frozen=True)
class CountConfig:
    steps: int = 6  # how many steps to count
    rate: float = 1.5  # added per step
    interrupt_at: int = -1  # raise KeyboardInterrupt after this many steps (-1: never)

    def validate(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def _run(cfg: CountConfig, ctx: RunContext) -> dict[str, str]:
    def advance(x):
        x = x + cfg.rate
        concrete = not isinstance(x, jax.core.Tracer)  # run_chunked first traces advance for its output shape
        if cfg.interrupt_at >= 0 and concrete and float(x[0]) >= cfg.interrupt_at * cfg.rate:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the next chunk
        return x, x[None]

    res = run_chunked(advance, jnp.zeros(1), n_chunks=cfg.steps, steps_per_chunk=1, checkpointer=ctx.checkpointer,
                      progress=False)
    path = os.path.join(ctx.out, "final.txt")
    with open(path, "w") as f:
        f.write(f"{float(res.state[0])} {res.resumed_from}")
    return {"final": path}


SIM = Simulation(prog="ivhl sim count", config_type=CountConfig, run=_run, default_out=lambda c, a: "runs/count",
                 extendable=("steps", "interrupt_at"), description="count", checkpoint_every=lambda c: 4)


def test_help_lists_every_key_with_type_default_and_meaning(capsys):
    with pytest.raises(SystemExit):
        run_main(SIM, ["--help"])
    out = capsys.readouterr().out
    for key, meaning in (("steps", "how many steps to count"), ("rate", "added per step")):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(key + " "))
        assert meaning in line
    assert "1.5" in out
    rows = describe_config(CountConfig)
    assert len(rows) == 3 and "int" in rows[0]


@pytest.mark.parametrize("bad, word", [(["--set", "bogus=1"], "bogus"), (["--set", "steps=abc"], "steps"),
                                       (["--set", "steps=0"], "steps"),
                                       (["--config", "/nonexistent.toml"], "not found")])
def test_config_errors_are_one_line_and_exit_2(bad, word, tmp_path, capsys):
    assert run_main(SIM, ["--out", str(tmp_path / "o"), *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_ctrl_c_keeps_checkpoints_and_the_rerun_resumes(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert run_main(SIM, ["--out", out, "--set", "interrupt_at=3"]) == 130
    err = capsys.readouterr().err
    # checkpoints every 4 steps (checkpoint_every); Ctrl-C during the third step checkpoints the two completed
    assert "interrupted at step 2; checkpoint at step 2 written" in err
    assert "rerun the same command to resume" in err and "Traceback" not in err
    assert run_main(SIM, ["--out", out]) == 0
    value, resumed = open(os.path.join(out, "final.txt")).read().split()
    assert float(value) == 6 * 1.5 and resumed == "2"


def test_a_different_configuration_is_refused(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert run_main(SIM, ["--out", out]) == 0
    assert run_main(SIM, ["--out", out, "--set", "rate=2.0"]) == 2
    assert "rate" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["holography", "cdt", "bec", "mera", "train_vortex_gru", "train_adaptive",
                                    "train_lm"])
def test_ported_simulations_document_every_key(module):
    import importlib

    sim = importlib.import_module(f"ivhl_jax.sims.{module}").SIMULATION
    for row in describe_config(sim.config_type):
        assert len(row.split()) >= 4, f"{module}: config key without a meaning: {row.strip()}"


def test_sigint_to_a_real_run_ends_with_one_clean_line_and_resumes(tmp_path):
    """Ctrl-C as a user sends it: SIGINT to `ivhl sim holography` while it runs."""
    import signal
    import subprocess
    import sys
    import time

    out = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "ivhl_jax.cli", "sim", "holography", "--out", out, "--set", "n_sources=8",
           "--set", "grid=[16, 16]", "--set", "steps=4000", "--set", "steps_per_chunk=2",
           "--set", "checkpoint_every=1000"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.time()
    # wait for the run to be inside its chunk loop (the first progress line goes to stderr)
    line = ""
    while time.time() - t0 < 120:
        line = p.stderr.readline()
        if "holography:" in line and "steps" in line:
            break
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted at step" in err and "rerun the same command" in err
    assert "checkpoint at step" in err


def test_help_shows_the_embedded_defaults_of_a_nested_config():
    from ivhl_jax.sims import train_lm

    rows = {r.split()[0]: r for r in describe_config(train_lm.TrainLMConfig)}
    embedded = train_lm.TrainLMConfig().model
    assert rows["model.d_model"].split()[2] == str(embedded.d_model) != "512"
    assert rows["model.n_layers"].split()[2] == str(embedded.n_layers)


def test_the_cli_turns_on_the_persistent_compilation_cache(tmp_path):
    import subprocess
    import sys

    code = ("from ivhl_jax import cli; cli._persistent_cache(); import jax; "
            "print(jax.config.jax_compilation_cache_dir)")
    env = {k: v for k, v in os.environ.items() if k != "IVHL_COMPILATION_CACHE"}
    env["IVHL_COMPILATION_CACHE_DIR"] = str(tmp_path / "xla")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(tmp_path / "xla")
    env["IVHL_COMPILATION_CACHE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() in ("None", "")
