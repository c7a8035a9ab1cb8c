"""Weak and strong scaling of the sharded 3-D Gross–Pitaevskii Strang step (distributed FFT).

``XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python -m bench.studies.condensate_scaling
--out bench/results/condensate_scaling_cpu.json`` measures, for 1, 2, 4 and 8 devices:

* strong scaling: one fixed grid (default 64³) on p devices (slab over p; pencil for p = 4, 8);
* weak scaling: the grid grows with p (default (32·p, 64, 64)), so each device holds the same block;
* the reference ``strong_gspmd_8``: the same step without a layout, ψ sharded ``P("x")`` over 8 devices and
  ``jnp.fft`` left to XLA's SPMD partitioner (which gathers the field);

and for every configuration the step time (a compiled ``trajectory`` of ``--steps`` steps, configurations
timed in interleaved rounds), the bytes each device exchanges per step (the all-to-alls parsed from the
compiled HLO by :func:`ivhl_jax.core.hlo.collectives`; any all-gather would be listed
too), and the per-device memory (arguments, outputs and temporaries from ``memory_analysis()``).

Emulated CPU devices share the host's cores, so step times measure the overhead of the decomposition
(the transposes, the extra copies), not a speed-up; the bytes and the memory are what a real cluster
would see. The document adds a labelled *estimate* for GPUs from those bytes: communication time =
bytes sent per device / link bandwidth (NVLink within a node, InfiniBand between nodes), compute time
scaled from one measured single-GPU step.
"""

from __future__ import annotations

import argparse
import math
import platform
import shlex
import sys
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from ivhl_jax.bench.harness import memory_bytes
from ivhl_jax.core import backend
from ivhl_jax.core.hlo import collectives
from ivhl_jax.core.mesh import device_mesh, place
from ivhl_jax.numerics import distributed_fft as D
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C

DT = 1e-3
# Link bandwidths of the estimate (bytes/s, one direction, per GPU): NVLink 4 (H100 SXM, 18 links) and one
# 400 Gb/s InfiniBand NDR port per GPU. Compute anchor: the measured single-H200 GP 3-D step at 512³
# (7.3 ms/step, trajectory of condensate.strang, complex64), scaled by N log N.
NVLINK_BPS = 450e9
IB_BPS = 50e9
GPU_STEP_512_S = 7.3e-3


