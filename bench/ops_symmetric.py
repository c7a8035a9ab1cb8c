"""Symmetric (block-sparse Z2 / U(1)) MERA against the dense MERA, interleaved in one process.

* ``sweeps``: Z2 Ising sweep time (median and IQR of interleaved repeats, one ``trajectory`` of n sweeps per call;
  the speed-up as the ratio of the medians and as the median of the per-repeat ratios; the process CPU time too),
  compile time, the stored numbers of the state and the compiled step's temporary memory, at χ = 8, 12, 16; both
  MERAs run from the same start (the dense one is the symmetric start's embedding), so their energies after the
  same sweeps agree to rounding (reported).
* :func:`gpu_check`: symmetric sweeps at χ = 24, 32, 48 (``quick``: χ = 4, for a CPU check).

``--cores n`` holds XLA to n of the process's cores (:func:`ivhl_jax.run.device.limit_host_cores`, applied before
JAX starts; the results file says which): the per-core comparison, and the setting of a host whose other cores
run other work.

    python -m ivhl_jax.bench.ops_symmetric --what sweeps --chis 8,12,16 --out bench/results/mera_symmetric_sweeps.json
    python -m ivhl_jax.bench.ops_symmetric --chis 16,12,8 --cores 1 --out bench/results/mera_symmetric_sweeps_1core.json

Without ``--out`` the sweeps go to ``bench/results/mera_symmetric_sweeps.json`` (``…_<n>core.json`` with
``--cores n``) beside this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import jax
import numpy as np

from ivhl_jax import mera as M
from ivhl_jax import trajectory
from ivhl_jax.bench.harness import memory_bytes


def z2_config(chi: int, layers: int | None = None, u_delay: int = 0) -> M.MERAConfig:
    """The sweep shape of bench/ops_tn (χ_mid ≈ ¾χ; one transitional layer up to χ = 16, else (16, χ, χ)) with
    even/odd sectors of equal size (the odd one one smaller when odd)."""
    mid = max(2, (3 * chi) // 4)

    def half(n: int) -> dict[int, int]:
        return {0: (n + 1) // 2, 1: n // 2}

    if chi <= 16:
        n = 2 if layers is None else layers + 1
        return M.MERAConfig(
            chi=chi,
            chi_mid=(4,) + (mid,) * (n - 1),
            layers=n - 1,
            u_delay=u_delay,
            symmetry=M.Symmetry("Z2", sectors=half(chi), mid_sectors=[half(4)] + [half(mid)] * (n - 1)),
        )
    return M.MERAConfig(
        chi=(16, chi, chi),
        chi_mid=(4, min(mid, 16), mid),
        layers=2,
        u_delay=u_delay,
        symmetry=M.Symmetry(
            "Z2", sectors=[half(16), half(chi), half(chi)], mid_sectors=[half(4), half(min(mid, 16)), half(mid)]
        ),
    )


def _stored(m: Any) -> int:
    leaves = jax.tree_util.tree_leaves(m)
    return int(sum(np.size(x) for x in leaves))


def _temp_bytes(st: Any, state: Any) -> int | None:
    try:
        return memory_bytes(jax.jit(st.step_fn).lower(state, st.params).compile())["temp_size_in_bytes"]
    except Exception:  # noqa: BLE001 (not every backend reports it)
        return None


def compare_sweeps(chi: int, sweeps: int = 5, repeats: int = 3, memory: bool = True) -> dict[str, Any]:
    """Z2-symmetric vs dense Ising sweeps at ``chi`` from the same start, interleaved."""
    model = M.ising()
    cfg = z2_config(chi)
    with jax.enable_x64(True):
        sst = M.evenbly_vidal(model, cfg)
        dst = M.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
        s_sym = sst.init(key=jax.random.key(0))
        s_den = dst.init(mera=M.to_dense(s_sym.mera, model, cfg.symmetry))
        rec: dict[str, Any] = {
            "chi": chi,
            "layer_chis": list(s_sym.mera.chis),
            "layer_chi_mids": list(s_sym.mera.chi_mids),
            "sectors": str(cfg.symmetry.sectors),
            "mid_sectors": str(cfg.symmetry.mid_sectors),
            "sweeps_per_call": sweeps,
        }
        states = {"symmetric": s_sym, "dense": s_den}
        steppers = {"symmetric": sst, "dense": dst}
        energies: dict[str, list[float]] = {k: [] for k in states}
        times: dict[str, list[float]] = {k: [] for k in states}
        cpu: dict[str, list[float]] = {k: [] for k in states}  # process CPU time (all threads): less load-bound
        for name in states:  # compile (first call)
            t0 = time.perf_counter()
            states[name], e = trajectory(steppers[name], states[name], sweeps, observe=M.observe)
            jax.block_until_ready(e)
            rec[f"{name}_first_call_s"] = round(time.perf_counter() - t0, 2)
            energies[name] += np.asarray(e).tolist()
        for _ in range(repeats):
            for name in states:
                t0, c0 = time.perf_counter(), time.process_time()
                states[name], e = trajectory(steppers[name], states[name], sweeps, observe=M.observe)
                jax.block_until_ready(e)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                energies[name] += np.asarray(e).tolist()
        for name in states:
            rec[f"{name}_ms_per_sweep"] = round(1e3 * float(np.median(times[name])) / sweeps, 2)
            rec[f"{name}_ms_per_sweep_all"] = [round(1e3 * t / sweeps, 2) for t in times[name]]
            q1, q3 = np.percentile(times[name], [25, 75])
            rec[f"{name}_ms_per_sweep_iqr"] = [round(1e3 * q1 / sweeps, 2), round(1e3 * q3 / sweeps, 2)]
            rec[f"{name}_cpu_ms_per_sweep"] = round(1e3 * float(np.median(cpu[name])) / sweeps, 2)
            rec[f"{name}_stored_numbers"] = _stored(states[name].mera)
            if memory:
                rec[f"{name}_step_temp_bytes"] = _temp_bytes(steppers[name], states[name])
        es, ed = np.asarray(energies["symmetric"]), np.asarray(energies["dense"])
        rec["sweeps_run"] = len(es)
        rec["energy_error_final"] = float(es[-1] - model.e0)
        rec["max_energy_difference_sym_vs_dense"] = float(np.max(np.abs(es[1:] - ed[1:])))
        rec["speedup"] = round(rec["dense_ms_per_sweep"] / rec["symmetric_ms_per_sweep"], 2)
        # per repeat (the two calls of a repeat ran back to back, under the same load): their median and IQR
        ratios = np.asarray(times["dense"]) / np.asarray(times["symmetric"])
        rec["speedup_per_repeat_median"] = round(float(np.median(ratios)), 2)
        rec["speedup_per_repeat_iqr"] = [round(float(x), 2) for x in np.percentile(ratios, [25, 75])]
        rec["speedup_cpu_time"] = round(rec["dense_cpu_ms_per_sweep"] / rec["symmetric_cpu_ms_per_sweep"], 2)
    return rec


def gpu_check(quick: bool = False) -> dict[str, Any]:
    """Symmetric Z2 Ising sweeps at χ = 24, 32, 48 (``quick``: χ = 4, for a CPU check of the script): compile
    time, ms per sweep, energy after the timed sweeps of a cold start, isometry check."""
    out: list[dict[str, Any]] = []
    for chi in (4,) if quick else (24, 32, 48):
        cfg = z2_config(chi)
        try:
            with jax.enable_x64(True):
                st = M.evenbly_vidal(M.ising(), cfg)
                s = st.init(key=jax.random.key(0))
                n = 3 if quick else 10
                t0 = time.perf_counter()
                s, e = trajectory(st, s, n, observe=M.observe)
                jax.block_until_ready(e)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                s, e = trajectory(st, s, n, observe=M.observe)
                jax.block_until_ready(e)
                ms = 1e3 * (time.perf_counter() - t0) / n
                iso = max(M.isometry_errors(M.to_dense(s.mera)).values())
            out.append(
                {
                    "chi": chi,
                    "layer_chis": list(s.mera.chis),
                    "compile_s": round(first - ms * n / 1e3, 2),
                    "ms_per_sweep": round(ms, 2),
                    "energy_error": float(e[-1]) - M.E0_CRITICAL_ISING,
                    "isometry_error": iso,
                    "device": str(jax.devices()[0].device_kind),
                }
            )
        except Exception as exc:  # noqa: BLE001 (a size that does not fit is reported, the others still run)
            out.append({"chi": chi, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return {
        "symmetric_sweeps": out,
        "summary": [
            f"Z2 sweep chi={r['chi']}: "
            + (f"{r['ms_per_sweep']} ms, compile {r['compile_s']} s" if "error" not in r else r["error"])
            for r in out
        ],
    }


def _hold_cores(cores: int | None) -> str:
    """Hold XLA to ``cores`` CPU cores before JAX starts (None: all of them); what was done, in words. A limit
    that cannot be applied (JAX already started) is an error, not a results file labelled with the wrong cores."""
    from ivhl_jax.core.backend import host_core_ids
    from ivhl_jax.run.device import limit_host_cores

    allowed = host_core_ids()
    if cores is None:
        return f"all cores: {allowed}"
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"--cores must be a whole number of cores >= 1, got {cores!r}")
    done = limit_host_cores(cores)
    if done.startswith("applied"):
        return done
    if len(allowed) <= cores:  # already on that few cores (taskset, a small machine): nothing to hold
        return f"all cores: {allowed} (--cores {cores})"
    raise ValueError(f"--cores {cores}: {done}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", choices=["sweeps", "gpu_quick"], default="sweeps")
    ap.add_argument("--chis", default="8,12,16")
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--out",
        default=None,
        help="results file (default: bench/results/mera_symmetric_sweeps.json, or mera_symmetric_sweeps_<n>core.json "
        "with --cores n; '-' writes none)",
    )
    ap.add_argument(
        "--cores",
        type=int,
        default=None,
        help="hold XLA to this many of the process's CPU cores (ivhl_jax.run.device.limit_host_cores; default: all)",
    )
    args = ap.parse_args(argv)
    from ivhl_jax.bench.harness import write_results

    if args.out is None and args.what == "sweeps":
        name = "mera_symmetric_sweeps" + ("" if args.cores is None else f"_{args.cores}core") + ".json"
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    elif args.out == "-":
        args.out = None

    command = "python -m ivhl_jax.bench.ops_symmetric " + " ".join(sys.argv[1:] if argv is None else argv)
    doc: dict[str, Any] = {"host_cores": _hold_cores(args.cores)}
    if args.what == "sweeps":
        doc["what"] = (
            "Z2-symmetric vs dense Ising MERA sweeps, interleaved in one process from the same start "
            "(the dense start is the symmetric one embedded); float64"
        )
        doc["method"] = (
            "per chi: one compile call each, then `repeats` rounds of one symmetric and one dense call of `sweeps` "
            "sweeps, back to back; *_ms_per_sweep the median wall time per sweep (IQR in *_iqr), speedup the ratio "
            "of the medians, speedup_per_repeat_* the median and IQR of the per-round ratios, speedup_cpu_time the "
            "ratio of the median process CPU times (all threads; on a loaded host less sensitive to waiting than "
            "wall time); XLA's default threading on the cores that host_cores names"
        )
        doc["results"] = []
        for chi in (int(c) for c in args.chis.split(",")):
            rec = compare_sweeps(chi, args.sweeps, args.repeats)
            print(json.dumps(rec), flush=True)
            doc["results"].append(rec)
            if args.out:  # after every chi, so a run cut short keeps what it measured
                write_results(args.out, doc, command=command)
    else:
        doc["results"] = gpu_check(quick=True)
        print(json.dumps(doc["results"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
