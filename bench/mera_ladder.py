"""Wall time to accuracy of MERA χ ladders (schedules and precision ladders), in one process.

Each schedule is a list of stages ``chi/chi_mid/layers/sweeps/precision``; stages are joined by
:func:`ivhl_jax.physics.mera.grow`, the first one is a cold start with the stuck-start check. The clock runs from
the first sweep to the end of each compiled chunk and includes every compilation (the persistent compilation
cache is not used), so "time to reach ε" is what a user waits for. Energy errors are float64 evaluations of the
energy measured in each sweep (a float32 sweep measures its energy in float32: ≈ 1e-7 relative).

    .venv/bin/python -m ivhl_jax.bench.mera_ladder --schedule published=6/4/1/2000/f64,8/6/2/1800/f64 \\
        --schedule mixed=6/4/1/2000/f32,8/6/2/1800/f64 --out bench/results/mera_precision_ladder.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from ivhl_jax.physics import mera as M
from ivhl_jax.run.io import write_json

TARGETS = (1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 2e-6, 1.5e-6, 1e-6, 5e-7, 2e-7, 1e-7, 5e-8)


def parse_schedule(text: str) -> tuple[str, list[dict]]:
    name, _, body = text.partition("=")
    stages = []
    for part in body.split(","):
        chi, mid, layers, sweeps, prec = part.split("/")
        stages.append({"chi": int(chi), "chi_mid": int(mid), "layers": int(layers), "sweeps": int(sweeps),
                       "precision": prec})
    return name, stages


def run(stages: list[dict], seed: int = 0, chunk: int = 50) -> dict:
    """Run one ladder; per-chunk (sweep, seconds since start, energy error) and per-stage summaries."""
    e0 = M.E0_CRITICAL_ISING
    key = jax.random.key(seed)
    marks: list[tuple[int, float, float]] = []
    errors: list[np.ndarray] = []
    summary = []
    restarts: list[dict] = []
    jax.clear_caches()  # every schedule pays its own compilations (no reuse of an earlier schedule's programs)
    with jax.enable_x64(True):
        mera: M.MERA | None = None
        t0 = time.perf_counter()
        done = 0
        for k, st in enumerate(stages):
            cfg = M.MERAConfig(chi=st["chi"], chi_mid=st["chi_mid"], layers=st["layers"])
            dtype = M.precision_dtype(st["precision"])
            h = M.ising_two_site_hamiltonian(1.0, dtype)
            make = lambda n, cfg=cfg, h=h: M.make_advance(h, n, cfg.power_iters, cfg.u_delay, cfg.refsym,
                                                         cfg.si_scales)
            n = st["sweeps"]
            ts = time.perf_counter()
            if mera is None:
                check = M.StuckCheck()
                mera, e, restarts = M.cold_start(cfg, key, e0, make, chunk, check, dtype=dtype)
                errors.append(e - e0)
                done += len(e)
                marks.append((done, time.perf_counter() - t0, float(e[-1] - e0)))
                n -= len(e)
            else:
                mera = M.grow(M.cast_mera(mera, np.float64), jax.random.fold_in(key, k), st["chi"], st["chi_mid"],
                              layers=st["layers"], refsym=cfg.refsym)
            mera = M.cast_mera(mera, dtype)
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
        dims = M.scaling_dimensions(M.cast_mera(mera, np.float64), 4)
    err = np.concatenate(errors)
    reach = {}
    for tgt in TARGETS:
        hit = [(s, t) for s, t, e in marks if e <= tgt]
        reach[f"{tgt:.0e}"] = None if not hit else {"sweep": hit[0][0], "seconds": round(hit[0][1], 2)}
    return {"stages": summary, "total_s": round(marks[-1][1], 2), "final_energy_error": float(err[-1]),
            "restarts": restarts, "time_to_error": reach, "scaling_dimensions": [float(x) for x in dims],
            "chunk_marks": [[s, round(t, 3), e] for s, t, e in marks]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedule", action="append", required=True,
                    help="name=chi/chi_mid/layers/sweeps/precision,... (precision f64 or f32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    doc: dict = {"what": "MERA ladders, wall time (compilation included) to each energy error per site; one "
                         "process, schedules run one after the other",
                 "command": "python -m ivhl_jax.bench.mera_ladder " + " ".join(argv if argv is not None
                                                                               else sys.argv[1:]),
                 "host": f"{os.cpu_count()}-CPU host shared with other jobs (compare within this file)",
                 "jax_version": jax.__version__, "results": {}}
    for text in args.schedule:
        name, stages = parse_schedule(text)
        print(name, flush=True)
        doc["results"][name] = run(stages, args.seed)
        print(json.dumps({name: doc["results"][name]["time_to_error"]}), flush=True)
        if args.out:
            write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
