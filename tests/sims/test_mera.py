"""`ivhl sim mera`: outputs, JSON contents, checkpoint resume (tiny χ = 4 ladder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ivhl_jax.sims import mera as sim


def sets(*settings: str) -> list[str]:
    """The command-line words that set each ``key=value`` of ``settings`` (``--set key=value`` each)."""
    return [word for setting in settings for word in ("--set", setting)]


# Same sweep settings as tests/physics/mera/test_sweep.py::_SMALL with one step (sweep) per chunk.
SCHEDULE = ("u_delay=3", "steps_per_chunk=1", "checkpoint_every=2")
ARGS = sets("chis=[4]", "chi_mids=[]", "steps=[6]", "layers=[1]", *SCHEDULE) + ["--no-progress"]


def test_sim_outputs_and_resume(tmp_path, capsys):
    # JAX's backend runs before sim.main, as it does after any earlier test: on a busy host the sim would otherwise
    # pin this pytest process (and every process it starts later) to one core
    jax.devices()
    out = str(tmp_path / "mera")
    ahead = ARGS
    assert sim.main(ahead + ["--out", out]) == 0
    with open(os.path.join(out, "mera.json")) as f:
        doc = json.load(f)
    err = np.array(doc["energy_error_per_sweep"])
    assert err.shape == (6,) and np.all(err > 0)
    assert doc["stages"][0]["chi"] == 4 and doc["stages"][0]["resumed_from"] is None
    assert doc["stages"][0]["precision"] == "float64" and doc["restarts"] == []  # 6 sweeps: no stuck check
    assert doc["stages"][0]["isometry_error"]["w"] < 1e-12
    assert doc["stages"][0]["layer_chis"] == [4, 4] and doc["model"] == "ising(g=1)"
    table = doc["conformal_data"]
    assert len(table) == 12 and table[0]["label"] == "1" and abs(table[0]["delta"]) < 1e-8
    assert all(r["reflection_parity"] in (-1, 0, 1) for r in table) and table[1]["primary"] in ("σ", "ε", "1")
    assert len(doc["scaling_dimensions"]) == len(doc["scaling_dimensions_exact"])
    assert abs(doc["scaling_dimensions"][0]) < 1e-8
    # OPE and central charge are reported (6 sweeps at χ = 4 are far from the CFT: a value or the stated reason)
    assert set(doc["ope_coefficients"]) in ({"C_σσε"}, {"error"})
    cc = doc["central_charge"]
    assert np.isfinite(cc["c"]) and cc["exact"] == 0.5 and "rings" in cc["method"] and len(cc["pairs"]) == 3
    # host_cores=0 (the default): all cores, whatever the host's load
    assert doc["host_cores"] == "all cores (host_cores=0)", doc["host_cores"]
    for name in ("convergence.png", "scaling_dims.png", "config.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    # a second run with the same configuration resumes from the finished checkpoint and reproduces it
    assert sim.main(ahead + ["--out", out]) == 0
    with open(os.path.join(out, "mera.json")) as f:
        again = json.load(f)
    assert again["stages"][0]["resumed_from"] == 6
    np.testing.assert_array_equal(again["energy_error_per_sweep"], err)
    # host_cores changes no result: a folder written before the key existed, or with another value, resumes
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({k: v for k, v in written.items() if k != "host_cores"}, f)
    assert sim.main(ahead + ["--set", "host_cores=2", "--out", out]) == 0
    with open(os.path.join(out, "mera.json")) as f:
        assert json.load(f)["stages"][0]["resumed_from"] == 6


def test_sim_refuses_a_different_configuration_in_the_same_folder(tmp_path, capsys):
    out = str(tmp_path / "mera")
    assert sim.main(ARGS + ["--out", out]) == 0
    assert sim.main(ARGS + ["--set", "seed=3", "--out", out]) == 2
    assert "different configuration" in capsys.readouterr().err


def test_sim_bad_config(capsys):
    assert sim.main(["--set", "chis=4,6", "--set", "steps=[10]", "--set", "layers=[1]"]) == 2
    assert "same" in capsys.readouterr().err
    # the last stage must finish in float64; per-stage lists need one entry per stage
    assert sim.main(ARGS + ["--set", 'precision=["f32"]']) == 2
    assert "f64" in capsys.readouterr().err
    assert sim.main(ARGS + ["--set", "chi_mids=[4, 4]"]) == 2  # one stage
    assert "one entry per stage" in capsys.readouterr().err
    assert sim.main(ARGS + sets("chis=[4, 4]", "steps=[6, 6]", "layers=[1, 1]", 'precision=["bf16", "f64"]')) == 2
    assert "precision[0]" in capsys.readouterr().err
    for bad in ("-1", "true", "1.5"):
        assert sim.main(ARGS + ["--set", f"host_cores={bad}"]) == 2
        assert "host_cores" in capsys.readouterr().err


def test_sim_model_and_per_layer_chi_errors_name_the_key(tmp_path, capsys):
    """One line, exit 2, naming the key: a χ a layer cannot carry, a non-Hermitian term, a spin-dimension mismatch,
    an unknown model."""

    def fails(extra, key):
        assert sim.main(ARGS + extra + ["--out", str(tmp_path / "m")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and key in err, err

    fails(["--set", "chis=[20]"], "chis[0]")  # one transitional layer above d² = 16 cannot reach χ = 20
    fails(["--set", "layer_chis=[[20, 20]]"], "layer_chis[0]")
    fails(["--set", "layer_chis=[[4, 4, 4]]"], "layer_chis[0]")  # layers + 1 entries
    fails(["--set", "d=3"], "d=3")
    fails(["--set", "model=heisenberg"], "model")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.arange(16.0).reshape(2, 2, 2, 2))
    fails(["--set", "model=custom", "--set", f"term_file={bad}"], "term_file")
    fails(["--set", "model=custom"], "term_file")
    good = tmp_path / "xx.npy"
    np.save(good, np.asarray(sim.M.xx().term))
    fails(["--set", "model=custom", "--set", f"term_file={good}"], "stuck_after")  # no e0 for the stuck check
    assert not os.path.exists(tmp_path / "m")


def test_sim_runs_another_model_with_per_layer_chi(tmp_path):
    """The XX chain on a per-layer ladder (χ above the layers: 4, 4 then 4, 6, 6): energies above the exact −1/π;
    resumed from its checkpoints."""
    out = str(tmp_path / "xx")
    args = sets(
        "model=xx", "chis=[4, 6]", "chi_mids=[]", "steps=[6, 2]", "layers=[1, 2]", "layer_chis=[[4, 4], [4, 6, 6]]"
    )
    args += sets(*SCHEDULE) + ["--no-progress", "--out", out]
    assert sim.main(args) == 0
    with open(os.path.join(out, "mera.json")) as f:
        doc = json.load(f)
    assert doc["model"] == "xx" and doc["e0_exact"] == pytest.approx(-1 / np.pi)
    assert doc["stages"][1]["layer_chis"] == [4, 6, 6]
    assert np.all(np.array(doc["energy_error_per_sweep"]) > 0)
    # the per-layer shapes travel through the checkpoints: a second run resumes both stages and reproduces them
    assert sim.main(args) == 0
    with open(os.path.join(out, "mera.json")) as f:
        again = json.load(f)
    assert [st["resumed_from"] for st in again["stages"]] == [6, 2]
    np.testing.assert_array_equal(again["energy_error_per_sweep"], doc["energy_error_per_sweep"])


@pytest.mark.slow  # a fresh process (~10 s)
@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores (Linux)")
def test_cli_run_holds_xla_to_one_core_when_asked(tmp_path):
    """From the command line nothing starts JAX's backend before the sim applies host_cores."""
    out = str(tmp_path / "mera")
    subprocess.run(
        [sys.executable, "-m", "ivhl_jax.sims.mera", *ARGS, "--set", "host_cores=1", "--out", out],
        check=True,
        capture_output=True,
        text=True,
    )
    with open(os.path.join(out, "mera.json")) as f:
        assert json.load(f)["host_cores"].startswith("applied: cores [")


