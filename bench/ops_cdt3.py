"""2+1D CDT side by side: our engine (``cdt.metropolis_3d``) against the reference code JorenB/3d-cdt.

Same couplings, same target volume, same sweep, same measurement rule: the reference runs first
(:mod:`ivhl_jax.bench.peer_cdt3`: ``k0``, a starting ``k3`` it retunes during thermalisation, ``target``
(3,1) tetrahedra, ``epsilon``, ``T`` slices, sweeps of ``ksteps * 1000`` attempts, a measurement after each
sweep once N(3,1) equals the target); our chain then runs at the reference's final ``k3`` (``k3_tuned``) with
``measure="reference"`` (the reference's (2,6)/(6,2) acceptance) and ``stop_at_target=True`` (its
continue-until-target rule), the same ``eps``, ``target`` and ``attempts_per_sweep``, from the minimal
triangulation of ``T`` slices. Both are analysed by :func:`ivhl_jax.bench.peer_cdt3.analyse` and compared
with z-scores (:func:`ivhl_jax.physics.cdt.d3_profile.z_scores`): ⟨N22⟩/⟨N31⟩, ⟨N0⟩, ⟨N3⟩, the de Sitter ``s``,
and the centred averaged profile slice by slice (χ² of the per-slice z-scores).

Throughput: move attempts per second of the timed loops (wall clock, and per CPU-second, which other jobs on a
shared host do not change), on one core (one chain, one process) and in aggregate over two chains (ours: a
``jax.vmap`` batch of 2, whose host kernels run in parallel threads; the reference: 2 processes at once), with
the cores each actually got.

Command line (writes ``bench/results/cdt3_vs_reference.json``)::

    python -m ivhl_jax.bench.ops_cdt3 --peer-src DIR --k0 5.0 --target 1000 --slices 16
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import jax
import numpy as np

from ivhl_jax.bench import peer_cdt3


def engine_run(spec: peer_cdt3.RunSpec, *, chains: int = 1) -> dict[str, Any]:
    """Run our engine as :func:`peer_cdt3.run_peer` runs the reference (``spec.k3`` is used as is: pass the
    reference's ``k3_tuned``); return the counts and profiles of chain 0 (the keys of the reference's record)
    and the attempts/s of the measurement phase summed over ``chains`` (a vmapped batch, seeds from
    ``spec.seed``)."""
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import cdt

    spec.check()
    stepper = cdt.metropolis_3d(
        spec.k0,
        spec.k3,
        target=spec.target,
        eps=spec.epsilon,
        attempts_per_sweep=spec.ksteps * 1000,
        measure="reference",
        stop_at_target=True,
    )
    keys = jax.random.split(jax.random.key(spec.seed), chains)
    chain = jax.vmap(lambda k: stepper.init(k, spec.n_slices))(keys)

    def run(c, n):
        return jax.vmap(lambda s: trajectory(stepper, s, n, observe=cdt.observe_3d))(c)

    t0 = time.perf_counter()
    chain, _ = run(chain, spec.thermal)
    t_thermal = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    chain, obs = run(chain, spec.sweeps)
    obs = jax.device_get(obs)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    attempts = int(np.asarray(obs["attempts"]).sum())
    acc = np.asarray(obs["accepts"]).sum(axis=(0, 1))
    att = np.asarray(obs["attempts"]).sum(axis=(0, 1))
    # the reference measures only at N(3,1) == target: keep chain 0's measurements that are (stop_at_target can miss)
    hit = np.asarray(obs["at_target"])[0]
    counts = {name: np.asarray(obs[name])[0][hit].astype(np.int64) for name in ("n0", "n31", "n22", "n3")}
    return {
        "spec": dataclasses.asdict(spec),
        "chains": chains,
        "thermal_seconds": t_thermal,
        "seconds": seconds,
        "attempts": attempts,
        "attempts_per_s": attempts / seconds,
        # CPU time of this process (all threads: the host kernels run in the callback's threads), robust to other
        # jobs on the host; per chain when there are several
        "cpu_seconds": cpu_seconds,
        "attempts_per_cpu_s": attempts / cpu_seconds,
        "accept_by_move": {
            name: {"attempted": int(att[i]), "accepted": int(acc[i])}
            for i, name in enumerate(("26", "62", "44", "23", "32"))
        },
        "at_target_fraction": float(np.mean(np.asarray(obs["at_target"]))),
        "overflow": bool(np.any(np.asarray(obs["overflow"]))),
        "counts": counts,
        "profiles": np.asarray(obs["slice_volumes"])[0][hit].astype(np.int64),
    }


def compare(ours: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """z-scores of the observables of two :func:`peer_cdt3.analyse` results (``ours``, ``ref``) and the χ² of the
    per-slice z-scores of their centred averaged profiles (``dof`` = slices)."""
    from ivhl_jax.physics.cdt import d3_profile

    def pick(res: dict[str, Any]) -> dict[str, tuple[float, float]]:
        out = {"n22_over_n31": (res["n22_over_n31"]["value"], res["n22_over_n31"]["error"])}
        for name in ("n0", "n31", "n22", "n3"):
            out[f"mean_{name}"] = (res[f"mean_{name}"]["value"], res[f"mean_{name}"]["error"])
        if "s" in res["de_sitter"]:
            out["de_sitter_s"] = (res["de_sitter"]["s"], res["de_sitter"]["s_err"])
        return out

    z = d3_profile.z_scores(pick(ours), pick(ref))
    a, ea = np.asarray(ours["profile"]["mean"]), np.asarray(ours["profile"]["error"])
    b, eb = np.asarray(ref["profile"]["mean"]), np.asarray(ref["profile"]["error"])
    d, s = a - b, np.sqrt(ea**2 + eb**2)
    # a slice that never fluctuated in either run (the minimal stalk) has error 0: z = 0 if equal, inf if not
    zt = np.where(s > 0, d / np.where(s > 0, s, 1.0), np.where(d == 0, 0.0, np.inf))
    return {"z": z, "profile_z": zt.tolist(), "profile_chi2": float(zt @ zt), "profile_dof": int(zt.shape[0])}


def side_by_side(peer_src: str | None, spec: peer_cdt3.RunSpec, timed_attempts: int = 2_000_000) -> dict[str, Any]:
    """The reference at ``spec``, then our engine at its tuned k3; observables, z-scores and attempts/s on one
    core and over two chains (ours: a vmapped pair, measurement sweeps only; the reference: two processes, its
    timed ``attemptMove()`` loops)."""
    binary = peer_cdt3.build_peer(peer_src)
    ref = peer_cdt3.run_peer(binary, peer_src, spec, timed_attempts=timed_attempts)
    at_k3 = dataclasses.replace(spec, k3=ref["k3_tuned"])
    ours = engine_run(at_k3)
    ref_res = peer_cdt3.analyse(ref["counts"], ref["profiles"])
    our_res = peer_cdt3.analyse(ours["counts"], ours["profiles"])
    ours2 = engine_run(dataclasses.replace(at_k3, seed=spec.seed + 100, sweeps=max(10, spec.sweeps // 4)), chains=2)
    short = dataclasses.replace(spec, seed=spec.seed + 100, sweeps=10, thermal=max(10, spec.thermal // 4))
    ref2 = peer_cdt3.run_peer_parallel(binary, peer_src, short, 2, timed_attempts=timed_attempts)
    keep: tuple[str, ...] = ("seconds", "cpu_seconds", "attempts", "attempts_per_s", "attempts_per_cpu_s")
    keep += ("accept_by_move", "at_target_fraction", "overflow")
    return {
        "spec": dataclasses.asdict(spec),
        "k3_tuned": ref["k3_tuned"],
        "attempts_per_sweep": spec.ksteps * 1000,
        "ours": {**{k: ours[k] for k in keep}, **our_res},
        "reference": {**peer_cdt3.summary(ref), **ref_res},
        "comparison": compare(our_res, ref_res),
        "throughput": {
            "one_core": {"ours": ours["attempts_per_s"], "reference": ref["attempts_per_s"]},
            "one_core_per_cpu_s": {"ours": ours["attempts_per_cpu_s"], "reference": ref["attempts_per_cpu_s"]},
            "two_chains": {
                "ours": ours2["attempts_per_s"],
                "reference": ref2["attempts_per_s"],
                "ours_cores_used": ours2["cpu_seconds"] / ours2["seconds"],
                "reference_cores_used": ref2["cores_used"],
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.run.device import device_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-src", default=None, help=f"JorenB/3d-cdt sources (default ${peer_cdt3.ENV_VAR})")
    ap.add_argument("--k0", type=float, default=peer_cdt3.EXAMPLE["k0"])
    ap.add_argument("--target", type=int, default=1000)
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--thermal", type=int, default=200)
    ap.add_argument("--sweeps", type=int, default=1000)
    ap.add_argument("--ksteps", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=peer_cdt3.EPSILON)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--export", default="bench/results/cdt3_vs_reference.json")
    a = ap.parse_args(argv)
    k3 = peer_cdt3.starting_k3(a.k0)
    spec = peer_cdt3.RunSpec(a.k0, k3, a.target, a.slices, a.thermal, a.sweeps, a.ksteps, a.epsilon, a.seed)
    doc = side_by_side(a.peer_src, spec)
    doc = {"op": "cdt3_vs_reference", **doc, "environment": device_report()}
    print({k: doc["comparison"]["z"][k] for k in doc["comparison"]["z"]}, doc["throughput"], flush=True)
    print("wrote", write_results(a.export, doc, command=peer_cdt3.command_line("ivhl_jax.bench.ops_cdt3", argv)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