def _layout(p: int, kind: str) -> D.FFTLayout | None:
    if p == 1:
        return None
    devs = jax.devices()[:p]
    if kind == "slab":
        return D.fft_layout(device_mesh((p,), ("x",), devs), P("x"))
    px = {4: 2, 8: 4}[p]
    return D.fft_layout(device_mesh((px, p // px), ("x", "y"), devs), P("x", "y"))


def _case(shape: tuple[int, ...], p: int, kind: str, steps: int) -> tuple[dict[str, Any], Any]:
    grid = C.Grid.uniform(shape, 12.0)
    if kind == "gspmd":  # no layout: ψ sharded P("x") and jnp.fft left to XLA's partitioner (the reference)
        layout = None
        stepper = C.strang(C.GPSystem.create(grid, C.harmonic(grid), 50.0), DT)
        slab = _layout(p, "slab")
        psi = stepper.init(C.gaussian(grid)) if slab is None else place(stepper.init(C.gaussian(grid)), slab.sharding())
    else:
        layout = _layout(p, kind)
        stepper = C.strang(C.GPSystem.create(grid, C.harmonic(grid), 50.0, layout=layout), DT)
        psi = stepper.init(C.gaussian(grid))
    run = jax.jit(lambda st, s: trajectory(st, s, steps)[0])
    one = jax.jit(lambda st, s: st.step(s))
    compiled = one.lower(stepper, psi).compile()
    text = compiled.as_text() or ""
    coll = collectives(text)
    # The real-time step is a conditional on the phase range (fast or full-range sine reduction): the program holds
    # both branches, each with the same FFT transposes, and one runs per step.
    branches = 2 if "conditional(" in text else 1
    mem = memory_bytes(compiled)
    shard = psi.addressable_shards[0].data.nbytes
    jax.block_until_ready(run(stepper, psi))
    rec = {
        "grid": list(shape),
        "devices": p,
        "decomposition": "none" if p == 1 else kind,
        "mesh": None if p == 1 else {"x": p} if layout is None else dict(layout.mesh.shape),
        "shard_bytes": shard,
        "field_bytes": int(np.prod(shape)) * 8,
        "collectives_per_step": [{"kind": k, "bytes": b} for k, b in coll],
        "all_to_all_bytes_per_step": sum(b for k, b in coll if k == "all-to-all") // branches,
        "all_gather_bytes_per_step": sum(b for k, b in coll if k == "all-gather") // branches,
        "bytes_sent_per_device_per_step": sum(b for k, b in coll if k == "all-to-all") / branches * (p - 1) / p,
        "memory_per_device": {
            "argument_bytes": mem["argument_size_in_bytes"],
            "output_bytes": mem["output_size_in_bytes"],
            "temp_bytes": mem["temp_size_in_bytes"],
            "temp_over_shard": mem["temp_size_in_bytes"] / shard,
        },
    }
    return rec, (lambda: jax.block_until_ready(run(stepper, psi)))


def _gpu_estimate(n: int, p: int, kind: str) -> dict[str, Any]:
    """Estimated step time of an n³ complex64 GP run on p GPUs (an estimate, not a measurement)."""
    transposes = 0 if p == 1 else (2 if kind == "slab" else 4)
    shard = n**3 * 8 / p
    sent = transposes * shard * (p - 1) / p
    compute = GPU_STEP_512_S * (n**3 * math.log2(n)) / (512**3 * math.log2(512)) / p
    out = {
        "grid": n,
        "gpus": p,
        "decomposition": "none" if p == 1 else kind,
        "shard_GB": shard / 1e9,
        "bytes_sent_per_gpu_GB": sent / 1e9,
        "compute_ms_est": compute * 1e3,
    }
    out["step_ms_est_nvlink"] = (compute + sent / NVLINK_BPS) * 1e3
    out["step_ms_est_infiniband"] = (compute + sent / IB_BPS) * 1e3
    return out


def _configs(strong: int, weak: int) -> list[tuple[str, tuple[int, ...], int, str]]:
    """(scaling, grid, devices, layout) of every case: slab on 1–8 devices, pencil on 4 and 8, GSPMD on 8."""
    configs: list[tuple[str, tuple[int, ...], int, str]] = []
    for p in (1, 2, 4, 8):
        configs.append(("strong", (strong,) * 3, p, "slab"))
        configs.append(("weak", (weak * p, 64, 64), p, "slab"))
    for p in (4, 8):
        configs.append(("strong", (strong,) * 3, p, "pencil"))
        configs.append(("weak", (weak * p, 64, 64), p, "pencil"))
    configs.append(("strong", (strong,) * 3, 8, "gspmd"))
    return configs


def _build(configs: list[tuple[str, tuple[int, ...], int, str]], steps: int) -> tuple[dict, dict]:
    """Each case's compiled record (HLO bytes, memory) and its timed call, by case name."""
    recs, calls = {}, {}
    for scaling, shape, p, kind in configs:
        name = f"{scaling}_{kind if p > 1 else 'none'}_{p}"
        if name in recs:
            continue
        rec, call = _case(shape, p, kind, steps)
        rec["scaling"] = scaling
        recs[name], calls[name] = rec, call
        print(
            f"{name}: grid {shape}, temp/shard {rec['memory_per_device']['temp_over_shard']:.2f}, "
            f"all-to-all {rec['all_to_all_bytes_per_step']} B/step, all-gather {rec['all_gather_bytes_per_step']}",
            flush=True,
        )
    return recs, calls


def _time(recs: dict, calls: dict, rounds: int, steps: int) -> None:
    """Interleaved rounds of every call; each record gains its step time and its ratios to the 1-device case."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, c in calls.items():
            t0 = time.perf_counter()
            c()
            times[k].append((time.perf_counter() - t0) / steps)
    for k, rec in recs.items():
        rec["step_s_median"] = float(np.median(times[k]))
        rec["step_s_samples"] = times[k]
        # per round, so that a load change during the run hits both alike
        ratios = np.asarray(times[k]) / np.asarray(times[f"{rec['scaling']}_none_1"])
        rec["time_over_1device"] = float(np.median(ratios))
        # grid points per point of the 1-device run: the same host cores do work_ratio times the work
        rec["work_ratio"] = int(np.prod(rec["grid"])) / int(np.prod(recs[f"{rec['scaling']}_none_1"]["grid"]))
        rec["points_per_s_vs_1device"] = rec["work_ratio"] / rec["time_over_1device"]
        print(f"{k}: {rec['step_s_median'] * 1e3:.2f} ms/step ({rec['time_over_1device']:.2f}x 1 device)", flush=True)


def _document(argv: list[str] | None, note: str, recs: dict) -> dict:
    """The results document: what, command, host, note, the measured records and the GPU estimate."""
    estimate = [
        _gpu_estimate(n, p, kind)
        for n in (512, 1024, 2048)
        for p, kind in ((1, "slab"), (8, "slab"), (8, "pencil"), (64, "pencil"))
        if n**3 * 8 / p < 80e9 / 4
    ]
    return {
        "what": "GP 3-D Strang step (complex64) sharded with the distributed FFT on 1, 2, 4, 8 emulated CPU devices: "
        "strong scaling (fixed grid) and weak scaling (grid grows with the devices); step time, bytes "
        "exchanged per step from the compiled HLO, per-device memory",
        "command": "XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python -m "
        "bench.studies.condensate_scaling " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "host": {
            "platform": platform.platform(),
            "cpus": backend.machine_cores(),
            "jax": jax.__version__,
            "backend": backend.platform(),
        },
        "note": note
        or (
            "emulated devices share the host's cores, so step times measure the "
            "decomposition's overhead, not a speed-up; compare the ratios (time_over_1device), "
            "interleaved in one run"
        ),
        "results": recs,
        "gpu_estimate": {
            "what": "ESTIMATE, not a measurement: step time = compute + bytes sent per GPU / link bandwidth (no "
            "overlap); compute scaled by N³log N from the measured single-H200 512³ step and divided by p",
            "assumptions": {
                "nvlink_bytes_per_s": NVLINK_BPS,
                "infiniband_bytes_per_s": IB_BPS,
                "single_gpu_512_step_s": GPU_STEP_512_S,
            },
            "rows": estimate,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON document here")
    ap.add_argument("--strong", type=int, default=64, help="points per axis of the strong-scaling grid")
    ap.add_argument("--weak", type=int, default=32, help="points of the first axis per device (weak scaling)")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed call")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    ap.add_argument("--note", default="", help="a note stored with the results (e.g. the host's load)")
    args = ap.parse_args(argv)
    if jax.device_count() < 8:
        print("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8", file=sys.stderr)
        return 2
    recs, calls = _build(_configs(args.strong, args.weak), args.steps)
    _time(recs, calls, args.rounds, args.steps)
    doc = _document(argv, args.note, recs)
    if args.out:
        from ivhl_jax.bench.harness import write_results

        print(f"wrote {write_results(args.out, doc, command=doc['command'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
