"""Time of one MERA sweep under a busy host: XLA CPU thread settings against the NumPy reference (doVarMERA port,
single-threaded BLAS), each with and without background load.

Each setting runs in a fresh process (``XLA_FLAGS`` is read when JAX creates its CPU client), compiles a chunk of
``--chunk`` sweeps (u and w updates on, reflection symmetric) at each ``chi/chi_mid/layers`` and reports the median
seconds per sweep over ``--repeats`` samples; a sample is as many chunks back to back as last at least
``--window`` seconds (default 0.5; 0: one chunk), and the reference's samples likewise. Load: ``--load`` processes each
spinning a single-threaded NumPy matmul loop (300 × 300) for the duration of the measurement. Rounds interleave
settings and load conditions. The slowdown of a setting is its median under load over its median
without load in the same round.

    .venv/bin/python -m ivhl_jax.bench.mera_busy_host --shape 8/6/3 --shape 12/8/3 --rounds 2 \\
        --out bench/results/mera_busy_host_window.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SETTINGS = {
    "default": ("", False),
    "eigen_single_thread": ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", False),
    "no_concurrency_scheduler": ("--xla_cpu_enable_concurrency_optimized_scheduler=false", False),
    "eigen_single+no_concurrency": ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 "
                                    "--xla_cpu_enable_concurrency_optimized_scheduler=false", False),
    "affinity_one_core": ("", True),  # taskset -c 0: XLA sizes its thread pools from the affinity mask
    "host_cores_1": ("", False),  # the library's run.device.limit_host_cores(1) (what `ivhl sim mera` does, χ <= 12)
}
_LIBRARY_CORES = {"host_cores_1": 1}
_SPIN = "import numpy as np\na = np.random.rand(300, 300)\nwhile True:\n    a = a @ a; a /= np.abs(a).max()\n"


def child(shapes: list[str], chunk: int, repeats: int, cache: str | None = None, host_cores: int = 0,
          window_s: float = 0.0) -> list[dict]:
    if host_cores:
        from ivhl_jax.run.device import limit_host_cores

        assert limit_host_cores(host_cores).startswith("applied"), "the backend started before the child's setting"
    import jax
    import numpy as np

    if cache:  # the same setting compiles once across load conditions (the flags are part of the cache key)
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    from ivhl_jax.bench.harness import time_in_windows
    from ivhl_jax.physics import mera as M

    out = []
    with jax.enable_x64(True):
        h = M.ising_two_site_hamiltonian(1.0)
        for text in shapes:
            chi, mid, layers = (int(x) for x in text.split("/"))
            cfg = M.MERAConfig(chi=chi, chi_mid=mid, layers=layers)
            mera = M.init_mera(jax.random.key(0), cfg)
            adv = M.make_advance(h, chunk, cfg.power_iters, 0, cfg.refsym, cfg.si_scales)
            t = time.perf_counter()
            mera, e = adv(mera)
            e.block_until_ready()
            first = time.perf_counter() - t
            box = [mera]

            def advance(box=box, adv=adv):
                box[0], e = adv(box[0])
                return e

            per_call, calls = time_in_windows(advance, repeats=repeats, window_s=window_s)
            times = [x / chunk for x in per_call]
            out.append({"shape": text, "median_s": float(np.median(times)), "min_s": float(np.min(times)),
                        "first_call_s": round(first, 2), "sweeps_per_sample": chunk * calls,
                        "per_sweep_s": [round(x, 5) for x in times]})
    return out


def _run_child(setting: str, shapes: list[str], chunk: int, repeats: int, cache: str | None,
               window_s: float = 0.0) -> list[dict]:
    flags, pin = SETTINGS[setting]
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "IVHL_COMPILATION_CACHE": "0"}
    cmd = [sys.executable, "-m", "ivhl_jax.bench.mera_busy_host", "--child", "--chunk", str(chunk),
           "--repeats", str(repeats), "--window", str(window_s)] + [a for s in shapes for a in ("--shape", s)]
    if cache:
        cmd += ["--cache", cache]
    if setting in _LIBRARY_CORES:
        cmd += ["--host-cores", str(_LIBRARY_CORES[setting])]
    if pin:
        cmd = ["taskset", "-c", "0"] + cmd
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _run_reference(shapes: list[str], repeats: int, window_s: float = 0.0) -> list[dict]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "ivhl_jax.bench.mera_reference", "--repeats", str(repeats),
           "--window", str(window_s)]
    cmd += [a for s in shapes for a in ("--time-sweep", s)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return [{"shape": f"{r['chi']}/{r['chi_mid']}/{r['layers']}", "median_s": r["median_s"],
             "per_sweep_s": r["times_s"]} for r in rows]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", default=[], help="chi/chi_mid/layers")
    ap.add_argument("--setting", action="append", default=None, choices=sorted(SETTINGS))
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--window", type=float, default=0.5,
                    help="seconds: each timed sample repeats the chunk until it lasts at least this long "
                         "(0: one chunk per sample, which under load measures the scheduler's time slices)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--cache", default=None, help="persistent compilation cache folder for the timed processes")
    ap.add_argument("--host-cores", type=int, default=0, help="(child) limit_host_cores(N) before JAX starts")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    shapes = args.shape or ["8/6/3", "12/8/3"]
    if args.child:
        rows = child(shapes, args.chunk, args.repeats, args.cache, args.host_cores, args.window)
        print(json.dumps(rows), flush=True)
        return {"rows": rows}
    settings = args.setting or list(SETTINGS)
    doc: dict = {"what": "seconds per MERA sweep (median of chunks), XLA CPU thread settings and the NumPy "
                         "doVarMERA port, without and with background load",
                 "command": "python -m ivhl_jax.bench.mera_busy_host " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]),
                 "host": f"{os.cpu_count()}-CPU host shared with other jobs", "load": f"{args.load} processes "
                 "spinning a single-threaded NumPy 300x300 matmul", "settings": {k: SETTINGS[k] for k in settings},
                 "rounds": []}
    for r in range(args.rounds):
        rnd: dict = {}
        for load in ((0, args.load) if r % 2 == 0 else (args.load, 0)):
            spinners = [subprocess.Popen([sys.executable, "-c", _SPIN], env={**os.environ,
                        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}) for _ in range(load)]
            try:
                time.sleep(1.0 if load else 0.0)
                for name in settings + ["reference_numpy_1thread"]:
                    t = time.perf_counter()
                    rows = (_run_reference(shapes, max(2, args.repeats // 2), args.window)
                            if name.startswith("reference")
                            else _run_child(name, shapes, args.chunk, args.repeats, args.cache, args.window))
                    key = f"{name}|load={load}"
                    rnd[key] = rows
                    print(f"round {r} {key}: " + ", ".join(f"{x['shape']} {1e3 * x['median_s']:.1f} ms"
                                                          for x in rows) + f" ({time.perf_counter() - t:.0f} s)",
                          flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
        slow = {}
        for name in settings + ["reference_numpy_1thread"]:
            for a, b in zip(rnd[f"{name}|load=0"], rnd[f"{name}|load={args.load}"]):
                slow[f"{name}|{a['shape']}"] = round(b["median_s"] / a["median_s"], 2)
        rnd["slowdown_under_load"] = slow
        print(json.dumps(slow), flush=True)
        doc["rounds"].append(rnd)
        if args.out:
            from ivhl_jax.run.io import write_json

            write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
