"""The attention kernels' tunable choices, registered for ``ivhl tune`` (:mod:`ivhl_jax.core.tunables`).

``attention`` — causal self-attention forward + backward: the dense f32 kernel vs ``jax.nn.dot_product_attention``,
the implementation for bf16 inputs (``xla``, ``chunked``; ``cudnn`` and compiled ``pallas`` on a GPU), the chunked
kernel's key block, and on a GPU the compiled Pallas kernel's tiles (block sizes are measurements: the caller's
arguments).
"""

from __future__ import annotations

import functools
from typing import Any

from ivhl_jax.core import backend, tunables
from ivhl_jax.core.tunables import Candidate, Tuner

__all__ = ["tune_attention"]


def tune_attention(t: Tuner) -> dict[str, dict[str, Any]]:
    """Causal self-attention forward + backward at B = 4, T = 256, 4 heads of 64 (tiny: T = 32): the dense f32
    kernel vs ``jax.nn.dot_product_attention``; then the bf16 implementation, the chunked kernel's key block and
    (GPU) the Pallas tiles."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.nn import attention as A

    B, T, N, H = (1, 32, 2, 16) if t.tiny else (4, 256, 4, 64)
    on_gpu = backend.platform() == "gpu"
    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])

    def build(dtype, impl, settings, **blocks):
        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), dtype) for kk in ks)

        def loss(q, k, v):
            o = A.attention(q, k, v, causal=True, implementation=impl, **blocks)
            return jnp.sum(o.astype(jnp.float32) ** 2)

        return t.aot(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, k, v, settings=settings)

    def choose(key: str, candidates: list[Candidate], dtype: str, note: str | None = None) -> dict[str, Any]:
        """One attention choice: the same rounds, shapes and parameters for every key; bf16 outputs compared
        to 3e-2, f32 to 1e-4."""
        half_precision = dtype == "bfloat16"
        entry = t.choose(
            key,
            None,
            candidates,
            rounds=5 if t.tiny else 9,
            rtol=3e-2 if half_precision else 1e-4,
            dtype="bf16" if half_precision else "f32",
            params={"B": B, "T": T, "N": N, "H": H, "dtype": dtype, "causal": True},
        )
        if note:
            entry["note"] = note
        out[f"{key}|all"] = entry
        return entry

    out: dict[str, dict[str, Any]] = {}
    t.log(f"attention f32 {B}x{T}x{N}x{H} causal fwd+bwd ...")
    dense = [
        Candidate(
            f"dense_{d}",
            {"attention_dense": d},
            functools.partial(build, jnp.float32, "xla", {"attention_dense": d}),
            default=(d == row.attention_dense),
        )
        for d in (True, False)
    ]
    choose("attention.dense", dense, "float32")
    t.log(f"attention bf16 {B}x{T}x{N}x{H} causal fwd+bwd ...")
    impls = ["xla", "chunked"] + (["cudnn", "pallas"] if on_gpu else [])
    half = [
        Candidate(
            i, {"attention_half": i}, functools.partial(build, jnp.bfloat16, i, {}), default=(i == row.attention_half)
        )
        for i in impls
    ]
    choose("attention.half", half, "bfloat16")
    # the chunked kernel's key block (attention(block_k=...), default 128): candidates up to T, distinct after the
    # min(block_k, T) the kernel applies
    blocks = sorted({min(b, T) for b in (16, 32, 64, 128, 256, 512)})
    t.log(f"attention chunked bf16 {B}x{T}x{N}x{H}: key blocks {blocks} ...")
    chunk = [
        Candidate("block_k_default", {"block_k": min(128, T)}, lambda: build(jnp.bfloat16, "chunked", {}), default=True)
    ]
    chunk += [
        Candidate(f"block_k{b}", {"block_k": b}, functools.partial(build, jnp.bfloat16, "chunked", {}, block_k=b))
        for b in blocks
        if b != min(128, T)
    ]
    choose(
        "attention.chunk_block",
        chunk,
        "bfloat16",
        "a measurement: attention(block_k=...) is the caller's argument (default 128); no default reads this entry",
    )
    if not on_gpu:
        t.note(
            "Pallas attention block sizes: not timed on this platform (the Pallas GPU kernel compiles "
            "only on a GPU; elsewhere it runs in the interpreter, which times nothing real)"
        )
        return out
    tiles = sorted(
        {
            (min(A.pallas_tile(bq), A.pallas_tile(T)), min(A.pallas_tile(bk), A.pallas_tile(T)))
            for bq, bk in ((32, 32), (64, 64), (64, 128), (128, 64), (128, 128))
        }
    )
    t.log(f"attention pallas bf16 {B}x{T}x{N}x{H}: (block_q, block_k) {tiles} ...")
    pallas = [
        Candidate(
            f"pallas_q{bq}_k{bk}",
            {"block_q": bq, "block_k": bk},
            functools.partial(build, jnp.bfloat16, "pallas", {}, block_q=bq, block_k=bk, interpret=False),
            default=(bq, bk) == (min(128, A.pallas_tile(T)), min(128, A.pallas_tile(T))),
        )
        for bq, bk in tiles
    ]
    choose(
        "attention.pallas_blocks",
        pallas,
        "bfloat16",
        "a measurement: attention(implementation='pallas', block_q=..., block_k=...) are the caller's "
        "arguments (default 128); no default reads this entry",
    )
    return out


tunables.register(tunables.Area("attention", tune_attention, order=40))
