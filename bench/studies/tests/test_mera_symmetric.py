"""The symmetric MERA ladder study at a few sweeps: a stage saved with one transitional layer count continues with
more (``--load`` and ``--layers``), the loaded MERA's scale-invariant layer copied below its top as the dense
ladder does."""

from __future__ import annotations

import json
import pickle

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
