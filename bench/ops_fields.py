"""Benchmarks of the wave-field kernels: ``superpose`` and the fast ``sincos``.

``superpose`` is the seed's field-superposition benchmark (points X ~ N(0, I) in 3-D, sources
S ~ N(0, 0.25 I), A = 1, k = 1, ω = 1, φ = 0, t = 0, softening ε = 0.1), i.e.

    ψ_n = Σ_j A_j e^{i(k_j r_nj − ω_j t + φ_j)} / (r_nj + ε),

timed through the public :func:`ivhl_jax.physics.fields.superpose` (float32 in, complex64 out). Peers,
timed in the same process: the same formula in NumPy (float64 and float32), PyTorch eager and
``torch.compile`` (float32; real cos/sin parts because inductor cannot generate complex code),
and the straightforward JAX formulation with XLA's own cos/sin (what ``fastmath`` replaced).
"""

from __future__ import annotations

import numpy as np

from ivhl_jax.bench.harness import BenchCase

# (points N, sources M) per size: the seed benchmark's sizes.
SUPERPOSE_SIZES = {"small": (512, 10), "medium": (2048, 20), "large": (8192, 50), "extreme": (32768, 100)}
# elements per call for the sincos micro-benchmark.
SINCOS_SIZES = {"small": 1 << 16, "medium": 1 << 20, "large": 1 << 22, "extreme": 1 << 24}
SOFTENING = 0.1


def _superpose_inputs(n: int, m: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"points": rng.normal(size=(n, 3)).astype(np.float32),
            "sources": (0.5 * rng.normal(size=(m, 3))).astype(np.float32),
            "amplitudes": np.ones(m, np.float32), "wavenumbers": np.ones(m, np.float32),
            "frequencies": np.ones(m, np.float32), "phases": np.zeros(m, np.float32),
            "t": np.float32(0.0)}


def _numpy_peer(inp: dict[str, np.ndarray], dtype) -> callable:
    def build():
        p, s = inp["points"].astype(dtype), inp["sources"].astype(dtype)
        a, k = inp["amplitudes"].astype(dtype), inp["wavenumbers"].astype(dtype)
        th = (inp["phases"] - inp["frequencies"] * inp["t"]).astype(dtype)
        eps = dtype(SOFTENING)

        def call():
            d = p[:, None, :] - s[None, :, :]
            r = np.sqrt(np.einsum("nmd,nmd->nm", d, d))
            w = a / (r + eps)
            ph = k * r + th
            return (w * np.cos(ph)).sum(1), (w * np.sin(ph)).sum(1)

        return call

    return build


def _torch_peer(inp: dict[str, np.ndarray], compiled: bool) -> callable:
    def build():
        import torch

        p, s, a, k = (torch.from_numpy(np.ascontiguousarray(inp[x])) for x in
                      ("points", "sources", "amplitudes", "wavenumbers"))
        th = torch.from_numpy(inp["phases"] - inp["frequencies"] * inp["t"])

        def field(p, s, a, k, th):
            d = p[:, None, :] - s[None, :, :]
            r = torch.sqrt((d * d).sum(-1))
            w = a / (r + SOFTENING)
            ph = k * r + th
            return (w * torch.cos(ph)).sum(1), (w * torch.sin(ph)).sum(1)

        fn = torch.compile(field) if compiled else field

        def call():
            with torch.no_grad():
                return fn(p, s, a, k, th)

        return call

    return build


