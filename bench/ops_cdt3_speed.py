"""2+1D CDT engine speed against the reference code JorenB/3d-cdt, side by side in one run.

For each target volume (``target`` (3,1) tetrahedra, the reference's ``volfixswitch 0``), at the same ``k0``,
``epsilon`` and number of slices:

1. the reference (built from ``--peer-src`` by :func:`ivhl_jax.bench.peer_cdt3.build_peer`) thermalises from its
   own initial geometry while it tunes ``k3``; our chain then thermalises from the minimal triangulation at the
   reference's tuned ``k3`` with the reference's acceptance (``measure="reference"``), so both sample the same
   ensemble at the same volume;
2. **one core**, interleaved rounds: a reference process (thermalised again, from ``k3_tuned``) times
   ``--attempts`` calls of its ``Simulation::attemptMove()`` with its process CPU clock; then our kernel
   (:func:`ivhl_jax.physics.cdt.d3_host.sweep_chain`, one chain, called from this thread) times ``--attempts``
   attempts with :func:`time.thread_time`. Attempts per CPU-second, each round;
3. **two cores**, interleaved rounds: two reference processes at once (sum of their attempts per wall-second in
   the timed loops) against our two chains at once (:func:`~ivhl_jax.physics.cdt.d3_host.sweep_batch`: one
   numba thread per chain), ``2 x --attempts`` attempts per wall-second.

An *attempt* is counted as the reference counts it: one call of its ``attemptMove()`` = one move family drawn
(frequencies 1 : 1 : 1) and its proposal, accepted or rejected at any stage (the Metropolis test, which the
reference draws before picking a simplex for the (2,6)/(6,2)/(2,3)/(3,2), or a geometric check); ours counts one
attempt per iteration of the same proposal (:mod:`ivhl_jax.physics.cdt.d3_host`), rejected or not. The two
random streams differ (the reference: ``std::default_random_engine``; ours: SplitMix64).

The host may be shared: run it niced; every round records the load average, and the ratios of interleaved
rounds are what count.

Command line (writes ``bench/results/cdt3_speed_vs_reference.json``)::

    nice -n 10 python -m ivhl_jax.bench.ops_cdt3_speed --peer-src DIR --targets 8000 32000
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np

from ivhl_jax.bench import peer_cdt3
from ivhl_jax.physics.cdt import d3_host, d3_state

ATTEMPT_DEFINITION = (
    "one attempt = one call of the reference's Simulation::attemptMove() (a move family drawn 1:1:1, then its "
    "proposal), counted whether it is accepted or rejected at the Metropolis test or at a geometric check; ours "
    "counts one attempt per iteration of the same proposal in d3_host (attempts field), rejections included"
)


@dataclasses.dataclass
class Chain:
    """Our chain(s) at the reference's couplings: buffers (chains, size), the kernels' offsets and couplings."""

    bufs: np.ndarray
    off: np.ndarray
    spec: peer_cdt3.RunSpec
    tetra_capacity: int

    def couplings(self) -> tuple[float, float, float, float]:
        return self.spec.k0, self.spec.k3, self.spec.epsilon, float(self.spec.target)

    def run_one(self, attempts: int, seed: int) -> float:
        """``attempts`` attempts of chain 0 in this thread; returns the thread's CPU seconds."""
        c0 = time.thread_time()
        k0, k3, eps, target = self.couplings()
        d3_host.sweep_chain(
            self.bufs[0], self.off, attempts, k0, k3, eps, target, False, True, self.spec.n_slices, False, 0,
            np.uint64(seed),
        )  # fmt: skip
        return time.thread_time() - c0

    def run_all(self, attempts: int, seed: int) -> tuple[float, float]:
        """``attempts`` attempts of every chain at once (one numba thread each); returns (wall, CPU) seconds."""
        n = self.bufs.shape[0]
        per = [np.full(n, x, np.float64) for x in self.couplings()]
        seeds = np.arange(seed, seed + n, dtype=np.uint64)
        t0, c0 = time.perf_counter(), time.process_time()
        d3_host.sweep_batch(self.bufs, self.off, attempts, *per, False, True, self.spec.n_slices, False, 0, seeds)  # type: ignore[call-arg]
        return time.perf_counter() - t0, time.process_time() - c0

    def counts(self) -> list[dict[str, int]]:
        out = []
        for b in self.bufs:
            c = d3_state.unpack(b, self.tetra_capacity, self.spec.n_slices)["counts"]
            out.append(dict(zip(d3_state.COUNTS, (int(x) for x in c), strict=True)))
        return out

    def acceptance(self) -> dict[str, float]:
        """Accepted over attempted per move, chain 0's last call."""
        f = d3_state.unpack(self.bufs[0], self.tetra_capacity, self.spec.n_slices)
        return {
            m: float(a) / max(int(t), 1)
            for m, a, t in zip(d3_state.MOVE_NAMES_3D, f["accepts"], f["attempts"], strict=True)
        }


