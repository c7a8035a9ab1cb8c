"""bench.studies.cdt_dimensions: a tiny run's records, pooling of raw records, and the scaling fits on known laws."""

import json
import math

import numpy as np
import pytest

from bench.studies import cdt_dimensions as cd


@pytest.fixture(scope="module")
def tiny():
    return cd.run(
        [256],
        chains=4,
        thermal=6,
        measurements=6,
        gap=2,
        origins=3,
        sigma_factor=1.0,
        mix_limit=0,
        walk_origins=1,
        thermal_every=3,
        log=lambda s: None,
    )


def test_run_records_configurations_at_the_target_walks_and_thermal_series(tiny):
    (r,) = tiny
    assert r["n2_target"] == 256 and r["n_slices"] == 8 and r["eps"] == 0.02
    # only the chains at the target volume at each measurement are configurations (the fixed-volume ensemble)
    k = len(r["n2"])
    assert len(r["at_target"]) == 6 and sum(r["at_target"]) == k >= 1
    assert r["n2"] == [256] * k and len(r["chain"]) == k and set(r["chain"]) <= {0, 1, 2, 3}
    for g, nodes in (("vertex", 128), ("dual", 256)):
        assert r["n_nodes"][g] == [nodes] * k
        assert len(r["mean_distance"][g]) == k and all(d > 1 for d in r["mean_distance"][g])
        # one walk per configuration to sigma_max = sqrt(N2) steps, P(0) = 1
        assert [len(p) for p in r["p"][g]] == [17] * k and all(p[0] == pytest.approx(1.0) for p in r["p"][g])
    ts = r["thermal_series"]
    assert ts["sweeps"] == [3, 6] and np.shape(ts["n0"]) == (2, 4)
    assert np.shape(ts["vertex"]) == (2, 4) and np.shape(ts["dual"]) == (2, 4)


