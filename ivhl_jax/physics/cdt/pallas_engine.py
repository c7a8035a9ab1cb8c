"""The CDT moves as one Pallas kernel (``cdt.metropolis(..., engine="pallas")``).

One kernel launch runs a whole sweep for a block of chains: each program of the grid owns
``block_chains`` chains (one per vector lane), loops over the attempts inside the kernel and reads and
writes every chain's packed buffer in place (the buffer is aliased input -> output). Each attempt is
*the same code* as the JAX engine's (:func:`ivhl_jax.physics.cdt.moves.move_writes`: the same decoding
of the two random words, the same exact index draw, the same float32 acceptance arithmetic), evaluated
on ref loads instead of array gathers, and its writes are applied one by one as masked stores: the
values of an attempt are all read before its first write and no two enabled writes of one attempt hit
the same word with different values, so the result equals the JAX engine's single scatter bit for bit
(tested with explicit words: :func:`attempts`).

Random words: drawn inside the kernel, per chain, with Threefry-2x32 (20 rounds, the generator behind
``jax.random``; Salmon et al., SC 2011) keyed by two 32-bit words drawn from the chain's sweep key;
attempt ``i`` of the sweep uses the counter ``(i, 0)`` (``(i, 1)`` for the attempts that steer the volume
to its target). Plain 32-bit integer arithmetic, so the same kernel runs in Pallas's interpreter on CPU
and compiled on a GPU; the stream differs from the JAX engine's (which draws with ``jax.random.bits``
in blocks), as the host engine's does, so whole sweeps agree in law, not in bits.

Backends: where the program is lowered for a CUDA GPU the kernel is compiled by Pallas's GPU lowering;
on every other platform (CPU, TPU) it runs in the Pallas interpreter (``interpret=True``): exact, and
slow (each ref access becomes an XLA gather or scatter), for validation on small universes; use
``engine="jax"`` or ``"host"`` for production runs there. The choice is made when the program is
lowered (:func:`jax.lax.platform_dependent`), so the same jitted function is right on every platform;
``interpret=True/False`` forces it.

Shapes: ``buf`` (..., size) int32 as in :func:`ivhl_jax.physics.cdt.state.buffer_layout`; the leading
axes (vmapped chains included: the batching rule hands the whole batch to one launch) are flattened
into chains and padded to a multiple of ``block_chains``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ivhl_jax.physics.cdt.moves import (
    EXTRA_ATTEMPTS,
    MAX_VERTEX_CAPACITY,
    SweepRequest,
    move_writes,
    sweep_length,
    sweep_request,
)
from ivhl_jax.physics.cdt.state import CDTState

__all__ = ["sweep", "sweep_state", "attempts", "threefry2x32", "BLOCK_CHAINS", "MAX_VERTEX_CAPACITY"]

#: Chains per program of the grid (one per lane of the vector unit; a power of two for the GPU lowering).
BLOCK_CHAINS = 32

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x, r):
    return (x << jnp.uint32(r)) | (x >> jnp.uint32(32 - r))


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds on uint32 arrays (broadcasting): key ``(k0, k1)``, counter ``(x0, x1)``
    -> two uint32 words. The block function of ``jax.random``'s default PRNG, written in 32-bit integer
    operations so that it runs inside a kernel."""
    k0, k1, x0, x1 = (jnp.asarray(v, jnp.uint32) for v in (k0, k1, x0, x1))
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r)
            x1 = x1 ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


class _RefRows:
    """The buffers of one block of chains as seen by :func:`move_writes`: ``buf[i]`` (``i`` a Python int or
    a per-chain (B,) index vector) is one word per chain, clamped into the buffer like an XLA gather."""

    def __init__(self, ref, rows, size):
        self.ref, self.rows, self.size = ref, rows, size

    def __getitem__(self, i):
        idx = jnp.clip(jnp.broadcast_to(jnp.asarray(i, jnp.int32), self.rows.shape), 0, self.size - 1)
        return self.ref[self.rows, idx]


class _Couplings(NamedTuple):
    lam: jax.Array
    eps: jax.Array
    target: jax.Array


def _store_writes(ref, rows, size, writes):
    """Apply ``(index, value, enabled)`` writes in order as masked stores (disabled ones rewrite word 0's
    current value, so a garbage index is never dereferenced)."""
    for i, v, on in writes:
        on = jnp.broadcast_to(on, rows.shape)
        idx = jnp.where(on, jnp.broadcast_to(jnp.asarray(i, jnp.int32), rows.shape), 0)
        idx = jnp.clip(idx, 0, size - 1)
        old = ref[rows, idx]
        ref[rows, idx] = jnp.where(on, jnp.broadcast_to(jnp.asarray(v, jnp.int32), rows.shape), old)