def _jax_plain_peer(inp: dict[str, np.ndarray], chunk: int = 2048) -> callable:
    """The straightforward JAX formulation: chunk × M tiles with XLA's jnp.cos/jnp.sin."""
    def build():
        import jax
        import jax.numpy as jnp

        from ivhl_jax.numerics.fastmath import safe_norm

        def tile(pts, s, a, k, th):
            r = safe_norm(pts[:, None, :] - s[None, :, :])
            w = a / (r + SOFTENING)
            ph = k * r + th
            return jnp.sum(w * jnp.cos(ph), axis=1), jnp.sum(w * jnp.sin(ph), axis=1)

        def field(p, s, a, k, th):
            n = p.shape[0]
            if n <= chunk:
                return tile(p, s, a, k, th)
            blocks = jnp.pad(p, ((0, -n % chunk), (0, 0))).reshape(-1, chunk, 3)
            re, im = jax.lax.map(lambda b: tile(b, s, a, k, th), blocks)
            return re.reshape(-1)[:n], im.reshape(-1)[:n]

        args = [jnp.asarray(inp[x]) for x in ("points", "sources", "amplitudes", "wavenumbers")]
        args.append(jnp.asarray(inp["phases"] - inp["frequencies"] * inp["t"]))
        compiled = jax.jit(field).lower(*args).compile()
        return lambda: jax.block_until_ready(compiled(*args))

    return build


def superpose_case(size: str) -> BenchCase:
    import jax.numpy as jnp

    from ivhl_jax.physics import fields

    n, m = SUPERPOSE_SIZES[size]
    inp = _superpose_inputs(n, m)

    def fn(points, sources, amplitudes, wavenumbers, frequencies, phases, t):
        return fields.superpose(points, sources, amplitudes=amplitudes, wavenumbers=wavenumbers,
                                frequencies=frequencies, phases=phases, t=t, softening=SOFTENING)

    args = tuple(jnp.asarray(inp[x]) for x in
                 ("points", "sources", "amplitudes", "wavenumbers", "frequencies", "phases", "t"))
    return BenchCase(
        op="superpose", size=size, fn=fn, args=args,
        params={"points": n, "sources": m, "dim": 3, "dtype": "float32 -> complex64", "softening": SOFTENING,
                "inputs": "points ~ N(0, I), sources ~ N(0, 0.25 I), A = k = omega = 1, phi = 0, t = 0, seed 0"},
        items_per_call=float(n * m), items_name="point-source pairs",
        peers={"numpy_float64": _numpy_peer(inp, np.float64), "numpy_float32": _numpy_peer(inp, np.float32),
               "torch_eager": _torch_peer(inp, compiled=False), "torch_compile": _torch_peer(inp, compiled=True),
               "jax_plain_xla_sincos": _jax_plain_peer(inp)},
        notes="jit = ivhl_jax.physics.fields.superpose -> fastmath.point_source_sum (own sincos, SoA, complex "
              "accumulator, loop over sources unrolled x4). peer_over_jit > 1 means ivhl_jax is faster. "
              "Peers use the real cos/sin form and the same float32 dtype.")


def sincos_case(size: str) -> BenchCase:
    import jax.numpy as jnp

    from ivhl_jax.numerics.fastmath import sincos

    n = SINCOS_SIZES[size]
    x = np.random.default_rng(0).uniform(-100.0, 100.0, n).astype(np.float32)

    def xla_peer():
        import jax

        xj = jnp.asarray(x)
        compiled = jax.jit(lambda v: (jnp.sin(v), jnp.cos(v))).lower(xj).compile()
        return lambda: jax.block_until_ready(compiled(xj))

    def torch_peer(compiled: bool):
        def build():
            import torch

            xt = torch.from_numpy(x)
            f = (lambda v: (torch.sin(v), torch.cos(v)))
            fn = torch.compile(f) if compiled else f
            return lambda: fn(xt)

        return build

    return BenchCase(
        op="sincos", size=size, fn=sincos, args=(jnp.asarray(x),),
        params={"elements": n, "dtype": "float32", "range": "uniform(-100, 100)"},
        items_per_call=float(n), items_name="elements (sin and cos each)",
        peers={"jax_xla_sin_cos": xla_peer, "numpy_float32": lambda: (lambda: (np.sin(x), np.cos(x))),
               "torch_eager": torch_peer(False), "torch_compile": torch_peer(True)},
        notes="jit = ivhl_jax.numerics.fastmath.sincos (Cody-Waite + minimax, shared reduction); "
              "jax_xla_sin_cos = jnp.sin and jnp.cos under one jit.")


OPS = {"superpose": superpose_case, "sincos": sincos_case}
