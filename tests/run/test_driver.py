"""The shared simulation driver (ivhl_jax.run.driver): help lists every key, config errors are one line with
exit status 2, Ctrl-C leaves the checkpoints and says how to resume, and the rerun resumes."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from ivhl_jax.run.config import option
from ivhl_jax.run.driver import RunContext, Simulation, describe_config, run_main
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.sims._common import shared_key


@dataclasses.dataclass(frozen=True)
class CountConfig:
    steps: int = option(6, "how many steps to count")
    rate: float = option(1.5, "added per step")
    interrupt_at: int = option(-1, "raise KeyboardInterrupt after this many steps (-1: never)")

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

    res = run_chunked(
        advance, jnp.zeros(1), n_chunks=cfg.steps, steps_per_chunk=1, checkpointer=ctx.checkpointer, progress=False
    )
    path = os.path.join(ctx.out, "final.txt")
    with open(path, "w") as f:
        f.write(f"{float(res.state[0])} {res.resumed_from}")
    return {"final": path}


class CountSimulation(Simulation):
    prog = "ivhl sim count"
    config_type = CountConfig
    description = "count"
    extendable = ("steps", "interrupt_at")

    def run(self, cfg, ctx):
        return _run(cfg, ctx)

    def default_out(self, cfg, args):
        return "runs/count"

    def checkpoint_every(self, cfg):
        return 4


SIM = CountSimulation()


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


@pytest.mark.parametrize(
    "bad, word",
    [
        (["--set", "bogus=1"], "bogus"),
        (["--set", "steps=abc"], "steps"),
        (["--set", "steps=0"], "steps"),
        (["--config", "/nonexistent.toml"], "not found"),
    ],
)
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


@pytest.mark.parametrize(
    "module", ["holography", "cdt", "bec", "gft", "mera", "train_vortex_gru", "train_adaptive", "train_lm"]
)
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
    cmd = [
        sys.executable,
        "-m",
        "ivhl_jax.cli",
        "sim",
        "holography",
        "--out",
        out,
        "--set",
        "n_sources=8",
        "--set",
        "grid=[16, 16]",
        "--set",
        "steps=4000",
        "--set",
        "steps_per_chunk=2",
        "--set",
        "checkpoint_every=1000",
    ]
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

    code = "from ivhl_jax import cli; cli._persistent_cache(); import jax; print(jax.config.jax_compilation_cache_dir)"
    env = {k: v for k, v in os.environ.items() if k != "IVHL_COMPILATION_CACHE"}
    env["IVHL_COMPILATION_CACHE_DIR"] = str(tmp_path / "xla")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(tmp_path / "xla")
    env["IVHL_COMPILATION_CACHE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() in ("None", "")


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
    steps: int = option(40, "steps to run")
    steps_per_chunk: int = shared_key("steps_per_chunk", 10)
    save_every: int = shared_key("save_every", 5)
    checkpoint_every: int = option(20, "steps between checkpoints")
    warmup_steps: int = shared_key("warmup_steps", 8)
    ratio: float = option(
        0.5,
        "a meaning kept whole, however long it runs, never cut at a column: "
        ":func:`~ivhl_jax.run.driver.run_main` shows it as plain text",
    )
    choice: tuple[tuple[float, float], ...] = option(((0.0, 1.0),), "a long type must not shift the other columns")
    setup_fails: bool = option(False, "the simulation's own builder refuses the configuration")

    def validate(self):
        for k in ("steps", "steps_per_chunk", "save_every", "checkpoint_every"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1")
        if self.steps % self.steps_per_chunk or self.steps_per_chunk % self.save_every:
            raise ValueError("steps must be a multiple of steps_per_chunk, itself a multiple of save_every")
        if self.checkpoint_every % self.steps_per_chunk:
            raise ValueError("checkpoint_every must be a multiple of steps_per_chunk")
        if self.warmup_steps > self.steps:
            raise ValueError("warmup_steps must be <= steps")


def _run_chunks(cfg: ChunkConfig, ctx: RunContext) -> dict[str, str]:
    if cfg.setup_fails:
        raise ValueError("dt=5.0 is unstable on this grid;\n use dt <= 0.5")

    def advance(x):
        return x + 1.0, jnp.full((cfg.steps_per_chunk // cfg.save_every,), x[0])

    res = run_chunked(
        advance,
        jnp.zeros(1),
        n_chunks=cfg.steps // cfg.steps_per_chunk,
        steps_per_chunk=cfg.steps_per_chunk,
        checkpointer=ctx.checkpointer,
        progress=ctx.progress,
    )
    print(res.rate_line())
    path = os.path.join(ctx.out, "cfg.txt")
    with open(path, "w") as f:
        f.write(
            f"{cfg.steps} {cfg.steps_per_chunk} {cfg.save_every} {cfg.checkpoint_every} {cfg.warmup_steps} "
            f"{res.steps_run}"
        )
    return {"cfg": path}


class ChunkSimulation(Simulation):
    prog = "ivhl sim chunks"
    config_type = ChunkConfig
    description = "chunks"
    extendable = ("steps",)

    def run(self, cfg, ctx):
        return _run_chunks(cfg, ctx)

    def default_out(self, cfg, args):
        return "runs/chunks"

    def checkpoint_every(self, cfg):
        return cfg.checkpoint_every


CHUNK_SIM = ChunkSimulation()


@pytest.mark.parametrize("steps, want", [(1, "1 1 1 20 1"), (6, "6 6 1 24 6"), (40, "40 10 5 20 8")])
def test_a_run_shorter_than_a_chunk_is_clipped_and_said_once(steps, want, tmp_path, capsys):
    out = str(tmp_path / "o")
    assert run_main(CHUNK_SIM, ["--out", out, "--no-progress", "--set", f"steps={steps}"]) == 0
    got = open(os.path.join(out, "cfg.txt")).read().split()
    assert " ".join(got[:5]) == want and int(got[5]) == steps
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if "shorter than one chunk" in ln]
    assert len(said) == (steps < 10), err
    if steps == 6:
        assert "steps_per_chunk 10 -> 6" in said[0] and "save_every 5 -> 1" in said[0]
        assert "warmup_steps 8 -> 6" in said[0] and "checkpoint_every 20 -> 24" in said[0]


def test_clip_short_run_on_per_stage_steps():
    from ivhl_jax.run.config import clip_short_run

    @dataclasses.dataclass(frozen=True)
    class Stages:
        steps: tuple[int, ...] = (2000, 1800)
        steps_per_chunk: int = 50
        checkpoint_every: int = 200

    assert clip_short_run(Stages())[1] == {}
    cfg, changes = clip_short_run(Stages(steps=(10, 15)))
    assert cfg.steps_per_chunk == 5 and changes == {"steps_per_chunk": (50, 5)}
    cfg, changes = clip_short_run(Stages(steps=(4, 4)))
    assert (cfg.steps_per_chunk, cfg.checkpoint_every) == (4, 200)
    cfg, _ = clip_short_run(Stages(steps=(3,)))
    assert (cfg.steps_per_chunk, cfg.checkpoint_every) == (3, 201)


def test_a_builder_error_before_the_first_chunk_is_one_line_and_exit_2(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert run_main(CHUNK_SIM, ["--out", out, "--set", "setup_fails=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use dt <= 0.5" in err and err.startswith("ivhl sim chunks:")
    # the folder it left holds no checkpoint, so it does not tie the next run to that configuration
    assert run_main(CHUNK_SIM, ["--out", out, "--no-progress"]) == 0


def test_an_error_after_work_started_keeps_its_traceback(tmp_path):
    def run(cfg, ctx):
        run_chunked(lambda x: (x + 1, x[None]), jnp.zeros(1), n_chunks=1, steps_per_chunk=1, progress=False)
        raise ValueError("a failure in the middle of the run")

    class Failing(ChunkSimulation):
        def run(self, cfg, ctx):
            return run(cfg, ctx)

    sim = Failing()
    with pytest.raises(ValueError, match="middle of the run"):
        run_main(sim, ["--out", str(tmp_path / "o")])


def test_resume_when_every_checkpoint_is_unusable_is_one_line_and_exit_2(tmp_path, capsys):
    import shutil

    out = str(tmp_path / "o")
    assert run_main(CHUNK_SIM, ["--out", out, "--no-progress"]) == 0
    ckpt = os.path.join(out, "ckpt")
    steps = [d for d in os.listdir(ckpt) if d.isdigit()]
    assert steps
    for d in steps:
        shutil.rmtree(os.path.join(ckpt, d, "state"))
    capsys.readouterr()
    assert run_main(CHUNK_SIM, ["--out", out, "--no-progress", "--set", "steps=80"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no usable checkpoint" in err and "--no-resume" in err, err


def test_a_resumed_run_counts_only_its_own_steps_and_says_so_first(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert run_main(CHUNK_SIM, ["--out", out, "--no-progress"]) == 0
    capsys.readouterr()
    assert run_main(CHUNK_SIM, ["--out", out, "--set", "steps=60"]) == 0
    cap = capsys.readouterr()
    assert "40 steps in" not in cap.out and "20 steps in" in cap.out
    assert cap.out.splitlines()[0].startswith("ivhl sim chunks: resuming from step 40"), cap.out


def test_help_keeps_comments_whole_columns_aligned_and_shows_the_out_default(capsys):
    with pytest.raises(SystemExit) as info:
        run_main(CHUNK_SIM, ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "a meaning kept whole, however long it runs, never cut at a column: run_main shows it as plain text" in (
        " ".join(out.split())
    )
    assert "output folder (default: runs/chunks)" in " ".join(out.split())
    rows = describe_config(ChunkConfig)
    starts = {r.index(str(d)) for r, d in zip(rows, ("40", "10", "5", "20", "8", "0.5"))}
    assert len(starts) == 1, rows  # every default starts in the same column, whatever the width of a type


def test_a_list_key_given_one_number_says_how_to_write_a_list(tmp_path, capsys):
    assert run_main(CHUNK_SIM, ["--out", str(tmp_path / "o"), "--set", "choice=4"]) == 2
    err = capsys.readouterr().err
    assert "must be a list, got 4: say --set choice=4,4" in err


def test_integer_settings_are_echoed_as_integers(tmp_path, capsys):
    from ivhl_jax.core.validation import check_scalar

    with pytest.raises(ValueError, match=r"got -5$"):
        check_scalar(-5, "steps", integer=True, minimum=1)
    with pytest.raises(ValueError, match=r"got -5\.5$"):
        check_scalar(-5.5, "dt", positive=True)


def test_a_simulation_is_a_subclass_that_names_its_command_and_config():
    """Simulation is abstract: run and default_out are its own; prog and config_type are checked when built."""
    with pytest.raises(TypeError, match="abstract"):
        Simulation()

    class NoConfig(CountSimulation):
        config_type = int

    with pytest.raises(TypeError, match="NoConfig.config_type must be a config dataclass type"):
        NoConfig()

    class NoProg(CountSimulation):
        prog = ""

    with pytest.raises(TypeError, match="NoProg.prog must be the command"):
        NoProg()
    assert SIM.keep(CountConfig()) == 3 and SIM.overrides(None) == [] and SIM.default_resume(None) is True


def test_help_comes_from_field_metadata_or_the_docstring_attributes():
    from ivhl_jax.run.driver import field_help

    @dataclasses.dataclass(frozen=True)
    class Documented:
        """A nested config of a library layer.

        Attributes:
          a, b: first, second.
          c: the third key.
        """

        a: int = 1
        b: int = 2
        c: int = option(3, "from the metadata")
        d: int = 4

    assert field_help(Documented) == {"a": "first", "b": "second", "c": "from the metadata", "d": ""}
    with pytest.raises(ValueError, match="help must be a non-empty string"):
        option(3)