def test_load_raw_pools_independent_seeds_and_keeps_one_copy_of_a_chain(tiny, tmp_path):
    (r,) = tiny
    other = {**r, "seed": 7, "mean_distance": {g: [x + 1 for x in v] for g, v in r["mean_distance"].items()}}
    short = {**r, "seed": 9, "p": {g: [p[:5] for p in v] for g, v in r["p"].items()}}
    for name, recs in (("a", [r]), ("b", [r, other]), ("c", [short])):
        (tmp_path / f"{name}.json").write_text(json.dumps(recs))
    (pooled,) = cd.load_raw([tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"])
    # the same seed read twice counts once; a shorter walk is not pooled; the other seed adds its configurations
    k = len(r["n2"])
    assert len(pooled["n2"]) == 2 * k and pooled["chains"] == 8
    assert pooled["mean_distance"]["vertex"] == r["mean_distance"]["vertex"] + other["mean_distance"]["vertex"]
    assert [run["configurations"] for run in pooled["runs"]] == [k, k]


def _samples(law, vols, rel, n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [law(v) * (1 + rel * rng.standard_normal(n)) for v in vols]


def test_scaling_fits_recover_known_exponents():
    vols = [1024.0 * 2**k for k in range(11)]
    # <r> = 3 + 0.7 N^(1/2): the offset form finds d_H = 2 within its error, with chi2/dof near 1;
    # the pure power law, blind to the offset, reads a larger d_H
    fits = cd._scaling_fits(vols, _samples(lambda v: 3 + 0.7 * math.sqrt(v), vols, 0.01), n_boot=40)
    off = fits["offset: <r> = a + b N^(1/d_H)"]["N2=4096..1048576"]
    assert abs(off["d_H"] - 2) < 3 * off["error"] and off["error"] < 0.1
    assert off["chi2_per_dof"] < 3 and 0 < off["bootstrap_error"] < 3 * off["error"]
    assert fits["power: <r> = b N^(1/d_H)"]["N2=4096..1048576"]["d_H"] > 2.02
    # a pure power law with d_H = 2.5: the power form finds it
    fits = cd._scaling_fits(vols, _samples(lambda v: 0.9 * v**0.4, vols, 0.01, seed=1), n_boot=2)
    pw = fits["power: <r> = b N^(1/d_H)"]["N2=1024..1048576"]
    assert abs(pw["d_H"] - 2.5) < 3 * pw["error"] and pw["error"] < 0.05


def test_mean_error_sees_correlated_configurations_through_chain_means():
    # two chains whose configurations sit at different levels: the spread within each is small, so the error
    # over configurations understates the uncertainty of the mean; the error over chain means shows it
    x = [10.0, 10.1, 10.0, 10.1, 12.0, 12.1, 12.0, 12.1]
    labels = ["0"] * 4 + ["1"] * 4
    conf, chains = cd._mean_error(x, labels)
    assert conf == pytest.approx(np.std(x, ddof=1) / math.sqrt(8))
    assert chains == pytest.approx(1.0) and chains > conf
    assert cd._mean_error(x, ["0"] * 8)[1] is None
    assert cd._chain_labels({"chains": 2, "n2": [1, 1, 1, 1]}) == ["0", "1", "0", "1"]


def test_compared_with_reports_what_moved_per_volume_and_window(tmp_path, monkeypatch):
    """--compare: <r> and local exponents of the volumes in both files, plateaus only over the same sigma window,
    each with z = (new - old) / combined error."""
    monkeypatch.setattr(cd, "RESULTS", tmp_path)
    old_h = {
        "provenance": {"commit": "abc"},
        "volumes": [1024.0, 2048.0],
        **{
            g: {"mean_distance": [7.0, 9.0], "mean_distance_error": [0.3, 0.4], "fits": {"local_1024_2048": [2.4, 0.1]}}
            for g in ("vertex", "dual")
        },
    }
    old_s = {"per_volume": [{"graph": "vertex", "n2": 2048.0, "window": [10, 45], "d_s_window_fit": [1.9, 0.03]}]}
    (tmp_path / "old_hausdorff_scaling.json").write_text(json.dumps(old_h))
    (tmp_path / "old_spectral_dimension.json").write_text(json.dumps(old_s))
    haus = {
        "volumes": [2048.0, 4096.0],
        **{
            g: {"mean_distance": [9.5, 12.0], "mean_distance_error": [0.3, 0.4], "fits": {}} for g in ("vertex", "dual")
        },
    }
    spec = {
        "per_volume": [
            {"graph": "vertex", "n2": 2048.0, "window": [10, 45], "d_s_window_fit": [2.0, 0.04]},
            {"graph": "dual", "n2": 2048.0, "window": [10, 45], "d_s_window_fit": [2.0, 0.04]},
        ]
    }
    out = cd._compared_with("old", haus, spec)
    assert out["commit"] == "abc" and list(out["mean_distance_vertex"]) == ["2048"]
    assert out["mean_distance_vertex"]["2048"]["z"] == pytest.approx(0.5 / 0.5)
    assert list(out["d_s_plateaus_same_window"]) == ["vertex 2048 sigma 10..45"]
    assert out["d_s_plateaus_same_window"]["vertex 2048 sigma 10..45"]["z"] == pytest.approx(0.1 / 0.05)


def test_combined_fits_the_volumes_of_earlier_files_with_this_run(tmp_path, monkeypatch):
    """--combine: <r> of earlier results files joined with this run's (this run's value where both have a volume),
    local exponents between neighbours, weighted fits that recover a known law, and with --compare the fits over
    the same ranges as the compared file, old and new with z."""
    monkeypatch.setattr(cd, "RESULTS", tmp_path)
    law = lambda v: 3 + 0.7 * math.sqrt(v)  # noqa: E731 - d_H = 2 with an offset
    vols = [1024.0 * 2**k for k in range(9)]

    def results(vs, shift=0.0):
        rows = {"mean_distance": [law(v) + shift for v in vs], "mean_distance_error": [0.01 * law(v) for v in vs]}
        return {"provenance": {"commit": "c0"}, "volumes": vs, "vertex": rows, "dual": rows}

    # a's value at 8192 is off the law; b's, the later file's, is taken
    (tmp_path / "a_hausdorff_scaling.json").write_text(json.dumps(results(vols[:4], shift=5.0)))
    (tmp_path / "b_hausdorff_scaling.json").write_text(json.dumps(results(vols[3:7])))
    old = results(vols)
    fit = {"offset: <r> = a + b N^(1/d_H)": {"N2=4096..262144": {"d_H": 2.3, "error": 0.1}}}
    for g in ("vertex", "dual"):
        old[g]["weighted_fits"] = fit
    (tmp_path / "old_hausdorff_scaling.json").write_text(json.dumps(old))
    out = cd._combined(["a", "b"], results(vols[6:]), compare="old")
    v = out["vertex"]
    assert v["volumes"] == vols and v["source"] == ["a"] * 3 + ["b"] * 3 + ["this run"] * 3
    assert v["mean_distance"][3] == law(vols[3]) and v["mean_distance"][2] == law(vols[2]) + 5.0
    assert list(v["local_exponents"]) == [f"local_{a:.0f}_{b:.0f}" for a, b in zip(vols, vols[1:])]
    assert v["local_exponents"]["local_8192_16384"][0] == pytest.approx(math.log(2) / math.log(law(16384) / law(8192)))
    offset = v["weighted_fits"]["offset: <r> = a + b N^(1/d_H)"]
    assert offset["N2=8192..262144"]["d_H"] == pytest.approx(2.0, abs=1e-6)
    assert offset["N2=4096..262144"]["d_H"] != pytest.approx(2.0, abs=1e-3)  # a's point at 4096 is off
    same = v["weighted_fits_same_range"]
    assert list(same) == ["offset: <r> = a + b N^(1/d_H) N2=4096..262144"]
    row = same["offset: <r> = a + b N^(1/d_H) N2=4096..262144"]
    assert row["z"] == pytest.approx((row["new"][0] - 2.3) / math.hypot(row["new"][1], 0.1))
