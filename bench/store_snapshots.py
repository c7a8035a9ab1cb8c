"""What writing ψ snapshots to the run store costs: a 3-D Gross–Pitaevskii run with ψ (complex64) saved every 100
steps against the same run without snapshots, timed in alternating order.

    python -m ivhl_jax.bench.store_snapshots --grid 96 --chunks 2 --rounds 7

Each contestant runs ``--chunks`` chunks of 100 steps through :func:`ivhl_jax.run.runner.run_chunked` (observations
every 50 steps); the "store" one also writes the snapshots (one per chunk) on the store's writer thread, the last
one before the run returns. A round times both once, in an order that alternates between rounds (so that neither
always runs first after the pause), and gives one ratio store/plain − 1; the result
(``bench/results/store_snapshots.json``) holds the command, commit, machine, versions, every round's times and the
median, quartiles and range of the overhead ratio (wall and CPU time), and the time of one snapshot written alone
(host copy, compression, file write, no overlap) against a 100-step chunk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import write_results
from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import condensate as C
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.run.store import RunStore, Snapshots


def _alternating_rounds(calls: dict, rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]], list]:
    """Wall and CPU seconds of each of the two ``calls`` once per round, the order alternating between rounds
    (so that neither always runs first after the pause), and the order of each round."""
    first, second = calls
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    order = []
    for r in range(rounds):
        names = [first, second] if r % 2 == 0 else [second, first]
        order.append(names)
        for name in names:
            time.sleep(0.05)  # let the previous call's worker threads go idle
            t0, c0 = time.perf_counter(), time.process_time()
            calls[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu, order


def _one_write_s(psi, folder: str, repeats: int = 5) -> list[float]:
    """Seconds of one snapshot written alone, synchronously (host copy, compression, file write): its cost with
    no overlap."""
    import zarr

    arr = zarr.create_array(os.path.join(folder, "alone.zarr"), shape=psi.shape, chunks=psi.shape, dtype=psi.dtype)
    write_s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        arr[...] = np.asarray(psi)
        write_s.append(time.perf_counter() - t0)
    return write_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, default=96)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "store_snapshots.json"))
    args = ap.parse_args(argv)
    grid = C.Grid.uniform((args.grid,) * 3, 20.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 200.0)
    stepper = C.strang(system, 1e-3)
    psi0 = stepper.init(C.gaussian(grid))
    advance = chunked(stepper, 100, save_every=50, observe=C.observe, donate=True)
    tmp = tempfile.mkdtemp(prefix="ivhl-store-bench-")
    snaps = Snapshots(
        every=100,
        fields=lambda psi: {"psi": psi},
        dims=("x", "y", "z"),
        coords={d: np.asarray(c) for d, c in zip("xyz", grid.coords)},
    )

    def plain() -> None:
        r = run_chunked(advance, jnp.copy(psi0), n_chunks=args.chunks, steps_per_chunk=100, progress=False)
        jax.block_until_ready(r.state)

    def stored() -> None:
        store = RunStore(os.path.join(tmp, "run.zarr"), snapshots=snaps, dt=1e-3)
        r = run_chunked(advance, jnp.copy(psi0), n_chunks=args.chunks, steps_per_chunk=100, progress=False, sink=store)
        store.close()
        jax.block_until_ready(r.state)

    plain()
    stored()  # compile both
    wall, cpu, order = _alternating_rounds({"plain": plain, "store": stored}, args.rounds)
    overhead = [s / p - 1 for s, p in zip(wall["store"], wall["plain"])]
    cpu_overhead = [s / p - 1 for s, p in zip(cpu["store"], cpu["plain"])]
    write_s = _one_write_s(jnp.copy(psi0), tmp)
    q1, med, q3 = (float(v) for v in np.percentile(overhead, [25, 50, 75]))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(tmp, "run.zarr")) for f in fs)
    shutil.rmtree(tmp, ignore_errors=True)
    chunk_s = float(np.median(wall["plain"])) / args.chunks  # one 100-step chunk without the store
    result = {
        "grid": args.grid,
        "steps": 100 * args.chunks,
        "snapshot_every": 100,
        "snapshot_bytes": int(args.grid**3 * 8),
        "order_per_round": order,
        "wall_s": wall,
        "overhead_per_round": overhead,
        "overhead_median": med,
        "overhead_quartiles": [q1, q3],
        "overhead_range": [min(overhead), max(overhead)],
        "cpu_s": cpu,
        "cpu_overhead_per_round": cpu_overhead,
        "cpu_overhead_median": float(np.median(cpu_overhead)),
        "one_snapshot_write_s": write_s,
        "one_snapshot_write_median_s": float(np.median(write_s)),
        "one_snapshot_write_over_plain_chunk": float(np.median(write_s) / chunk_s),
        "store_bytes": size,
    }
    command = "python -m ivhl_jax.bench.store_snapshots " + " ".join(argv or sys.argv[1:])
    write_results(args.out, result, command=command)
    print(
        f"{args.grid}^3, {100 * args.chunks} steps, ψ every 100: plain {wall['plain']} s, with store "
        f"{wall['store']} s; overhead {[f'{o:+.1%}' for o in overhead]}: median {med:+.1%}, quartiles "
        f"{q1:+.1%} .. {q3:+.1%}, range {min(overhead):+.1%} .. {max(overhead):+.1%}; CPU time overhead median "
        f"{result['cpu_overhead_median']:+.1%}; one snapshot written alone {np.median(write_s):.3f} s = "
        f"{result['one_snapshot_write_over_plain_chunk']:.1%} of a 100-step chunk -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
