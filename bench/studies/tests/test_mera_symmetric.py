"""The symmetric MERA ladder study at a few sweeps: a stage saved with one transitional layer count continues with
more (``--load`` and ``--layers``), the loaded MERA's scale-invariant layer copied below its top as the dense
ladder does."""

from __future__ import annotations

import json
import pickle

import pytest

from bench.studies import mera_symmetric as S


def test_a_loaded_stage_continues_with_more_transitional_layers(tmp_path):
    save = tmp_path / "ising"
    first = ["--model", "ising", "--light", "--save", str(save)]
    assert S.main([*first, "--ladder", "4/4/3", "--out", str(tmp_path / "a.json")]) == 0
    with open(f"{save}_chi4.pkl", "rb") as f:
        m, _ = pickle.load(f)
    assert m.num_layers == 3  # Ising's default: two transitional layers and the scale-invariant one
    more = ["--model", "ising", "--light", "--load", f"{save}_chi4.pkl", "--layers", "3", "--save", str(save)]
    assert S.main([*more, "--ladder", "4/4/2", "--out", str(tmp_path / "b.json")]) == 0
    stage = json.loads((tmp_path / "b.json").read_text())["stages"][0]
    assert stage["layer_chis"] == [4, 4, 4, 4] and stage["sweeps_done"] == 2
    assert abs(stage["energy_error"]) < 1.0


@pytest.mark.slow  # two U(1) sweeps compiled (χ 4 and 6)
def test_tracked_stage_and_given_sectors(tmp_path):
    """``--track`` records the energy and the charged dimensions during a stage; ``--grow-sectors`` replaces the grown
    sectors of the bonds of that size (U(1) XX, χ 4 → 6)."""
    save = tmp_path / "xx"
    first = ["--model", "xx", "--light", "--save", str(save), "--ladder", "4/4/2", "--out", str(tmp_path / "a.json")]
    assert S.main(first) == 0
    more = ["--model", "xx", "--light", "--load", f"{save}_chi4.pkl", "--ladder", "6/4/4", "--track", "2"]
    given = ["--grow-sectors", '{"-2": 1, "-1": 1, "0": 2, "1": 1, "2": 1}', "--out", str(tmp_path / "b.json")]
    assert S.main([*more, *given]) == 0
    stage = json.loads((tmp_path / "b.json").read_text())["stages"][0]
    assert [t["sweeps"] for t in stage["tracked"]] == [2, 4]
    assert stage["tracked"][-1]["energy_error"] == stage["energy_error_at_sweep"]["4"]
    assert stage["sectors"][-1] == {"-2": 1, "-1": 1, "0": 2, "1": 1, "2": 1}


def test_xx_block_charges_follow_the_compact_boson_tower():
    """The Schmidt values of a long block of the XX chain fall in the towers of the c = 1 compact boson (free
    fermion), levels h = q²/2 + n in charge q: q = 0 at h = 0 and 1, q = ±1 at h = ½ above them, then the pair q = ±1
    at h = 3/2 tied, then four tied at h = 2 (q = 0 twice, q = ±2)."""
    rec = S.xx_block_charges(64, 6)
    assert rec["kept"] == {"-1": 1, "0": 2, "1": 1} and rec["tied"] == {"-1": 1, "1": 1}
    rec = S.xx_block_charges(64, 7)
    assert rec["kept"] == {"-1": 2, "0": 2, "1": 2} and rec["tied"] == {"-2": 1, "0": 2, "2": 1}