def _one(ref, rows, size, w0, w1, couplings, lay, c0, stop_n0=None, active=None):
    bits = (w0, w1)
    writes = move_writes(_RefRows(ref, rows, size), lay, bits, couplings, c0, stop_n0, active)
    _store_writes(ref, rows, size, writes)


def _rows(block):
    return pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)


def _words_kernel(words_ref, lam_ref, eps_ref, target_ref, buf_in, buf_ref, *, lay, c0, size, block, n):
    del buf_in  # aliased to buf_ref
    rows = _rows(block)
    couplings = _Couplings(lam_ref[rows], eps_ref[rows], target_ref[rows])

    def body(i, carry):
        _one(buf_ref, rows, size, words_ref[rows, i, 0], words_ref[rows, i, 1], couplings, lay, c0)
        return carry

    jax.lax.fori_loop(0, n, body, 0)


def _sweep_kernel(
    seed_ref, lam_ref, eps_ref, target_ref, tn0_ref, buf_in, buf_ref, *, lay, c0, size, block, n, steer_volume
):
    """``n`` attempts (a fixed count), then, with ``steer_volume`` and where ``tn0 >= 0``, more until n0 == tn0
    (at most 10 n); words from Threefry keyed by the chain's seed."""
    del buf_in
    rows = _rows(block)
    couplings = _Couplings(lam_ref[rows], eps_ref[rows], target_ref[rows])
    k0, k1 = seed_ref[rows, 0], seed_ref[rows, 1]
    o_n0, o_miss = lay["n0"][0], lay["missed_target"][0]

    def body(i, carry):
        w0, w1 = threefry2x32(k0, k1, jnp.broadcast_to(i.astype(jnp.uint32), rows.shape), jnp.uint32(0))
        _one(buf_ref, rows, size, w0, w1, couplings, lay, c0)
        return carry

    jax.lax.fori_loop(0, jnp.int32(n), body, 0)
    if not steer_volume:
        return
    tn0 = tn0_ref[rows]
    steer = tn0 >= 0
    max_extra = jnp.int32(EXTRA_ATTEMPTS * n)

    def n0_now():
        return buf_ref[rows, jnp.full_like(rows, o_n0)]

    def cond(i):
        # a max over int32, not jnp.any: Pallas' Triton lowering has no boolean reduce_or (seen on an H200 with
        # jax 0.11.2: "Unimplemented primitive in Pallas Triton lowering: reduce_or")
        return jnp.max((steer & (n0_now() != tn0) & (i < max_extra)).astype(jnp.int32)) > 0

    def extra(i):
        w0, w1 = threefry2x32(k0, k1, jnp.broadcast_to(i.astype(jnp.uint32), rows.shape), jnp.uint32(1))
        _one(buf_ref, rows, size, w0, w1, couplings, lay, c0, stop_n0=tn0, active=steer & (i < max_extra))
        return i + 1

    jax.lax.while_loop(cond, extra, jnp.int32(0))
    missed = steer & (n0_now() != tn0)
    o = jnp.full_like(rows, o_miss)
    buf_ref[rows, o] = buf_ref[rows, o] + missed.astype(jnp.int32)


def _pad(x, total):
    extra = total - x.shape[0]
    if not extra:
        return x
    return jnp.concatenate([x, jnp.broadcast_to(x[:1], (extra,) + x.shape[1:])])


