"""Attempts per second of the 2+1D CDT host engine on one core, and its acceptance rate per move.

For each volume: the minimal start of ``T`` slices, grown with the volume term on N3 (``fix="n3"``, the
reference's epsilon) while ``k3`` is tuned towards the critical value at ``k0`` (as the reference code tunes it
during thermalisation: up when N3 is above the target, down below), then ``--attempts`` attempts timed in one
call of the numba kernel (one chain, one thread), ``--repeats`` times.

Run: ``python -m ivhl_jax.bench.cdt3_engine_speed --volumes 8000,32000 --export bench/results/cdt3_engine_speed.json``
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np

from ivhl_jax.physics.cdt import d3_host, d3_state
from ivhl_jax.physics.cdt.d3_stepper import REFERENCE_EPSILON
from ivhl_jax.run.provenance import write_results


def _thermalise(t_n: int, target: int, k0: float, k3: float, seed: int) -> tuple[np.ndarray, float, int]:
    """A chain at N3 ~ target: grow and tune k3 (blocks of 200k attempts) until N3 is within 2 % of the target for
    five blocks in a row; returns (buffer, tuned k3, tetrahedron capacity)."""
    c3 = 2 * target
    buf = np.array(d3_state.initial_state(t_n, c3).buf)
    off = d3_host.field_offsets(c3, t_n)
    near, block = 0, 0
    while near < 5 and block < 2000:
        d3_host.sweep_chain(
            buf,
            off,
            200_000,
            k0,
            k3,
            REFERENCE_EPSILON,
            float(target),
            True,
            False,
            t_n,
            False,
            0,
            np.uint64(seed + block),
        )
        n3 = int(d3_state.unpack(buf, c3, t_n)["counts"][d3_state.COUNTS.index("n3")])
        dev = (n3 - target) / target
        k3 += 0.02 * dev if abs(dev) > 0.02 else 0.0
        near = near + 1 if abs(dev) <= 0.02 else 0
        block += 1
    return buf, k3, c3


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--volumes", default="8000,32000", help="target N3 values, comma-separated")
    p.add_argument("--slices", type=int, default=8)
    p.add_argument("--k0", type=float, default=5.0, help="the reference's example config: k0 5.0")
    p.add_argument("--k3", type=float, default=1.7, help="starting k3 (tuned)")
    p.add_argument("--attempts", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--export", default=None)
    a = p.parse_args(argv)
    rows = []
    for v in (int(x) for x in a.volumes.split(",")):
        buf, k3, c3 = _thermalise(a.slices, v, a.k0, a.k3, 1000)
        off = d3_host.field_offsets(c3, a.slices)
        rates, cpu_rates, acc = [], [], []
        for r in range(a.repeats):
            c0 = time.thread_time()  # the kernel runs in this thread: its CPU time, apart from the host's load
            t0 = time.perf_counter()
            d3_host.sweep_chain(
                buf,
                off,
                a.attempts,
                a.k0,
                k3,
                REFERENCE_EPSILON,
                float(v),
                True,
                False,
                a.slices,
                False,
                0,
                np.uint64(r + 7),
            )
            rates.append(a.attempts / (time.perf_counter() - t0))
            cpu_rates.append(a.attempts / (time.thread_time() - c0))
            f = d3_state.unpack(buf, c3, a.slices)
            acc.append((f["accepts"] / np.maximum(f["attempts"], 1)).tolist())
        counts = dict(zip(d3_state.COUNTS, (int(x) for x in f["counts"]), strict=True))
        row = {
            "target_n3": v,
            "slices": a.slices,
            "k0": a.k0,
            "k3_tuned": k3,
            "counts": counts,
            "attempts_per_s": rates,
            "attempts_per_s_median": float(np.median(rates)),
            "attempts_per_cpu_s": cpu_rates,
            "attempts_per_cpu_s_median": float(np.median(cpu_rates)),
            "acceptance": dict(zip(d3_state.MOVE_NAMES_3D, np.mean(acc, 0).tolist(), strict=True)),
            "load_average_1min": os.getloadavg()[0],
        }
        rows.append(row)
        print(row, flush=True)
    if a.export:
        write_results(
            a.export,
            {
                "op": "cdt3_engine_speed",
                "note": "one chain, one thread (the numba kernel called directly); the host is shared: "
                "load_average_1min is the host's load when the row was measured, attempts_per_cpu_s divides by the "
                "thread's CPU time (time.thread_time), which the load does not inflate",
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
