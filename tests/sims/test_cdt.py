"""``ivhl sim cdt``: grow, thermalise, measure at the target volume, analyse; resume; config errors."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from ivhl_jax.physics.cdt import host as cdt_host
from ivhl_jax.sims import cdt as sim

SMALL = [
    "--set",
    "slices=4",
    "--set",
    "volume=64",
    "--set",
    "chains=2",
    "--set",
    "steps_per_chunk=4",
    "--set",
    "save_every=2",
    "--set",
    "r_max=16",
    "--set",
    "curvature_deltas=2",
    "--set",
    "curvature_samples=2",
    "--no-progress",
]


@pytest.mark.parametrize(
    "engine",
    [
        "jax",
        pytest.param(
            "host", marks=[pytest.mark.skipif(not cdt_host.available(), reason="needs numba"), pytest.mark.slow]
        ),
    ],
)
def test_sim_writes_outputs_measures_at_target_and_resumes(tmp_path, capsys, engine):
    out = str(tmp_path / "run")
    args = SMALL + ["--set", f"engine={engine}", "--out", out]
    assert sim.main(args + ["--set", "steps=8"]) == 0
    first = json.load(open(os.path.join(out, "summary.json")))
    assert first["resumed_from"] is None and not first["overflow"]
    assert first["derived"]["engine"] == engine
    # sweeps of fixed length; the averages run over the measurements at N2 = 64 (the fixed-volume ensemble)
    assert 0 < first["measurements_at_target"] < 8
    assert first["at_target_fraction"] == first["measurements_at_target"] / 8
    assert first["mean_slice_length"] == 64 / 2 / 4 and abs(first["mean_n2"] - 64) < 20
    assert first["derived"]["engine_reason"] == "engine set in the config"
    assert 0 < first["geometry"]["configurations"] <= 2 * 9 and first["geometry"]["times"] == 9
    therm = first["thermalisation"]
    assert all(m > 0 for m in therm["criterion_met_at"]) and therm["steps"] >= 2 * max(therm["criterion_met_at"])
    for graph in ("vertex", "dual"):
        geo = first["geometry"][graph]
        n_nodes = 32 if graph == "vertex" else 64
        assert abs(sum(geo["sphere_volumes"]) - n_nodes) < 1e-3  # r_max = 16 spans these tiny tori
        assert len(geo["dbar_over_delta"]) == 2 and all(v > 0 for v in geo["dbar_over_delta"])
    np.testing.assert_allclose(first["mean_coordination"], 6.0)  # Euler on the torus
    for f in first["figures"]:
        assert os.path.getsize(f) > 1000
    check_store(os.path.join(out, "run.zarr"), steps=8, save_every=2, chains=2, slices=4)
    assert sim.main(args + ["--set", "steps=16"]) == 0  # extending: only steps grows
    second = json.load(open(os.path.join(out, "summary.json")))
    assert second["resumed_from"] == 8 and second["steps_done"] == 16
    assert second["thermalisation"] == first["thermalisation"]  # not redone on resume
    capsys.readouterr()
    assert sim.main(args + ["--set", "steps=16", "--set", "volume=80"]) == 2
    assert re.search("different configuration.*volume", capsys.readouterr().err)


def check_store(path, *, steps, save_every, chains, slices):
    """The run store as xarray opens it: dimensions named and shared across variables (``time``, ``chain``,
    ``slice``, ``q``, ``move``), their coordinates, and a UDUNITS-style unit on every variable."""
    import xarray as xr

    ds = xr.open_zarr(path)
    n = steps // save_every
    assert dict(ds.sizes) == {"time": n, "chain": chains, "slice": slices, "q": 33, "move": 3}
    assert ds["lengths"].dims == ("time", "chain", "slice") and ds["n2"].dims == ("time", "chain")
    assert ds["coordination"].dims == ("time", "chain", "q")
    assert ds["accepts"].dims == ds["attempts"].dims == ("time", "chain", "move")
    assert not any("_dim" in d for d in ds.dims)
    np.testing.assert_array_equal(ds["chain"], np.arange(chains))
    np.testing.assert_array_equal(ds["slice"], np.arange(slices))
    np.testing.assert_array_equal(ds["move"], np.arange(3))  # flip, add, delete (cdt.MOVE_NAMES)
    np.testing.assert_array_equal(ds["time"], save_every * np.arange(1, n + 1))
    for name in (*ds.data_vars, *ds.coords):
        assert isinstance(ds[name].attrs.get("units"), str) and ds[name].attrs["units"], name
    for name in ("lengths", "n2", "coordination", "at_target", "chain", "slice"):
        assert ds[name].attrs["units"] == "1"
    # the fixed-volume ensemble is selectable by its flag, and the total volume lines up with the slices
    np.testing.assert_array_equal(ds["lengths"].sum("slice") * 2, ds["n2"])
    np.testing.assert_array_equal(ds["at_target"], ds["n2"] == 64)


#: the counts a run needs at least one of, and those where 0 means automatic
_AT_LEAST_ONE = ("chains", "steps", "save_every", "steps_per_chunk", "thermalise_max", "origins", "curvature_samples")
_AT_LEAST_ZERO = ("attempts_per_sweep", "capacity", "seed", "r_max", "curvature_deltas", "geometry_times")


@pytest.mark.parametrize(
    "sets, pattern",
    [
        (["slices=2"], "slices must be >= 3"),
        (["capacity=20"], "capacity=20 .*cannot hold the target"),
        (["eps=0", "lam=0.6"], "lam=0.6 <= ln 2"),
        (["volume=65"], "even number of triangles"),
        (["engine=gpu"], "engine must be"),
        (["steps=30"], "multiple of steps_per_chunk"),
        (["steps_per_chunk=5", "steps=20"], "multiple of save_every"),
        (["chunks=4"], "unknown config key.*chunks.*steps_per_chunk"),  # one vocabulary: steps_per_chunk, as elsewhere
        # one bad value for every other key: one line, exit 2, before any work
        (["eps=-1"], "eps must be >= 0"),
        (["eps=nan"], "eps must be a finite number"),
        (["lam=inf"], "lam must be a finite number"),
        (["volume=-64"], "volume must be an even number"),
        (["capacity=70000", "engine=jax"], "capacity=70000 .*jax engine"),
    ]
    + [([f"{k}=0"], f"{k} must be >= 1") for k in _AT_LEAST_ONE]
    + [([f"{k}=-1"], f"{k} must be >= 0") for k in _AT_LEAST_ZERO],
)
def test_sim_config_errors_are_one_line(tmp_path, capsys, sets, pattern):
    args = [x for kv in sets for x in ("--set", kv)] + ["--out", str(tmp_path / "bad")]
    assert sim.main(args) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err) and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_every_phase_reports_progress(tmp_path, capsys):
    """Growing and thermalising, the sweeps and the geometry each announce themselves and report progress."""
    args = [a for a in SMALL if a != "--no-progress"] + [
        "--set",
        "engine=jax",
        "--set",
        "steps=8",
        "--out",
        str(tmp_path / "p"),
    ]
    assert sim.main(args) == 0
    captured = capsys.readouterr()
    err = captured.err + captured.out
    for phase in ("grow and thermalise", "geometry"):
        assert re.search(rf"^{phase} \(.+\) \.\.\.$", err, re.M), err
        assert re.search(rf"^{phase}: done in [0-9.]+ s$", err, re.M), err
    assert "vertex graph measured" in err and "dual graph measured" in err
    assert "every chain met the criterion" in err
    assert "cdt sweeps" in err


def test_host_engine_without_numba_is_a_config_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cdt_host, "available", lambda: False)
    assert sim.main(["--set", "engine=host", "--out", str(tmp_path / "x")]) == 2
    assert "needs numba" in capsys.readouterr().err


@pytest.mark.parametrize("key, value", [("sweeps", "400"), ("measure_every", "4")])
@pytest.mark.parametrize("where", ["set", "toml", "json"])
def test_unknown_keys_are_one_line_listing_the_valid_keys(tmp_path, capsys, key, value, where):
    """One vocabulary (steps, save_every) in the config and the CLI: any other key is refused by name."""
    args = ["--out", str(tmp_path / "bad")]
    if where == "set":
        args += ["--set", f"{key}={value}"]
    else:
        path = tmp_path / f"run.{where}"
        path.write_text(f"{key} = {value}\n" if where == "toml" else json.dumps({key: int(value)}))
        args += ["--config", str(path)]
    assert sim.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"unknown config key(s) ['{key}']" in err and "valid keys: [" in err, err
    assert "'steps'" in err and "'save_every'" in err, err
    assert not os.path.exists(tmp_path / "bad" / "config.json")  # refused before the run folder is touched


def test_the_new_keys_are_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        sim.main(["--help"])
    out = capsys.readouterr().out
    assert re.search(r"\n  steps +int +200 +measured steps \(1 step = 1 sweep\)", out), out
    assert re.search(r"\n  save_every +int +2 +steps \(sweeps\) between measurements", out), out
    assert re.search(r"\n  thermalise_max +int +2000 +most steps \(sweeps\)", out), out
    assert not re.search(r"\n  (sweeps|measure_every) ", out)


@pytest.mark.slow  # three short CLI runs (20 s on a loaded 2-core host)
def test_streamed_observations_equal_the_in_memory_analysis(tmp_path):
    """The sweeps' records go to <out>/run.zarr and the analysis reads them back; an extended run appends
    without duplicating a record: its summary equals the uninterrupted run's."""
    from ivhl_jax.run import open_run

    plain, streamed = str(tmp_path / "plain"), str(tmp_path / "streamed")
    args = SMALL + ["--set", "engine=jax"]
    assert sim.main(args + ["--set", "steps=8", "--out", plain]) == 0
    assert sim.main(args + ["--set", "steps=4", "--out", streamed]) == 0
    assert sim.main(args + ["--set", "steps=8", "--out", streamed]) == 0
    a = json.load(open(os.path.join(plain, "summary.json")))
    b = json.load(open(os.path.join(streamed, "summary.json")))
    assert open_run(streamed).observations.sizes["time"] == 8 // 2
    for key in (
        "mean_n2",
        "std_n2",
        "mean_slice_length",
        "autocorrelation",
        "volume_correlator",
        "coordination_histogram",
        "accepted_moves",
        "geometry",
    ):
        assert key in a and a[key] == b[key], key


