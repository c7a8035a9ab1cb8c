"""Speed of the physics kernels per precision policy (``f64``, ``f32``, ``bf16``, ``pure_bf16``).

Each kernel is timed through its public function with ``policy=`` set, all policies of a kernel in
one process: every policy of a kernel is compiled (compile time apart), warmed up once, then the
policies are called in interleaved rounds (one call each per round, ``repeats`` rounds), each call
ending in ``block_until_ready``; median and IQR per policy. Interleaving matters on a shared host:
load changes hit every policy alike. float64 cases are built, compiled and called inside
``jax.enable_x64(True)`` (the other policies inside ``jax.enable_x64(False)``). Kernels (``small``
size, chosen to run in seconds):

* ``fields``: :func:`~ivhl_jax.physics.fields.superpose`, 4096 points × 32 sources (3-D);
* ``vortex``: :func:`~ivhl_jax.physics.fields.vortex`, a 128² grid, 4 vortices of charge ±1, ±2;
* ``gp``: 100 real-time Strang steps (:func:`~ivhl_jax.physics.condensate.strang`), 1-D 4096 points;
* ``gft``: 20 Strang steps (:func:`~ivhl_jax.physics.gft.strang`), 16³ lattice;
* ``adaptive``: 5 steps of the adaptive-node model (N = 100, H = 64, D = 784), batch 32;
* ``gru``: :func:`~ivhl_jax.nn.gru.recurrence` run for all T steps, T = 50, batch 64, D = 32, H = 128.

A policy a kernel rejects (bf16 for the complex split-step solvers) is recorded with its error
message instead of a time. Errors per policy are measured and asserted in each kernel's test file
(``tests/physics/test_fields.py``, ``tests/physics/condensate/test_stepper.py``, ``tests/physics/test_gft.py``,
``tests/nn/test_adaptive.py``, ``test_gru.py``; table in docs/guide/precision.md).

The f32/bf16/pure_bf16 cases are also registered as ops (``precision_<kernel>_<policy>``) for
``ivhl bench``; ``python -m ivhl_jax.bench.ops_precision`` runs every kernel and policy and writes
``bench/results/precision_cpu.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import BenchCase, summarize
from ivhl_jax.core import host
from ivhl_jax.numerics.rollout import trajectory

POLICIES = ("f64", "f32", "bf16", "pure_bf16")
KERNELS = ("fields", "vortex", "gp", "gft", "adaptive", "gru")


def _fields(policy: str) -> BenchCase:
    from ivhl_jax.physics import fields as F

    rng = np.random.default_rng(0)
    n, m = 4096, 32
    pts = rng.normal(size=(n, 3)).astype(np.float32)
    src = (0.5 * rng.normal(size=(m, 3))).astype(np.float32)
    k = rng.uniform(0.5, 8.0, m).astype(np.float32)
    fn = functools.partial(F.superpose, softening=0.1, policy=policy)
    return BenchCase(
        op=f"precision_fields_{policy}",
        size="small",
        fn=lambda p, s, kk: fn(p, s, wavenumbers=kk),
        args=(pts, src, k),
        params={"points": n, "sources": m, "policy": policy},
        op_by_op=False,
        items_per_call=n * m,
        items_name="pairs",
    )


def _vortex(policy: str) -> BenchCase:
    from ivhl_jax.physics import fields as F

    pts = np.asarray(F.grid_points((128, 128), -2.0, 2.0))
    ctr = np.array([[0.3, -0.2], [-0.9, 0.7], [1.1, 1.0], [-1.0, -1.2]], np.float32)
    q = np.array([1, -2, 2, -1])
    return BenchCase(
        op=f"precision_vortex_{policy}",
        size="small",
        fn=lambda p, c: F.vortex(p, c, q, core_size=0.2, policy=policy),
        args=(pts, ctr),
        params={"points": 128 * 128, "vortices": 4, "policy": policy},
        op_by_op=False,
        items_per_call=128 * 128 * 4,
        items_name="point-vortex pairs",
    )


def _gp(policy: str) -> BenchCase:
    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform(4096, 409.6)
    system = C.GPSystem.create(grid, C.harmonic(grid, 0.05), 10.0)
    psi0 = C.gaussian(grid, width=10.0)
    steps = 100
    return BenchCase(
        op=f"precision_gp_{policy}",
        size="small",
        fn=lambda p: trajectory(st := C.strang(system, 1e-3, policy=policy), st.init(p), steps, save_every=steps)[0],
        args=(psi0,),
        params={"shape": grid.shape, "steps": steps, "policy": policy},
        op_by_op=False,
        items_per_call=steps,
        items_name="steps",
    )


def _gft(policy: str) -> BenchCase:
    from ivhl_jax.physics import gft as G

    shape = (16, 16, 16)
    system = G.GFTSystem.create(shape, -0.5, 0.1)
    rng = np.random.default_rng(0)
    phi0 = (0.3 * (rng.normal(size=shape) + 1j * rng.normal(size=shape)) + 0.5).astype(np.complex64)
    steps = 20
    return BenchCase(
        op=f"precision_gft_{policy}",
        size="small",
        fn=lambda p: trajectory(st := G.strang(system, 0.02, policy=policy), st.init(p), steps, save_every=steps)[0],
        args=(phi0,),
        params={"shape": shape, "steps": steps, "policy": policy},
        op_by_op=False,
        items_per_call=steps,
        items_name="steps",
    )


def _adaptive(policy: str) -> BenchCase:
    from ivhl_jax.nn import adaptive as A

    cfg = A.AdaptiveConfig()
    w = A.init_params(jax.random.key(0), cfg)
    steps, batch = 5, 32
    xs = jax.random.normal(jax.random.key(1), (steps, batch, cfg.input_dim), jnp.float32)
    state = A.init_state(cfg, batch)

    def fn(w, s, xs):
        return A.apply_sequence(w, xs, cfg, jax.random.key(2), s, policy=policy)[1]["logits"]

    return BenchCase(
        op=f"precision_adaptive_{policy}",
        size="small",
        fn=fn,
        args=(w, state, xs),
        params={
            "nodes": cfg.num_nodes,
            "hidden": cfg.hidden_dim,
            "input": cfg.input_dim,
            "batch": batch,
            "steps": steps,
            "policy": policy,
        },
        op_by_op=False,
        items_per_call=steps * batch,
        items_name="sample-steps",
    )


def _gru_hs(p: dict, h0: jax.Array, xs: jax.Array, policy: str) -> jax.Array:
    """hs [T, ..., H] of the GRU recurrence over ``xs`` from ``h0``."""
    from ivhl_jax.nn import gru
    from ivhl_jax.numerics.rollout import trajectory

    st = gru.recurrence(p, xs, policy=policy)
    return trajectory(st, st.init(h0), xs.shape[0], observe=gru.observe)[1]


def _gru(policy: str) -> BenchCase:
    from ivhl_jax.nn import gru

    t, b, d, h = 50, 64, 32, 128
    p = gru.init_params(jax.random.key(0), d, h)
    xs = jax.random.normal(jax.random.key(1), (t, b, d), jnp.float32)
    h0 = jnp.zeros((b, h), jnp.float32)
    return BenchCase(
        op=f"precision_gru_{policy}",
        size="small",
        fn=lambda p, h0, xs: _gru_hs(p, h0, xs, policy),
        args=(p, h0, xs),
        params={"T": t, "batch": b, "input": d, "hidden": h, "policy": policy},
        op_by_op=False,
        items_per_call=t * b,
        items_name="sample-steps",
    )


_FACTORIES: dict[str, Callable[[str], BenchCase]] = {
    "fields": _fields,
    "vortex": _vortex,
    "gp": _gp,
    "gft": _gft,
    "adaptive": _adaptive,
    "gru": _gru,
}


def _op(kernel: str, policy: str, size: str) -> BenchCase:
    del size  # one size: the point is the ratio between policies
    return _FACTORIES[kernel](policy)


# f64 needs x64 around the whole run, which `ivhl bench` does not set: only the 32/16-bit policies
# are registered; the complex split-step solvers reject bf16, so they register f32 only.
OPS = {
    f"precision_{k}_{p}": functools.partial(_op, k, p)
    for k in KERNELS
    for p in ("f32", "bf16", "pure_bf16")
    if not (k in ("gp", "gft") and p != "f32")
}


def _cpu_flags() -> list[str]:
    return sorted(x for x in host.facts().cpu_flags if "bf16" in x or x.startswith("avx512"))


def _time_kernel(kernel: str, policies: tuple[str, ...], repeats: int, pause_s: float = 0.005) -> list[dict[str, Any]]:
    """Compile every policy of one kernel, then time them in interleaved rounds (one call of each per
    round), so that load changes on a shared host hit all policies alike."""
    rows: dict[str, dict[str, Any]] = {}
    calls: dict[str, Callable[[], Any]] = {}
    for policy in policies:
        x64 = policy == "f64"
        rec: dict[str, Any] = {"op": f"precision_{kernel}_{policy}", "kernel": kernel, "policy": policy}
        with jax.enable_x64(x64):
            try:
                case = _FACTORIES[kernel](policy)
                t0 = time.perf_counter()
                compiled = jax.jit(case.fn).lower(*case.args).compile()
                rec["compile_s"] = time.perf_counter() - t0
            except ValueError as e:  # a policy the kernel rejects, with its message
                rec["rejected"] = str(e)
                rows[policy] = rec
                continue
        rec["params"] = case.params
        rec["items_per_call"], rec["items_name"] = case.items_per_call, case.items_name

        def call(compiled=compiled, args=case.args, x64=x64):
            # Every call (all policies alike) runs inside its x64 context: f64 arrays stay f64.
            with jax.enable_x64(x64):
                return jax.block_until_ready(compiled(*args))

        call()  # warm-up
        rows[policy], calls[policy] = rec, call
    samples: dict[str, list[float]] = {p: [] for p in calls}
    load0 = os.getloadavg()
    for _ in range(repeats):
        for policy, timed in calls.items():
            time.sleep(pause_s)
            t0 = time.perf_counter()
            timed()
            samples[policy].append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    for policy, s in samples.items():
        rec = rows[policy]
        rec["jit"] = summarize(s)
        rec["loadavg_start"], rec["loadavg_end"] = list(load0), list(load1)
        if rec.get("items_per_call"):
            rec["throughput_per_s"] = rec["items_per_call"] / rec["jit"]["median_s"]
    for policy, rec in rows.items():
        if "jit" in rec:
            print(
                f"{kernel:9s} {policy:9s} {rec['jit']['median_s'] * 1e3:9.3f} ms "
                f"(iqr {rec['jit']['iqr_s'] * 1e3:.3f}, compile {rec['compile_s']:.2f} s)",
                flush=True,
            )
        else:
            print(f"{kernel:9s} {policy:9s} rejected: {rec['rejected'][:90]}", flush=True)
    return [rows[p] for p in policies]


def run_all(kernels=KERNELS, policies=POLICIES, repeats: int = 15) -> dict[str, Any]:
    """Time every (kernel, policy); returns the JSON document (rows plus a speed table)."""
    from ivhl_jax.run.device import device_report

    rows: list[dict[str, Any]] = []
    for kernel in kernels:
        rows.extend(_time_kernel(kernel, tuple(policies), repeats))
    table: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = table.setdefault(r["kernel"], {})
        entry[r["policy"]] = r["jit"]["median_s"] * 1e3 if "jit" in r else "rejected"
    for entry in table.values():
        base = entry.get("f32")
        if isinstance(base, float):
            entry["time_over_f32"] = {
                p: (v / base if isinstance(v, float) else v) for p, v in entry.items() if p in POLICIES
            }
    return {
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m ivhl_jax.bench.ops_precision", *sys.argv[1:]]),
        "environment": device_report(),
        "cpu_flags_avx512_bf16": _cpu_flags(),
        "method": {
            "repeats": repeats,
            "warmup": 1,
            "statistic": "median wall time per call (block_until_ready); the policies of one kernel "
            "are timed in interleaved rounds",
            "x64": "enabled only around the f64 cases (jax.enable_x64 context, also around each call)",
        },
        "milliseconds_per_call": table,
        "results": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from ivhl_jax.bench.harness import write_results

    p = argparse.ArgumentParser(description="physics kernels: time per precision policy")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--note", default="", help="free text stored in the JSON (e.g. host load)")
    p.add_argument("--export", default="bench/results/precision_cpu.json")
    a = p.parse_args(argv)
    doc = run_all(tuple(a.kernels.split(",")), tuple(a.policies.split(",")), a.repeats)
    doc["note"] = a.note
    if argv is not None:  # called from Python: the command is these arguments, not this process's
        doc["command"] = " ".join(["python -m ivhl_jax.bench.ops_precision", *argv])
    doc["loadavg_at_end"] = list(os.getloadavg())
    print("wrote", write_results(a.export, doc, command=doc["command"]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
