"""Benchmarks of the Gross–Pitaevskii split-step (``gp_step``) and the GFT condensate step (``gft_step``).

``gp_step``: K real-time Strang steps of i∂ψ/∂t = [−½∇² + V + g|ψ|²]ψ (harmonic trap, g = 100,
dt = 1e-3, complex64) through ``trajectory(condensate.strang(system, dt), psi, K)`` without observables, on
1D 4096 (small), 2D 256² (medium), 3D 64³ (large), 3D 128³ (extreme). Each step is two FFTs and
two local (cos/sin) phase multiplications. Peers, in the same process, run the identical algorithm
(same precomputed kinetic factor, complex64): NumPy (``numpy.fft``) and PyTorch eager (``torch.fft``).

Memory-bandwidth bound: an ideal step reads and writes the complex64 array once per FFT and once
for the fused local/kinetic multiplications, i.e. ``bytes_moved = 3 · 2 · 8 · N`` per step (a lower
bound: multi-dimensional FFTs make more passes). ``params["copy_bandwidth_GBps"]`` is a STREAM-like
copy measured in the same process, so the fraction of the bound is gbytes_per_s / copy bandwidth.
"""

from __future__ import annotations

import time

import numpy as np

from ivhl_jax.bench.harness import BenchCase

GP_SIZES = {"small": (4096,), "medium": (256, 256), "large": (64, 64, 64), "extreme": (128, 128, 128)}
GP_STEPS = {"small": 100, "medium": 20, "large": 10, "extreme": 5}
GFT_SIZES = {"small": (16, 16, 16), "medium": (32, 32, 32), "large": (16, 16, 16, 16), "extreme": (64, 64, 64)}
DT, G = 1e-3, 100.0


def copy_bandwidth_gbps(n_bytes: int = 1 << 27, repeats: int = 5) -> float:
    """Read + write bandwidth of a large NumPy copy (GB/s), the practical memory bound of this host."""
    a = np.ones(n_bytes // 8, np.float64)
    b = np.empty_like(a)
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best / 1e9


def _gp_setup(shape, fft="xla"):
    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform(shape, [0.1 * n for n in shape])  # dx = 0.1: dt·k_max²/2 < π in 3D
    system = C.GPSystem(grid, C.harmonic(grid), G, fft=fft)
    psi = C.gaussian(grid)
    kin = np.exp(-0.5j * DT * grid.k_squared()).astype(np.complex64)
    return C, grid, system, psi, kin


def _numpy_peer(shape, steps):
    def build():
        _, grid, system, psi, kin = _gp_setup(shape)
        v = np.asarray(system.potential)
        p0 = np.asarray(psi)
        half = np.float32(0.5 * DT)
        g = np.float32(G)

        def local(p):
            return p * np.exp(-1j * half * (v + g * (p.real ** 2 + p.imag ** 2))).astype(np.complex64)

        def call():
            p = p0
            for _ in range(steps):
                p = local(p)
                p = np.fft.ifftn(np.fft.fftn(p) * kin)
                p = local(p)
            return p

        return call

    return build


def _torch_peer(shape, steps, device="cpu", compiled=False):
    """PyTorch eager (or ``torch.compile``) Strang steps on ``device``; the call returns after the work."""
    def build():
        import torch

        _, grid, system, psi, kin = _gp_setup(shape)
        v = torch.from_numpy(np.array(system.potential)).to(device)
        p0 = torch.from_numpy(np.array(psi)).to(device)
        kin_t = torch.from_numpy(kin).to(device)
        half, g = 0.5 * DT, G
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

        def local(p):
            return p * torch.polar(torch.ones_like(v), -half * (v + g * (p.real ** 2 + p.imag ** 2)))

        def evolve(p):
            for _ in range(steps):
                p = local(p)
                p = torch.fft.ifftn(torch.fft.fftn(p) * kin_t)
                p = local(p)
            return p

        run = torch.compile(evolve) if compiled else evolve

        def call():
            with torch.no_grad():
                p = run(p0)
            sync()
            return p

        return call

    return build


def _no_observation(state, params):
    """Record nothing (a module-level observe, so the compiled loop is reused)."""
    return None


def _gp_case(size: str, fft: str) -> BenchCase:
    from ivhl_jax.numerics.rollout import trajectory

    shape, steps = GP_SIZES[size], GP_STEPS[size]
    C, grid, system, psi, _ = _gp_setup(shape, fft)
    stepper = C.strang(system, DT)

    def fn(p):
        return trajectory(stepper, p, steps, save_every=steps, observe=_no_observation)[0]

    n = int(np.prod(shape))
    return BenchCase(
        op="gp_step" if fft == "xla" else f"gp_step_{fft}", size=size, fn=fn, args=(psi,),
        params={"shape": list(shape), "steps_per_call": steps, "dtype": "complex64", "dt": DT, "g": G,
                "fft": fft, "copy_bandwidth_GBps": copy_bandwidth_gbps()},
        flops=steps * (2 * 5 * n * np.log2(n) + 30 * n), bytes_moved=steps * 3 * 2 * 8 * n,
        peers={"numpy": _numpy_peer(shape, steps), "torch_eager": _torch_peer(shape, steps)},
        op_by_op=size in ("small", "medium", "large") and fft == "xla", items_per_call=steps, items_name="steps",
        notes="K Strang steps per call; flops = 5 N log2 N per FFT + ~30 per point; bytes = 3 passes of r+w"
              + ("" if fft == "xla" else f"; kinetic FFT pair on the host ({fft}, via ivhl_jax.numerics.spectral)"),
    )


def gp_step(size: str) -> BenchCase:
    return _gp_case(size, "xla")


def gp_step_ducc(size: str) -> BenchCase:
    """The same step with the opt-in host FFT backend (``GPSystem(fft="ducc")``; needs ``ducc0``)."""
    return _gp_case(size, "ducc")


def gft_step(size: str) -> BenchCase:
    import jax

    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import gft as Gm

    shape = GFT_SIZES[size]
    system = Gm.GFTSystem(shape, -0.5, 0.1)
    kr, ki = jax.random.split(jax.random.key(0))
    phi = 0.1 * jax.lax.complex(jax.random.normal(kr, shape), jax.random.normal(ki, shape))
    steps = 10
    stepper = Gm.strang(system, 0.01)

    def fn(p):
        return trajectory(stepper, p, steps, save_every=steps, observe=_no_observation)[0]

    n = int(np.prod(shape))
    return BenchCase(op="gft_step", size=size, fn=fn, args=(phi,),
                     params={"shape": list(shape), "steps_per_call": steps, "mass_sq": -0.5, "lam": 0.1},
                     bytes_moved=steps * 3 * 2 * 8 * n, items_per_call=steps, items_name="steps",
                     op_by_op=size != "extreme",
                     notes="GFT condensate Strang step (rank = len(shape)); the seed's forward-Euler step "
                           "is unstable, so no peer of the seed is timed")


OPS = {"gp_step": gp_step, "gp_step_ducc": gp_step_ducc, "gft_step": gft_step}