def test_the_run_names_its_engine_and_why(monkeypatch, capsys):
    """engine=auto where the platform's default is the host engine but numba is missing: the run takes the JAX
    engine and its first line says so and why (never silently another engine than ``ivhl info`` shows)."""
    from ivhl_jax.core import backend

    cfg = sim.CDTConfig(slices=4, volume=64, chains=2)
    with backend.override(cdt_engine="host"):
        monkeypatch.setattr(cdt_host, "available", lambda: False)
        engine, reason = sim.engine_choice(cfg)
        assert engine == "jax" and "needs numba" in reason and "cpu-kernels" in reason
        assert sim.derived(cfg)["engine_reason"] == reason
        monkeypatch.setattr(cdt_host, "available", lambda: True)
        assert sim.engine_choice(cfg) == ("host", "engine=auto: this platform's default (ivhl info: cdt_engine=host)")
    assert sim.engine_choice(sim.CDTConfig(engine="jax")) == ("jax", "engine set in the config")


# ----------------------------------------------------------------------------------------------
# dims=3: the 2+1D chain (cdt.metropolis_3d, host engine)

SMALL_3D = [
    x
    for kv in (
        "dims=3",
        "slices=4",
        "target=60",
        "chains=2",
        "steps_per_chunk=4",
        "save_every=2",
        "attempts_per_sweep=600",
        "eps=0.2",  # a tiny universe: a stiff volume term keeps half the measurements at the target
        "k3=1.9",
    )
    for x in ("--set", kv)
] + ["--no-progress"]


