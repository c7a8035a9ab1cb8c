"""The Pallas CDT engine lowered for a CUDA GPU from the CPU: the sweep kernel and the explicit-word kernel each
become one Triton custom call (not Mosaic GPU, whose TMA copies reject the chains' unaligned row strides), and
the kernel uses no boolean ``reduce_or`` (a primitive Pallas's Triton lowering lacks)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from ivhl_jax import cdt
from ivhl_jax.physics.cdt import moves, pallas_engine
from ivhl_jax.physics.cdt.state import buffer_layout, initial_state

CAP = 64


def _check_cuda_lowering(f, *args):
    traced = jax.jit(f).trace(*args)
    jaxpr = str(traced.jaxpr)  # the kernel's jaxpr is printed inside the pallas_call
    assert "pallas_call" in jaxpr and "reduce_or" not in jaxpr
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1, "expected exactly one Triton custom call"
    assert "mosaic_gpu" not in text


@pytest.mark.slow  # ~6 s: traces and lowers both kernels
def test_sweep_and_attempts_lower_for_cuda_as_one_triton_call():
    s = initial_state(3, 4, capacity=CAP)
    lay = buffer_layout(CAP, 3)
    params = cdt.metropolis(cdt.LN2, eps=0.05, target=30.0).params
    bufs = jnp.stack([s.buf] * 5)
    seeds = jnp.zeros((5, 2), jnp.uint32)
    words = jnp.zeros((5, 7, 2), jnp.uint32)
    # interpret=None (the default): the CUDA branch of the lowering-time platform choice is the compiled kernel
    _check_cuda_lowering(
        lambda b, k: pallas_engine.sweep(b, moves.SweepRequest(k, 10, lay, CAP, jnp.int32(15)), params), bufs, seeds
    )
    _check_cuda_lowering(lambda b, w: pallas_engine.attempts(b, w, params, lay, CAP), bufs, words)
