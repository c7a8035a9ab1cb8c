"""The holography simulation: physics against a direct evaluation, CLI end to end, exact resume."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from ivhl_jax import cli, fields
from ivhl_jax.run.config import load_config
from ivhl_jax.sims import holography as H
from ivhl_jax.train.checkpoint import Checkpointer

SMALL = ["n_sources=12", "grid=[24, 20]", "steps=8", "steps_per_chunk=2", "checkpoint_every=4"]


def small_cfg(*extra: str) -> H.HolographyConfig:
    return load_config(H.HolographyConfig, None, [*SMALL, *extra])


def test_simulation_matches_direct_field_evaluation():
    cfg = small_cfg("plane=xz", "plane_offset=0.2")
    result, params = H.simulate(cfg, progress=False)
    st = result.state
    assert int(st.step) == 8 and result.history["t"].shape == (8,)
    # a record after k steps is at t = k·dt (the time convention of ivhl sim bec too)
    np.testing.assert_allclose(np.asarray(result.history["t"]), np.arange(1, 9) * cfg.dt, rtol=1e-6)
    # Independent evaluation of the last frame: helix sources, vortex imprint, xz plane at y = 0.2.
    t_last = 8 * cfg.dt
    pts = np.asarray(params.points)
    assert np.all(pts[:, 1] == np.float32(0.2))
    src = np.asarray(fields.helix_sources(12, cfg.helix_radius, cfg.helix_pitch, cfg.helix_turns), np.float64)
    r = np.linalg.norm(pts[:, None].astype(np.float64) - src[None], axis=-1)
    k = np.asarray(params.wavenumbers, np.float64)
    ph = np.pi * (np.arange(12) % 2)
    psi = (np.exp(1j * (k * r - k * t_last + ph)) / (r + cfg.softening)).sum(1)
    psi *= np.asarray(params.imprint)
    np.testing.assert_allclose(np.asarray(st.field), psi, rtol=1e-4, atol=1e-4 * np.abs(psi).max())
    # Time average of the intensity over the 8 frames (t = dt ... 8 dt).
    mean_i = np.zeros(pts.shape[0])
    for n in range(1, 9):
        f = (np.exp(1j * (k * r - k * n * cfg.dt + ph)) / (r + cfg.softening)).sum(1) * np.asarray(params.imprint)
        mean_i += np.abs(f) ** 2 / 8
    np.testing.assert_allclose(np.asarray(st.intensity_sum) / 8, mean_i, rtol=1e-4, atol=1e-4 * mean_i.max())


def test_imprinted_vortex_is_detected_in_an_empty_field():
    """A single source far away gives a nearly plane wave; the imprinted charges show in vortex_map."""
    cfg = small_cfg(
        "n_sources=1",
        "helix_radius=30.0",
        "grid=[40, 40]",
        "extent=1.0",
        "vortex_centers=[[0.31, 0.27], [-0.42, -0.18]]",
        "vortex_charges=[1, -1]",
    )
    result, _ = H.simulate(cfg, progress=False)
    np.testing.assert_array_equal(np.asarray(result.history["net_charge"]), 0)
    np.testing.assert_array_equal(np.asarray(result.history["vortices_positive"]), 1)
    np.testing.assert_array_equal(np.asarray(result.history["vortices_negative"]), 1)


def test_cli_end_to_end_and_resume_is_exact(tmp_path, capsys):
    args = [f"--set={s}" for s in SMALL] + ["--no-progress"]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    assert cli.main(["sim", "holography", "--out", full, *args]) == 0
    printed = capsys.readouterr().out
    for name in ("intensity.png", "phase.png", "mean_intensity.png", "summary.json"):
        path = os.path.join(full, name)
        assert os.path.isfile(path) and os.path.getsize(path) > 0
        assert os.path.abspath(path) in printed
    # An interrupted run: stop at step 4 (a checkpoint), then continue to 8 in a second invocation.
    assert cli.main(["sim", "holography", "--out", part, *args, "--set=steps=4"]) == 0
    capsys.readouterr()
    assert cli.main(["sim", "holography", "--out", part, *args]) == 0
    resumed = capsys.readouterr().out.splitlines()
    assert "resuming from step 4" in resumed[0], resumed  # said first; the rate counts the steps run here
    assert any(ln.startswith("4 steps in") for ln in resumed) and not any("8 steps in" in ln for ln in resumed)
    a = json.load(open(os.path.join(full, "summary.json")))
    b = json.load(open(os.path.join(part, "summary.json")))
    assert b["resumed_from"] == 4 and a["resumed_from"] is None
    assert a["final"] == b["final"]
    from ivhl_jax.run import open_run

    assert open_run(full).observations.equals(open_run(part).observations)  # the run store: no record lost or twice
    # Bit-exact final state.
    # Bit-exact final state, also equal to an in-process run without checkpoints.
    direct, _ = H.simulate(small_cfg(), progress=False)
    like = {"state": direct.state}  # the records are in the run store, not in the checkpoints
    with Checkpointer(os.path.join(full, "ckpt")) as c1, Checkpointer(os.path.join(part, "ckpt")) as c2:
        s1, x1, _ = c1.restore(like)
        s2, x2, _ = c2.restore(like)
    assert s1 == s2 == 8
    leaves = jax.tree_util.tree_leaves
    for l0, l1, l2 in zip(leaves(like), leaves(x1), leaves(x2)):
        np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))
        np.testing.assert_array_equal(np.asarray(l0), np.asarray(l1))


def test_cli_rejects_bad_config_and_mismatched_resume(tmp_path, capsys):
    assert cli.main(["sim", "holography", "--out", str(tmp_path), "--set", "plane=ab"]) == 2
    assert "plane" in capsys.readouterr().err
    assert cli.main(["sim", "holography", "--out", str(tmp_path), "--set", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    out = str(tmp_path / "r")
    args = [f"--set={s}" for s in SMALL] + ["--no-progress", "--set=steps=4"]
    assert cli.main(["sim", "holography", "--out", out, *args]) == 0
    assert cli.main(["sim", "holography", "--out", out, *args, "--set=wavelength=0.7"]) == 2
    assert "different configuration" in capsys.readouterr().err
    assert cli.main(["sim", "holography", "--out", out, *args, "--set=wavelength=0.7", "--no-resume"]) == 0


@pytest.mark.slow
def test_3d_grid_run(tmp_path):
    cfg = small_cfg("grid=[12, 10, 8]", "steps=2", "checkpoint_every=2")
    result, params = H.simulate(cfg, progress=False)
    assert result.state.field.shape == (960,)
    paths = H.write_outputs(cfg, result, params, str(tmp_path))
    assert all(os.path.isfile(p) for p in paths.values())


def test_config_validation_messages():
    with pytest.raises(ValueError, match="steps_per_chunk"):
        small_cfg("steps=7")
    with pytest.raises(ValueError, match="vortex_charges"):
        small_cfg("vortex_charges=[1]")
    with pytest.raises(ValueError, match="grid"):
        small_cfg("grid=[1, 5]")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['n_steps'\].*valid keys: .*'steps'"):
        small_cfg("n_steps=4")


def test_cli_writes_observations_to_the_run_store_equal_to_the_in_memory_history(tmp_path, capsys):
    from ivhl_jax.run import open_run

    args = [f"--set={s}" for s in SMALL] + ["--no-progress"]
    out = str(tmp_path / "run")
    assert cli.main(["sim", "holography", "--out", out, *args]) == 0
    b = json.load(open(os.path.join(out, "summary.json")))
    assert "history" not in b and b["observations"] == os.path.join(os.path.abspath(out), "run.zarr")
    in_memory, _ = H.simulate(small_cfg(), progress=False)
    run = open_run(out)
    for key, values in in_memory.history.items():
        np.testing.assert_array_equal(run.observations[key].values, np.asarray(values), err_msg=key)


def test_a_dt_beyond_float32_phase_resolution_is_refused_naming_dt(tmp_path, capsys):
    assert cli.main(["sim", "holography", "--out", str(tmp_path / "r"), "--set", "dt=1e30"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("ivhl sim holography:") and "lower dt" in err[0], err
    # the bound: the largest phase k_max·steps·dt, so a long run with the default dt is still accepted
    load_config(H.HolographyConfig, None, ["steps=100000", "steps_per_chunk=4"])
    with pytest.raises(ValueError, match="dt"):
        load_config(H.HolographyConfig, None, ["steps=16", "dt=5000"])


def test_pictures_are_written_when_the_field_is_not_finite(tmp_path):
    cfg = small_cfg("steps=2", "steps_per_chunk=2", "checkpoint_every=2")
    result, params = H.simulate(cfg, progress=False)
    st = result.state
    field = np.asarray(st.field).copy()
    field[:5] = np.nan
    field[5:9] = np.inf
    bad = result.__class__(
        **{
            **result.__dict__,
            "state": st.replace(
                field=jax.numpy.asarray(field), intensity_sum=jax.numpy.full_like(st.intensity_sum, np.inf)
            ),
        }
    )
    paths = H.write_outputs(cfg, bad, params, str(tmp_path))
    for name in ("intensity", "phase", "mean_intensity"):
        with open(paths[name], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _truncate_data_files(ckpt: str) -> None:
    for root, _, names in os.walk(ckpt):
        for name in names:
            if os.path.basename(root) == "d":
                path = os.path.join(root, name)
                os.truncate(path, os.path.getsize(path) // 2)


def test_resume_from_truncated_checkpoints_is_one_line_naming_the_folder_and_the_fix(tmp_path, capfd):
    out = str(tmp_path / "run")
    args = ["--no-progress", *[a for s in SMALL for a in ("--set", s)]]
    assert cli.main(["sim", "holography", "--out", out, *args]) == 0
    _truncate_data_files(os.path.join(out, "ckpt"))
    capfd.readouterr()
    assert cli.main(["sim", "holography", "--out", out, *args, "--set=steps=12"]) == 2
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    line = err[0]
    ckpt = os.path.join(out, "ckpt")
    assert line.startswith("ivhl sim holography: no usable checkpoint in " + ckpt), line
    assert "truncated" in line and "--no-resume" in line and "tensorstore" not in line.lower(), line
    assert len(line) < 500, line
    assert cli.main(["sim", "holography", "--out", out, *args, "--set=steps=12", "--no-resume"]) == 0


def test_out_on_a_file_is_one_line_saying_it_is_a_file(tmp_path, capsys):
    path = tmp_path / "afile"
    path.write_text("x")
    assert cli.main(["sim", "holography", "--out", str(path), "--set", "steps=1"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "shorter than one chunk" not in ln]
    assert len(err) == 1 and f"{path} (--out) is a file, not a folder" in err[0] and "File exists" not in err[0], err
    assert cli.main(["sim", "holography", "--out", str(path / "sub"), "--set", "steps=1"]) == 2
    assert f"lies under {path}, which is a file" in capsys.readouterr().err