def test_sim_unknown_keys_fail_with_one_line_listing_the_valid_keys(tmp_path, capsys):
    """An unknown key fails (exit 2) with one line naming it and listing the valid keys."""
    for bad, key in (("sweeps=[6]", "sweeps"), ("sweeps_per_chunk=1", "sweeps_per_chunk")):
        assert sim.main(["--set", bad, "--out", str(tmp_path / "m"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"unknown config key(s) ['{key}']" in err, err
        assert "valid keys: [" in err and "'steps'" in err and "'steps_per_chunk'" in err, err
    cfg = tmp_path / "bad.toml"
    cfg.write_text("chis = [4]\nsweeps = [6]\nlayers = [1]\n")
    assert sim.main(["--config", str(cfg), "--out", str(tmp_path / "m"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown config key(s) ['sweeps']" in err and "valid keys: [" in err, err
    assert not os.path.exists(tmp_path / "m")


def test_sim_streams_each_stages_energies(tmp_path):
    """Each stage's per-sweep energies go to the group stage<k> (k from 1, as the log counts) of <out>/run.zarr,
    listed in the root attribute "groups", and the summary reads them back."""
    import zarr

    from ivhl_jax.run import open_run

    out = str(tmp_path / "run")
    assert sim.main(ARGS + ["--out", out]) == 0
    b = json.load(open(os.path.join(out, "mera.json")))
    root = [os.path.join(out, p) for p in os.listdir(out) if p.endswith(".zarr")][0]
    assert zarr.open_group(root, mode="r").attrs["groups"] == ["stage1"]
    stage = open_run(out, group="stage1")
    assert stage.observations.sizes["time"] == 6 and stage.observations["energy"].dims == ("time",)
    key = "energy_error_per_sweep" if "energy_error_per_sweep" in b else "energy_per_sweep"
    e = stage.observations["energy"].values.astype(np.float64)
    np.testing.assert_allclose(np.diff(np.asarray(b[key])[-6:]), np.diff(e), rtol=0, atol=1e-12)


def test_progress_counts_every_phase_to_its_configured_steps(tmp_path, capsys):
    """With progress, the cold start's checked steps and the rest of the stage count to the stage's configured
    steps (200/200, not the 50 left after the check), and the conformal-data phase is announced."""
    args = [a for a in ARGS if a != "--no-progress"]
    args += ["--set", "steps=[200]", "--set", "stuck_after=150", "--set", "stuck_every=0"]
    args += ["--set", "steps_per_chunk=50", "--set", "checkpoint_every=50"]
    assert sim.main(args + ["--out", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert "cold start (checked): step 150/200" in err and "(stage 1/1): step 200/200" in err, err
    assert "/50," not in err
    for what in ("one-site scaling dimensions", "two-site scaling dimensions", "central charge"):
        assert f"conformal data: {what}" in err, err


def test_wrong_e0_is_an_error_naming_e0(tmp_path, capsys):
    """A custom model whose claimed exact energy lies above the MERA's: a one-line error naming e0 (exit 2)."""
    from ivhl_jax import mera

    term = tmp_path / "h.npy"
    np.save(term, np.asarray(mera.ising().term))
    args = ARGS + ["--set", "model=custom", "--set", f"term_file={term}", "--set", "stuck_after=0"]
    with pytest.raises(SystemExit) as exc:
        sim.main(args + ["--set", "e0=-1.0", "--out", str(tmp_path / "m")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "e0=-1.0 is not the exact energy per site" in err and err.count("\n") == 1, err


@pytest.mark.slow  # two symmetric stages and their conformal data (~40 s)
def test_symmetric_run_from_the_cli(tmp_path):
    """--set symmetry=Z2 runs the block-sparse MERA with the dense run's records: energies per sweep, the store's
    stage groups, and scaling dimensions with their charges (the identity even)."""
    from ivhl_jax.run import open_run

    out = str(tmp_path / "sym")
    args = ARGS + ["--set", "symmetry=Z2", "--set", "chis=[4,6]", "--set", "steps=[6,4]", "--set", "layers=[1,1]"]
    assert sim.main(args + ["--out", out]) == 0
    doc = json.load(open(os.path.join(out, "mera.json")))
    assert doc["symmetry"] == "Z2" and len(doc["energy_error_per_sweep"]) == 10
    assert np.all(np.asarray(doc["energy_error_per_sweep"]) > 0)
    assert doc["stages"][1]["layer_chis"] == [6, 6] and doc["scaling_dimension_charges"][0] == 0
    assert set(doc["scaling_dimension_charges"]) == {0, 1}
    assert open_run(out, group="stage2").observations.sizes["time"] == 4


def test_ctrl_c_in_the_conformal_phase_is_raised_not_lost():
    """A SIGINT during the conformal-data phase is kept and raised as KeyboardInterrupt at its next step (never
    swallowed inside a library callback), and the previous handler is back afterwards."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with sim._interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            sim.interrupt_point()
            raise AssertionError("interrupt_point did not raise")
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):  # one that lands after the last step is raised on leaving the phase
        with sim._interruptible():
            os.kill(os.getpid(), signal.SIGINT)
