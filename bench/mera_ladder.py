"""Wall time to accuracy of MERA χ ladders (schedules and precision ladders), in one process.

Each schedule is a list of stages ``chi/chi_mid/layers/steps/precision`` (one step = one sweep); stages are joined by
:func:`ivhl_jax.physics.mera.grow`, the first one is a cold start with the stuck-start check. The clock runs from
the first sweep to the end of each compiled chunk and includes every compilation (the persistent compilation
cache is not used), so "time to reach ε" is what a user waits for. Energy errors are float64 evaluations of the
energy measured in each sweep (a float32 sweep measures its energy in float32: ≈ 1e-7 relative).

``--compile-ahead`` runs every schedule twice, interleaved, without and with ahead-of-time compilation of each
stage's sweep in a background thread (:func:`ivhl_jax.physics.mera.compile_advance`, stage k+1 while stage k runs;
``ivhl sim mera``'s ``compile_ahead``), ``--repeats`` times, and ``--reference`` adds the NumPy port of tensors.net
doVarMERA (:mod:`ivhl_jax.bench.mera_reference`, single-threaded BLAS) on the same schedule in a subprocess.

    .venv/bin/python -m ivhl_jax.bench.mera_ladder --schedule published=6/4/1/2000/f64,8/6/2/1800/f64 \\
        --schedule mixed=6/4/1/2000/f32,8/6/2/1800/f64 --out bench/results/mera_precision_ladder.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from ivhl_jax.physics import mera as M
from ivhl_jax.run.io import write_json
from ivhl_jax.sims.mera import StageCompiler

TARGETS = (1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 2e-6, 1.5e-6, 1e-6, 5e-7, 2e-7, 1e-7, 5e-8)


def parse_schedule(text: str) -> tuple[str, list[dict]]:
    name, _, body = text.partition("=")
    stages = []
    for part in body.split(","):
        chi, mid, layers, steps, prec = part.split("/")
        stages.append({"chi": int(chi), "chi_mid": int(mid), "layers": int(layers), "steps": int(steps),
                       "precision": prec})
    return name, stages


def run(stages: list[dict], seed: int = 0, chunk: int = 50, ahead: bool = False, check: M.StuckCheck | None = None
        ) -> dict:
    """Run one ladder; per-chunk (step, seconds since start, energy error) and per-stage summaries. ``ahead``:
    compile every stage's chunk ahead of time (``ivhl sim mera``'s StageCompiler: stage k+1 in a background thread
    once stage k runs its steady chunks)."""
    e0 = M.E0_CRITICAL_ISING
    key = jax.random.key(seed)
    marks: list[tuple[int, float, float]] = []
    errors: list[np.ndarray] = []
    summary = []
    restarts: list[dict] = []
    jax.clear_caches()  # every schedule pays its own compilations (no reuse of an earlier schedule's programs)
    configs = [M.MERAConfig(chi=st["chi"], chi_mid=st["chi_mid"], layers=st["layers"]) for st in stages]
    compile_s: list = []
    with jax.enable_x64(True):
        mera: M.MERA | None = None
        t0 = time.perf_counter()
        sc = (StageCompiler([(c, chunk, M.precision_dtype(st["precision"])) for c, st in zip(configs, stages)])
              if ahead else None)
        done = 0
        for k, st in enumerate(stages):
            cfg = configs[k]
            dtype = M.precision_dtype(st["precision"])
            h = M.ising_two_site_hamiltonian(1.0, dtype)
            compiled = sc.get(k) if sc is not None else None
            make = lambda n, cfg=cfg, h=h, c=compiled: (c if c is not None and n == chunk else M.make_advance(
                h, n, cfg.power_iters, cfg.u_delay, cfg.refsym, cfg.si_scales))
            n = st["steps"]
            ts = time.perf_counter()
            if mera is None:
                mera, e, restarts = M.cold_start(cfg, key, e0, make, chunk, check or M.StuckCheck(), dtype=dtype,
                                                 limit=n)
                errors.append(e - e0)
                done += len(e)
                marks.append((done, time.perf_counter() - t0, float(e[-1] - e0)))
                n -= len(e)
            else:
                mera = M.grow(M.cast_mera(mera, np.float64), jax.random.fold_in(key, k), st["chi"], st["chi_mid"],
                              layers=st["layers"], refsym=cfg.refsym)
            mera = M.cast_mera(mera, dtype)
            if sc is not None:
                sc.prefetch(k + 1)
            adv = make(chunk)
            for _ in range(n // chunk):
                mera, e_dev = adv(mera)
                e = np.asarray(e_dev, np.float64)
                errors.append(e - e0)
                done += chunk
                marks.append((done, time.perf_counter() - t0, float(e[-1] - e0)))
            summary.append({**st, "wall_s": round(time.perf_counter() - ts, 2),
                            "final_energy_error": float(errors[-1][-1])})
            print(f"  stage {k}: {st} -> {errors[-1][-1]:.3e} in {summary[-1]['wall_s']} s", flush=True)
        assert mera is not None
        if sc is not None:
            sc.close()
            compile_s = [sc.seconds.get(k) for k in range(len(stages))]
        dims = M.scaling_dimensions(M.cast_mera(mera, np.float64), 4)
    err = np.concatenate(errors)
    return {"stages": summary, "total_s": round(marks[-1][1], 2), "final_energy_error": float(err[-1]),
            "compile_ahead": ahead, "ahead_compile_s": compile_s,
            "restarts": restarts, "time_to_error": reach(marks), "scaling_dimensions": [float(x) for x in dims],
            "chunk_marks": [[s, round(t, 3), e] for s, t, e in marks]}


def reach(marks: list) -> dict:
    out = {}
    for tgt in TARGETS:
        hit = [(m[0], m[1]) for m in marks if m[2] <= tgt]
        out[f"{tgt:.0e}"] = None if not hit else {"sweep": hit[0][0], "seconds": round(hit[0][1], 2)}
    return out


def reference(stages: list[dict], seed: int, fold: int = 0) -> dict:
    """The NumPy doVarMERA port on the same schedule, in a fresh single-threaded-BLAS process (``fold``: start from
    ``fold_in(key, fold)``)."""
    body = ",".join(f"{st['chi']}/{st['chi_mid']}/{st['layers']}/{st['steps']}" for st in stages)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = f"/tmp/mera_reference_{os.getpid()}.json"
    subprocess.run([sys.executable, "-m", "ivhl_jax.bench.mera_reference", "--schedule", f"ref={body}",
                    "--seed", str(seed), "--fold", str(fold), "--out", out], check=True, env=env)
    with open(out) as f:
        res = json.load(f)["ladders"]["ref"]
    os.remove(out)
    res["time_to_error"] = reach(res["chunk_marks"])
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedule", action="append", required=True,
                    help="name=chi/chi_mid/layers/steps/precision,... (precision f64 or f32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-ahead", action="store_true",
                    help="run each schedule without and with ahead-of-time compilation, interleaved")
    ap.add_argument("--reference", action="store_true", help="also run the NumPy doVarMERA port (interleaved)")
    ap.add_argument("--reference-fold", type=int, default=0,
                    help="the reference starts from fold_in(key, N), e.g. the start the stuck check kept")
    ap.add_argument("--no-jax", action="store_true", help="only the reference (with --reference)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--single-check", action="store_true", help="stuck check at step 300 only (no rechecks)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    doc: dict = {"what": "MERA ladders, wall time (compilation included) to each energy error per site; one "
                         "process, schedules run one after the other",
                 "command": "python -m ivhl_jax.bench.mera_ladder " + " ".join(argv if argv is not None
                                                                               else sys.argv[1:]),
                 "host": f"{os.cpu_count()}-CPU host shared with other jobs (compare within this file)",
                 "jax_version": jax.__version__, "results": {}}
    check = M.StuckCheck(every=0) if args.single_check else M.StuckCheck()
    for text in args.schedule:
        name, stages = parse_schedule(text)
        modes = [] if args.no_jax else [False, True] if args.compile_ahead else [False]
        for rep in range(args.repeats):
            for ahead in modes:
                label = name + ("+ahead" if ahead else "") + (f"#{rep}" if args.repeats > 1 else "")
                print(label, flush=True)
                doc["results"][label] = run(stages, args.seed, ahead=ahead, check=check)
                print(json.dumps({label: [doc["results"][label]["total_s"],
                                          doc["results"][label]["time_to_error"]]}), flush=True)
            if args.reference:
                label = name + "+reference" + (f"#{rep}" if args.repeats > 1 else "")
                print(label, flush=True)
                doc["results"][label] = reference(stages, args.seed, args.reference_fold)
                print(json.dumps({label: [doc["results"][label]["total_s"],
                                          doc["results"][label]["time_to_error"]]}), flush=True)
            if args.out:
                write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
