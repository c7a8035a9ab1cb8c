"""2+1D CDT on the JAX engine: attempts per second of many vmapped chains (the ``cdt3`` section of
``bench.gpu_checks``).

:func:`gpu_check` thermalises one chain with the host engine (numba; the JAX engine reads its buffer), copies it
to ``B`` chains with their own keys and times one ``jit(vmap(step))`` call of ``attempts`` attempts per chain on
the default device (compile apart, the median of ``repeats`` calls): attempts/s in aggregate and per chain,
acceptance, for B = 1, 8, 64 (``--quick``, CPU-sized) or 1 … 4096 (GPU sizes). It also lowers the JAX engine's
step and records whether its HLO holds a host callback (it must not: the engine runs on the device alone), and
times the host engine's step on one chain of the same state in the same process for the ratio.

``python -m ivhl_jax.bench.ops_cdt3_jax --out FILE [--quick]``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import gpu_check_main, summarize
from ivhl_jax.core import backend
from ivhl_jax.physics import cdt
from ivhl_jax.physics.cdt import d3_host, d3_state

#: The system: T slices and the couplings of the extended phase the tests use (volume fixed on N(3,1)).
T_SLICES, K0, K3, EPS = 4, 1.0, 0.6, 0.01


class Sizes(NamedTuple):
    """Target N(3,1), the numbers of chains timed, attempts per chain per call, timed calls."""

    target: int
    chains: tuple[int, ...]
    attempts: int
    repeats: int


QUICK = Sizes(150, (1, 8, 64), 500, 3)
GPU = Sizes(1000, (1, 8, 64, 512, 4096), 200, 3)


def _thermalised(target: int, capacity: int, attempts: int) -> np.ndarray:
    """One chain's buffer after ``attempts`` host-engine attempts from the minimal start (at the target volume)."""
    buf = np.array(d3_state.initial_state(T_SLICES, capacity).buf)
    off = d3_host.field_offsets(capacity, T_SLICES)
    d3_host.sweep_chain(buf, off, attempts, K0, K3, EPS, float(target), False, False, T_SLICES, False, 0, np.uint64(1))
    return buf


def _stepper(target: int, attempts: int, engine: str):
    return cdt.metropolis_3d(K0, K3, target=target, eps=EPS, attempts_per_sweep=attempts, engine=engine)


def has_host_callback(hlo_text: str) -> bool:
    """Whether lowered HLO/StableHLO text calls back into Python (a ``custom_call`` to a callback target)."""
    return "callback" in hlo_text


def _measure(st, buf: np.ndarray, capacity: int, n: int, repeats: int) -> dict[str, Any]:
    geometry = d3_state.CDT3State(buf=jnp.tile(jnp.asarray(buf), (n, 1)), tetra_capacity=capacity, n_slices=T_SLICES)
    chains = cdt.Chain3d(key=jax.random.split(jax.random.key(0), n), geometry=geometry)
    t0 = time.perf_counter()
    step = jax.jit(jax.vmap(st.step)).lower(chains).compile()
    compile_s = time.perf_counter() - t0
    chains = jax.block_until_ready(step(chains))
    times, attempted, accepted = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        chains = jax.block_until_ready(step(chains))
        times.append(time.perf_counter() - t0)
        attempted.append(int(np.asarray(chains.geometry.field("attempts")).sum()))
        accepted.append(int(np.asarray(chains.geometry.field("accepts")).sum()))
    s = summarize(times)
    att, acc = float(np.mean(attempted)), float(np.mean(accepted))
    return {
        "engine": st.params.engine,
        "chains": n,
        "attempts_per_call": att,
        "compile_s": compile_s,
        "time": s,
        "attempts_per_s_aggregate": att / s["median_s"],
        "attempts_per_s_per_chain": att / n / s["median_s"],
        "acceptance": acc / att,
        "overflow": bool(np.any(np.asarray(chains.geometry.count("overflow")))),
    }


def gpu_check(quick: bool = False, chains: Sequence[int] | None = None) -> dict[str, Any]:
    """Attempts/s of the JAX engine for each number of chains (module docstring), the host engine's one-chain rate
    on the same state, and the no-callback guard. Returns the rows, ``no_host_callback`` and a ``summary``."""
    cfg = QUICK if quick else GPU
    target = cfg.target
    capacity = 8 * target
    buf = _thermalised(target, capacity, 400 * target)
    st = _stepper(target, cfg.attempts, "jax")
    one = cdt.Chain3d(key=jax.random.key(0), geometry=d3_state.CDT3State(jnp.asarray(buf), capacity, T_SLICES))
    hlo = jax.jit(st.step).lower(one).as_text()
    rows = [_measure(st, buf, capacity, n, cfg.repeats) for n in (chains or cfg.chains)]
    host = _measure(_stepper(target, 20 * cfg.attempts, "host"), buf, capacity, 1, cfg.repeats)
    best = max(rows, key=lambda r: r["attempts_per_s_aggregate"])
    lines = [
        f"cdt3 jax chains {r['chains']:5d}: {r['attempts_per_s_aggregate']:.3e} attempts/s aggregate, "
        f"{r['attempts_per_s_per_chain']:.3e} per chain (compile {r['compile_s']:.1f} s)"
        for r in rows
    ]
    lines.append(f"cdt3 host one chain: {host['attempts_per_s_aggregate']:.3e} attempts/s")
    lines.append(f"cdt3 jax step has a host callback: {has_host_callback(hlo)}")
    return {
        "platform": backend.platform(),
        "device": str(jax.devices()[0]),
        # a shared host's other jobs slow every row alike: the load when the rows were measured
        "load_average_1min": os.getloadavg()[0],
        "system": {"T": T_SLICES, "k0": K0, "k3": K3, "eps": EPS, "fix": "n31", "capacity": capacity, **cfg._asdict()},
        "no_host_callback": not has_host_callback(hlo),
        "rows": rows,
        "host_one_chain": host,
        "summary": lines,
        "headline": {
            "jax_attempts_per_s": best["attempts_per_s_aggregate"],
            "jax_best_chains": best["chains"],
            "jax_one_chain_attempts_per_s": rows[0]["attempts_per_s_aggregate"],
            "host_one_chain_attempts_per_s": host["attempts_per_s_aggregate"],
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    return gpu_check_main("ops_cdt3_jax", gpu_check, argv)


if __name__ == "__main__":
    raise SystemExit(main())
