"""A terminal is never silent during a long phase (issue 14, CLI items), and every train script writes its loss
curves as PNG into the run folder.

Progress: :func:`ivhl_jax.run.runner.run_chunked` announces the first chunk's compilation before and after it;
``ivhl sim bec`` reports the ground-state search as it goes. Plots: the plotting functions of
``ivhl train vortex_gru``, ``ivhl train adaptive`` and ``ivhl train lm`` are run on a synthetic history (fast: no
training compile), and a tiny vortex_gru run writes its pictures end to end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.run import runner

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG and f.seek(0, 2) > 5000  # a real picture, not an empty canvas


def test_run_chunked_announces_the_compile_before_and_after(capsys):
    advance = jax.jit(lambda s: (s + 1.0, s[None]))
    res = runner.run_chunked(advance, jnp.zeros(3), n_chunks=4, steps_per_chunk=1, description="demo")
    assert res.steps == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "compiling demo ..."  # printed before the compile starts
    assert err[1].startswith("compiling demo: done in ") and err[1].endswith(" s")
    assert any(line.startswith("demo: 4/4 steps") for line in err[2:])
    runner.run_chunked(advance, jnp.zeros(3), n_chunks=2, steps_per_chunk=1, progress=False)
    assert capsys.readouterr().err == ""  # --no-progress stays quiet


def test_phase_lines():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), runner.phase("loading data", detail="2 files") as note:
        note("1/2 files")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "loading data (2 files) ..."
    assert lines[1].startswith("loading data: 1/2 files (") and lines[2].startswith("loading data: done in")


def test_bec_reports_the_ground_state_search_as_it_goes(tmp_path, capsys):
    from ivhl_jax.sims import bec

    args = ["--set", "grid=32", "--set", "length=12.0", "--set", "ground_steps=400", "--set", "g=50",
            "--set", "steps=100", "--set", "steps_per_chunk=50", "--set", "save_every=25",
            "--set", "checkpoint_every=100", "--out", str(tmp_path)]
    assert bec.main(args) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    start = lines.index("ground state (imaginary time, up to 400 steps of dt=0.005; compiling first) ...")
    notes = [line for line in lines if line.startswith("ground state: ") and " steps, E = " in line]
    assert notes and notes[0].startswith("ground state: 100/400 steps, E = ")  # one line per 100-step share
    done = next(i for i, line in enumerate(lines) if line.startswith("ground state: done in"))
    compiling = lines.index("compiling bec[gp] ...")
    assert start < lines.index(notes[0]) < done < compiling  # the phases in order, each named
    import json

    gs = json.loads((tmp_path / "observables.json").read_text())["ground_state"]
    assert gs["steps"] == int(notes[-1].split("/")[0].split()[-1])  # the record counts every segment's steps


def _history(n_steps: int = 60, chunk: int = 20) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    loss = np.exp(-np.linspace(0, 2, n_steps)) + 0.05 * rng.random(n_steps)
    return {"loss": loss.astype(np.float32), "chunk_end_step": chunk * np.arange(1, n_steps // chunk + 1)}


def test_vortex_gru_plots(tmp_path):
    from ivhl_jax.sims import train_vortex_gru as tv

    hist = _history()
    hist["test_rmse"] = np.array([0.05, 0.03, 0.02])
    paths = np.linspace(-0.4, 0.4, 3 * 12 * 2).reshape(3, 12, 2)
    data = {"true_test": paths, "test": paths + 0.01}
    plot, curve = tv.write_plots(str(tmp_path), hist, data, paths[:, 1:] + 0.02,
                                 {"constant_velocity_rmse": 0.025, "persistence_rmse": 0.06}, 20)
    assert _is_png(plot) and _is_png(curve) and curve.endswith("loss_curve.png")


def test_adaptive_plots(tmp_path):
    from ivhl_jax.nn import adaptive
    from ivhl_jax.sims import train_adaptive as ta

    hist = _history()
    n = len(hist["loss"])
    hist.update(accuracy=np.linspace(0.1, 0.9, n), test_accuracy=np.array([0.3, 0.6, 0.8]),
                mean_energy=np.linspace(1, 0.5, n), mean_anxiety=np.linspace(0.2, 0.1, n))
    for p in adaptive.PHASES:
        hist[f"{p}_ratio"] = np.full(n, 1.0 / len(adaptive.PHASES))
    paths = ta._plots(str(tmp_path), hist, 20)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["training.png", "energy.png"]
    assert all(_is_png(p) for p in paths)


def test_lm_loss_curve(tmp_path):
    from ivhl_jax.sims import train_lm as tl

    hist = _history()
    hist.update(val_step=np.array([20, 40, 60]), val_loss=np.array([3.0, 2.5, 2.2]))
    path = tmp_path / "loss_curve.png"
    tl._plot(hist, {"unigram_entropy_bits": 4.9}, str(path))
    assert _is_png(path)


@pytest.mark.slow  # two tiny training runs: 70 s on the loaded 2-core host (GRU compile)
def test_vortex_gru_run_writes_its_pictures(tmp_path, capsys):
    from ivhl_jax.sims import train_vortex_gru as tv

    out = tmp_path / "run"
    sets = ["n_train=8", "n_test=4", "length=12", "grid=16", "hidden=8", "layers=1", "steps=4", "chunk=2",
            "batch_size=4"]
    assert tv.main(["--out", str(out), "--no-progress"] + [a for s in sets for a in ("--set", s)]) == 0
    assert _is_png(out / "vortex_gru.png") and _is_png(out / "loss_curve.png")
    printed = capsys.readouterr().out
    assert "loss_curve" in printed and "vortex_gru.png" in printed
    assert tv.main(["--out", str(tmp_path / "np"), "--no-progress", "--no-plots"]
                   + [a for s in sets for a in ("--set", s)]) == 0
    assert not (tmp_path / "np" / "loss_curve.png").exists()
