"""The 2+1D CDT reference runner (bench/peer_cdt3.py).

The reference code (JorenB/3d-cdt) is not vendored: the tests that build and run it skip unless
``IVHL_3DCDT_SRC`` names a folder with its sources (e.g. ``git -C <mirror> archive HEAD | tar -x -C DIR``).
"""

import os

import numpy as np
import pytest

from ivhl_jax.bench import peer_cdt3

SRC = os.environ.get(peer_cdt3.ENV_VAR)
needs_src = pytest.mark.skipif(not SRC, reason=f"set {peer_cdt3.ENV_VAR} to a JorenB/3d-cdt checkout to run it")


def test_missing_sources_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(peer_cdt3.ENV_VAR, raising=False)
    with pytest.raises(peer_cdt3.PeerNotVendoredError, match="IVHL_3DCDT_SRC"):
        peer_cdt3.peer_src_dir(None)
    with pytest.raises(peer_cdt3.PeerNotVendoredError, match="lacks universe.cpp"):
        peer_cdt3.peer_src_dir(tmp_path)


def test_config_file_is_the_reference_format(tmp_path):
    path = peer_cdt3.write_config(tmp_path / "c.dat", k0=5.0, targetvolume=3000, infile="g.cdt")
    assert (tmp_path / "c.dat").read_text() == "k0 5.0\ntargetvolume 3000\ninfile g.cdt\n"
    assert path.endswith("c.dat")


def test_bad_run_parameters_are_refused_before_running():
    with pytest.raises(ValueError, match="thermal must be >= 10"):
        peer_cdt3.RunSpec(thermal=5).check()
    with pytest.raises(ValueError, match="target"):
        peer_cdt3.RunSpec(target=0).check()
    with pytest.raises(ValueError, match="n_slices"):
        peer_cdt3.RunSpec(n_slices=2).check()
    assert peer_cdt3.starting_k3(5.0) == peer_cdt3.EXAMPLE["k3"]


@needs_src
def test_reference_runs_and_its_counts_are_consistent(tmp_path):
    binary = peer_cdt3.build_peer(SRC, out=tmp_path / "bench")
    T, target, sweeps = 4, 300, 20
    spec = peer_cdt3.RunSpec(target=target, n_slices=T, thermal=10, sweeps=sweeps, ksteps=1, epsilon=0.01)
    run = peer_cdt3.run_peer(binary, SRC, spec, timed_attempts=20_000, workdir=tmp_path / "w")
    c, prof = run["counts"], run["profiles"]
    assert prof.shape == (sweeps, T)
    # the reference measures once N(3,1) equals the target exactly
    assert np.all(c["n31_only"] == target) and np.all(prof.sum(axis=1) == target)
    assert np.all(c["n13"] == c["n31_only"]) and np.all(c["n31"] == 2 * target)
    assert np.all(c["n3"] == c["n31"] + c["n22"])
    # every slice a triangulated 2-sphere: V = F/2 + 2 per slice
    assert np.all(c["n0"] == target // 2 + 2 * T)
    by_move = run["accept_by_move"]
    assert sum(m["attempted"] for m in by_move.values()) == run["attempts"] == 20_000
    assert run["attempts_per_cpu_s"] > 0
    res = peer_cdt3.analyse(c, prof)
    assert 0 < res["n22_over_n31"]["value"] < 1 and res["n22_over_n31"]["error"] > 0
    assert len(res["profile"]["mean"]) == T
    assert sum(res["slice_area_histogram"]["counts"]) == sweeps * T
