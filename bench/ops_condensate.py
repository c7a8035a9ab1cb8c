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
from typing import Any

import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.core import backend

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
    system = C.GPSystem.create(grid, C.harmonic(grid), G, fft=fft)
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
            return p * np.exp(-1j * half * (v + g * (p.real**2 + p.imag**2))).astype(np.complex64)

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
            return p * torch.polar(torch.ones_like(v), -half * (v + g * (p.real**2 + p.imag**2)))

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
        op="gp_step" if fft == "xla" else f"gp_step_{fft}",
        size=size,
        fn=fn,
        args=(psi,),
        params={
            "shape": list(shape),
            "steps_per_call": steps,
            "dtype": "complex64",
            "dt": DT,
            "g": G,
            "fft": fft,
            "copy_bandwidth_GBps": copy_bandwidth_gbps(),
        },
        flops=steps * (2 * 5 * n * np.log2(n) + 30 * n),
        bytes_moved=steps * 3 * 2 * 8 * n,
        peers={"numpy": _numpy_peer(shape, steps), "torch_eager": _torch_peer(shape, steps)},
        op_by_op=size in ("small", "medium", "large") and fft == "xla",
        items_per_call=steps,
        items_name="steps",
        notes="K Strang steps per call; flops = 5 N log2 N per FFT + ~30 per point; bytes = 3 passes of r+w"
        + ("" if fft == "xla" else f"; kinetic FFT pair on the host ({fft}, via ivhl_jax.numerics.spectral)"),
    )


def gp_step(size: str) -> BenchCase:
    return _gp_case(size, "xla")


def gp_step_ducc(size: str) -> BenchCase:
    """The same step with the opt-in host FFT backend (``GPSystem.create(fft="ducc")``; needs ``ducc0``)."""
    return _gp_case(size, "ducc")


def gft_step(size: str) -> BenchCase:
    import jax

    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import gft as Gm

    shape = GFT_SIZES[size]
    system = Gm.GFTSystem.create(shape, -0.5, 0.1)
    kr, ki = jax.random.split(jax.random.key(0))
    phi = 0.1 * jax.lax.complex(jax.random.normal(kr, shape), jax.random.normal(ki, shape))
    steps = 10
    stepper = Gm.strang(system, 0.01)

    def fn(p):
        return trajectory(stepper, p, steps, save_every=steps, observe=_no_observation)[0]

    n = int(np.prod(shape))
    return BenchCase(
        op="gft_step",
        size=size,
        fn=fn,
        args=(phi,),
        params={"shape": list(shape), "steps_per_call": steps, "mass_sq": -0.5, "lam": 0.1},
        bytes_moved=steps * 3 * 2 * 8 * n,
        items_per_call=steps,
        items_name="steps",
        op_by_op=size != "extreme",
        notes="GFT condensate Strang step (rank = len(shape)); no peer library runs this model",
    )


OPS = {"gp_step": gp_step, "gp_step_ducc": gp_step_ducc, "gft_step": gft_step}


# ------------------------------------------------------------------------------------------ GPU check
GPU_SHAPES = ((256, 256, 256), (512, 512, 512))
QUICK_SHAPES = ((16, 16, 16),)


def _median_ms(call, reps: int) -> float:
    call()  # compile / warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def _jax_runs(shape, steps: int):
    """(unfused call, fused call) of ``steps`` real-time GP steps on the default device, each returning after the
    work: ``trajectory`` of ``condensate.strang`` observed after every step (each step its own two potential
    half-steps) and observed once at the end (the stepper's ``run``: potential half-steps of consecutive steps
    merged, 2 FFTs and 2 elementwise passes per step)."""
    import jax

    from ivhl_jax.numerics.rollout import trajectory

    C, grid, system, psi, _ = _gp_setup(shape)
    stepper = C.strang(system, DT)
    psi = stepper.init(psi)
    every = jax.jit(lambda p, st: trajectory(st, p, steps, save_every=1, observe=_no_observation)[0])
    once = jax.jit(lambda p, st: trajectory(st, p, steps, save_every=steps, observe=_no_observation)[0])
    return (
        (lambda: jax.block_until_ready(every(psi, stepper))),
        (lambda: jax.block_until_ready(once(psi, stepper))),
        (every, once, psi, stepper),
    )


def fused_vs_unfused(shape=(64, 64, 64), steps: int = 20, rounds: int = 7) -> dict:
    """Interleaved timing of the unfused Strang loop (``trajectory``) and the fused multi-step path on this
    device: per-round ratio fused/unfused (< 1 is faster) and the largest |Δψ| between them."""
    from ivhl_jax.bench.harness import interleaved_rounds

    unfused, fused, (traj, fz, psi, stepper) = _jax_runs(shape, steps)
    diff = float(np.max(np.abs(np.asarray(traj(psi, stepper)) - np.asarray(fz(psi, stepper)))))
    unfused(), fused()
    wall, _ = interleaved_rounds({"unfused": unfused, "fused": fused}, rounds)
    ratios = [f / u for f, u in zip(wall["fused"], wall["unfused"])]
    return {
        "shape": list(shape),
        "steps": steps,
        "rounds": rounds,
        "unfused_ms_per_step": 1e3 * float(np.median(wall["unfused"])) / steps,
        "fused_ms_per_step": 1e3 * float(np.median(wall["fused"])) / steps,
        "ratio_fused_over_unfused_median": float(np.median(ratios)),
        "ratio_fused_over_unfused_range": [float(min(ratios)), float(max(ratios))],
        "max_abs_diff": diff,
    }


