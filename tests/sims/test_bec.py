"""`ivhl sim bec` (Gross–Pitaevskii): outputs, and checkpoints that resume bit-exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ivhl_jax.run.config import load_config
from ivhl_jax.sims import bec

GP = [
    "--no-progress",
    "--set",
    "grid=32",
    "--set",
    "length=12.0",
    "--set",
    "ground_steps=200",
    "--set",
    "g=50",
    "--set",
    "steps_per_chunk=50",
    "--set",
    "save_every=25",
    "--set",
    "checkpoint_every=100",
    "--set",
    "imprints=[[1.0, 0.0, 1]]",
]


def test_gp_run_project_norm_keeps_the_norm(tmp_path):
    assert bec.main([*GP, "--set", "steps=200", "--set", "project_norm=true", "--out", str(tmp_path)]) == 0
    norms = json.loads((tmp_path / "observables.json").read_text())["observables"]["norm"]
    assert max(abs(n - 1) for n in norms) < 1e-6  # measured 6e-8 (CPU)


def test_gp_run_with_damping_loses_energy_and_keeps_the_norm(tmp_path):
    """--set gamma: the damped evolution (the imprinted vortex off-centre in a rotating frame relaxes); the energy
    falls at every record and the norm stays 1."""
    extra = ["--set", "gamma=0.05", "--set", "omega_rot=0.3"]
    assert bec.main([*GP, *extra, "--set", "steps=200", "--out", str(tmp_path)]) == 0
    obs = json.loads((tmp_path / "observables.json").read_text())["observables"]
    energy = np.asarray(obs["energy_total"])
    assert np.all(np.diff(energy) < 0), energy
    assert max(abs(n - 1) for n in obs["norm"]) < 1e-5


def test_gp_run_resumes_bit_exactly(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert bec.main([*GP, "--set", "steps=200", "--out", str(full)]) == 0
    assert bec.main([*GP, "--set", "steps=100", "--out", str(part)]) == 0
    assert bec.main([*GP, "--set", "steps=200", "--out", str(part)]) == 0  # extends from the step-100 checkpoint
    a, b = np.load(full / "final_state.npy"), np.load(part / "final_state.npy")
    assert np.array_equal(a, b)
    obs_full = json.loads((full / "observables.json").read_text())
    obs_part = json.loads((part / "observables.json").read_text())
    assert obs_part["resumed_from"] == 100 and obs_full["resumed_from"] is None
    assert obs_full["observables"] == obs_part["observables"]
    # the ground-state record survives the resume (it travels in the checkpoint metadata)
    assert obs_part["ground_state"] is not None and obs_part["ground_state"] == obs_full["ground_state"]
    for name in ("density.png", "phase.png", "observables.png"):
        assert (full / name).stat().st_size > 0
    # Raw float32 scheme: FFT round-off loses norm (measured over these 200 steps: -2.9e-5 XLA:CPU,
    # -1.2e-4 cuFFT on an H100); project_norm removes it (test below).
    assert abs(obs_full["final"]["norm"] - 1) < 2e-4
    assert obs_full["vortices"]["net_charge"] == 1


def test_a_bad_dims_and_the_gft_keys_are_refused(tmp_path, capsys):
    assert bec.main(["--set", "dims=4", "--out", str(tmp_path / "bad")]) == 2
    assert "dims must be 1, 2 or 3" in capsys.readouterr().err
    assert bec.main(["--set", "model=gft", "--out", str(tmp_path / "bad")]) == 2  # GFT is `ivhl sim gft`
    assert "unknown config key(s) ['model']" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message", [("save_every=7", "multiple of save_every"), ("omega_rot=0.5", "needs dims=2 or 3")]
)
def test_config_validation(tmp_path, capsys, override, message):
    extra = ["--set", "dims=1"] if "omega" in override else []
    assert bec.main(["--set", override, *extra, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_an_unconverged_ground_state_is_reported(tmp_path, capsys):
    args = [*GP, "--set", "steps=50", "--set", "ground_steps=20", "--set", "ground_tol=1e-12", "--out", str(tmp_path)]
    assert bec.main(args) == 0
    err = capsys.readouterr().err
    assert "did not converge" in err and "ground_steps" in err
    assert json.loads((tmp_path / "observables.json").read_text())["ground_state"]["converged"] is False


def test_bec_reports_the_ground_state_search_as_it_goes(tmp_path, capsys):
    from ivhl_jax.sims import bec

    args = [
        "--set",
        "grid=32",
        "--set",
        "length=12.0",
        "--set",
        "ground_steps=400",
        "--set",
        "g=50",
        "--set",
        "steps=100",
        "--set",
        "steps_per_chunk=50",
        "--set",
        "save_every=25",
        "--set",
        "checkpoint_every=100",
        "--out",
        str(tmp_path),
    ]
    assert bec.main(args) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    start = lines.index("ground state (imaginary time, up to 400 steps of dt=0.005; compiling first) ...")
    notes = [line for line in lines if line.startswith("ground state: ") and " steps, E = " in line]
    assert notes and notes[0].startswith("ground state: 100/400 steps, E = ")  # one line per 100-step share
    done = next(i for i, line in enumerate(lines) if line.startswith("ground state: done in"))
    compiling = lines.index("compiling bec ...")
    assert start < lines.index(notes[0]) < done < compiling  # the phases in order, each named
    import json

    gs = json.loads((tmp_path / "observables.json").read_text())["ground_state"]
    assert gs["steps"] == int(notes[-1].split("/")[0].split()[-1])  # the record counts every segment's steps


# One bad value per key: each is refused by validate() before any work, in one line, exit 2.
BAD_VALUES = [
    ("grid", "1", "grid must be >= 2"),
    ("grid", "0", "grid must be >= 2"),
    ("length", "-5", "length must be a finite number > 0"),
    ("length", "inf", "length must be a finite number > 0"),
    ("g", "nan", "g must be a finite number"),
    ("ground_tol", "-1", "ground_tol must be a finite number > 0"),
    ("ground_dt", "0", "ground_dt must be a finite number > 0"),
    ("dt", "-1", "dt must be a finite number"),
    ("dt", "0.5", "use dt <= 0.00777"),
    ("omega_rot", "inf", "omega_rot must be a finite"),
    ("noise", "-1", "noise must be a finite number >= 0"),
    ("trap", "[-1.0]", "trap frequencies must be finite and >= 0"),
    ("dims", "0", "dims must be 1, 2 or 3"),
    ("steps", "0", "steps must be >= 1"),
    ("ground_steps", "0", "ground_steps must be >= 1"),
    ("save_every", "0", "save_every must be >= 1"),
    ("checkpoint_every", "-3", "checkpoint_every must be >= 1"),
    ("imprints", "[[1.0, 0.0, 0.5]]", "must be an integer"),
    ("imprints", "[[nan, 0.0, 1]]", "finite x, y"),
    ("model", "gft", "model"),
    ("precision", "float16", "precision"),
    ("fft", "fftw", "fft"),
    ("gamma", "-0.1", "gamma must be a finite number >= 0"),
]


@pytest.mark.parametrize("key, value, message", BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_every_bad_value_is_one_line_and_exit_2(tmp_path, capsys, key, value, message):
    out = tmp_path / "x"
    assert bec.main(["--no-progress", "--set", f"{key}={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert not (out / "final_state.npy").exists()


def test_3d_plots_name_their_slice_and_time_counts_from_the_first_record(tmp_path):
    args = [
        "--no-progress",
        "--set",
        "dims=3",
        "--set",
        "grid=16",
        "--set",
        "length=8.0",
        "--set",
        "g=10",
        "--set",
        "ground_steps=100",
        "--set",
        "steps=20",
        "--set",
        "steps_per_chunk=20",
        "--set",
        "save_every=10",
        "--set",
        "checkpoint_every=20",
        "--set",
        "dt=1e-3",
        "--out",
        str(tmp_path),
    ]
    assert bec.main(args) == 0
    doc = json.loads((tmp_path / "observables.json").read_text())
    assert doc["plot_slice"] == "slice z = 0 (index 8 of 16)"
    np.testing.assert_allclose(doc["t"], [0.01, 0.02])  # records after 10 and 20 steps of dt = 1e-3


def test_gp_run_writes_its_store_and_a_resumed_store_equals_an_uninterrupted_one(tmp_path):
    """Each chunk's records go to <out>/run.zarr (nothing kept in memory or in the checkpoints), equal to the
    in-memory history of the same run; a run extended from its checkpoint appends after the last record, never
    duplicating one; snapshots of ψ every 100 steps and the store's final_state equal the final state."""
    import xarray as xr

    from ivhl_jax.run import open_run

    plain, full, part = tmp_path / "plain", tmp_path / "full", tmp_path / "part"
    snap = ["--set", "snapshot_every=100"]
    assert bec.main([*GP, "--set", "steps=200", "--out", str(plain)]) == 0
    assert bec.main([*GP, *snap, "--set", "steps=200", "--out", str(full)]) == 0
    assert bec.main([*GP, *snap, "--set", "steps=100", "--out", str(part)]) == 0
    assert bec.main([*GP, *snap, "--set", "steps=200", "--out", str(part)]) == 0
    cfg = load_config(bec.BECConfig, None, [a for a in GP if "=" in a] + ["steps=200"])
    in_memory, _ = bec.simulate(cfg, progress=False)
    expected = {k: np.asarray(v) for k, v in in_memory.history.items()}
    for folder in (full, part):
        run = open_run(folder)
        assert run.observations.sizes["time"] == 200 // 25 and run.attrs["records"] == 8
        for key, values in expected.items():
            np.testing.assert_array_equal(run.observations[key].values, values, err_msg=key)
        assert run.observations["energy_total"].attrs["units"] == "ħω"
        np.testing.assert_allclose(run.observations["time"].values, (np.arange(8) + 1) * 25 * cfg.dt)
        assert run.attrs["config"]["steps"] == 200 and run.attrs["seeds"] == {"seed": 0}
        assert run.snapshots.sizes["snapshot_time"] == 2
        last = run.snapshots["psi"].sel(snapshot_time=200 * cfg.dt, method="nearest").values
        assert np.array_equal(last, np.load(folder / "final_state.npy"))
        final = run.fields["final_state"]  # the store holds the final state too (the extended run's, step 200)
        assert final.dims == ("x", "y") and final.attrs["step"] == 200
        assert final.attrs["units"] == "(trap length)^(-d/2)"
        np.testing.assert_array_equal(final["x"].values, run.snapshots["x"].values)
        assert np.array_equal(final.values, np.load(folder / "final_state.npy"))
        json_obs = json.loads((folder / "observables.json").read_text())["observables"]
        assert json_obs == json.loads((plain / "observables.json").read_text())["observables"]
    assert xr.open_zarr(part / "run.zarr")["psi"].dims == ("snapshot_time", "x", "y")
    assert np.array_equal(np.load(plain / "final_state.npy"), np.load(part / "final_state.npy"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("ground_dt=1.0", "ground_dt=1 is too large: the local decay per step ground_dt·max|V + g|ψ|²|"),
        ("g=1e9", "g=1e+09 is too large for ground_dt=0.005"),
        ("g=1e9", "use |g| <= "),
    ],
)
def test_unresolved_local_step_names_the_key_at_fault(tmp_path, capsys, override, message):
    assert bec.main([*GP, "--set", "steps=50", "--set", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert " dt=" not in err  # not blamed on the evolution's dt


def test_gp_run_default_keeps_the_norm(tmp_path):
    # The default run restores the norm after every save_every steps (project_norm=false): float32 FFT round-off
    # no longer accumulates (the raw scheme loses ~1.4e-7 per step).
    assert (
        bec.main(
            [
                *GP,
                "--set",
                "steps=1000",
                "--set",
                "steps_per_chunk=500",
                "--set",
                "checkpoint_every=1000",
                "--set",
                "save_every=250",
                "--set",
                "imprints=[]",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    norms = json.loads((tmp_path / "observables.json").read_text())["observables"]["norm"]
    assert max(abs(n - 1) for n in norms) < 1e-6


def test_float64_runs_in_a_scope_and_never_turns_x64_on_for_the_process():
    import jax
    import jax.numpy as jnp

    cfg = bec.BECConfig(dims=1, grid=16, precision="float64")
    before = bool(jax.config.jax_enable_x64)
    if not before:
        with pytest.raises(ValueError, match="precision=float64 needs 64-bit JAX"):
            bec.gp_system(cfg)
    with bec.precision_scope(cfg):
        assert bec.gp_system(cfg).potential.dtype == jnp.float64
    assert bool(jax.config.jax_enable_x64) == before