@pytest.mark.skipif(not cdt_host.available(), reason="the 2+1D engine needs numba")
def test_sim_3d_records_observe_3d_and_an_interrupted_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    """dims=3 builds cdt.metropolis_3d and streams observe_3d's records; a run killed after its first chunk and
    started again ends with the records, summary and final checkpoint of the run that was never interrupted."""
    import jax
    import xarray as xr

    from ivhl_jax.physics import cdt

    plain, killed = str(tmp_path / "plain"), str(tmp_path / "killed")
    args = SMALL_3D + ["--set", "steps=8"]
    assert sim.main(args + ["--out", plain]) == 0

    real = sim.vmapped_chunk

    def dies_in_the_second_chunk(stepper, steps, save_every, observe):
        advance = real(stepper, steps, save_every, observe)
        if observe is not cdt.observe_3d:
            return advance
        calls = []

        def wrapped(chains):
            if not isinstance(jax.tree_util.tree_leaves(chains)[0], jax.core.Tracer):  # a chunk run, not a trace
                calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt  # what Ctrl-C or a SIGTERM becomes in the driver
            return advance(chains)

        return wrapped

    monkeypatch.setattr(sim, "vmapped_chunk", dies_in_the_second_chunk)
    assert sim.main(args + ["--out", killed]) == 130  # interrupted: "rerun the same command to resume"
    monkeypatch.setattr(sim, "vmapped_chunk", real)
    assert sim.main(args + ["--out", killed]) == 0

    a, b = (json.load(open(os.path.join(p, "summary.json"))) for p in (plain, killed))
    assert a["resumed_from"] is None and b["resumed_from"] == 4 and b["steps_done"] == a["steps_done"] == 8
    for key in ("n22_over_n31", "mean_n3", "mean_profile_centred", "accepted_moves", "de_sitter"):
        assert a[key] == b[key], key
    for key in ("steps", "criterion_met_at"):  # the grow-and-thermalise phase, all but its wall time
        assert a["thermalisation"][key] == b["thermalisation"][key], key
    da, db = xr.open_zarr(os.path.join(plain, "run.zarr")), xr.open_zarr(os.path.join(killed, "run.zarr"))
    assert dict(da.sizes) == {"time": 4, "chain": 2, "slice": 4, "move": 5}
    assert da["slice_volumes"].dims == ("time", "chain", "slice") and da["accepts"].dims == ("time", "chain", "move")
    for name in ("slice_volumes", "n0", "n31", "n22", "n3", "at_target", "accepts", "attempts"):
        np.testing.assert_array_equal(da[name].values, db[name].values, err_msg=name)
    # the records are observe_3d's: N(3,1) = N(1,3) = the spatial triangles, N0 = N(3,1)/2 + 2T on spherical slices
    n31_up = da["n31"].values // 2
    np.testing.assert_array_equal(da["slice_volumes"].sum("slice").values, n31_up)
    np.testing.assert_array_equal(da["n0"].values, n31_up // 2 + 2 * 4)
    np.testing.assert_array_equal(da["n3"].values, da["n31"].values + da["n22"].values)
    np.testing.assert_array_equal(da["at_target"].values, n31_up == 60)
    assert a["derived"]["attempts_per_sweep"] == 600 and a["thermalisation"]["steps"] >= sim.THERMALISE_3D_MIN
    for f in a["figures"]:
        assert os.path.getsize(f) > 1000


@pytest.mark.parametrize(
    "sets, pattern",
    [
        (["dims=4"], "dims must be 2 \\(1\\+1D\\) or 3 \\(2\\+1D\\)"),
        (["dims=3", "lam=0.8"], "dims=3 does not read the 1\\+1D \\(dims=2\\) key\\(s\\) lam;"),
        (["dims=3", "volume=1024", "origins=4"], "dims=3 does not read .* key\\(s\\) volume, origins;"),
        (["k0=6"], "dims=2 does not read the 2\\+1D \\(dims=3\\) key\\(s\\) k0;"),
        (["target=500", "fix=n3"], "dims=2 does not read .* key\\(s\\) target, fix;"),
        (["dims=3", "engine=jax"], "dims=3 runs on the host engine"),
        (["dims=3", "eps=0"], "dims=3 needs eps > 0"),
        (["dims=3", "target=20"], "target must be >= 96 .*16 slices"),
        (["dims=3", "fix=n4"], "fix must be one of"),
        (["dims=3", "measure=exact"], "measure must be one of"),
        (["dims=3", "k3=nan"], "k3 must be a finite number"),
        (["dims=3", "capacity=100"], "capacity"),
        (["dims=3", "steps=30"], "multiple of steps_per_chunk"),
    ],
)
def test_sim_3d_config_errors_are_one_line(tmp_path, capsys, sets, pattern):
    args = [x for kv in sets for x in ("--set", kv)] + ["--out", str(tmp_path / "bad")]
    assert sim.main(args) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_sim_3d_defaults_are_the_reference_example_couplings():
    """A user asking for dims=3 gets the reference's example couplings (k0 = 5, k3 = 1.703) with its (2,6)/(6,2)
    ratios, for which that k3 is tuned, N(3,1) fixed at 1000 and a sweep of 10 x target attempts."""
    cfg = sim.CDTConfig(dims=3)
    cfg.validate()
    assert (cfg.k0, cfg.k3, cfg.target, cfg.fix, cfg.measure) == (5.0, 1.703, 1000, "n31", "reference")
    d = sim.derived_3d(cfg)
    assert d["attempts_per_sweep"] == 10_000 and d["tetra_capacity"] == 8000
    st = sim.stepper_3d(cfg, d)
    assert st.params.k0 == 5.0 and st.params.k3 == 1.703 and st.params.measure == "reference"