def gpu_check(quick: bool = False) -> dict:
    """GP 3D real-time Strang steps on this device (256³ and 512³ complex64; ``quick``: 16³ on any device, a
    few seconds on a CPU), ms/step, against the same algorithm in PyTorch on the same device (when torch is
    importable; eager ``torch.fft`` with the same precomputed kinetic factor).

    Two JAX paths, both ``trajectory`` of ``condensate.strang``: observed after every step (two potential
    half-steps per step) and observed once (the stepper's merged multi-step path: 2 FFTs and 2 elementwise
    passes per step). Times are medians of calls waited on (``block_until_ready``; ``torch.cuda.synchronize``).
    Returns the records and a ``summary`` (one line per size).
    """
    import jax

    shapes = QUICK_SHAPES if quick else GPU_SHAPES
    steps = 5 if quick else 20
    reps = 3 if quick else 10
    platform = backend.platform()
    torch_dev = None
    try:
        import torch

        torch_dev = (
            "cuda" if platform == "gpu" and torch.cuda.is_available() else ("cpu" if platform == "cpu" else None)
        )
    except ImportError:
        torch = None
    doc: dict = {
        "device": str(jax.devices()[0]),
        "steps_per_call": steps,
        "dt": DT,
        "g": G,
        "dtype": "complex64",
        "torch": torch_dev or "not importable or not on this device",
        "results": [],
    }
    summary = []
    for shape in shapes:
        rec: dict = {"shape": list(shape)}
        try:
            unfused, fused, (traj, fz, psi, stepper) = _jax_runs(shape, steps)
            rec["every_step_ms_per_step"] = _median_ms(unfused, reps) / steps
            rec["fused_ms_per_step"] = _median_ms(fused, reps) / steps
            rec["fused_max_abs_diff"] = float(jax.numpy.max(jax.numpy.abs(traj(psi, stepper) - fz(psi, stepper))))
            line = (
                f"GP {'x'.join(map(str, shape))}: observed every step {rec['every_step_ms_per_step']:.3f} "
                f"ms/step, merged {rec['fused_ms_per_step']:.3f} ms/step"
            )
            if torch_dev is not None:
                rec["torch_ms_per_step"] = _median_ms(_torch_peer(shape, steps, device=torch_dev)(), reps) / steps
                line += f", torch eager {rec['torch_ms_per_step']:.3f} ms/step"
        except Exception as e:  # noqa: BLE001 - one size failing (e.g. out of memory) must not hide the others
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            line = f"GP {'x'.join(map(str, shape))}: {rec['error']}"
        doc["results"].append(rec)
        summary.append(line)
    doc["summary"] = summary
    return doc


def main(argv=None) -> int:
    """``python -m ivhl_jax.bench.ops_condensate fused --out FILE``: :func:`fused_vs_unfused` at 2D 256², 3D 64³
    and 3D 128³ on this device, written as JSON with the command that made it. (This tree against an older
    commit, every op interleaved: ``python -m bench.studies.compare_revisions --against REV``.)"""
    import argparse
    import platform
    import sys

    import jax

    p = argparse.ArgumentParser(prog="python -m ivhl_jax.bench.ops_condensate")
    p.add_argument("what", choices=("fused",))
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    from ivhl_jax.bench.harness import write_results

    command = "python -m ivhl_jax.bench.ops_condensate " + " ".join(sys.argv[1:] if argv is None else argv)
    doc: dict[str, Any] = {
        "device": str(jax.devices()[0]),
        "host": platform.node(),
        "cpu_count": backend.machine_cores(),
        "measures": "GP real-time Strang steps: a trajectory observed every step (two potential half-steps per "
        "step) vs one observed once (potential half-steps of consecutive steps merged), interleaved "
        "rounds on one device; ratio < 1: merged faster",
    }
    cases = (((256, 256), 20), ((64, 64, 64), 20), ((128, 128, 128), 5))
    doc["results"] = [fused_vs_unfused(shape, steps, a.rounds) for shape, steps in cases]
    lines = [
        f"{r['shape']}: fused/unfused median {r['ratio_fused_over_unfused_median']:.3f} (range "
        f"{r['ratio_fused_over_unfused_range'][0]:.2f}-{r['ratio_fused_over_unfused_range'][1]:.2f}), "
        f"max |diff| {r['max_abs_diff']:.1e}"
        for r in doc["results"]
    ]
    write_results(a.out, doc, command=command)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
