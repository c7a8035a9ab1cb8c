"""`ivhl sim bec` (Gross–Pitaevskii): outputs, and checkpoints that resume bit-exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ivhl_jax.run.config import load_config
from ivhl_jax.sims import bec


def _sets(*pairs: str) -> list[str]:
    """``--set key=value`` for each of ``pairs``."""
    return [a for kv in pairs for a in ("--set", kv)]


SMALL_GP = ["grid=32", "length=12.0", "g=50", "steps_per_chunk=50", "save_every=25", "checkpoint_every=100"]
GP = ["--no-progress", *_sets(*SMALL_GP, "ground_steps=200", "imprints=[[1.0, 0.0, 1]]")]


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

    args = [*_sets(*SMALL_GP, "ground_steps=400", "steps=100", "ground_method=flow"), "--out", str(tmp_path)]
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
    assert gs["method"] == "flow"


def test_a_cg_ground_state_is_reported_as_it_goes_and_recorded(tmp_path, capsys):
    """The default search of a scalar run on one device is the conjugate gradient (ground_method=auto): its
    progress lines count iterations and report the residual, and the record names the method, its iterations,
    its residual (at most the float32 default tolerance, 1e-5) and that it converged."""
    args = [*_sets(*SMALL_GP, "ground_steps=400", "steps=100"), "--out", str(tmp_path)]
    assert bec.main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    assert "ground state (conjugate gradient, up to 400 iterations; compiling first) ..." in lines
    notes = [line for line in lines if line.startswith("ground state: ") and " iterations, E = " in line]
    assert notes and ", residual " in notes[-1] and "(converged)" in notes[-1]
    gs = json.loads((tmp_path / "observables.json").read_text())["ground_state"]
    assert gs["method"] == "cg" and gs["converged"] and 0 < gs["residual"] <= 1e-5
    assert gs["steps"] == int(notes[-1].split("/")[0].split()[-1]) <= 400  # iterations, all segments counted


def test_auto_picks_cg_on_one_device_and_the_flow_on_a_mesh_or_with_ground_dt():
    """ground_method=auto follows the library's default_method for the system the run builds."""
    cfg = load_config(bec.BECConfig, None, ["grid=16", "dims=2"])
    assert bec.ground_method(cfg, bec.condensate_system(cfg)) == "cg"
    for sets in (["mesh=8"], ["ground_dt=0.01"]):
        other = load_config(bec.BECConfig, None, ["grid=16", "dims=2", *sets])
        assert bec.ground_method(other, bec.condensate_system(other)) == "flow", sets
    spin1 = load_config(bec.BECConfig, None, ["system=spin1", "grid=16", "spin1.c0=50", "spin1.c2=-5"])
    assert bec.ground_method(spin1, bec.condensate_system(spin1)) == "flow"  # spin-1 in float32
    forced = load_config(bec.BECConfig, None, ["grid=16", "dims=2", "ground_method=flow"])
    assert bec.ground_method(forced, bec.condensate_system(forced)) == "flow"


@pytest.mark.parametrize(
    "sets, message",
    [
        (["ground_method=cg", "ground_dt=0.01"], "ground_dt=0.01 is the flow's step and ground_method=cg has none"),
        (["ground_method=cg", "mesh=8"], "ground_method=cg runs on one device, not on mesh=8"),
        (["ground_method=sgd"], "ground_method"),
    ],
)
def test_ground_method_settings_that_do_not_fit_are_refused(refused, sets, message):
    refused(bec.main, sets, message)


