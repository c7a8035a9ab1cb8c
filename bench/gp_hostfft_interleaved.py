"""The GP Strang step with ``fft="ducc"``: the kinetic factor as a keyed host copy vs as a traced operand.

One process, interleaved rounds (a busy host slows every variant alike; read the ratios). Variants, all
``trajectory(condensate.strang(system, dt), psi, steps)`` at the same 3-D grid, dt = 1e-3, g = 100, complex64:

* ``xla``: ``fft="xla"`` (XLA's FFT);
* ``ducc_keyed``: ``fft="ducc"`` as built by ``strang`` now (the factor is a ``spectral.HostFactor``: only
  its int32 key crosses to the host per step);
* ``ducc_operand``: the same stepper with the plan's factor replaced by its plain device array, i.e. the
  path every step took before the fix (the factor is a callback operand, copied to the host each step);
* ``ducc_static``: the factor captured as a NumPy constant by a hand-written jitted loop (no stepper,
  recompiles for a new dt; the pre-stepper design, the lower bound).

    .venv/bin/python -m ivhl_jax.bench.gp_hostfft_interleaved --n 128 --rounds 15 \
        --out bench/results/condensate_gp_hostfft.json

``--out`` appends one record to the file's ``interleaved`` list (the older harness records are kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

DT, G = 1e-3, 100.0


def _zero(state, params):
    del state, params
    return jnp.zeros(())


def build(n: int, steps: int):
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.numerics.spectral import HostFactor, spectral_multiply
    from ivhl_jax.physics import condensate as C

    shape = (n, n, n)
    grid = C.Grid.uniform(shape, [0.1 * k for k in shape])  # dx = 0.1: dt·k_max²/2 < π in 3D
    psi = C.gaussian(grid)
    sys_x = C.GPSystem(grid, C.harmonic(grid), G, fft="xla")
    sys_d = sys_x.replace(fft="ducc")
    st_x, st_k = C.strang(sys_x, DT), C.strang(sys_d, DT)
    assert isinstance(st_k.params.plan.kin, HostFactor)
    st_o = st_k.replace(params=st_k.params.replace(plan=st_k.params.plan.replace(kin=st_k.params.plan.kin.value)))
    kin_np = C._static_kinetic(grid, DT, False, "complex64")
    pot = sys_d.potential

    def local(p):
        return pot + G * (p.real * p.real + p.imag * p.imag)

    @jax.jit
    def static(p):
        def kinetic(q):
            return spectral_multiply(q, kin_np, (0, 1, 2), "ducc")
        return jax.lax.fori_loop(0, steps, lambda i, q: C.split_step(q, local, kinetic, DT, False), p)

    def run(stepper):
        return lambda p: trajectory(stepper, p, steps, save_every=steps, observe=_zero)[0]

    cases = {"xla": run(st_x), "ducc_keyed": run(st_k), "ducc_operand": run(st_o)}
    cases["ducc_static"] = static
    return cases, psi


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=128, help="grid points per axis (3-D grid n³)")
    ap.add_argument("--steps", type=int, default=5, help="Strang steps per timed call")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=None, help="JSON file to append the record to")
    args = ap.parse_args(argv)
    cases, psi = build(args.n, args.steps)
    first = {}
    for name, f in cases.items():
        t0 = time.perf_counter()
        f(psi).block_until_ready()
        first[name] = time.perf_counter() - t0
        f(psi).block_until_ready()
    ref = np.asarray(cases["xla"](psi))
    max_diff = {name: float(np.abs(np.asarray(f(psi)) - ref).max()) for name, f in cases.items()}
    load0 = os.getloadavg()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, f in cases.items():
            t0 = time.perf_counter()
            f(psi).block_until_ready()
            samples[name].append((time.perf_counter() - t0) / args.steps)
    load1 = os.getloadavg()

    def stats(v):
        q75, q25 = np.percentile(v, [75, 25])
        return {"median_ms": 1e3 * float(np.median(v)), "iqr_ms": 1e3 * float(q75 - q25), "min_ms": 1e3 * float(min(v)),
                "samples_ms": [round(1e3 * x, 3) for x in v]}

    def ratio(a, b):  # median of the per-round ratios (interleaved, so a busy round slows both)
        return float(np.median([x / y for x, y in zip(samples[a], samples[b])]))

    record = {
        "what": "keyed host factor: GP Strang step per step, fft='ducc' with the kinetic factor as a HostFactor "
                "(key only to the host) vs as a traced operand (the regression) vs captured constant, and fft='xla'",
        "command": "python -m ivhl_jax.bench.gp_hostfft_interleaved "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "timestamp_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "shape": [args.n] * 3, "steps_per_call": args.steps, "dt": DT, "g": G, "dtype": "complex64",
        "rounds": args.rounds, "statistic": "per-step wall time (call / steps), block_until_ready; ratios are "
                                            "medians of per-round ratios",
        "jax": jax.__version__, "cpu_count": os.cpu_count(), "loadavg_start": load0, "loadavg_end": load1,
        "first_call_s": first, "max_abs_diff_vs_xla": max_diff,
        "ms_per_step": {k: stats(v) for k, v in samples.items()},
        "ratios": {"ducc_operand/ducc_keyed": ratio("ducc_operand", "ducc_keyed"),
                   "ducc_keyed/ducc_static": ratio("ducc_keyed", "ducc_static"),
                   "ducc_keyed/xla": ratio("ducc_keyed", "xla"), "ducc_operand/xla": ratio("ducc_operand", "xla")},
    }
    print(json.dumps({k: v for k, v in record.items() if k != "ms_per_step"}, indent=1))
    per_step = record["ms_per_step"]
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "samples_ms"} for k, v in per_step.items()},
                     indent=1))
    if args.out:
        with open(args.out) as f:
            data = json.load(f)
        data.setdefault("interleaved", []).append(record)
        with open(args.out, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    return record


if __name__ == "__main__":
    main()
