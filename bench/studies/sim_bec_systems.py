"""The ``ivhl sim bec --set system=...`` commands of the condensates guide, run as a user gets them, and what they
conserve: the ground-state search of each, the largest deviation of every conserved record (N, each N_i, M) from
its first value, the largest relative change of the energy, a two-component mixture's overlap, the dipolar cloud's
⟨x²⟩, ⟨y²⟩, ⟨z²⟩ (elongated along the dipoles), the wall time of each run.

``python -m bench.studies.sim_bec_systems --out bench/results/sim_bec_systems_cpu.json`` (a few minutes on 2 CPU
cores; ``--steps N`` shortens the evolutions).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import tempfile
import time

import numpy as np

from ivhl_jax.sims import bec

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "condensates.md"
CONSERVED = ("norm", "magnetization")


def guide_commands() -> list[list[str]]:
    """The ``--set`` overrides of each ``ivhl sim bec --set system=...`` command in the guide's bash blocks."""
    text = GUIDE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ivhl sim bec --set system="):
            words = shlex.split(line.split("#")[0])
            out.append([w for a, w in zip(words, words[1:]) if a == "--set"])
    return out


def measure(sets: list[str], steps: int | None) -> dict:
    extra = [] if steps is None else [f"steps={steps}"]
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--no-progress", "--out", tmp]
        for kv in [*sets, *extra]:
            argv += ["--set", kv]
        t = time.perf_counter()
        assert bec.main(argv) == 0, sets
        wall = time.perf_counter() - t
        doc = json.loads((pathlib.Path(tmp) / "observables.json").read_text())
        state = np.load(pathlib.Path(tmp) / "final_state.npy")
    obs = {k: np.asarray(v, np.float64) for k, v in doc["observables"].items()}
    res: dict = {"settings": sets + extra, "steps": doc["steps"], "ground_state": doc["ground_state"], "wall_s": wall}
    res["max_abs_dev_from_first_record"] = {
        k: float(np.max(np.abs(v - v[0]))) for k, v in obs.items() if k.startswith(CONSERVED)
    }
    e = obs["energy_total"]
    res["max_rel_energy_dev"] = float(np.max(np.abs(e / e[0] - 1)))
    if "overlap" in obs:
        res["overlap_first_last"] = [float(obs["overlap"][0]), float(obs["overlap"][-1])]
    if "energy_dipolar" in obs:
        cfg = doc["config"]
        x = np.linspace(-cfg["length"] / 2, cfg["length"] / 2, cfg["grid"], endpoint=False)
        rho = np.abs(state) ** 2
        res["r2_xyz"] = [
            float(np.sum(rho * np.moveaxis(np.broadcast_to(x**2, rho.shape), -1, a)) / rho.sum()) for a in range(3)
        ]
        res["energy_dipolar_last"] = float(obs["energy_dipolar"][-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=None, help="evolution steps (default: the guide's, the config's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    runs = []
    for sets in guide_commands():
        r = measure(sets, a.steps)
        print(json.dumps(r), flush=True)
        runs.append(r)
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, {"runs": runs})


if __name__ == "__main__":
    main()