# One bad value per key: each is refused by validate() before any work, in one line, exit 2.
BAD_VALUES = [
    ("grid", "1", "grid must be >= 2"),
    ("grid", "0", "grid must be >= 2"),
    ("length", "-5", "length must be a finite number > 0"),
    ("length", "inf", "length must be a finite number > 0"),
    ("g", "nan", "g must be a finite number"),
    ("ground_tol", "-1", "ground_tol must be a finite number > 0"),
    ("ground_dt", "0", "ground_dt must be a finite number > 0"),
    ("ground_method", "newton", "ground_method"),
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
def test_every_bad_value_is_one_line_and_exit_2(refused, key, value, message):
    refused(bec.main, [f"{key}={value}"], message)


def test_3d_plots_name_their_slice_and_time_counts_from_the_first_record(tmp_path):
    dims = ("dims=3", "grid=16", "length=8.0", "g=10", "ground_steps=100", "dt=1e-3")
    args = ["--no-progress", *_sets(*dims, "steps=20", "steps_per_chunk=20", "save_every=10", "checkpoint_every=20")]
    args += ["--out", str(tmp_path)]
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
        e = run.observations["energy_total"].attrs  # trap units: a number, "1", its long_name names ħω
        assert e["units"] == "1" and "ħω" in e["long_name"]
        np.testing.assert_allclose(run.observations["time"].values, (np.arange(8) + 1) * 25 * cfg.dt)
        assert run.attrs["config"]["steps"] == 200 and run.attrs["seeds"] == {"seed": 0}
        assert run.snapshots.sizes["snapshot_time"] == 2
        last = run.snapshots["psi"].sel(snapshot_time=200 * cfg.dt, method="nearest").values
        assert np.array_equal(last, np.load(folder / "final_state.npy"))
        final = run.fields["final_state"]  # the store holds the final state too (the extended run's, step 200)
        assert final.dims == ("x", "y") and final.attrs["step"] == 200
        assert final.attrs["units"] == "1" and "(trap length)^(-d/2)" in final.attrs["long_name"]
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
    """The flow's step (ground_dt, default 5e-3 with ground_method=flow) over the guess names the key at fault."""
    sets = ["steps=50", override, "ground_method=flow"]
    assert bec.main([*GP, *_sets(*sets), "--out", str(tmp_path)]) == 2
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
                *_sets("steps=1000", "steps_per_chunk=500", "checkpoint_every=1000", "save_every=250", "imprints=[]"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    norms = json.loads((tmp_path / "observables.json").read_text())["observables"]["norm"]
    # (the float32 sum of N over the 32² grid carries ~1e-6 of round-off; the raw scheme would have lost 1.4e-4)
    assert max(abs(n - 1) for n in norms) < 2e-6


# --------------------------------------------------------------------------- dipolar, mixture and spin-1 systems
def _run(tmp_path, name, *sets, steps=200):
    """``ivhl sim bec`` on a small grid with ``sets`` (``key=value``); returns (observables.json, out folder)."""
    out = tmp_path / name
    base = ["steps_per_chunk=50", "save_every=25", "checkpoint_every=100", f"steps={steps}"]
    args = ["--no-progress", "--out", str(out), *_sets(*base, *sets)]
    assert bec.main(args) == 0
    return json.loads((out / "observables.json").read_text()), out


MIXTURE_2D = ["system=mixture", "grid=32", "length=12.0", "g=50", "mixture.g22=40", "mixture.g12=20"]


def test_mixture_run_conserves_each_norm_and_the_energy(tmp_path):
    """A two-component mixture started from an unconverged search (so it moves): N_1, N_2 of ``mixture.norms`` and the
    energy hold over the evolution, and the state has its component axis first. The search is 100 flow steps (cg's
    100 iterations would come too close to the ground state for the energy parts to move)."""
    sets = ["mixture.norms=[0.7, 0.3]", "ground_method=flow", "ground_steps=100", "ground_tol=1e-12"]
    doc, out = _run(tmp_path, "mix", *MIXTURE_2D, *sets)
    obs = doc["observables"]
    assert doc["ground_state"]["converged"] is False  # the evolution starts away from the ground state
    # measured over these 200 float32 steps (CPU): N_i to 1.3e-6, E to 3.7e-7
    np.testing.assert_allclose(obs["norm_1"], 0.7, rtol=1e-5)
    np.testing.assert_allclose(obs["norm_2"], 0.3, rtol=1e-5)
    energy = np.asarray(obs["energy_total"])
    assert np.max(np.abs(energy / energy[0] - 1)) < 1e-5
    assert np.ptp(obs["energy_interaction"]) > 1e3 * np.ptp(energy)  # the parts exchange energy: it moves
    assert np.load(out / "final_state.npy").shape == (2, 32, 32)
    assert all(0 < v <= 1 for v in obs["overlap"])


def test_mixture_separates_where_g12_squared_exceeds_g11_g22(tmp_path):
    """The ground-state overlap of two components either side of g₁₂² = g₁₁g₂₂ (g₁₁ = g₂₂ = 100): 1 at g₁₂ = 90
    (miscible), near 0 at g₁₂ = 110 (the components separate; measured 1.0000 and 0.0042)."""
    common = ["system=mixture", "dims=1", "grid=128", "length=16.0", "g=100", "ground_steps=4000", "ground_dt=0.01"]
    mixed, _ = _run(tmp_path, "mixed", *common, "mixture.g12=90", steps=50)
    apart, _ = _run(tmp_path, "apart", *common, "mixture.g12=110", steps=50)
    assert mixed["ground_state"]["converged"] and apart["ground_state"]["converged"]
    assert mixed["observables"]["overlap"][0] > 0.99
    assert apart["observables"]["overlap"][0] < 0.05


def test_spin1_run_holds_the_magnetization_and_conserves_n_and_m(tmp_path):
    """The search holds the requested M; the evolution (Zeeman p, q on; started unconverged, so the populations
    mix) conserves N and M."""
    sets = [
        "system=spin1",
        "grid=32",
        "length=12.0",
        "spin1.c0=50",
        "spin1.c2=-5",
        "spin1.p=0.5",
        "spin1.q=0.2",
        "spin1.magnetization=0.3",
    ]
    doc, out = _run(tmp_path, "spin1", *sets, "ground_steps=100", "ground_tol=1e-12")
    obs = doc["observables"]
    # measured over these 200 float32 steps (CPU): N to 1.3e-6, M to 4.3e-7, E to 1.4e-6
    np.testing.assert_allclose(obs["norm"], 1.0, atol=1e-5)
    np.testing.assert_allclose(obs["magnetization"], 0.3, atol=1e-5)
    energy = np.asarray(obs["energy_total"])
    assert np.max(np.abs(energy / energy[0] - 1)) < 1e-5
    assert np.ptp(obs["energy_spin"]) > 300 * np.ptp(energy)  # spin mixing: the parts exchange energy
    psi = np.load(out / "final_state.npy")
    assert psi.shape == (3, 32, 32)


def test_dipolar_ground_state_stretches_along_the_dipoles(tmp_path):
    """In an isotropic trap the dipolar cloud is elongated along ``dipolar.axis`` (its dipolar energy negative);
    the evolution keeps N and E."""
    common = ["system=dipolar", "dims=3", "grid=16", "length=10.0", "g=100", "dipolar.eps_dd=0.8", "ground_steps=1000"]
    grid = np.linspace(-5.0, 5.0, 16, endpoint=False)
    for axis, along in (("[0, 0, 1]", 2), ("[1, 0, 0]", 0)):
        doc, out = _run(tmp_path, f"dd{along}", *common, f"dipolar.axis={axis}", "dt=1e-3", steps=50)
        obs = doc["observables"]
        assert doc["ground_state"]["converged"] and obs["energy_dipolar"][-1] < 0
        np.testing.assert_allclose(obs["norm"], 1.0, atol=1e-5)  # measured 1.2e-7
        e = np.asarray(obs["energy_total"])
        assert np.max(np.abs(e / e[0] - 1)) < 1e-5  # measured 1.7e-7
        rho = np.abs(np.load(out / "final_state.npy")) ** 2
        widths = [np.sum(rho * np.moveaxis(np.broadcast_to(grid**2, rho.shape), -1, a)) for a in range(3)]
        others = [w for a, w in enumerate(widths) if a != along]
        assert widths[along] > 1.5 * max(others), widths  # measured ⟨r²⟩ 6.29 along, 3.34 across


def test_mixture_resumes_bit_exactly_with_its_component_axis_in_the_store(tmp_path):
    from ivhl_jax.run import open_run

    sets = [*MIXTURE_2D, "ground_steps=200", "snapshot_every=100", "snapshot_fields=density_phase"]
    full_doc, full = _run(tmp_path, "full", *sets)
    _run(tmp_path, "part", *sets, steps=100)
    part_doc, part = _run(tmp_path, "part", *sets)  # extends from the step-100 checkpoint
    assert part_doc["resumed_from"] == 100 and full_doc["resumed_from"] is None
    assert np.array_equal(np.load(full / "final_state.npy"), np.load(part / "final_state.npy"))
    assert full_doc["observables"] == part_doc["observables"]
    assert part_doc["ground_state"] == full_doc["ground_state"]
    for folder in (full, part):
        run = open_run(folder)
        density = run.snapshots["density"]
        assert density.dims == ("snapshot_time", "component", "x", "y")
        np.testing.assert_array_equal(density["component"].values, [1, 2])
        final = run.fields["final_state"]
        assert final.dims == ("component", "x", "y")
        np.testing.assert_allclose(
            density.isel(snapshot_time=-1).values, np.abs(final.values) ** 2, rtol=1e-6, atol=1e-9
        )
        assert run.observations["norm_2"].attrs["units"] == "1"
        assert run.observations["energy_total"].attrs["units"] == "1"  # in ħω (its long_name)
    for name in ("density.png", "phase.png", "observables.png"):
        assert (full / name).stat().st_size > 0


# Settings of the other systems, and combinations a system does not support: one line each, exit 2, no work.
# The least settings of each system (a case adds the one at fault).
MIXTURE = ["system=mixture", "mixture.g12=1"]
COUPLED = ["system=mixture", "mixture.couplings=[[1.0, 2.0], [2.0, 1.0]]"]
SPIN1 = ["system=spin1", "spin1.c0=10", "spin1.c2=-1"]
DIPOLAR = ["system=dipolar", "dims=3", "dipolar.eps_dd=0.5"]
BAD_SYSTEM_SETTINGS = [
    (["spin1.c2=-1"], "spin1.c2 applies to system=spin1, not to system=scalar: drop it or set system=spin1"),
    (["dipolar.eps_dd=0.5"], "dipolar.eps_dd applies to system=dipolar, not to system=scalar"),
    (["mixture.g12=10"], "mixture.g12 applies to system=mixture, not to system=scalar"),
    (["system=mixture", "mixture.g12=10", "spin1.c0=5"], "spin1.c0 applies to system=spin1, not to system=mixture"),
    (["system=mixture"], "system=mixture needs the inter-component coupling"),
    (["system=mixture", "mixture.couplings=[[1.0, 2.0], [3.0, 1.0]]"], "must be symmetric"),
    (["system=mixture", "mixture.couplings=[[1.0]]"], "mixture.couplings must be a C × C matrix with C >= 2"),
    ([*COUPLED, "mixture.g12=2"], "mixture.g12 and mixture.couplings both give the couplings"),
    ([*COUPLED, "g=3"], "g=3 and mixture.couplings both give g_11"),
    ([*MIXTURE, "mixture.norms=[1.0]"], "mixture.norms must be a number or have 2 entries"),
    ([*MIXTURE, "mixture.norms=[1.0, -1.0]"], "mixture.norms must be > 0 and finite for every component"),
    (["system=mixture", "mixture.g12=inf"], "mixture.g12, mixture.g22 or mixture.couplings) contains NaN or inf"),
    (["system=spin1", "spin1.c0=10"], "system=spin1 needs spin1.c2"),
    (["system=spin1", "spin1.c2=10"], "system=spin1 needs spin1.c0"),
    (["system=spin1", "spin1.c0=10", "spin1.c2=nan"], "spin1.c2 must be finite"),
    ([*SPIN1, "spin1.magnetization=1.5"], "spin1.magnetization must satisfy |M| < N"),
    ([*SPIN1, "g=3"], "g=3 does not apply to system=spin1"),
    (["system=dipolar", "dipolar.eps_dd=0.5"], "system=dipolar needs dims=3"),
    (["system=dipolar", "dims=3"], "system=dipolar needs dipolar.eps_dd"),
    (["system=dipolar", "dims=3", "dipolar.eps_dd=-1"], "dipolar.eps_dd must be"),
    ([*DIPOLAR, "dipolar.axis=[0, 0, 0]"], "dipolar.axis must be a non-zero vector"),
    ([*DIPOLAR, "dipolar.cutoff=-1"], "dipolar.cutoff must be"),
    (["system=bogus"], "system"),
]


@pytest.mark.parametrize("sets, message", BAD_SYSTEM_SETTINGS, ids=[" ".join(s) for s, _ in BAD_SYSTEM_SETTINGS])
def test_every_bad_system_setting_is_one_line_and_exit_2(refused, sets, message):
    refused(bec.main, sets, message)


@pytest.mark.parametrize("system", [MIXTURE, SPIN1, DIPOLAR], ids=["mixture", "spin1", "dipolar"])
@pytest.mark.parametrize(
    "setting", ["omega_rot=0.5", "gamma=0.1", "imprints=[[1.0, 0.0, 1]]", "noise=0.1", "project_norm=true", "fft=ducc"]
)
def test_a_setting_of_the_scalar_scheme_is_refused_with_another_system(refused, system, setting):
    """Rotation, damping, imprints, a noisy guess, the per-step projection and the host FFT are the scalar scheme's
    alone: changed with another system, one line naming the setting and the system."""
    key, name = setting.split("=")[0], system[0].split("=")[1]
    refused(bec.main, [*system, setting], f"applies to system=scalar, not to system={name}")
    refused(bec.main, [*system, setting], f"{key}=")


@pytest.mark.parametrize(
    "sets",
    [
        ["system=mixture", "mixture.g12=20"],
        ["system=spin1", "spin1.c0=50", "spin1.c2=-5"],
        ["system=dipolar", "dims=3", "grid=16", "length=10.0", "dipolar.eps_dd=0.5"],
    ],
    ids=["mixture", "spin1", "dipolar"],
)
def test_an_unresolved_ground_step_of_another_system_names_ground_dt(tmp_path, capsys, sets):
    args = ["--no-progress", "--out", str(tmp_path), *_sets("grid=16", "ground_dt=2.0", *sets)]
    assert bec.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ground_dt=2 is too large" in err and "use ground_dt <= " in err, err


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param([*MIXTURE_2D, "ground_steps=100"], id="mixture"),
        pytest.param(
            [
                "system=spin1",
                "grid=32",
                "length=12.0",
                "spin1.c0=50",
                "spin1.c2=-5",
                "spin1.magnetization=0.3",
                "ground_steps=100",
            ],
            id="spin1",
        ),
        pytest.param(
            ["system=dipolar", "dims=3", "grid=16", "length=10.0", "g=50", "dipolar.eps_dd=0.5", "ground_steps=100"],
            id="dipolar",
        ),
    ],
)
def test_mesh_spreads_a_mixture_spin1_or_dipolar_field_and_gives_the_one_device_run(tmp_path, sets):
    """``--set mesh=8`` (a slab over the 8 emulated devices, the distributed FFT of the system's layout) gives the
    one-device run's records and final state (float32 rounding of a different FFT decomposition)."""
    one, out1 = _run(tmp_path, "one", *sets, "ground_method=flow", steps=100)  # the mesh run's search
    slab, out8 = _run(tmp_path, "slab", *sets, "mesh=8", steps=100)
    for key, series in one["observables"].items():
        np.testing.assert_allclose(slab["observables"][key], series, rtol=2e-5, atol=2e-6, err_msg=key)
    np.testing.assert_allclose(np.load(out8 / "final_state.npy"), np.load(out1 / "final_state.npy"), atol=2e-5)
    import zarr

    # the final state is written shard by shard, one chunk per device's slab of the first grid axis
    x_axis = -int(dict(s.split("=") for s in sets).get("dims", 2))
    n = int(dict(s.split("=") for s in sets)["grid"])
    assert zarr.open_group(out8 / "run.zarr", mode="r")["final_state"].chunks[x_axis] == n // 8
    assert zarr.open_group(out1 / "run.zarr", mode="r")["final_state"].chunks[x_axis] == n


def test_a_system_section_is_set_from_the_command_line_or_a_file_table(tmp_path):
    """``--set mixture.g12=150`` and a ``[mixture]`` TOML table fill the same section (the other sections keep their
    defaults); the system is the section's, built by the library's ``create``."""
    cli = load_config(bec.BECConfig, None, ["system=mixture", "mixture.g12=150", "mixture.norms=[0.6, 0.4]"])
    path = tmp_path / "run.toml"
    path.write_text('system = "mixture"\n[mixture]\ng12 = 150.0\nnorms = [0.6, 0.4]\n')
    assert load_config(bec.BECConfig, path) == cli
    assert cli.mixture == bec.MixtureSettings(g12=150.0, norms=[0.6, 0.4])
    assert cli.spin1 == bec.Spin1Settings() and cli.dipolar == bec.DipolarSettings()
    system = bec.condensate_system(dataclasses.replace(cli, grid=8))
    np.testing.assert_allclose(np.asarray(system.g), [[200.0, 150.0], [150.0, 200.0]])
    assert bec.ground_targets(cli, system) == ([0.6, 0.4], {})