def _launch(kernel, bufs, inputs, *, interpret, block, static):
    """Run ``kernel`` over chains ``bufs`` (B, size) with per-chain ``inputs`` (each (B, ...)). ``interpret=None``:
    compiled where the program is lowered for a CUDA GPU, Pallas's interpreter on every other platform (a
    lowering-time choice, :func:`jax.lax.platform_dependent`)."""
    b, size = bufs.shape
    total = -(-b // block) * block
    bufs_p = _pad(bufs, total)
    ins = [_pad(x, total) for x in inputs]

    def call(interp, *args):
        return pl.pallas_call(
            functools.partial(kernel, size=size, block=block, **static),
            out_shape=jax.ShapeDtypeStruct(bufs_p.shape, jnp.int32),
            grid=(total // block,),
            input_output_aliases={len(ins): 0},
            interpret=interp,
            # Triton explicitly: the default CUDA lowering (Mosaic GPU) rejects this kernel's unaligned row strides.
            compiler_params=None if interp else pltriton.CompilerParams(num_warps=4),
        )(*args)

    if interpret is None:
        out = jax.lax.platform_dependent(
            *ins, bufs_p, cuda=functools.partial(call, False), default=functools.partial(call, True)
        )
    else:
        out = call(bool(interpret), *ins, bufs_p)
    return out[:b]


def _flat_couplings(params: Any, lead: tuple[int, ...]) -> list[jax.Array]:
    return [
        jnp.broadcast_to(jnp.asarray(x, jnp.float32), lead).reshape(-1) for x in (params.lam, params.eps, params.target)
    ]


@functools.cache
def _batched_sweep(n: int, steer_volume: bool, lay_items: tuple, c0: int, interpret: bool | None, block: int):
    lay = dict(lay_items)

    @jax.custom_batching.custom_vmap
    def run(buf, seed, lam, eps, target, tn0):
        lead = buf.shape[:-1]
        flat = [x.reshape((-1,) + x.shape[len(lead) :]) for x in (seed, lam, eps, target, tn0)]
        out = _launch(
            _sweep_kernel,
            buf.reshape(-1, buf.shape[-1]),
            flat,
            interpret=interpret,
            block=block,
            static=dict(lay=lay, c0=c0, n=n, steer_volume=steer_volume),
        )
        return out.reshape(buf.shape)

    @run.def_vmap
    def rule(axis_size, in_batched, *args):
        full = [x if b else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, b in zip(args, in_batched)]
        return run(*full), True

    return run


def sweep(
    buf: jax.Array,
    request: SweepRequest,
    params: Any,
    *,
    interpret: bool | None = None,
    block_chains: int = BLOCK_CHAINS,
) -> jax.Array:
    """One sweep on ``buf`` (..., size) as ``request`` asks: ``request.n >= 1`` attempts (a fixed count), words
    from Threefry keyed by ``request.seed`` (..., 2) uint32; then, unless ``request.target_n0`` is None, attempts
    until n0 == target_n0 (at most ``10 n``; a miss increments ``missed_target``). One kernel launch for all chains,
    under jit and vmap. ``interpret``: None (compiled on a CUDA GPU, interpreted elsewhere), True or False."""
    n = sweep_length(request.n, params)
    lead = buf.shape[:-1]
    lam, eps, target = (x.reshape(lead) for x in _flat_couplings(params, lead))
    target_n0 = request.target_n0
    tn0 = jnp.broadcast_to(jnp.asarray(-1 if target_n0 is None else target_n0, jnp.int32), lead)
    seed = jnp.broadcast_to(jnp.asarray(request.seed, jnp.uint32), lead + (2,))
    lay_items = tuple(sorted(request.lay.items()))
    fn = _batched_sweep(int(n), target_n0 is not None, lay_items, int(request.c0), interpret, int(block_chains))
    return fn(buf, seed, lam, eps, target, tn0)


def attempts(
    buf: jax.Array,
    words: jax.Array,
    params: Any,
    lay: dict[str, tuple[int, int]],
    c0: int,
    *,
    interpret: bool | None = None,
    block_chains: int = BLOCK_CHAINS,
) -> jax.Array:
    """The attempts given by explicit words (B, n, 2) uint32 on chains ``buf`` (B, size), in one launch: the
    bit-for-bit cross-check with :func:`ivhl_jax.physics.cdt.moves.attempt` (the JAX engine)."""
    if buf.ndim != 2 or words.ndim != 3 or words.shape[0] != buf.shape[0] or words.shape[2] != 2:
        raise ValueError(f"buf must be (B, size) and words (B, n, 2), got {buf.shape} and {words.shape}")
    lam, eps, target = _flat_couplings(params, buf.shape[:1])
    return _launch(
        _words_kernel,
        buf,
        [jnp.asarray(words, jnp.uint32), lam, eps, target],
        interpret=None if interpret is None else bool(interpret),
        block=int(block_chains),
        static=dict(lay=lay, c0=int(c0), n=int(words.shape[1])),
    )


def sweep_state(key: jax.Array, state: CDTState, params: Any, n: int | None = None) -> CDTState:
    """One sweep of the stepper on the Pallas engine (``params.engine == "pallas"``): the kernel's Threefry key
    is two words drawn from ``key``; ``n`` attempts (default ``params.attempts_per_sweep``; a fixed count), then
    with ``params.stop_at_first_hit`` (biased) more until N2 == target
    (:func:`~ivhl_jax.physics.cdt.moves.sweep_request`)."""
    return state.replace(buf=sweep(state.buf, sweep_request(key, state, params, n), params))