def thermalised(spec: peer_cdt3.RunSpec, chains: int, attempts: int) -> Chain:
    """``chains`` chains from the minimal triangulation of ``spec.n_slices`` slices after ``attempts`` attempts
    each at ``spec`` (``k3`` as given), then until N(3,1) sits at the target once; capacity 6 x the target
    (N3 is about 2.6 x)."""
    c3 = 6 * int(spec.target)
    one = np.asarray(d3_state.initial_state(spec.n_slices, c3).buf)
    ch = Chain(np.ascontiguousarray(np.stack([one] * chains)), d3_host.field_offsets(c3, spec.n_slices), spec, c3)
    k0, k3, eps, target = ch.couplings()
    for c in range(chains):
        d3_host.sweep_chain(
            ch.bufs[c], ch.off, attempts, k0, k3, eps, target, False, True, spec.n_slices, True, 10 * attempts,
            np.uint64(spec.seed + 1000 * c),
        )  # fmt: skip
    bad = [c for c in ch.counts() if c["overflow"] or c["missed_target"]]
    if bad:
        raise RuntimeError(f"our chain did not thermalise at {spec}: {bad}")
    return ch


def speed_at(peer_src: str | None, binary: str, spec: peer_cdt3.RunSpec, attempts: int, rounds: int) -> dict:
    """Steps 1-3 of the module docstring at one target volume."""
    first = peer_cdt3.run_peer(binary, peer_src, spec, timed_attempts=attempts)
    at = dataclasses.replace(spec, k3=first["k3_tuned"])
    thermal_attempts = spec.thermal * spec.ksteps * 1000
    ours = thermalised(at, 2, thermal_attempts)
    ours.run_all(1000, 1)  # compiles or loads the threaded kernel outside the timed rounds
    one_core, two_cores = [], []
    for r in range(rounds):
        ref = peer_cdt3.run_peer(
            binary, peer_src, dataclasses.replace(at, seed=spec.seed + 1 + r), timed_attempts=attempts
        )
        cpu = ours.run_one(attempts, 7 + r)
        one_core.append({
            "reference_attempts_per_cpu_s": ref["attempts_per_cpu_s"],
            "ours_attempts_per_cpu_s": attempts / cpu,
            "ratio": attempts / cpu / ref["attempts_per_cpu_s"],
            "reference_n31_n22": [ref["n31_final"], ref["n3_final"] - 2 * ref["n31_final"]],
            "ours_counts": ours.counts()[0],
            "ours_acceptance": ours.acceptance(),
            "reference_accept_by_move": ref["accept_by_move"],
            "load_average_1min": os.getloadavg()[0],
        })  # fmt: skip
        print(at.target, "one core", {k: v for k, v in one_core[-1].items() if "accept" not in k}, flush=True)
    for r in range(rounds):
        spec2 = dataclasses.replace(at, seed=spec.seed + 100 + 2 * r)
        ref2 = peer_cdt3.run_peer_parallel(binary, peer_src, spec2, 2, timed_attempts=attempts)
        wall, cpu = ours.run_all(attempts, 70 + 2 * r)
        ours_rate = 2 * attempts / wall
        two_cores.append({
            "reference_attempts_per_s": ref2["attempts_per_s"],
            "reference_cores_used": ref2["cores_used"],
            "ours_attempts_per_s": ours_rate,
            "ours_cores_used": cpu / wall,
            "ratio": ours_rate / ref2["attempts_per_s"],
            "reference_n31_n22": [[x["n31_final"], x["n3_final"] - 2 * x["n31_final"]] for x in ref2["runs"]],
            "ours_counts": ours.counts(),
            "load_average_1min": os.getloadavg()[0],
        })  # fmt: skip
        print(at.target, "two cores", two_cores[-1], flush=True)
    return {
        "target_n31_only": spec.target,
        "k3_tuned": first["k3_tuned"],
        "reference_first_run": peer_cdt3.summary(first),
        "ours_counts_after": ours.counts(),
        "one_core": {
            "rounds": one_core,
            "ratio_median": float(np.median([x["ratio"] for x in one_core])),
            "ours_attempts_per_cpu_s_median": float(np.median([x["ours_attempts_per_cpu_s"] for x in one_core])),
            "reference_attempts_per_cpu_s_median": float(
                np.median([x["reference_attempts_per_cpu_s"] for x in one_core])
            ),
        },
        "two_cores": {
            "rounds": two_cores,
            "ratio_median": float(np.median([x["ratio"] for x in two_cores])),
            "ours_attempts_per_s_median": float(np.median([x["ours_attempts_per_s"] for x in two_cores])),
            "reference_attempts_per_s_median": float(np.median([x["reference_attempts_per_s"] for x in two_cores])),
        },
    }


