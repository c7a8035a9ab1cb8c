"""Machine reference ops: the ceilings other ops are compared against (GFLOP/s, MFU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ivhl_jax.bench.harness import BenchCase

_MATMUL_N = {"small": 1024, "medium": 2048, "large": 4096, "extreme": 4096}


def matmul_peak_case(size: str) -> BenchCase:
    """A large square f32 matmul: the practical FLOP/s ceiling for MFU and TN GFLOP/s figures."""
    n = _MATMUL_N[size]
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    return BenchCase(
        op="matmul_peak_f32",
        size=size,
        fn=jnp.matmul,
        args=(a, b),
        params={"n": n},
        flops=2.0 * n**3,
        op_by_op=False,
        notes="reference ceiling for GFLOP/s and MFU on this host",
    )


OPS = {"matmul_peak_f32": matmul_peak_case}
