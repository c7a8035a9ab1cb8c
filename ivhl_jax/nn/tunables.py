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


class _AttentionBench:
    """The shapes, the compiled candidates and the recorded choices of one :func:`tune_attention` run."""

    def __init__(self, t: Tuner):
        self.t = t
        self.shape = (1, 32, 2, 16) if t.tiny else (4, 256, 4, 64)  # B, T, N (heads), H (head size)
        self.row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])
        self.out: dict[str, dict[str, Any]] = {}

    def build(self, dtype: Any, impl: str, settings: dict[str, Any], **blocks: Any) -> Any:
        """The compiled causal forward + backward of ``attention(implementation=impl, **blocks)`` on ``dtype``."""
        import jax
        import jax.numpy as jnp

        from ivhl_jax.nn import attention as A

        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, self.shape, dtype) for kk in ks)

        def loss(q, k, v):
            o = A.attention(q, k, v, causal=True, implementation=impl, **blocks)
            return jnp.sum(o.astype(jnp.float32) ** 2)

        return self.t.aot(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, k, v, settings=settings)

    def choose(self, key: str, candidates: list[Candidate], dtype: str, note: str | None = None) -> None:
        """One attention choice: the same rounds, shapes and parameters for every key; bf16 outputs compared
        to 3e-2, f32 to 1e-4."""
        half_precision = dtype == "bfloat16"
        B, T, N, H = self.shape
        entry = self.t.choose(
            key,
            None,
            candidates,
            rounds=5 if self.t.tiny else 9,
            rtol=3e-2 if half_precision else 1e-4,
            dtype="bf16" if half_precision else "f32",
            params={"B": B, "T": T, "N": N, "H": H, "dtype": dtype, "causal": True},
        )
        if note:
            entry["note"] = note
        self.out[f"{key}|all"] = entry

    def log(self, what: str) -> None:
        B, T, N, H = self.shape
        self.t.log(f"attention {what.format(shape=f'{B}x{T}x{N}x{H}')} ...")


def tune_attention(t: Tuner) -> dict[str, dict[str, Any]]:
    """Causal self-attention forward + backward at B = 4, T = 256, 4 heads of 64 (tiny: T = 32): the dense f32
    kernel vs ``jax.nn.dot_product_attention``; then the bf16 implementation, the chunked kernel's key block and
    (GPU) the Pallas tiles."""
    bench = _AttentionBench(t)
    _choose_dense(bench)
    _choose_half(bench)
    _choose_chunk_block(bench)
    if backend.platform() != "gpu":
        t.note(
            "Pallas attention block sizes: not timed on this platform (the Pallas GPU kernel compiles "
            "only on a GPU; elsewhere it runs in the interpreter, which times nothing real)"
        )
        return bench.out
    _choose_pallas_tiles(bench)
    return bench.out


def _choose_dense(bench: _AttentionBench) -> None:
    """float32: the dense kernel vs ``jax.nn.dot_product_attention``."""
    import jax.numpy as jnp

    bench.log("f32 {shape} causal fwd+bwd")
    dense = [
        Candidate(
            f"dense_{d}",
            {"attention_dense": d},
            functools.partial(bench.build, jnp.float32, "xla", {"attention_dense": d}),
            default=(d == bench.row.attention_dense),
        )
        for d in (True, False)
    ]
    bench.choose("attention.dense", dense, "float32")


def _choose_half(bench: _AttentionBench) -> None:
    """bfloat16: the implementation (``xla``, ``chunked``; on a GPU also ``cudnn`` and ``pallas``)."""
    import jax.numpy as jnp

    bench.log("bf16 {shape} causal fwd+bwd")
    impls = ["xla", "chunked"] + (["cudnn", "pallas"] if backend.platform() == "gpu" else [])
    half = [
        Candidate(
            i,
            {"attention_half": i},
            functools.partial(bench.build, jnp.bfloat16, i, {}),
            default=(i == bench.row.attention_half),
        )
        for i in impls
    ]
    bench.choose("attention.half", half, "bfloat16")


def _choose_chunk_block(bench: _AttentionBench) -> None:
    """The chunked kernel's key block (attention(block_k=...), default 128): candidates up to T, distinct after
    the min(block_k, T) the kernel applies."""
    import jax.numpy as jnp

    T = bench.shape[1]
    blocks = sorted({min(b, T) for b in (16, 32, 64, 128, 256, 512)})
    bench.log(f"chunked bf16 {{shape}}: key blocks {blocks}")
    chunk = [
        Candidate(
            "block_k_default", {"block_k": min(128, T)}, lambda: bench.build(jnp.bfloat16, "chunked", {}), default=True
        )
    ]
    chunk += [
        Candidate(f"block_k{b}", {"block_k": b}, functools.partial(bench.build, jnp.bfloat16, "chunked", {}, block_k=b))
        for b in blocks
        if b != min(128, T)
    ]
    bench.choose(
        "attention.chunk_block",
        chunk,
        "bfloat16",
        "a measurement: attention(block_k=...) is the caller's argument (default 128); no default reads this entry",
    )


def _choose_pallas_tiles(bench: _AttentionBench) -> None:
    """GPU: the compiled Pallas kernel's (block_q, block_k) tiles."""
    import jax.numpy as jnp

    from ivhl_jax.nn import attention as A

    T = bench.shape[1]
    tiles = sorted(
        {
            (min(A.pallas_tile(bq), A.pallas_tile(T)), min(A.pallas_tile(bk), A.pallas_tile(T)))
            for bq, bk in ((32, 32), (64, 64), (64, 128), (128, 64), (128, 128))
        }
    )
    bench.log(f"pallas bf16 {{shape}}: (block_q, block_k) {tiles}")
    pallas = [
        Candidate(
            f"pallas_q{bq}_k{bk}",
            {"block_q": bq, "block_k": bk},
            functools.partial(bench.build, jnp.bfloat16, "pallas", {}, block_q=bq, block_k=bk, interpret=False),
            default=(bq, bk) == (min(128, A.pallas_tile(T)), min(128, A.pallas_tile(T))),
        )
        for bq, bk in tiles
    ]
    bench.choose(
        "attention.pallas_blocks",
        pallas,
        "bfloat16",
        "a measurement: attention(implementation='pallas', block_q=..., block_k=...) are the caller's "
        "arguments (default 128); no default reads this entry",
    )


tunables.register(tunables.Area("attention", tune_attention, order=40))