def main(argv: list[str] | None = None) -> int:
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.run.device import device_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-src", default=None, help=f"JorenB/3d-cdt sources (default ${peer_cdt3.ENV_VAR})")
    ap.add_argument("--k0", type=float, default=peer_cdt3.EXAMPLE["k0"])
    ap.add_argument("--targets", type=int, nargs="+", default=[8000, 32000], help="N(3,1) targets")
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--thermal", type=int, default=200, help="thermal sweeps (the reference tunes k3 in them)")
    ap.add_argument("--ksteps", type=int, default=100, help="a sweep is ksteps * 1000 attempts")
    ap.add_argument("--epsilon", type=float, default=peer_cdt3.EPSILON)
    ap.add_argument("--attempts", type=int, default=4_000_000, help="timed attempts per chain and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--export", default="bench/results/cdt3_speed_vs_reference.json")
    a = ap.parse_args(argv)
    binary = peer_cdt3.build_peer(a.peer_src)
    rows = []
    for target in a.targets:
        k3 = peer_cdt3.starting_k3(a.k0)
        spec = peer_cdt3.RunSpec(a.k0, k3, target, a.slices, a.thermal, 10, a.ksteps, a.epsilon, a.seed)
        rows.append(speed_at(a.peer_src, binary, spec, a.attempts, a.rounds))
    doc = {
        "op": "cdt3_speed_vs_reference",
        "reference": {
            "url": peer_cdt3.PEER_URL,
            "commit": peer_cdt3.reference_commit(a.peer_src),
            "driver": "bench/peer_cdt3_driver.cpp",
            "cxxflags": list(peer_cdt3.CXXFLAGS),
        },  # fmt: skip
        "attempt": ATTEMPT_DEFINITION,
        "note": "one core: attempts per CPU-second of one process (reference: CLOCK_PROCESS_CPUTIME_ID in its driver) "
        "or of the calling thread (ours: time.thread_time); two cores: attempts per wall-second summed over two "
        "reference processes vs our two chains in one call (two numba threads); rounds interleaved, the host shared "
        f"with other jobs (this process ran at niceness {os.nice(0)}; load_average_1min per round)",
        "rows": rows,
        "environment": device_report(),
    }
    for row in rows:
        print(row["target_n31_only"], "one core ratio", row["one_core"]["ratio_median"], "two cores ratio",
              row["two_cores"]["ratio_median"])  # fmt: skip
    print("wrote", write_results(a.export, doc, command=peer_cdt3.command_line("ivhl_jax.bench.ops_cdt3_speed", argv)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
