"""CDT benchmarks: Metropolis attempts and accepted moves per second, one chain and many vmapped chains.

Op ``cdt_sweeps`` (for ``ivhl bench``): volume-fixed 1+1D CDT (T = 16, target N2 = 512, lambda = ln 2,
eps = 0.02), ``SWEEPS`` sweeps of N2 attempts for a batch of independent chains on the pure-JAX engine;
the size picks the number of chains (small 1, medium 16, large 128, extreme 1024). Peer: the compiled
host engine (``engine="host"``, numba) on the same chains, when numba is installed.

``python -m ivhl_jax.bench.ops_cdt [--chains 1,16,256] [--volumes 512,2048] [--engines jax,host]
[--peer-src DIR] [--export FILE]`` measures both engines against the volume and the number of chains,
and the reference C++ code (JorenB/2d-cdt, via :mod:`ivhl_jax.bench.peer_cdt`) when its sources are
given, interleaved in one process. :func:`gpu_check` is the CDT section of ``bench.gpu_checks``: many
chains at N2 = 2048 on the JAX engine against the host engine (and 2d-cdt) on the same machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from ivhl_jax.bench.harness import BenchCase, summarize
from ivhl_jax.core import backend
from ivhl_jax.physics import cdt
from ivhl_jax.physics.cdt import host as cdt_host
from ivhl_jax.run.measure import cost_record

T_SLICES, VOLUME, SWEEPS = 16, 512, 2
CHAINS = {"small": 1, "medium": 16, "large": 128, "extreme": 1024}


def _setup(n_chains: int, volume: int = VOLUME, attempts: int | None = None, engine: str = "jax"):
    """``fn(chains) -> chains``: one sweep of ``attempts`` (default N2) attempts of every chain, vmapped
    ``stepper.step`` of ``cdt.metropolis``; the chains start on the regular torus at the target volume."""
    stepper = cdt.metropolis(cdt.LN2, eps=0.02, target=volume, attempts_per_sweep=attempts or volume, engine=engine)
    params = stepper.params
    keys = jax.random.split(jax.random.key(0), n_chains)
    chains = jax.vmap(lambda k: stepper.init(k, T_SLICES, volume // (2 * T_SLICES), volume))(keys)

    def fn(chains):
        return jax.vmap(stepper.step)(chains)

    return fn, (chains,), params


def _factory(size: str) -> BenchCase:
    n = CHAINS[size]
    fn, args, params = _setup(n, attempts=SWEEPS * VOLUME)
    attempts = n * params.attempts_per_sweep
    peers = {}
    if cdt_host.available():
        host_fn, _, _ = _setup(n, attempts=SWEEPS * VOLUME, engine="host")
        host = jax.jit(host_fn)
        peers["host_engine"] = lambda: jax.block_until_ready(host(*args))
    return BenchCase(
        op="cdt_sweeps",
        size=size,
        fn=fn,
        args=args,
        params={
            "chains": n,
            "T": T_SLICES,
            "target_N2": VOLUME,
            "lambda": cdt.LN2,
            "eps": 0.02,
            "sweeps": SWEEPS,
            "attempts_per_chain": params.attempts_per_sweep,
        },
        peers=peers,
        op_by_op=False,
        items_per_call=attempts,
        items_name="move attempts (all chains)",
        notes="pure-JAX engine; peer: the numba host engine on the same chains. Accepted moves: cdt_jax_scaling.json",
    )


OPS = {"cdt_sweeps": _factory}


def _measure(engine: str, n: int, volume: int, attempts: int, repeats: int) -> dict:
    fn, (chains,), params = _setup(n, volume, attempts, engine)
    compiled = jax.jit(fn).lower(chains).compile()
    chains = jax.block_until_ready(compiled(chains))  # warm-up and partial thermalisation
    times, cpu, accepted, attempted = [], [], [], []
    for _ in range(repeats):
        acc0, att0 = np.asarray(chains.geometry.accepts).sum(), np.asarray(chains.geometry.attempts).sum()
        t0, c0 = time.perf_counter(), time.process_time()
        chains = jax.block_until_ready(compiled(chains))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        accepted.append(int(np.asarray(chains.geometry.accepts).sum() - acc0))
        # counted, not assumed (a sweep with stop_at_first_hit would continue past its attempts)
        attempted.append(int(np.asarray(chains.geometry.attempts).sum() - att0))
    st = summarize(times)
    att = float(np.mean(attempted))
    acc = float(np.mean(accepted))
    return {
        "engine": engine,
        "N2": volume,
        "chains": n,
        "attempts_per_sweep": attempts,
        "attempts_per_call": att,
        "time": st,
        "attempts_per_s_aggregate": att / st["median_s"],
        "accepted_per_s_aggregate": acc / st["median_s"],
        "accepted_per_s_per_chain": acc / n / st["median_s"],
        "acceptance": acc / att,
        # CPU time of the whole process (all threads): insensitive to other jobs on a shared host
        "attempts_per_cpu_s": att / float(np.median(cpu)),
        "accepted_per_cpu_s": acc / float(np.median(cpu)),
        "cores_used": float(np.median(cpu)) / st["median_s"],
        # flops/bytes of the compiled call (a host-engine call's work is in a callback XLA does not count)
        "cost": cost_record(compiled, st["median_s"]),
        "overflow": bool(np.any(np.asarray(chains.geometry.overflow))),
    }


def scaling(
    chain_counts=(1, 16, 256),
    volumes=(512, 2048, 8192, 32768),
    engines=("jax", "host"),
    attempts: dict | None = None,
    repeats: int = 3,
    peer_src: str | None = None,
) -> dict:
    """Per engine, volume and number of chains: attempts and accepted moves per second (per chain and in
    aggregate); with ``peer_src`` the C++ reference at the same volumes (one and two processes), interleaved."""
    from ivhl_jax.run.device import device_report

    attempts = attempts or {"jax": 4096, "host": 2_000_000}
    rows, peer_rows = [], []
    binary = None
    if peer_src:
        from ivhl_jax.bench import peer_cdt

        binary = peer_cdt.build_peer(peer_src)
    for volume in volumes:
        for engine in engines:
            for n in chain_counts:
                per_chain = attempts[engine] if engine == "jax" else max(attempts[engine] // n, 100_000)
                row = _measure(engine, n, volume, per_chain, repeats)
                rows.append(row)
                print(
                    f"N2 {volume:6d} {engine:4s} chains {n:5d}: {row['accepted_per_s_aggregate']:.3e} accepted/s "
                    f"aggregate, {row['accepted_per_s_per_chain']:.3e} per chain, acceptance {row['acceptance']:.3f}"
                )
        if binary:
            for procs in (1, 2):
                res = peer_cdt.run_peer_parallel(binary, volume, n_procs=procs, n_slices=T_SLICES, seconds=3.0)
                res.pop("runs")
                res.update({"N2": volume})
                peer_rows.append(res)
                acc_frac = sum(m["accepted"] for m in res["accept_by_move"].values()) / max(
                    sum(m["attempted"] for m in res["accept_by_move"].values()), 1
                )
                res["accepted_per_cpu_s_mean"] = res["attempts_per_cpu_s_mean"] * acc_frac
                print(
                    f"N2 {volume:6d} 2d-cdt x{procs}: {res['accepted_per_s']:.3e} accepted/s aggregate, "
                    f"{res['accepted_per_cpu_s_mean']:.3e} accepted per CPU-s per process"
                )
    return {
        "op": "cdt_scaling",
        "environment": device_report(),
        "system": {"T": T_SLICES, "lambda": cdt.LN2, "eps": 0.02, "capacity": "N2 vertex slots"},
        "rows": rows,
        "peer_2dcdt": peer_rows,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


GPU_CHAINS = (1024, 4096, 16384, 65536)
GPU_VOLUME = 2048


def gpu_check(quick: bool = False, engines: tuple[str, ...] | None = None, peer_src: str | None = None) -> dict:
    """Many CDT chains on this machine: accepted moves/s in aggregate and per chain at N2 = 2048 (T = 16,
    lambda = ln 2, eps = 0.02, capacity N2 vertex slots), one call = one sweep of N2 attempts per chain.

    The JAX and Pallas engines at 1024, 4096, 16384 and 65536 chains on the default device (the Pallas engine
    compiled on a GPU, interpreted elsewhere; 20 N2 attempts per chain per launch); the host engine (numba,
    this machine's cores) at one chain per core and at 1024 chains, 20 N2 attempts per chain per call; with
    ``peer_src`` (the JorenB/2d-cdt sources) the reference code at N2 = 2048 with one process per core.
    ``quick``: N2 = 128, 4 and 16 chains (seconds on a CPU; the host engine's first call compiles its
    kernel unless numba's disk cache has it). ``engines`` defaults to ``("jax", "pallas", "host")``, and to
    ``("jax", "host")`` when ``quick`` (off a GPU the Pallas engine runs in the interpreter, whose compile
    alone takes tens of seconds; name it to include it). Returns the rows and a ``summary`` with the
    headline numbers.
    """
    if engines is None:
        engines = ("jax", "host") if quick else ("jax", "pallas", "host")

    volume = 128 if quick else GPU_VOLUME
    jax_chains = (4, 16) if quick else GPU_CHAINS
    cores = backend.machine_cores()
    host_chains = (2, 4) if quick else tuple(sorted({cores, 1024}))
    repeats = 2 if quick else 5
    rows: list[dict] = []
    doc: dict = {
        "platform": backend.platform(),
        "device": str(jax.devices()[0]),
        "cores": cores,
        "system": {"T": T_SLICES, "N2": volume, "lambda": cdt.LN2, "eps": 0.02, "capacity": volume},
        "rows": rows,
    }
    summary: dict = {}
    for engine in engines:
        if engine == "host" and not cdt_host.available():
            doc["host"] = "skipped: numba is not installed"
            continue
        for n in host_chains if engine == "host" else jax_chains:
            # the Pallas engine loops over a call's attempts inside one kernel launch, the host engine in numba
            attempts = volume if engine == "jax" else 20 * volume
            row = _measure(engine, n, volume, attempts, repeats)
            rows.append(row)
            print(
                f"cdt {engine:4s} N2 {volume} chains {n:6d}: {row['accepted_per_s_aggregate']:.3e} accepted/s "
                f"aggregate, {row['accepted_per_s_per_chain']:.3e} per chain"
            )
        best = max((r for r in rows if r["engine"] == engine), key=lambda r: r["accepted_per_s_aggregate"])
        summary[f"{engine}_accepted_per_s"] = best["accepted_per_s_aggregate"]
        summary[f"{engine}_accepted_per_s_per_chain"] = best["accepted_per_s_per_chain"]
        summary[f"{engine}_best_chains"] = best["chains"]
    if peer_src:
        from ivhl_jax.bench import peer_cdt

        res = peer_cdt.run_peer_parallel(
            peer_cdt.build_peer(peer_src), volume, n_procs=cores, n_slices=T_SLICES, seconds=1.0 if quick else 3.0
        )
        res.pop("runs")
        doc["peer_2dcdt"] = res
        summary["2dcdt_accepted_per_s"] = res["accepted_per_s"]
    doc["summary"] = summary
    return doc


def _sweeps(stepper, chain, n: int, phase: str, record: dict | None, clock: list[float], progress: bool):
    """``n`` sweeps of one chain in blocks of 5; with ``record`` N0 and l_t of every sweep appended; progress
    (sweeps, N2, attempts/s since ``clock[0]``) at most once a second (``clock[1]``: the last line's time)."""
    from ivhl_jax.numerics.rollout import trajectory

    done = 0
    while done < n:
        block = min(n - done, 5)
        chain, obs = trajectory(stepper, chain, block, observe=cdt.observe)
        obs = jax.device_get(obs)
        done += block
        if record is not None:
            record["n0"].extend(np.asarray(obs["n0"]).tolist())
            record["lengths"].extend(np.asarray(obs["lengths"]).tolist())
        now = time.perf_counter()
        if progress and (now - clock[1] >= 1.0 or done == n):
            clock[1] = now
            att = int(np.asarray(chain.geometry.attempts).sum())
            print(
                f"{phase}: {done}/{n} sweeps, N2 = {int(obs['n2'][-1])}, "
                f"{att / (now - clock[0]):.3g} attempts/s since the start",
                flush=True,
            )
    return chain


def _autocorrelation_times(n0: np.ndarray, lengths: np.ndarray) -> tuple[dict[str, list[float]], list[str]]:
    """tau_int in sweeps (Sokal's window) of N0, of each slice length (mean and spread over slices) and of the
    profile spread (standard deviation of the l_t), and the warnings the estimator raised."""
    import warnings

    from ivhl_jax.numerics import statistics

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        tau_n0 = statistics.integrated_autocorrelation_time(n0)
        tau_slices = [statistics.integrated_autocorrelation_time(lengths[:, t]) for t in range(lengths.shape[1])]
        tau_spread = statistics.integrated_autocorrelation_time(lengths.std(-1))
    taus = {
        "n0": [tau_n0.tau, tau_n0.error],
        "slice_length_mean_over_slices": [
            float(np.mean([t.tau for t in tau_slices])),
            float(np.std([t.tau for t in tau_slices])),
        ],
        "profile_spread": [tau_spread.tau, tau_spread.error],
    }
    return taus, sorted({str(w.message) for w in caught})


def large_universe(
    n_slices: int = 64,
    volume: int = 1_000_000,
    thermal: int = 200,
    measure: int = 400,
    eps: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """One large universe on the host engine (2d-cdt's move lists): thermalise, then measure the integrated
    autocorrelation times of N0 and of the slice lengths.

    ``n_slices`` slices start as a regular torus at ``volume`` triangles (capacity 0.55 ``volume`` + 1024
    vertex slots, so memory is linear in N2); lambda = ln 2 with the volume term ``eps (N2 - volume)^2``
    (default ``eps = 2 / volume``: N2 fluctuates by ~ sqrt(volume / 4) triangles, so N0 has an
    autocorrelation time of its own; sweeps do not stop at the target). One sweep is N2 attempts.
    ``thermal`` sweeps, then ``measure`` sweeps recording N0 and l_t after every sweep; progress (sweeps,
    N2, attempts/s) at most once a second. tau_int (Sokal's window, :mod:`ivhl_jax.numerics.statistics`) is
    in sweeps; for the slice lengths, the mean over slices of each slice's tau and the tau of the profile
    spread (standard deviation of the l_t).
    """
    from ivhl_jax.run.device import device_report

    eps = 2.0 / volume if eps is None else eps
    stepper = cdt.metropolis(cdt.LN2, eps=eps, target=volume, engine="host")
    capacity = int(0.55 * volume) + 1024
    chain = stepper.init(jax.random.key(seed), n_slices, volume // (2 * n_slices), capacity)
    record: dict = {"n0": [], "lengths": []}
    t_start = time.perf_counter()
    clock = [t_start, t_start]
    chain = _sweeps(stepper, chain, thermal, "thermalise", None, clock, progress)
    t_thermal = time.perf_counter() - t_start
    chain = _sweeps(stepper, chain, measure, "measure", record, clock, progress)
    seconds = time.perf_counter() - t_start
    n0 = np.asarray(record["n0"], float)
    taus, caught = _autocorrelation_times(n0, np.asarray(record["lengths"], float))  # lengths: (measure, T)
    g = chain.geometry
    acc, att = np.asarray(g.accepts), np.asarray(g.attempts)
    return {
        "system": {
            "T": n_slices,
            "target_N2": volume,
            "lambda": cdt.LN2,
            "eps": eps,
            "engine": "host",
            "proposal": stepper.params.proposal,
            "capacity": capacity,
            "sweep": "N2 attempts",
        },
        "thermal_sweeps": thermal,
        "measured_sweeps": measure,
        "seconds_thermalise": t_thermal,
        "seconds_total": seconds,
        "attempts": int(att.sum()),
        "attempts_per_s": float(att.sum() / seconds),
        "acceptance": {n: float(acc[i] / max(att[i], 1)) for i, n in enumerate(cdt.MOVE_NAMES)},
        "overflow": bool(g.overflow),
        "mean_n2": float(2 * n0.mean()),
        "std_n2": float(2 * n0.std()),
        "tau_int_sweeps": taus,
        "warnings": caught,
        "environment": device_report(),
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    from ivhl_jax.bench.harness import write_results

    p = argparse.ArgumentParser(description="CDT engine scaling benchmark (volumes x chains x engines)")
    p.add_argument("--chains", default="1,16,256")
    p.add_argument("--volumes", default="512,2048,8192,32768")
    p.add_argument("--engines", default="jax,host")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer-src", default=None, help="folder with the JorenB/2d-cdt sources (not vendored)")
    large = p.add_argument_group("one large universe")
    large.add_argument(
        "--large-universe",
        action="store_true",
        help="one T=64, N2=1e6 universe on the host engine: thermalise, autocorrelation times "
        "(--slices, --volume, --thermal, --measure; writes bench/results/cdt_large_universe.json)",
    )
    for flag, default in (("--slices", 64), ("--volume", 1_000_000), ("--thermal", 200), ("--measure", 400)):
        large.add_argument(flag, type=int, default=default)
    p.add_argument(
        "--export",
        default=None,
        help="results file (default: bench/results/cdt_host_vs_2dcdt.json "
        "with --peer-src, else bench/results/cdt_<engines>_scaling.json)",
    )
    a = p.parse_args(argv)
    command = "python -m ivhl_jax.bench.ops_cdt " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.large_universe:
        doc = large_universe(a.slices, a.volume, a.thermal, a.measure)
        print("wrote", write_results(a.export or "bench/results/cdt_large_universe.json", doc, command=command))
        return 0
    doc = scaling(
        tuple(int(c) for c in a.chains.split(",")),
        tuple(int(v) for v in a.volumes.split(",")),
        tuple(a.engines.split(",")),
        repeats=a.repeats,
        peer_src=a.peer_src,
    )
    export = a.export or (
        "bench/results/cdt_host_vs_2dcdt.json"
        if a.peer_src
        else f"bench/results/cdt_{'_'.join(a.engines.split(','))}_scaling.json"
    )
    print("wrote", write_results(export, doc, command=command))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
